#!/usr/bin/env bash
# Regenerates the seeds of the checkpoint fuzz targets (checkpoint_shard, checkpoint_shard_set,
# checkpoint_metadata) from real checkpoints of a tiny GPT (1 layer, hidden 8, byte vocabulary):
# one rank and tensor 2 x data 2 with ZeRO-1, written by `troupe train` (format version 3) and, when
# V2_TROUPE names a troupe built before format version 3, by that one too (version 2); plus a
# version-1 single-file checkpoint written with h5py in troupe's version-1 layout.
#
#   fuzz/make_checkpoint_seeds.sh BUILD_DIR        (V2_TROUPE=/path/to/old/troupe optional)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
troupe=${1:?usage: $0 BUILD_DIR}/bin/troupe
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
head -c 20000 /usr/share/games/fortunes/fortunes > corpus.txt
"$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix d \
  --tokenizer-type ByteLevelTokenizer --append-eod > /dev/null
tiny() {
  "$1" train --num-layers 1 --hidden-size 8 --num-attention-heads 2 --seq-length 8 --micro-batch-size 2 \
    --global-batch-size 4 --lr 3e-3 --lr-decay-style constant --data-path d_text_document \
    --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --log-interval 1000 --train-iters 2 "${@:2}" > /dev/null
}
shard=$src/fuzz/corpus/checkpoint_shard set=$src/fuzz/corpus/checkpoint_shard_set meta=$src/fuzz/corpus/checkpoint_metadata
mkdir -p "$shard" "$set" "$meta"
# join FILES...: each as "u32 length, bytes" (checkpoint_shard_set's input).
join() { /usr/bin/python3 -c 'import sys, struct; sys.stdout.buffer.write(b"".join(struct.pack("<I", len(d)) + d for d in (open(p, "rb").read() for p in sys.argv[1:])))' "$@"; }
versions=("v3:$troupe")
[[ -n "${V2_TROUPE:-}" ]] && versions+=("v2:$V2_TROUPE")
for entry in "${versions[@]}"; do
  v=${entry%%:*} bin=${entry#*:}
  tiny "$bin" --save "$v-1"
  tiny "$bin" --save "$v-4" --tensor-model-parallel-size 2 --data-parallel-size 2 --zero-stage 1
  cp "$v-1/iter_0000002/shard_00000.h5" "$shard/${v}_one_rank.h5"
  cp "$v-4/iter_0000002/shard_00003.h5" "$shard/${v}_tp2_dp2_zero1_rank3.h5"
  join "$v-4"/iter_0000002/shard_0000{0,1,2,3}.h5 > "$set/${v}_tp2_dp2_zero1.bin"
  cp "$v-1/iter_0000002/metadata.json" "$meta/${v}_one_rank.json"
  cp "$v-4/iter_0000002/metadata.json" "$meta/${v}_tp2_dp2_zero1.json"
done
# Version 1: one file, global names and shapes, every dataset with its crc32 (docs/CHECKPOINT.md).
/usr/bin/python3 - "$shard/v1_single_file.h5" <<'PY'
import sys, zlib, json
import h5py, numpy as np
rng = np.random.default_rng(7)
C, V, P = 8, 257, 8
shapes = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (P, C), "transformer.ln_f.weight": (C,),
          "transformer.ln_f.bias": (C,), "transformer.h.0.attn.c_attn.weight": (3 * C, C),
          "transformer.h.0.attn.c_attn.bias": (3 * C,), "transformer.h.0.mlp.c_fc.weight": (4 * C, C)}
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["format"] = "troupe-checkpoint"
    f.attrs["format_version"] = np.int64(1)
    for k, v in (("iteration", 2), ("consumed_samples", 8), ("optimizer_step", 2)):
        f.attrs[k] = np.int64(v)
    f.attrs["config"] = json.dumps({"model": {"num_layers": 1, "hidden_size": C, "num_attention_heads": 2}})
    f.attrs["rng"] = json.dumps({"seed": 1234})
    for group in ("model", "optimizer/exp_avg", "optimizer/exp_avg_sq"):
        g = f.require_group(group)
        for name, shape in shapes.items():
            values = rng.standard_normal(shape).astype("<f4")
            d = g.create_dataset(name, data=values)
            d.attrs["crc32"] = np.int64(zlib.crc32(values.tobytes()))
PY
ls -l "$shard" "$set" "$meta"
