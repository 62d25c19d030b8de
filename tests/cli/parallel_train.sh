#!/usr/bin/env bash
# Parallel layouts through the CLI, end to end: in one process (tp 2 x pp 2 x dp 2 with ZeRO 3 and a
# timeline) and across processes with troupe launch (2 ranks: pp 2; 4 ranks: tp 2 x pp 2 with ZeRO 1;
# 4 ranks: pp 2 with dp 2 derived from the ranks and ZeRO 3), each against the 1x1x1 run on the same data: the loss of every
# iteration within 1e-5 relative. A layout that does not fit the ranks started is refused by name.
source "$(dirname "$0")/common.bash"
make_corpus

tiny() {
  "$troupe" train --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 24 \
    --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine \
    --lr-warmup-iters 2 --train-iters 6 --weight-decay 0.1 --clip-grad 1.0 --data-path d_text_document \
    --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --log-interval 1000 --num-threads 1 "$@"
}

# compare REF OTHER: every iteration's lm_loss within 1e-5 relative
compare() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def read(path):
    return {j["iteration"]: j["lm_loss"] for j in map(json.loads, open(path)) if j.get("type") == "train"}
ref, got = read(sys.argv[1]), read(sys.argv[2])
assert ref and sorted(ref) == sorted(got), f"iterations differ: {sorted(ref)} vs {sorted(got)}"
for it in sorted(ref):
    rel = abs(got[it] - ref[it]) / abs(ref[it])
    assert rel <= 1e-5, f"iteration {it}: loss {got[it]!r} vs 1x1x1 {ref[it]!r} (relative {rel:.2e})"
print(f"{sys.argv[2]}: {len(ref)} iterations within 1e-5 of the 1x1x1 losses")
PY
}

tiny --metrics-file ref.jsonl > ref.log 2>&1 || { cat ref.log; fail "the 1x1x1 run failed"; }

tiny --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --data-parallel-size 2 --zero-stage 3 \
  --timeline trace.json --metrics-file inproc.jsonl > inproc.log 2>&1 || { cat inproc.log; fail "tp2 pp2 dp2 ZeRO-3 in one process failed"; }
grep -q "parallel layout: tp=2 .*dp=2 pp=2" inproc.log || { cat inproc.log; fail "the layout line is missing"; }
compare ref.jsonl inproc.jsonl || fail "tp2 pp2 dp2 ZeRO-3 in one process differs from 1x1x1"
python3 - <<'PY' || fail "trace.json is not a Chrome trace with spans of all 8 ranks"
import json
ev = json.load(open("trace.json"))["traceEvents"]
tids = {e["tid"] for e in ev if e["ph"] == "X"}
cats = {e["cat"] for e in ev if e["ph"] == "X"}
assert tids == set(range(8)), tids
assert {"forward", "backward", "optimizer"} <= cats, cats
PY

run_launch() {
  local n="$1"; shift
  "$troupe" launch --nproc-per-node "$n" -- train --num-layers 4 --hidden-size 32 --num-attention-heads 4 \
    --seq-length 24 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 \
    --lr-decay-style cosine --lr-warmup-iters 2 --train-iters 6 --weight-decay 0.1 --clip-grad 1.0 \
    --data-path d_text_document --tokenizer-type ByteLevelTokenizer --eval-interval 1000 \
    --log-interval 1000 "$@"
}
run_launch 2 --pipeline-model-parallel-size 2 --pipeline-schedule zb-h1 --metrics-file p2.jsonl > p2.log 2>&1 \
  || { cat p2.log; fail "2 processes, pp 2 failed"; }
compare ref.jsonl p2.jsonl || fail "2 processes (pp 2, zb-h1) differ from 1x1x1"
run_launch 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --zero-stage 1 --sequence-parallel \
  --metrics-file p4.jsonl > p4.log 2>&1 || { cat p4.log; fail "4 processes, tp 2 x pp 2 failed"; }
compare ref.jsonl p4.jsonl || fail "4 processes (tp 2, pp 2, ZeRO 1, sequence parallel) differ from 1x1x1"
[[ $(grep -c "troupe train: finished" p4.log) -eq 1 ]] || { cat p4.log; fail "only rank 0 should report"; }
# dp derived from the ranks: 4 processes, pp 2 -> dp 2, ZeRO 3 gathering over processes
run_launch 4 --pipeline-model-parallel-size 2 --zero-stage 3 --metrics-file d2.jsonl > d2.log 2>&1 \
  || { cat d2.log; fail "4 processes, pp 2, derived dp 2, ZeRO 3 failed"; }
grep -q "dp=2 pp=2" d2.log || { cat d2.log; fail "dp was not derived from the 4 ranks"; }
compare ref.jsonl d2.jsonl || fail "4 processes (pp 2, dp 2 derived, ZeRO 3) differ from 1x1x1"

# 4 ranks cannot hold tp 2 x pp 2 x dp 2.
if run_launch 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --data-parallel-size 2 > bad.log 2>&1; then
  fail "tp2 x pp2 x dp2 on 4 ranks was accepted"
fi
grep -q "= 8 ranks, but troupe launch started 4" bad.log || { cat bad.log; fail "the refusal does not name the sizes and the ranks"; }
echo PASS
