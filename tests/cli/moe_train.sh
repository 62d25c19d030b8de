#!/usr/bin/env bash
# Mixture of experts through the CLI, end to end, in both dialects: Megatron-LM's flags (top-2 of 4
# experts on every layer, capacity 1.0, aux and z losses) and Megatron-DeepSpeed's (top-1 with RTS
# every second layer, PR-MoE), each on the 1x1x1 layout and with expert parallelism -- tp 2 x pp 2 x
# dp 2 with ep 2 and ZeRO 1 in one process, and dp 2 with ep 2 over two processes (troupe launch: the
# tokens cross processes in UCX's all-to-all) -- every iteration's loss within 1e-5 of the 1x1x1
# run; a checkpoint saved with ep 2 resumes on 1x1x1 (experts by their global index, Adam's moments
# included) with the straight run's losses, and so does its offline resharding to tp 2 x dp 4 with ep 4
# (troupe ckpt convert). Bad MoE input is refused with every problem at once.
source "$(dirname "$0")/common.bash"
make_corpus

common=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 24 --micro-batch-size 2
        --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 2
        --weight-decay 0.1 --clip-grad 1.0 --data-path d_text_document --tokenizer-type ByteLevelTokenizer
        --eval-interval 1000 --log-interval 1000)
lm=(--num-experts 4 --moe-router-topk 2 --moe-expert-capacity-factor 1.0 --moe-aux-loss-coeff 0.01
    --moe-z-loss-coeff 0.001)
ds=(--num-experts 4 --topk 1 --expert-interval 2 --mlp-type residual --moe-loss-coeff 0.01 --moe-min-capacity 2)

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

for dialect in lm ds; do
  declare -n moe="$dialect"
  "$troupe" train "${common[@]}" "${moe[@]}" --train-iters 6 --num-threads 1 --metrics-file "$dialect-ref.jsonl" \
    > "$dialect-ref.log" 2>&1 || { cat "$dialect-ref.log"; fail "$dialect: the 1x1x1 MoE run failed"; }
  grep -q "mixture of experts" "$dialect-ref.log" || { cat "$dialect-ref.log"; fail "$dialect: no reading of the MoE flags"; }
  ep_flag=--expert-model-parallel-size
  [[ $dialect == ds ]] && ep_flag=--moe-expert-parallel-size
  "$troupe" train "${common[@]}" "${moe[@]}" --train-iters 6 --num-threads 1 --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 2 --data-parallel-size 2 "$ep_flag" 2 --zero-stage 1 \
    --metrics-file "$dialect-ep.jsonl" > "$dialect-ep.log" 2>&1 \
    || { cat "$dialect-ep.log"; fail "$dialect: tp2 pp2 dp2 ep2 failed"; }
  compare "$dialect-ref.jsonl" "$dialect-ep.jsonl" || fail "$dialect: tp2 pp2 dp2 ep2 differs from 1x1x1"
done

# Two processes: dp 2 with ep 2, the experts' tokens through UCX.
"$troupe" launch --nproc-per-node 2 -- train "${common[@]}" "${lm[@]}" --train-iters 6 \
  --expert-model-parallel-size 2 --zero-stage 2 --metrics-file launch.jsonl --timeline launch-trace.json \
  > launch.log 2>&1 || { cat launch.log; fail "2 processes, dp 2, ep 2 failed"; }
compare lm-ref.jsonl launch.jsonl || fail "2 processes with ep 2 differ from 1x1x1"
# The token all-to-alls on the timeline: spans of their own, each inside the rank's forward or backward
# span that issued it, on both ranks.
python3 - <<'PY' || fail "the timeline does not show the MoE all-to-alls inside the compute spans"
import json
ev = [e for e in json.load(open("launch-trace.json"))["traceEvents"] if e["ph"] == "X"]
a2a = [e for e in ev if e["cat"] == "collective"]
assert {e["tid"] for e in a2a} == {0, 1}, {e["tid"] for e in a2a}
for what, inside in (("dispatch", "forward"), ("combine", "forward"), ("counts", "forward"),
                     ("combine-gradient", "backward"), ("dispatch-gradient", "backward")):
    spans = [e for e in a2a if e["name"].startswith("MoE %s all-to-all, h." % what)]
    assert spans, what
    for s in spans:
        parents = [p for p in ev if p["tid"] == s["tid"] and p["cat"] in ("forward", "backward")
                   and p["ts"] <= s["ts"] and s["ts"] + s["dur"] <= p["ts"] + p["dur"] + 1]
        assert len(parents) == 1 and parents[0]["cat"] == inside, (s, parents)
