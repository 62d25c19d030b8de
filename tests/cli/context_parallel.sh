#!/usr/bin/env bash
# Context parallelism through the CLI, end to end (docs/PARALLEL.md, "Long sequences"): a GPT-2 and a
# LLaMA-style model (rotary, grouped-query attention, SwiGLU, RMSNorm) trained with
# --context-parallel-size 2 and 4 -- in one process with tensor, pipeline and data parallelism and
# ZeRO beside it, and cp 2 over two processes (troupe launch: the key/value blocks travel over UCX),
# the ring and the all-gather exchange -- every iteration's loss within 1e-5 of the 1x1x1 run; the
# ring's transfers on both ranks' timelines, inside the forward and backward spans that issued them;
# MoE layers with cp and expert parallelism, and with Ulysses; a checkpoint saved at cp 4 resumes at
# cp 1 with the straight run's losses; bad input refused with
# every problem at once, exit 2.
source "$(dirname "$0")/common.bash"
make_corpus

common=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 48 --micro-batch-size 2
        --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 2
        --weight-decay 0.1 --clip-grad 1.0 --data-path d_text_document --tokenizer-type ByteLevelTokenizer
        --eval-interval 1000 --log-interval 1000 --num-threads 1)
llama=(--normalization RMSNorm --swiglu --position-embedding-type rope --group-query-attention
       --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear)

compare() {
  python3 - "$@" <<'PY'
import json, sys
def read(path):
    return {j["iteration"]: j["lm_loss"] for j in map(json.loads, open(path)) if j.get("type") == "train"}
ref, got = read(sys.argv[1]), read(sys.argv[2])
its = sorted(got)
assert its and set(its) <= set(ref), f"iterations differ: {sorted(ref)} vs {its}"
for it in its:
    rel = abs(got[it] - ref[it]) / abs(ref[it])
    assert rel <= 1e-5, f"iteration {it}: loss {got[it]!r} vs 1x1x1 {ref[it]!r} (relative {rel:.2e})"
print(f"{sys.argv[2]}: {len(its)} iterations within 1e-5 of the 1x1x1 losses")
PY
}

run() {  # name, flags...: trains 6 iterations into name.jsonl
  local name=$1
  shift
  "$troupe" train "${common[@]}" --train-iters 6 "$@" --metrics-file "$name.jsonl" > "$name.log" 2>&1 \
    || { cat "$name.log"; fail "$name failed"; }
}

run gpt-ref
run gpt-cp2 --context-parallel-size 2
grep -q "cp 2 (24 tokens of each sequence per rank, p2p ring)" gpt-cp2.log \
  || { cat gpt-cp2.log; fail "the start-up lines do not show the context-parallel layout"; }
compare gpt-ref.jsonl gpt-cp2.jsonl || fail "cp 2 differs from 1x1x1"
run gpt-cp4 --context-parallel-size 4 --tensor-model-parallel-size 2 --sequence-parallel --zero-stage 1 \
  --recompute-granularity selective
compare gpt-ref.jsonl gpt-cp4.jsonl || fail "cp 4 x tp 2 with sp, ZeRO 1 differs from 1x1x1"
run gpt-cp2pp --context-parallel-size 2 --pipeline-model-parallel-size 2 --data-parallel-size 2 --zero-stage 3 \
  --cp-comm-type all_gather
compare gpt-ref.jsonl gpt-cp2pp.jsonl || fail "cp 2 all_gather x pp 2 x dp 2, ZeRO 3 differs from 1x1x1"

run llama-ref "${llama[@]}"
run llama-cp4 "${llama[@]}" --context-parallel-size 4 --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1
compare llama-ref.jsonl llama-cp4.jsonl || fail "LLaMA cp 4 x interleaved pp 2 differs from 1x1x1"

# Mixture of experts (Megatron-Core's top-2 with drops and the aux loss): every cp rank routes the
# whole sequences; the experts over ep 2 beside cp 2, and with Ulysses 2.
moe=(--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.01 --moe-expert-capacity-factor 1.0)
run moe-ref "${moe[@]}"
run moe-cp2 "${moe[@]}" --context-parallel-size 2 --data-parallel-size 2 --expert-model-parallel-size 2 --zero-stage 1
compare moe-ref.jsonl moe-cp2.jsonl || fail "MoE cp 2 x dp 2 x ep 2 differs from 1x1x1"
run moe-u2 "${moe[@]}" --ds-sequence-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel
compare moe-ref.jsonl moe-u2.jsonl || fail "MoE Ulysses 2 x tp 2 with sp differs from 1x1x1"

# Two processes, cp 2: the key/value blocks and their gradients over UCX; the timeline shows every
# ring transfer on both ranks, each inside the forward or backward span that issued it.
"$troupe" launch --nproc-per-node 2 -- train "${common[@]}" "${llama[@]}" --train-iters 6 \
  --context-parallel-size 2 --metrics-file launch.jsonl --timeline trace.json > launch.log 2>&1 \
  || { cat launch.log; fail "2 processes with cp 2 failed"; }
