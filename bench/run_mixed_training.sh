#!/usr/bin/env bash
# Training throughput by precision: the default job's model (scripts/run_default.sh: 4 layers,
# hidden 256, sequence 256, micro-batch 8, global batch 32) on the fortunes corpus, one rank, for
# fp32, bf16 and fp16, and bf16 again with TROUPE_CPU_FEATURES=generic (no AVX512-BF16 GEMM, generic
# conversions). fp16 starts at loss scale 4096 (Megatron's 2^32 would skip the first ~30 steps of
# this short run while the scale comes down). Prints ms per iteration and tokens/s (mean over iterations 3..N, from the metrics
# file) and each precision's ratio to fp32 in the same run. docs/PERFORMANCE.md keeps the figures.
#   bench/run_mixed_training.sh [iterations=14]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
iters=${1:-14}
troupe="${TROUPE_BUILD_DIR:-$here/build}/bin/troupe"
[[ -x "$troupe" ]] || TROUPE_TARGET=troupe "$here/scripts/build.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
shopt -s nullglob
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat | *.u8) continue ;; esac
  [[ -f "$f" ]] && cat "$f" >> "$work/corpus.txt"
done
[[ -s "$work/corpus.txt" ]] || { echo "bench: install Debian's fortunes (scripts/setup.sh)" >&2; exit 2; }
"$troupe" preprocess --input "$work/corpus.txt" --input-format text --text-separator % \
  --output-prefix "$work/f" --tokenizer-type ByteLevelTokenizer --append-eod > /dev/null

run() {  # name, env, flags...
  local name=$1 env=$2; shift 2
  env $env "$troupe" train --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 \
    --micro-batch-size 8 --global-batch-size 32 --lr 2e-3 --min-lr 2e-4 --lr-decay-style cosine \
    --lr-warmup-iters 2 --train-iters "$iters" --weight-decay 0.1 --clip-grad 1.0 --seed 1234 \
    --data-path "$work/f_text_document" --tokenizer-type ByteLevelTokenizer --log-interval 1 \
    --metrics-file "$work/$name.jsonl" "$@" > "$work/$name.log" 2>&1 ||
    { cat "$work/$name.log" >&2; exit 1; }
}
run fp32 "" ; run bf16 "" --bf16 ; run fp16 "" --fp16 --initial-loss-scale 4096 ; run bf16_generic "TROUPE_CPU_FEATURES=generic" --bf16
python3 - "$work" <<'PY'
import json, sys, os
work = sys.argv[1]
rows = {}
for name in ["fp32", "bf16", "fp16", "bf16_generic"]:
    its = [json.loads(l) for l in open(os.path.join(work, name + ".jsonl")) if '"type":"train"' in l]
    its = [r for r in its if r["iteration"] >= 3]
    ms = sum(r["ms_per_iter"] for r in its) / len(its)
    tok = sum(r["tokens_per_sec"] for r in its) / len(its)
    skipped = sum(1 for r in its if r.get("skipped"))
    rows[name] = (ms, tok, its[-1]["lm_loss"], skipped)
print("| precision | ms / iteration | tokens/s | vs fp32 | loss at the last iteration | skipped steps |")
print("|---|---|---|---|---|---|")
for name, (ms, tok, loss, skipped) in rows.items():
    print(f"| {name} | {ms:.0f} | {tok:.0f} | {tok / rows['fp32'][1]:.2f}x | {loss:.4f} | {skipped} |")
PY
