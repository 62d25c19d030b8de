#!/usr/bin/env bash
# The inspector's controls (docs/INSPECT.md): pause stops a running tp 2 x pp 2 job between
# iterations (the iteration stops advancing, the job is not taken for stuck), step N runs N more
# and pauses again, save writes a checkpoint while paused, resume goes on, and the losses equal an
# unpaused run's, in one process and under troupe launch. set lr fixes the learning rate from the
# next iteration, set log-interval changes what is printed; bad commands are refused with rc 2.
source "$(dirname "$0")/common.bash"
make_corpus
train_args=(train --num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
            --global-batch-size 6 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 3
            --data-path d_text_document --tokenizer-type ByteLevelTokenizer --eval-interval 1000)
small_train() { "$troupe" "${train_args[@]}" "$@"; }
model=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --distributed-timeout-minutes 0.1
       --inspect-stall-seconds 1)

# ask CMD: the inspector's JSON answer; when the client fails, the job's log says why.
ask() {
  local rc=0
  "$troupe" inspect "$insp" --exec "$*" --json || rc=$?
  if (( rc != 0 && rc != 2 )); then
    echo "--- inspect --exec '$*' exited $rc; the job's log:" >&2
    cat "${insp%.json}.log" >&2 || true
  fi
  return $rc
}
field() { python3 -c "import json,sys; j=json.load(sys.stdin); print(j$1)"; }

# The paused jobs run "for ever" and stop at --exit-interval 300 with the schedule of 300 iterations,
# so however slow the machine they are still running when paused, and end where the plain ones do.
long=(--train-iters 100000 --lr-decay-iters 300 --exit-interval 300)
small_train "${model[@]}" --train-iters 300 --log-interval 1000 --metrics-file plain.jsonl > plain.log

# controlled NAME [LAUNCH...]: pause, wait, step 2, save, resume; the same losses as plain.
controlled() {
  local name=$1
  shift
  insp=$name.json
  small_train "${model[@]}" "$@" "${long[@]}" --log-interval 1000 --inspect 0 --inspect-file "$work/$insp" --save "$name" \
    --metrics-file "$name.jsonl" > "$name.log" 2>&1 &
  job=$!
  kill_on_exit $job "$work/$insp"
  wait_for_file "$insp"
  ask pause > pause.json || { cat pause.json "$name.log"; fail "$name: pause failed"; }
  [[ $(field '["applied"]' < pause.json) == True && $(field '["paused"]' < pause.json) == True ]] ||
    { cat pause.json; fail "$name: pause did not pause"; }
  local at
  at=$(field '["paused_after"]' < pause.json)
  local stalls
  stalls=$(grep -c "stall:" "$name.log" || true)  # a slow step on a loaded machine may be one, not the pause
  sleep 2.5  # longer than --inspect-stall-seconds: a paused job is not stalled
  ask status > status.json
  [[ $(field '["iteration"]' < status.json) == "$at" && $(field '["job"]["paused"]' < status.json) == True ]] ||
    { cat status.json; fail "$name: the iteration moved while paused (paused after $at)"; }
  [[ $(grep -c "stall:" "$name.log" || true) == "$stalls" ]] || { cat "$name.log"; fail "$name: the pause was reported as a stall"; }
  # step N answers once its iterations ran and the job paused again: the answer is the state after.
  ask step 2 > step.json
  [[ $(field '["applied"]' < step.json) == True && $(field '["paused"]' < step.json) == True &&
     $(field '["paused_after"]' < step.json) == $((at + 2)) && $(field '["iteration"]' < step.json) == $((at + 2)) ]] ||
    { cat step.json; fail "$name: step 2's answer is not the state after 2 iterations"; }
  ask status > status.json
  [[ $(field '["iteration"]' < status.json) == $((at + 2)) ]] || { cat status.json; fail "$name: step 2 did not run 2 iterations"; }
  ask save > save.json
  [[ $(field '["applied"]' < save.json) == True ]] || { cat save.json; fail "$name: save while paused"; }
  local dir
  dir=$(printf '%s/iter_%07d' "$name" $((at + 2)))
  # The snapshot is taken before save answers; the offload actor writes it in the background.
  wait_for_checkpoint "$dir"
  ask resume > resume.json || fail "$name: resume failed"
  [[ $(field '["applied"]' < resume.json) == True && $(field '["paused"]' < resume.json) == False ]] ||
    { cat resume.json; fail "$name: resume's answer says the job is still paused"; }
  wait $job || { cat "$name.log"; fail "$name: the job failed after resume"; }
  kill_on_exit

  diff <(losses plain.jsonl) <(losses "$name.jsonl") > /dev/null ||
    { diff <(losses plain.jsonl) <(losses "$name.jsonl") | head; fail "$name: losses differ from the unpaused run"; }
  echo "ok: $name: paused after iteration $at, stepped 2, saved $dir, resumed; losses equal the unpaused run's"
}
controlled one
# Under troupe launch: 4 processes, one rank each, all pause after the same iteration.
# (Its unpaused twin runs under launch too: the UCX world sums the norm in another order than the
# in-process fabric.)
"$troupe" launch --nproc-per-node 4 --master-port "$(free_port)" -- "${train_args[@]}" --log-interval 1000 "${model[@]}" --train-iters 300 \
  --metrics-file plain_launched.jsonl > plain_launched.log 2>&1 || { cat plain_launched.log; fail "the unpaused launch failed"; }
