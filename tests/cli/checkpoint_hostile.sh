#!/usr/bin/env bash
# Hostile checkpoints against every command that reads them (issue 10, item 4): eval, train --load,
# ckpt info, ckpt convert and ckpt export each end with a message naming the file and exit code 2
# (bad input), never a signal, never more than a small resident memory, and write nothing:
# - a flipped byte in optimizer/exp_avg of a tensor 2 x data 2 ZeRO-1 shard (eval used to load it:
#   it reads no moments, but every reader now checks the whole file's checksum first);
# - a flipped byte in a shard's HDF5 metadata, a truncated shard, a shard swapped in from another save;
# - a version-2 checkpoint (written before format version 3, rebuilt from fuzz/corpus) with inputs
#   that crashed or hung libhdf5 when troupe still parsed shards with it (fuzz/regressions);
# - metadata.json with 1e400, a shard named "../x", and garbage.
# The intact version-2 checkpoint still evaluates and resumes.
source "$(dirname "$0")/common.bash"
make_corpus
fuzz=$src_dir/fuzz

tiny=(--num-layers 1 --hidden-size 8 --num-attention-heads 2 --seq-length 8 --micro-batch-size 2
      --global-batch-size 4 --lr 3e-3 --lr-decay-style constant --data-path d_text_document
      --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --log-interval 1000)
par=(--tensor-model-parallel-size 2 --data-parallel-size 2 --zero-stage 1)
"$troupe" train "${tiny[@]}" "${par[@]}" --train-iters 2 --save good > /dev/null || fail "the tp2 x dp2 run failed"
"$troupe" train "${tiny[@]}" --train-iters 3 --save other > /dev/null || fail "the other run failed"

peak_kb() { [[ -x /usr/bin/time ]] && /usr/bin/time -f %M -o rss.txt "$@" || "$@"; }

# every_reader_refuses CKPT TEXT: each command exits 2 naming TEXT, in bounded memory, writing nothing.
every_reader_refuses() {
  local ck=$1 want=$2 rc
  local cmds=("eval --load $ck --data-path d_text_document --eval-samples 4"
              "train ${tiny[*]} ${par[*]} --train-iters 4 --load $ck --save out"
              "ckpt info $ck"
              "ckpt convert --load $ck --save out --target-tensor-parallel-size 1"
              "ckpt export --load $ck --format hf-h5 --output out.h5")
  for c in "${cmds[@]}"; do
    rm -rf out out.h5 rss.txt
    set +e
    # shellcheck disable=SC2086
    peak_kb timeout 120 "$troupe" $c > stdout.txt 2> stderr.txt
    rc=$?
    set -e
    [[ $rc -eq 2 ]] || { cat stderr.txt >&2; fail "exit $rc (wanted 2) from: troupe $c"; }
    grep -qF -- "$want" stderr.txt || { cat stderr.txt >&2; fail "stderr does not name '$want': troupe $c"; }
    grep -q "error" stderr.txt || fail "no error line: troupe $c"
    [[ ! -e out && ! -e out.h5 && ! -e out.h5.tmp ]] || fail "output written despite the error: troupe $c"
    if [[ -s rss.txt ]] && (($(tail -1 rss.txt) > 300000)); then fail "troupe $c used $(tail -1 rss.txt) KB"; fi
  done
  echo "ok: every reader refuses $ck ($want)"
}

# 1. The issue's case: a flipped byte in exp_avg of transformer.wte.weight (rank 2 holds a ZeRO range).
cp -r good flip
python3 - flip/iter_0000002/shard_00002.h5 <<'PY'
import sys
path = sys.argv[1]
raw = bytearray(open(path, "rb").read())
# The moments' values follow the HDF5 metadata; flip a byte in the second half of the file.
at = len(raw) * 3 // 4
raw[at] ^= 0x40
open(path, "wb").write(raw)
PY
every_reader_refuses flip "flip/iter_0000002/shard_00002.h5"

# 2. A flipped byte in the HDF5 metadata (the first object headers), a truncated shard, a shard of
#    another save.
cp -r good meta_flip
python3 -c "
import sys; p='meta_flip/iter_0000002/shard_00001.h5'; b=bytearray(open(p,'rb').read()); b[700]^=0x01; open(p,'wb').write(b)"
every_reader_refuses meta_flip "meta_flip/iter_0000002/shard_00001.h5"
cp -r good cut && truncate -s 3000 cut/iter_0000002/shard_00003.h5
every_reader_refuses cut "cut/iter_0000002/shard_00003.h5"
cp -r good swapped && cp other/iter_0000003/shard_00000.h5 swapped/iter_0000002/shard_00000.h5
every_reader_refuses swapped "does not match metadata.json"

# 3. Version 2, rebuilt from the fuzz seeds: intact, it evaluates and resumes; with the inputs that
#    crashed libhdf5 (H5HG_read, free(), a hang) in place of a shard, every reader refuses it.
mkdir -p v2/iter_0000002
python3 - "$fuzz/corpus/checkpoint_shard_set/v2_tp2_dp2_zero1.bin" v2/iter_0000002 <<'PY'
import struct, sys
raw, at, i = open(sys.argv[1], "rb").read(), 0, 0
while at < len(raw):
    (n,) = struct.unpack_from("<I", raw, at)
    open(f"{sys.argv[2]}/shard_{i:05d}.h5", "wb").write(raw[at + 4:at + 4 + n])
    at, i = at + 4 + n, i + 1
PY
cp "$fuzz/corpus/checkpoint_metadata/v2_tp2_dp2_zero1.json" v2/iter_0000002/metadata.json
echo 2 > v2/latest_checkpointed_iteration.txt
"$troupe" eval --load v2 --data-path d_text_document --eval-samples 4 > /dev/null || fail "the version-2 checkpoint does not evaluate"
"$troupe" train "${tiny[@]}" --train-iters 3 --load v2 > /dev/null || fail "the version-2 checkpoint does not resume"
for bad in "$fuzz"/regressions/checkpoint_shard/v2_rank[13]_libhdf5_*.h5; do
  rank=$(basename "$bad" | sed 's/v2_rank\([0-9]\).*/\1/')
  rm -rf v2bad && cp -r v2 v2bad && cp "$bad" "v2bad/iter_0000002/shard_0000$rank.h5"
  every_reader_refuses v2bad "v2bad/iter_0000002/shard_0000$rank.h5"
done

# 4. metadata.json: a number beyond a double, a shard outside the folder, garbage.
for case in e400 path garbage; do
  rm -rf m_$case && cp -r good m_$case
  python3 - "m_$case/iter_0000002/metadata.json" "$case" <<'PY'
import sys
path, case = sys.argv[1], sys.argv[2]
text = open(path).read()
if case == "e400":
    text = text.replace('"consumed_samples": 8', '"consumed_samples": 1e400')
elif case == "path":
    text = text.replace('"shard_00001.h5"', '"../../shard_00001.h5"')
else:
    text = text[: len(text) // 2] + "\x00\xff{{{"
open(path, "w", errors="surrogateescape").write(text)
PY
  every_reader_refuses m_$case "m_$case/iter_0000002/metadata.json"
done
echo PASS
