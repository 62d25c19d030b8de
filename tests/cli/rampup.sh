#!/usr/bin/env bash
# Megatron's --rampup-batch-size, end to end: every iteration's global batch, consumed samples and
# learning rate against a transcription of Megatron's RampupBatchsizeNumMicroBatchesCalculator,
# update_train_iters and OptimizerParamScheduler (cosine, warm-up in samples); the same run on
# tp 2 x pp 2 x dp 2 (ZeRO 1, dropout on) within 1e-5 of the 1x1x1 losses; a resume in the middle of
# the ramp continues it exactly; the rules Megatron asserts are refused by name (all but the
# iteration-based ramp-up its own 175B example asks for: tests/cli/megatron_scripts.sh runs it).
source "$(dirname "$0")/common.bash"
make_corpus

ramp() {
  "$troupe" train --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 24 \
    --micro-batch-size 1 --global-batch-size 12 --rampup-batch-size 2 2 30 --train-samples 100 \
    --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-samples 9 --weight-decay 0.1 \
    --clip-grad 1.0 --data-path d_text_document --tokenizer-type ByteLevelTokenizer --eval-interval 1000 \
    --log-interval 1000 --num-threads 1 "$@"
}

ramp --metrics-file one.jsonl > one.log 2>&1 || { tail one.log; fail "the ramp-up run failed"; }
python3 - one.jsonl <<'PY' || fail "the ramp-up is not Megatron's"
import json, math, sys
rows = [j for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "train"]
# Megatron's calculator (megatron/core/num_microbatches_calculator.py), transcribed.
start, inc, ramp_samples, gbs, train_samples = 2, 2, 30, 12, 100
per_increment = ramp_samples / ((gbs - start) // inc)
def batch(consumed):
    if consumed > ramp_samples:
        return gbs
    return start + int(consumed / per_increment) * inc
# update_train_iters
iterations, consumed = 0, 0
while consumed <= ramp_samples:
    consumed += batch(consumed)
    iterations += 1
iterations += (train_samples - consumed) // gbs
assert len(rows) == iterations, (len(rows), iterations)
# OptimizerParamScheduler: num_steps += batch after each step; lr(num_steps) before it.
lr, min_lr, warmup, decay = 3e-3, 3e-4, 9, 100
def rate(n):
    if n <= warmup:
        return lr * n / warmup
    if n > decay:
        return min_lr
    r = (n - warmup) / (decay - warmup)
    return min_lr + 0.5 * (math.cos(math.pi * r) + 1.0) * (lr - min_lr)
consumed, sizes = 0, []
for j in rows:
    b = batch(consumed)
    sizes.append(b)
    assert j["global_batch_size"] == b, (j["iteration"], j["global_batch_size"], b)
    assert abs(j["lr"] - rate(consumed)) <= 1e-15 + 1e-12 * rate(consumed), (j["iteration"], j["lr"], rate(consumed))
    consumed += b
    assert j["consumed_samples"] == consumed, (j["iteration"], j["consumed_samples"], consumed)
assert len(set(sizes)) >= 4, sizes
print(f"ok: {len(rows)} iterations, batches {sizes}, as Megatron's calculator and scheduler")
PY

ramp --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --data-parallel-size 2 --zero-stage 1 \
  --metrics-file par.jsonl > par.log 2>&1 || { tail par.log; fail "the ramp-up run on tp 2 x pp 2 x dp 2 failed"; }
python3 - one.jsonl par.jsonl <<'PY' || fail "tp 2 x pp 2 x dp 2 ramps up differently"
import json, sys
read = lambda p: [j for j in map(json.loads, open(p)) if j.get("type") == "train"]
a, b = read(sys.argv[1]), read(sys.argv[2])
assert len(a) == len(b)
for x, y in zip(a, b):
    assert x["global_batch_size"] == y["global_batch_size"] and x["lr"] == y["lr"], (x, y)
    rel = abs(x["lm_loss"] - y["lm_loss"]) / abs(x["lm_loss"])
    assert rel <= 1e-5, (x["iteration"], x["lm_loss"], y["lm_loss"], rel)
print(f"ok: tp 2 x pp 2 x dp 2 within 1e-5 of the 1x1x1 losses over {len(a)} iterations of the ramp")
PY

# Interleaved (pp 2, two chunks a stage) with steps of 3 and 9 micro-batches, partial rounds that hold
# more activations in a chunk than the job's 12 (the engine gives each chunk what the ramp's tables
# hold: sched::engine_slots): the 1x1x1 losses within 1e-5.
odd_ramp() {
  "$troupe" train --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 24 \
    --micro-batch-size 1 --global-batch-size 12 --rampup-batch-size 3 3 30 --train-samples 60 \
    --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-samples 9 --weight-decay 0.1 \
    --data-path d_text_document --tokenizer-type ByteLevelTokenizer --eval-interval 1000 \
    --log-interval 1000 --num-threads 1 "$@"
}
odd_ramp --metrics-file odd1.jsonl > odd1.log 2>&1 || { tail odd1.log; fail "the 3-step ramp-up failed"; }
odd_ramp --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --metrics-file odd2.jsonl \
  > odd2.log 2>&1 || { tail odd2.log; fail "the interleaved ramp-up failed"; }
python3 - odd1.jsonl odd2.jsonl <<'PY' || fail "interleaved ramps up differently"
import json, sys
read = lambda p: [j for j in map(json.loads, open(p)) if j.get("type") == "train"]
a, b = read(sys.argv[1]), read(sys.argv[2])
assert len(a) == len(b) and {3, 9} <= {j["global_batch_size"] for j in a}, [j["global_batch_size"] for j in a]
for x, y in zip(a, b):
    assert x["global_batch_size"] == y["global_batch_size"], (x, y)
    rel = abs(x["lm_loss"] - y["lm_loss"]) / abs(x["lm_loss"])
    assert rel <= 1e-5, (x["iteration"], x["lm_loss"], y["lm_loss"], rel)
print(f"ok: interleaved within 1e-5 of the 1x1x1 losses through batches of 3 and 9")
PY

# Stopped in the middle of the ramp (iteration 6) and resumed: the same batches, rates and losses.
ramp --exit-interval 6 --save ck --metrics-file first.jsonl > first.log 2>&1 || { tail first.log; fail "the first half failed"; }
ramp --load ck --save ck --metrics-file first.jsonl > second.log 2>&1 || { tail second.log; fail "the resume failed"; }
python3 - one.jsonl first.jsonl <<'PY' || fail "the resumed ramp-up differs"
import json, sys
read = lambda p: [j for j in map(json.loads, open(p)) if j.get("type") == "train"]
a, b = read(sys.argv[1]), read(sys.argv[2])
assert [j["iteration"] for j in b] == [j["iteration"] for j in a], [j["iteration"] for j in b]
for x, y in zip(a, b):
    for k in ("global_batch_size", "lr", "lm_loss", "consumed_samples"):
        assert x[k] == y[k], (x["iteration"], k, x[k], y[k])
print("ok: a resume in the middle of the ramp continues it bit for bit")
PY

# Megatron's rules, each refused with the flag named.
for bad in "--micro-batch-size 2 --rampup-batch-size 3 3 30|multiples" \
           "--rampup-batch-size 2 4 30|does not reach" "--rampup-batch-size 0 2 30|must be positive"; do
  flags=${bad%%|*} want=${bad#*|}
  set +e
  # shellcheck disable=SC2086
  ramp $flags > bad.log 2>&1
  rc=$?
  set -e
  [[ $rc == 2 ]] || { cat bad.log; fail "$flags: exit $rc, not 2"; }
  grep -q -- "--rampup-batch-size" bad.log && grep -q "$want" bad.log || { cat bad.log; fail "$flags: not named"; }
done
echo "ok: the ramp-up's rules are refused by name"
echo "PASS: --rampup-batch-size ramps up as Megatron does, on every layout, across a resume"