insp=launched.json
"$troupe" launch --nproc-per-node 4 --master-port "$(free_port)" -- "${train_args[@]}" --log-interval 1000 "${model[@]}" "${long[@]}" --inspect 0 --inspect-file "$work/$insp" \
  --save launched --metrics-file launched.jsonl > launched.log 2>&1 &
job=$!
kill_on_exit $job "$work/$insp"
wait_for_file "$insp"
ask pause > pause.json || { cat pause.json launched.log; fail "launched: pause failed"; }
at=$(field '["paused_after"]' < pause.json)
sleep 1.5
ask status > status.json
[[ $(field '["iteration"]' < status.json) == "$at" ]] || { cat status.json; fail "launched: the iteration moved while paused"; }
python3 -c "import json,sys; j=json.load(open('status.json')); assert sorted(r['rank'] for r in j['ranks'])==[0,1,2,3] and 'unreachable' not in j, j" ||
  fail "launched: status does not cover the 4 processes"
ask step 1 > step.json
[[ $(field '["paused_after"]' < step.json) == $((at + 1)) && $(field '["paused"]' < step.json) == True ]] ||
  { cat step.json; fail "launched: step 1 answered before its iteration ran"; }
ask resume > resume.json
[[ $(field '["paused"]' < resume.json) == False ]] || { cat resume.json; fail "launched: resume's answer says paused"; }
wait $job || { cat launched.log; fail "launched: the job failed after resume"; }
kill_on_exit
diff <(losses plain_launched.jsonl) <(losses launched.jsonl) > /dev/null ||
  { diff <(losses plain_launched.jsonl) <(losses launched.jsonl) | head; fail "launched: losses differ from the unpaused run"; }
echo "ok: launched: 4 processes paused after iteration $at, stepped, resumed; losses equal the unpaused run's"