PY

# Save with ep 2 (dp 2, ZeRO 1) after 3 iterations, resume on 1x1x1 for the other 3.
"$troupe" train "${common[@]}" "${lm[@]}" --train-iters 3 --lr-decay-iters 6 --num-threads 1 --data-parallel-size 2 \
  --expert-model-parallel-size 2 --zero-stage 1 --save ckpt --save-interval 3 > save.log 2>&1 \
  || { cat save.log; fail "the ep 2 run that saves failed"; }
# Offline resharding of that checkpoint (troupe ckpt convert) to tp 2 x dp 4 with ep 4 and ZeRO 3:
# 8 shard files, and the run that loads them goes on as the straight run.
"$troupe" ckpt convert --load ckpt --save conv --target-tensor-parallel-size 2 --target-data-parallel-size 4 \
  --target-expert-model-parallel-size 4 --target-zero-stage 3 > convert.log 2>&1 || { cat convert.log; fail "ckpt convert to ep 4 failed"; }
[[ $(find conv -name '*.h5' -o -name '*.shard' -o -name 'shard*' | wc -l) -ge 8 ]] || { find conv; fail "the converted checkpoint has not 8 shards"; }
"$troupe" train "${common[@]}" "${lm[@]}" --train-iters 6 --lr-decay-iters 6 --num-threads 1 --load conv \
  --tensor-model-parallel-size 2 --data-parallel-size 4 --expert-model-parallel-size 4 --zero-stage 3 \
  --metrics-file converted.jsonl > converted.log 2>&1 || { cat converted.log; fail "resuming the converted ep 4 checkpoint failed"; }
compare lm-ref.jsonl converted.jsonl || fail "the run from the converted checkpoint differs from the straight run"
set +e
"$troupe" ckpt convert --load ckpt --save conv-bad --target-data-parallel-size 4 --target-expert-model-parallel-size 3 \
  > convert-bad.log 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || { cat convert-bad.log; fail "ckpt convert with ep 3: exit $code, not 2"; }
for want in "does not divide --target-data-parallel-size 4" "experts --"; do
  grep -qF -- "$want" convert-bad.log || { cat convert-bad.log; fail "ckpt convert with ep 3: '$want' not named"; }
done
"$troupe" train "${common[@]}" "${lm[@]}" --train-iters 6 --lr-decay-iters 6 --num-threads 1 --load ckpt --save ckpt \
  --save-interval 1000 --metrics-file resumed.jsonl > resumed.log 2>&1 \
  || { cat resumed.log; fail "resuming the ep 2 checkpoint on 1x1x1 failed"; }
compare lm-ref.jsonl resumed.jsonl || fail "the resumed run differs from the straight run"
python3 - <<'PY' || fail "the resumed run did not start at iteration 4"
import json
its = [j["iteration"] for j in map(json.loads, open("resumed.jsonl")) if j.get("type") == "train"]
assert its and min(its) == 4, its
PY

# Every problem at once, exit 2.
set +e
"$troupe" train "${common[@]}" --train-iters 1 --num-experts 6 --moe-router-topk 8 \
  --expert-model-parallel-size 4 --data-parallel-size 2 --moe-expert-capacity-factor 0 > bad.log 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || { cat bad.log; fail "bad MoE input: exit $code, not 2"; }
for want in "--moe-router-topk" "--expert-model-parallel-size" "--moe-expert-capacity-factor"; do
  grep -q -- "$want" bad.log || { cat bad.log; fail "bad MoE input: $want is not named"; }
done
echo PASS
