#!/usr/bin/env bash
# Checkpoints across layouts, end to end: save on one layout, resume on another, and every resumed
# iteration's loss equals the uninterrupted 1x1x1 run's within 1e-5 (optimizer state included):
#   tp 2 x pp 2 x dp 2, ZeRO 3, one process      -> 1x1x1
#   1x1x1 (one shard of whole tensors)            -> tp 2 x dp 2, ZeRO 2
#   tp 2 x pp 2, ZeRO 1, 4 processes (launch)     -> pp 2 x dp 2, zb-h1, one process
# The same layout resumes bitwise, also after a SIGKILL in the middle of a save (the previous
# checkpoint loads, the partial one is ignored and reported). The sharded checkpoint is readable by ckpt info (with its layout), ckpt export and eval, and
# `ckpt convert` reshards it offline.
source "$(dirname "$0")/common.bash"
make_corpus

args=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 24 --micro-batch-size 2
      --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 2
      --train-iters 6 --weight-decay 0.1 --clip-grad 1.0 --data-path d_text_document
      --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --log-interval 1000)
tiny() { "$troupe" train "${args[@]}" --num-threads 1 "$@"; }

# compare REF OTHER: the iterations OTHER ran, within 1e-5 of REF
compare() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def read(path):
    return {j["iteration"]: j["lm_loss"] for j in map(json.loads, open(path)) if j.get("type") == "train"}
ref, got = read(sys.argv[1]), read(sys.argv[2])
assert got and set(got) <= set(ref), f"iterations {sorted(got)} not in the reference {sorted(ref)}"
for it in sorted(got):
    rel = abs(got[it] - ref[it]) / abs(ref[it])
    assert rel <= 1e-5, f"iteration {it}: loss {got[it]!r} vs uninterrupted {ref[it]!r} (relative {rel:.2e})"
print(f"{sys.argv[2]}: iterations {sorted(got)} within 1e-5 of the uninterrupted run")
PY
}

tiny --metrics-file ref.jsonl > ref.log 2>&1 || { cat ref.log; fail "the 1x1x1 run failed"; }

# 1. tp2 pp2 dp2 ZeRO-3 -> 1x1x1
tiny --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --data-parallel-size 2 --zero-stage 3 \
  --exit-interval 3 --save ck1 > s1.log 2>&1 || { cat s1.log; fail "saving on tp2 pp2 dp2 ZeRO-3 failed"; }
[[ -s ck1/iter_0000003/metadata.json && -s ck1/iter_0000003/shard_00007.h5 ]] || fail "no sharded checkpoint in ck1"
tiny --load ck1 --metrics-file r1.jsonl > r1.log 2>&1 || { cat r1.log; fail "resuming ck1 on 1x1x1 failed"; }
compare ref.jsonl r1.jsonl || fail "tp2 pp2 dp2 ZeRO-3 -> 1x1x1 differs from the uninterrupted run"
"$troupe" ckpt info ck1 > info.txt || fail "ckpt info on a sharded checkpoint failed"
grep -q '"tensor_model_parallel_size":2' info.txt || { cat info.txt; fail "ckpt info does not show the layout"; }
grep -q "model/transformer.wte.weight" info.txt || { cat info.txt; fail "ckpt info does not list the tensors"; }
"$troupe" ckpt export --load ck1 --format hf-h5 --output hf.h5 > /dev/null || fail "ckpt export from shards failed"
"$troupe" eval --load ck1 --data-path d_text_document --eval-samples 8 --json > eval.json || fail "eval of shards failed"

# the same layout resumes bitwise: ck1 on tp2 pp2 dp2 ZeRO-3 equals that layout's straight run exactly
par=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --data-parallel-size 2 --zero-stage 3)
tiny "${par[@]}" --metrics-file par.jsonl > par.log 2>&1 || { cat par.log; fail "the straight tp2 pp2 dp2 run failed"; }
tiny "${par[@]}" --load ck1 --metrics-file same.jsonl > same.log 2>&1 || { cat same.log; fail "same-layout resume failed"; }
python3 - <<'PY' || fail "resuming on the same layout is not bitwise"
import json
def read(p):
    return {j["iteration"]: (j["lm_loss"], j["grad_norm"]) for j in map(json.loads, open(p)) if j.get("type") == "train"}
ref, got = read("par.jsonl"), read("same.jsonl")
assert sorted(got) == [4, 5, 6], sorted(got)
for it in got:
    assert got[it] == ref[it], f"iteration {it}: {got[it]} vs straight {ref[it]}"
print("same-layout resume: iterations 4-6 bitwise equal to the straight run")
PY

# SIGKILL in the middle of a save: the previous checkpoint stays the latest and loads; the partial one
# is ignored and reported; the resumed run is bitwise the straight one
if TROUPE_FAULT_KILL_AFTER_SHARD=4 tiny "${par[@]}" --save ck4 --save-interval 2 > kill.log 2>&1; then
  fail "the run with TROUPE_FAULT_KILL_AFTER_SHARD=4 was not killed"
