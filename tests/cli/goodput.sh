#!/usr/bin/env bash
# Goodput (docs/RESILIENCE.md, "Goodput"): the run's summary line and the metrics file's last line
# split the wall time into the productive steps and the time lost by cause. A job whose rank throws at
# iteration 17 and restarts from its save of iteration 10 (--max-restarts 1) loses iterations 11-16
# (6 computed again) to failures; a pipeline of 2 stages loses time to its bubble, one stage none; the
# parts add up to the wall time.
source "$(dirname "$0")/common.bash"
make_corpus
check_goodput() {  # METRICS_FILE PYTHON_CONDITION...: the goodput line, parts summing to the wall
  python3 - "$@" <<'PY'
import json, sys
g = [json.loads(l) for l in open(sys.argv[1]) if '"goodput"' in l][-1]
parts = g["productive_seconds"] + sum(g["lost_seconds"].values())
assert abs(parts - g["wall_seconds"]) < 1e-6 * max(1, g["wall_seconds"]), g
assert 0 < g["goodput"] <= 1 and abs(g["goodput"] - g["productive_seconds"] / g["wall_seconds"]) < 1e-9, g
assert set(g["lost_seconds"]) == {"startup", "failures", "recovery", "saves", "evaluation", "stragglers",
                                  "pipeline bubble", "other"}, g
lost = g["lost_seconds"]
for cond in sys.argv[2:]:
    assert eval(cond), (cond, g)
print(f"{sys.argv[1]}: goodput {g['goodput']:.3f} of {g['wall_seconds']:.2f} s, lost {lost}, iterations lost {g['iterations_lost']}")
PY
}

TROUPE_FAULT_THROW=rank0@17 small_train --train-iters 30 --save ck --save-interval 10 --max-restarts 1 \
  --metrics-file restart.jsonl > restart.log 2>&1 || { cat restart.log; fail "the restarted job failed"; }
grep -q "restart 1 of 1: every actor anew, from ck/iter_0000010" restart.log || { cat restart.log; fail "no restart from iteration 10"; }
grep -q "goodput .* failures.*(6 iteration(s) computed again after failures)" restart.log ||
  { cat restart.log; fail "the summary does not give the failure's loss"; }
# The lifecycle (engine/lifecycle.hpp) in the metrics file: the failed attempt recovered, the second
# finished.
python3 - restart.jsonl <<'PY' || fail "the restarted job's phases"
import json, sys
p = [json.loads(l) for l in open(sys.argv[1]) if '"type": "phase"' in l or '"type":"phase"' in l]
seq = [x["phase"] for x in p]
want = ["starting", "training", "recovering", "starting", "training", "stopping", "finished"]
assert seq == want, seq
assert [x["attempt"] for x in p] == [1, 1, 1, 2, 2, 2, 2], p
assert "rank0" in p[2]["why"] or "rank 0" in p[2]["why"], p[2]
print("phases:", " -> ".join(["resolving"] + seq))
PY
check_goodput restart.jsonl 'g["iterations_lost"] == 6' 'lost["failures"] > 0' 'lost["saves"] > 0' \
  'lost["pipeline bubble"] == 0' || fail "the restarted job's goodput"

small_train --train-iters 20 --pipeline-model-parallel-size 2 --num-threads 2 --eval-interval 10 --eval-iters 2 \
  --metrics-file pp2.jsonl > pp2.log 2>&1 || { cat pp2.log; fail "the pipelined job failed"; }
check_goodput pp2.jsonl 'lost["pipeline bubble"] > 0' 'lost["evaluation"] > 0' 'g["iterations_lost"] == 0' \
  'lost["failures"] == 0 and lost["recovery"] == 0' || fail "the pipelined job's goodput"
grep -q "goodput .*pipeline bubble" pp2.log || { cat pp2.log; fail "the summary does not give the bubble"; }
echo PASS
