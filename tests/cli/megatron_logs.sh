#!/usr/bin/env bash
# Megatron's log lines (issue 13): the line every --log-interval iterations prints the averages over
# those iterations (lm loss over the iterations, elapsed time per iteration), Megatron's fields
# (global batch size, loss scale, skipped and nan iteration counts); validation prints "lm loss
# value" and "lm loss PPL"; the timers come as Megatron's "(min, max) time across ranks (ms):" block
# by --timing-log-level (and all of them with DeepSpeed's wall_clock_breakdown), per rank with
# --timing-log-option all; --timeline writes a trace on one rank and on tp 3 x pp 2.
source "$(dirname "$0")/common.bash"
make_corpus

small_train --train-iters 9 --log-interval 3 --eval-interval 9 --eval-iters 2 --metrics-file m.jsonl \
  --timing-log-level 1 --timeline one.json > log.txt 2>&1 || { cat log.txt; fail "the run failed"; }
python3 - m.jsonl log.txt <<'PY' || { cat log.txt; fail "the log lines are not Megatron's"; }
import json, math, re, sys
rows = [j for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "train"]
evals = [j for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "eval"]
text = open(sys.argv[2]).read()
lines = re.findall(r"^ iteration +(\d+)/ +9 \|.*$", text, re.M)
printed = re.findall(r"^ iteration +(\d+)/ +9 \| consumed samples: +(\d+) \| elapsed time per iteration \(ms\): ([0-9.]+) "
                     r"\| learning rate: ([0-9.E+-]+) \| global batch size: +(\d+) \| lm loss: ([0-9.E+-]+) \| "
                     r"loss scale: 1\.0 \| grad norm: ([0-9.]+) \| number of skipped iterations: +0 \| "
                     r"number of nan iterations: +0 \|", text, re.M)
assert [int(p[0]) for p in printed] == [3, 6, 9], (lines, printed)
for it, consumed, ms, lr, batch, loss, gn in printed:
    it = int(it)
    window = [j for j in rows if it - 3 < j["iteration"] <= it]
    mean = sum(j["lm_loss"] for j in window) / 3
    assert abs(float(loss) - mean) <= 5e-7 * mean, (it, loss, mean)          # the interval's mean, 7 digits
    last = window[-1]
    assert int(consumed) == last["consumed_samples"] and int(batch) == last["global_batch_size"] == 6
    assert abs(float(lr) - last["lr"]) <= 5e-7 * last["lr"] and abs(float(gn) - last["grad_norm"]) <= 1e-3
    want_ms = sum(j["ms_per_iter"] for j in window) / 3
    assert abs(float(ms) - want_ms) <= 0.051 + 1e-3 * want_ms, (ms, want_ms)
# Validation: Megatron's "lm loss value" and "lm loss PPL".
v = re.search(r"validation loss at iteration 9 \| lm loss value: ([0-9.E+-]+) \| lm loss PPL: ([0-9.E+-]+) \|", text)
assert v and evals, text
assert abs(float(v.group(1)) - evals[-1]["validation_loss"]) <= 5e-7 * evals[-1]["validation_loss"]
assert abs(float(v.group(2)) - math.exp(evals[-1]["validation_loss"])) <= 1e-5 * float(v.group(2))
# Timers at level 1: the block after each log line, its names and (min, max).
blocks = re.findall(r"^\(min, max\) time across ranks \(ms\):\n((?:    .*\n)+)", text, re.M)
assert len(blocks) == 3, blocks
names = re.findall(r"^    ([a-z-]+) \.+: \(([0-9.]+), ([0-9.]+)\)$", blocks[0], re.M)
assert [n for n, _, _ in names] == ["forward-backward", "forward-compute", "backward-compute", "all-grads-sync",
                                    "params-all-gather", "optimizer"], names
assert all(float(a) <= float(b) for _, a, b in names)
fb = {n: float(b) for n, _, b in names}
assert fb["forward-compute"] + fb["backward-compute"] <= fb["forward-backward"] * 1.05 + 0.05, fb
assert "timers_ms" in rows[0] and set(rows[0]["timers_ms"]) == {n for n, _, _ in names}
print("ok: interval means, Megatron's fields, 'lm loss value', level-1 timers")
PY
python3 -c "import json; d = json.load(open('one.json')); assert d['traceEvents']" || fail "--timeline wrote no trace on one rank"

# DeepSpeed's wall_clock_breakdown: every timer, also the pipeline waits; per rank with "all".
cat > ds.json <<'JSON'
{"train_micro_batch_size_per_gpu": 3, "wall_clock_breakdown": true}
JSON
small_train --train-iters 4 --log-interval 2 --deepspeed-config ds.json --pipeline-model-parallel-size 2 \
  --tensor-model-parallel-size 3 --timing-log-option all --timeline par.json > ds.txt 2>&1 || { cat ds.txt; fail "the wall_clock_breakdown run failed"; }
grep -q "^times across ranks (ms):" ds.txt && grep -q "^  rank  5:" ds.txt && grep -q "forward-recv \.*:" ds.txt &&
  grep -q "backward-recv \.*:" ds.txt || { cat ds.txt; fail "wall_clock_breakdown did not print every timer of every rank"; }
python3 -c "import json; d = json.load(open('par.json')); assert {e.get('pid') for e in d['traceEvents'] if e.get('ph') == 'X'}" ||
  fail "--timeline wrote no trace on tp 3 x pp 2"
echo "PASS: Megatron's log lines, timers and --timeline"