fi
grep -q "killing this process during the save" kill.log || { cat kill.log; fail "the fault was not injected"; }
[[ $(tr -d '[:space:]' < ck4/latest_checkpointed_iteration.txt) == 2 ]] || fail "the latest pointer moved to the partial save"
[[ -d ck4/iter_0000004 && ! -e ck4/iter_0000004/metadata.json ]] || fail "expected a partial iter_0000004 without metadata"
tiny "${par[@]}" --load ck4 --metrics-file killed.jsonl > killed.log 2>&1 || { cat killed.log; fail "resuming after the kill failed"; }
grep -q "ignored .*iter_0000004: an unfinished save" killed.log || { cat killed.log; fail "the partial save was not reported"; }
python3 - <<'PY' || fail "the run resumed after the kill is not bitwise the straight run"
import json
def read(p):
    return {j["iteration"]: (j["lm_loss"], j["grad_norm"]) for j in map(json.loads, open(p)) if j.get("type") == "train"}
ref, got = read("par.jsonl"), read("killed.jsonl")
assert sorted(got) == [3, 4, 5, 6], sorted(got)
for it in got:
    assert got[it] == ref[it], f"iteration {it}: {got[it]} vs straight {ref[it]}"
print("after a SIGKILL during the save of iteration 4: resumed from 2, iterations 3-6 bitwise")
PY

# damaged checkpoints are clear errors naming the file, never a crash or silently wrong weights
cp -r ck1 ckmiss && rm ckmiss/iter_0000003/shard_00005.h5
if tiny --load ckmiss > miss.log 2>&1; then fail "a checkpoint with a missing shard loaded"; fi
grep -q "missing its shard .*shard_00005.h5" miss.log || { cat miss.log; fail "the missing shard is not named"; }
cp -r ck1 cktrunc && truncate -s 2000 cktrunc/iter_0000003/shard_00002.h5
if tiny --load cktrunc > trunc.log 2>&1; then fail "a checkpoint with a truncated shard loaded"; fi
grep -q "shard_00002.h5" trunc.log || { cat trunc.log; fail "the truncated shard is not named"; }
cp -r ck1 ckflip
python3 - ckflip/iter_0000003/shard_00000.h5 <<'PY'
import sys
# Flip one bit in the middle of the largest run of float data: the end of the file holds the last
# datasets' values (HDF5 writes metadata first), so flip a byte well inside the file's second half.
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) * 3 // 4] ^= 0x08
open(path, "wb").write(bytes(data))
PY
if tiny --load ckflip > flip.log 2>&1; then fail "a checkpoint with a flipped bit loaded"; fi
grep -q "shard_00000.h5" flip.log || { cat flip.log; fail "the damaged shard is not named"; }

# offline resharding: ck1 -> tp 4 shards, resumed on tp 4; a target that does not fit is refused
"$troupe" ckpt convert --load ck1 --save ck1c --target-tensor-parallel-size 4 > conv.log 2>&1 \
  || { cat conv.log; fail "ckpt convert to tp 4 failed"; }
[[ -s ck1c/iter_0000003/shard_00003.h5 && -s ck1c/latest_checkpointed_iteration.txt ]] || fail "ckpt convert wrote no tp-4 shards"
tiny --load ck1c --tensor-model-parallel-size 4 --metrics-file r1c.jsonl > r1c.log 2>&1 \
  || { cat r1c.log; fail "resuming the converted checkpoint on tp 4 failed"; }
compare ref.jsonl r1c.jsonl || fail "converted tp-4 checkpoint differs from the uninterrupted run"
if "$troupe" ckpt convert --load ck1 --save bad --target-tensor-parallel-size 3 > bad.log 2>&1; then
  fail "a tensor-parallel size that does not divide the heads was accepted"
fi
grep -q "does not divide the 4 attention heads" bad.log || { cat bad.log; fail "the refusal does not say why"; }

# 2. a one-shard checkpoint (1x1x1: whole tensors) -> tp2 dp2 ZeRO-2
tiny --exit-interval 3 --save ck2 > s2.log 2>&1 || { cat s2.log; fail "saving on 1x1x1 failed"; }
[[ -s ck2/iter_0000003/shard_00000.h5 && -s ck2/iter_0000003/metadata.json ]] || fail "the 1x1x1 run did not write its shard and metadata"
tiny --load ck2 --tensor-model-parallel-size 2 --data-parallel-size 2 --zero-stage 2 --metrics-file r2.jsonl \
  > r2.log 2>&1 || { cat r2.log; fail "resuming ck2 on tp2 dp2 ZeRO-2 failed"; }
compare ref.jsonl r2.jsonl || fail "1x1x1 -> tp2 dp2 ZeRO-2 differs from the uninterrupted run"

# 3. 4 processes, tp2 pp2 ZeRO-1 -> one process, pp2 dp2 zb-h1
"$troupe" launch --nproc-per-node 4 -- train "${args[@]}" --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 2 --zero-stage 1 --exit-interval 3 --save ck3 > s3.log 2>&1 \
  || { cat s3.log; fail "saving under troupe launch failed"; }
[[ -s ck3/iter_0000003/metadata.json ]] || { cat s3.log; fail "no metadata after the 4-process save"; }
tiny --load ck3 --pipeline-model-parallel-size 2 --data-parallel-size 2 --pipeline-schedule zb-h1 \
  --metrics-file r3.jsonl > r3.log 2>&1 || { cat r3.log; fail "resuming ck3 on pp2 dp2 failed"; }
compare ref.jsonl r3.jsonl || fail "4-process tp2 pp2 -> pp2 dp2 differs from the uninterrupted run"
echo PASS
