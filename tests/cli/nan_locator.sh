#!/usr/bin/env bash
# The NaN locator (docs/INSPECT.md, "A NaN hunt"): TROUPE_FAULT_NAN puts a NaN into one tensor of one
# layer at one iteration; with --watch-nan the job stops there with one line naming the iteration,
# micro-batch, rank, layer, tensor and direction (rc 1) and writes troupe-nan-PID.json, in one
# process (tp 2 x pp 2) and under troupe launch (4 processes); `watch nan` through the inspector
# switches it on at run time. A malformed spec is bad input (rc 2) listing the tensor names.
source "$(dirname "$0")/common.bash"
model=(--num-layers 4 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
       --global-batch-size 6 --mock-data --tokenizer-type ByteLevelTokenizer --log-interval 1000
       --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)

# check_report FILE ITERATION MICRO RANK PP TP SPEC: the JSON report names exactly that origin.
check_report() {
  python3 - "$@" <<'PY' || fail "the report $1 does not name the injected tensor"
import json, sys
f, it, micro, rank, pp, tp, spec = sys.argv[1:]
r = json.load(open(f))
assert r["format"] == "troupe.nan_report" and r["version"] == 1, r
assert r["iteration"] == int(it) and r["located"], r
o = r["origin"]
assert (o["micro_batch"], o["rank"], o["pp"], o["tp"], o["dp"]) == (int(micro), int(rank), int(pp), int(tp), 0), o
assert o["spec"] == spec and o["first_value"] == "nan" and o["first_index"] == 0, o
assert len(r["ranks"]) == 4 and r["message"].startswith("the NaN watch stopped the job at iteration " + it), r
print("ok:", r["message"])
PY
}

set +e
TROUPE_FAULT_NAN=layer2:mlp_fc9@4 "$troupe" train "${model[@]}" --train-iters 8 --watch-nan > bad.log 2>&1
rc_bad=$?
TROUPE_FAULT_NAN=layer7:mlp_fc1@4 "$troupe" train "${model[@]}" --train-iters 8 --watch-nan > range.log 2>&1
rc_range=$?
set -e
(( rc_bad == 2 )) && grep -q 'TROUPE_FAULT_NAN=layer2:mlp_fc9@4: "mlp_fc9" is not a tensor of a layer -- write' bad.log &&
  grep -q "attention_scores (forward backward)" bad.log || { cat bad.log; fail "a malformed spec: rc $rc_bad"; }
(( rc_range == 2 )) && grep -q "layer 7 but the model has 4 layers" range.log || { cat range.log; fail "layer 7: rc $rc_range"; }

# One process: the NaN in layer 2's c_fc output (stage 1, both tp ranks) at iteration 4.
set +e
TROUPE_FAULT_NAN=layer2:mlp_fc1@4 "$troupe" train "${model[@]}" --train-iters 8 --watch-nan --save run1 > one.log 2>&1
rc_one=$?
TROUPE_FAULT_NAN=layer2:mlp_fc1@4 "$troupe" train "${model[@]}" --train-iters 8 > unwatched.log 2>&1
rc_unwatched=$?
set -e
line="the NaN watch stopped the job at iteration 4: the loss was not finite; replaying the iteration from its saved inputs, the first non-finite value is layer 2 mlp fc1 output (forward) of micro-batch 0 on rank 2 (pp 1, tp 0, dp 0)"
(( rc_one == 1 )) && grep -qF "troupe train: error: $line -- details in run1/troupe-nan-" one.log ||
  { cat one.log; fail "one process: rc $rc_one, not the one-line report"; }
check_report run1/troupe-nan-*.json 4 0 2 1 0 layer2:mlp_fc1:forward
# Without the watch the same NaN fails the job as before, without a locator.
(( rc_unwatched == 1 )) && ! grep -q "NaN watch" unwatched.log && grep -q "not finite" unwatched.log ||
  { cat unwatched.log; fail "without --watch-nan: rc $rc_unwatched"; }

# Under troupe launch: the gradient into layer 1's q, k, v (the attention core's backward) on rank 1
# only, micro-batch 1 of iteration 3. Rank 0's process writes the report here.
mkdir launched && cd launched
set +e
TROUPE_FAULT_NAN=rank1/layer1:attention_scores:backward@3/1 "$troupe" launch --nproc-per-node 4 --master-port "$(free_port)" -- train "${model[@]}" \
  --train-iters 8 --watch-nan > launch.log 2>&1
rc_launch=$?
set -e
(( rc_launch == 1 )) && grep -qF "the first non-finite value is layer 1 attention scores grad input (backward) of micro-batch 1 on rank 1 (pp 0, tp 1, dp 0) -- details in ./troupe-nan-" launch.log ||
  { cat launch.log; fail "under launch: rc $rc_launch, not the report"; }
(( $(ls troupe-nan-*.json | wc -l) == 1 )) || fail "under launch: not exactly one report file"
check_report troupe-nan-*.json 3 1 1 0 1 layer1:attention_scores:backward
cd ..

# At run time: the job starts without the watch; `watch nan` through the inspector turns it on in
# every rank before the NaN of iteration 300 (layer 3's c_proj weight gradient, rank 3).
TROUPE_FAULT_NAN=rank3/layer3:mlp_fc2:weight@300 "$troupe" train "${model[@]}" --train-iters 400 --inspect 0 \
  --inspect-file insp.json > live.log 2>&1 &
job=$!
kill_on_exit $job
for _ in $(seq 1 300); do [[ -s insp.json ]] && break; sleep 0.1; done
[[ -s insp.json ]] || { cat live.log; fail "no inspect file after 30 s"; }
"$troupe" inspect insp.json --exec "watch nan" --json > watch.json || { cat watch.json; fail "watch nan failed"; }
python3 - watch.json <<'PY' || fail "watch nan did not answer as docs/INSPECT.md says"
import json, sys
w = json.load(open(sys.argv[1]))
assert w["watch"] == "nan" and w["processes"] == 1 and w["agreeing"] == 1, w
assert w["iteration"] < 298, "the job passed iteration 298 before the watch was on: %s" % w
print("ok: watch nan at iteration", w["iteration"])
PY
"$troupe" inspect insp.json --exec "watch" --json > asked.json
python3 -c "import json,sys; w=json.load(open(sys.argv[1])); assert w['watch'] == 'nan', w" asked.json || fail "watch: $(cat asked.json)"
"$troupe" inspect insp.json --exec "watch sideways" --json > wrong.json || true
grep -q "watch takes nan, off or nothing" wrong.json || fail "watch sideways: $(cat wrong.json)"
set +e
wait $job
rc_live=$?
set -e
kill_on_exit
(( rc_live == 1 )) && grep -qF "the NaN watch stopped the job at iteration 300: the gradient norm was not finite; replaying the iteration from its saved inputs, the first non-finite value is layer 3 mlp fc2 weight grad (backward) of micro-batch 0 on rank 3 (pp 1, tp 1, dp 0)" live.log ||
  { cat live.log; fail "watch nan at run time: rc $rc_live"; }
check_report troupe-nan-*.json 300 0 3 1 1 layer3:mlp_fc2:weight
echo "PASS: the NaN locator names the injected tensor in one process, under launch and switched on at run time"