# set lr and set log-interval, and refusals.
insp=set.json
small_train "${model[@]}" --train-iters 100000 --lr-decay-iters 300 --exit-interval 300 --inspect 0 --inspect-file "$work/$insp" --metrics-file set.jsonl --log-interval 1 > set.log 2>&1 &
job=$!
kill_on_exit $job
wait_for_file "$insp"
set +e
ask step 2 > notpaused.json; rc_step=$?
set -e
ask pause > pause.json
at=$(field '["paused_after"]' < pause.json)
set +e
ask set lr -1 > badlr.json; rc_lr=$?
ask save > nosave.json; rc_save=$?
ask "set frobs 3" > badset.json; rc_set=$?
set -e
(( rc_step == 2 )) && grep -q "not paused" notpaused.json || { cat notpaused.json; fail "step while running: rc $rc_step"; }
(( rc_lr == 2 )) && grep -q "positive number" badlr.json || { cat badlr.json; fail "set lr -1: rc $rc_lr"; }
(( rc_save == 2 )) && grep -q "without --save" nosave.json || { cat nosave.json; fail "save without --save: rc $rc_save"; }
(( rc_set == 2 )) && grep -q "set knows" badset.json || { cat badset.json; fail "set frobs: rc $rc_set"; }
ask set lr 0.000123 > setlr.json
ask set log-interval 5 > setlog.json
[[ $(field '["lr_override"]' < setlr.json) == 0.000123 ]] || { cat setlr.json; fail "set lr was not applied"; }
ask resume > /dev/null
wait $job || { cat set.log; fail "the job failed after set"; }
kill_on_exit
python3 - set.jsonl "$at" <<'PY' || fail "set lr did not change the learning rate from the next iteration on"
import json, sys
at = int(sys.argv[2])
lrs = {j["iteration"]: j["lr"] for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "train"}
assert all(abs(lrs[i] - 0.000123) < 1e-12 for i in lrs if i > at), lrs
assert all(abs(lrs[i] - 0.000123) > 1e-9 for i in lrs if i <= at), lrs
print("ok: set lr 0.000123 after iteration", at)
PY
grep -q "log interval set to 5 by the inspector" set.log || { cat set.log; fail "set log-interval was not applied"; }

# Every answer is the state after its command (the inspector was once woken before the trainer
# cleared its paused flag: about 1 resume in 20 answered "paused"): 20 rounds of step, resume and
# pause. Then stop, as SIGINT: the job saves after the current iteration and ends (exit 0, "stopped
# early"), here while paused, then while running.
for mode in paused running; do
  insp=stop_$mode.json
  small_train "${model[@]}" --train-iters 100000 --log-interval 1000 --inspect 0 --inspect-file "$work/$insp" \
    --save "stop_$mode" > "stop_$mode.log" 2>&1 &
  job=$!
  kill_on_exit $job "$work/$insp"
  wait_for_file "$insp"
  if [[ $mode == paused ]]; then
    ask pause > round_pause.json
    r_at=$(field '["paused_after"]' < round_pause.json)
    for round in $(seq 1 20); do
      ask step 1 > round_step.json
      [[ $(field '["paused"]' < round_step.json) == True && $(field '["paused_after"]' < round_step.json) == $((r_at + 1)) ]] ||
        { cat round_step.json; fail "round $round: step 1 answered a state other than paused after iteration $((r_at + 1))"; }
      ask resume > round_resume.json
      [[ $(field '["paused"]' < round_resume.json) == False ]] || { cat round_resume.json; fail "round $round: resume answered paused"; }
      ask pause > round_pause.json
      [[ $(field '["paused"]' < round_pause.json) == True ]] || { cat round_pause.json; fail "round $round: pause answered running"; }
      r_at=$(field '["paused_after"]' < round_pause.json)
    done
    echo "ok: 20 rounds of step 1, resume and pause each answered the state after the command"
  fi
  ask stop > stop.json || { cat stop.json; fail "stop ($mode) failed"; }
  [[ $(field '["applied"]' < stop.json) == True ]] || { cat stop.json; fail "stop ($mode) was not applied"; }
  rc=0
  wait $job || rc=$?
  kill_on_exit
  (( rc == 0 )) && grep -q "(stopped early)" "stop_$mode.log" || { cat "stop_$mode.log"; fail "stop ($mode): rc $rc"; }
  last=$(cat "stop_$mode/latest_checkpointed_iteration.txt")
  grep -q "finished at iteration $last/" "stop_$mode.log" || { cat "stop_$mode.log"; fail "stop ($mode) did not save its last iteration"; }
  echo "ok: stop while $mode: saved iteration $last and ended"
done
echo "PASS: pause, step, save, resume, stop (losses equal, one process and under launch), set lr, set log-interval, refusals"