compare llama-ref.jsonl launch.jsonl || fail "2 processes with cp 2 differ from 1x1x1"
python3 - <<'PY' || fail "the timeline does not show the ring's transfers inside the compute spans"
import json
ev = [e for e in json.load(open("trace.json"))["traceEvents"] if e["ph"] == "X"]
ring = [e for e in ev if e["cat"] == "collective" and e["name"].startswith("cp ring ")]
assert {e["tid"] for e in ring} == {0, 1}, {e["tid"] for e in ring}
for what, inside in (("K/V 1/2, h.", ("forward", "backward")), ("dK/dV 1/2, h.", ("backward",)),
                     ("dK/dV 2/2, h.", ("backward",))):
    spans = [e for e in ring if e["name"].startswith("cp ring " + what)]
    assert spans, what
    for s in spans:
        parents = [p for p in ev if p["tid"] == s["tid"] and p["cat"] in ("forward", "backward")
                   and p["ts"] <= s["ts"] and s["ts"] + s["dur"] <= p["ts"] + p["dur"] + 1]
        assert len(parents) == 1 and parents[0]["cat"] in inside, (s, parents)
print(f"{len(ring)} ring transfer spans on both ranks, each inside its pass")
PY

# Save at cp 4 (ZeRO 2) after 3 iterations; resume at cp 1 for the other 3: no cp in the checkpoint.
"$troupe" train "${common[@]}" --train-iters 3 --lr-decay-iters 6 --context-parallel-size 4 --zero-stage 2 \
  --data-parallel-size 1 --save ckpt --save-interval 3 > save.log 2>&1 || { cat save.log; fail "the cp 4 run that saves failed"; }
"$troupe" train "${common[@]}" --train-iters 6 --lr-decay-iters 6 --load ckpt --metrics-file resumed.jsonl \
  > resumed.log 2>&1 || { cat resumed.log; fail "resuming the cp 4 checkpoint at cp 1 failed"; }
compare gpt-ref.jsonl resumed.jsonl || fail "the run resumed at cp 1 differs from the straight run"
python3 - <<'PY' || fail "the resumed run did not start at iteration 4"
import json
its = [j["iteration"] for j in map(json.loads, open("resumed.jsonl")) if j.get("type") == "train"]
assert its and min(its) == 4, its
PY

# A running cp 2 x tp 2 job: status, stages and plan name every rank's cp coordinate (rank = tp + 2 cp).
"$troupe" train "${common[@]}" --train-iters 100000 --context-parallel-size 2 --tensor-model-parallel-size 2 \
  --inspect 0 --inspect-file run/insp.json > inspect.log 2>&1 &
job=$!
kill_on_exit $job "$work/run/insp.json"
wait_for_file run/insp.json
sleep 1
for verb in status stages plan; do
  "$troupe" inspect run/insp.json --exec "$verb" --json > "$verb.json" || { cat inspect.log; fail "$verb failed"; }
done
"$troupe" inspect run/insp.json --exec status > status.txt || fail "status for people failed"
"$troupe" inspect run/insp.json --exec "flight 2" > flight.txt || fail "flight failed"
kill -9 $job 2>/dev/null || true
wait $job 2>/dev/null || true
kill_on_exit
python3 - <<'PY' || fail "inspection does not show the cp coordinates"
import json
s = json.load(open("status.json"))
assert sorted((r["rank"], r["tp"], r["cp"]) for r in s["ranks"]) == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)], s["ranks"]
st = json.load(open("stages.json"))
assert sorted((r["rank"], r["cp"]) for r in st["ranks"]) == [(0, 0), (1, 0), (2, 1), (3, 1)], st["ranks"]
p = json.load(open("plan.json"))
assert sorted((a["rank"], a["cp"]) for s in p["stages"] for a in s["at"]) == [(0, 0), (1, 0), (2, 1), (3, 1)], p
print("status, stages and plan show the cp coordinates")
PY
grep -q "^  rank 3 (pp 0, tp 1, dp 0, cp 1) step" status.txt || { cat status.txt; fail "status for people lacks rank 3's cp"; }
# The flight recorder has the ring's messages on the cp group {0, 2}.
for op in send recv; do
  grep -q "cp \[0, 2\] .*$op" flight.txt || { head -40 flight.txt; fail "the flight recorder has no cp $op"; }
done

# Every problem at once, exit 2: a sequence 2 x cp does not divide, and a ring type (MoE layers are
# no problem).
set +e
"$troupe" train "${common[@]}" --train-iters 1 --seq-length 30 --context-parallel-size 4 --num-experts 4 \
  --cp-comm-type ring > bad.log 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || { cat bad.log; fail "bad context-parallel input: exit $code, not 2"; }
for want in "--seq-length 30 is not divisible by 2 x --context-parallel-size 4 = 8" "--cp-comm-type is \"ring\""; do
  grep -qF -- "$want" bad.log || { cat bad.log; fail "bad context-parallel input: '$want' not named"; }
done
! grep -q "MoE" bad.log || { cat bad.log; fail "bad context-parallel input: MoE layers refused"; }
echo PASS
