#!/usr/bin/env bash
# Supervision and restarts. An actor that throws (fault injection: TROUPE_FAULT_THROW=ACTOR@ITERATION)
# stops the job with a message naming it and the cause; with --max-restarts every actor restarts
# from the latest checkpoint and the losses equal the uninterrupted run's. Under troupe launch a
# rank that throws, a process killed with SIGKILL at a random moment, or a stuck rank
# (TROUPE_FAULT_HANG, --distributed-timeout-minutes) is restarted by troupe launch --max-restarts
# with the same result; a stuck rank in one process is named; a process that stops answering
# (SIGSTOP) ends the job with a message naming it instead of a hang.
source "$(dirname "$0")/common.bash"
make_corpus

# Model flags shared by every run here; heads 4 so that tp 2 works.
model=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
       --global-batch-size 6 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 3
       --data-path d_text_document --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --num-threads 1)
train() { "$troupe" train "${model[@]}" "$@"; }
launch2() { "$troupe" launch --nproc-per-node 2 "$@"; }

# The last line per iteration (a restart runs the iterations after the checkpoint again).
last_losses() {
  losses "$1" | /usr/bin/python3 -c '
import sys
rows = {}
for line in sys.stdin:
    rows[int(line.split()[0])] = line
print("".join(rows[k] for k in sorted(rows)), end="")'
}

expect_failure() {  # name, expected text, then the command
  local name=$1 text=$2
  shift 2
  if "$@" > "$name.log" 2>&1; then fail "$name: the job succeeded despite the fault"; fi
  grep -qF -- "$text" "$name.log" || { cat "$name.log" >&2; fail "$name: no message \"$text\""; }
}

# --- an actor that throws stops the job, named -------------------------------------------------
par=(--train-iters 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)
TROUPE_FAULT_THROW=rank3@4 expect_failure rank "error: rank 3 failed: std::runtime_error: fault injected by TROUPE_FAULT_THROW=rank3@4" \
  train "${par[@]}"
TROUPE_FAULT_THROW=optimizer2@3 expect_failure optimizer "the optimizer partition of rank 2 failed: std::runtime_error" \
  train "${par[@]}" --zero-stage 1 --data-parallel-size 1
TROUPE_FAULT_THROW=trainer@2 expect_failure trainer "the trainer failed: std::runtime_error" train --train-iters 4
TROUPE_FAULT_THROW=rank0@2 expect_failure rank0 "error: rank 0 failed: std::runtime_error" train --train-iters 4
TROUPE_FAULT_THROW=offload@2 expect_failure offload "the offload actor failed: std::runtime_error" \
  train "${par[@]}" --save ck_offload --save-interval 2
# Nothing was committed by the failed save: no checkpoint, or one that loads.
if [[ -f ck_offload/latest_checkpointed_iteration.txt ]]; then
  "$troupe" ckpt info ck_offload > /dev/null || fail "the failed background save left a broken latest checkpoint"
fi

# --- --max-restarts: restarted from the latest checkpoint, equal to the uninterrupted run -----------
train "${par[@]}" --data-parallel-size 1 --metrics-file straight.jsonl > straight.log
last_losses straight.jsonl > straight.txt
TROUPE_FAULT_THROW=rank1@7 train "${par[@]}" --save ck_r --save-interval 3 --max-restarts 1 \
  --metrics-file restarted.jsonl > restarted.log 2>&1 || { cat restarted.log; fail "the restarted job failed"; }
grep -q "restart 1 of 1: every actor anew, from ck_r/iter_0000006" restarted.log || { cat restarted.log; fail "no restart note"; }
last_losses restarted.jsonl > restarted.txt
diff straight.txt restarted.txt || fail "the restarted run's losses differ from the uninterrupted run"

# One process, one rank (1x1x1): the same.
train --train-iters 6 --metrics-file s1.jsonl > /dev/null
TROUPE_FAULT_THROW=rank0@5 train --train-iters 6 --save ck_s --save-interval 2 --max-restarts 2 \
  --metrics-file r1.jsonl > r1.log 2>&1 || { cat r1.log; fail "the restarted 1x1x1 job failed"; }
diff <(last_losses s1.jsonl) <(last_losses r1.jsonl) || fail "1x1x1: the restarted run differs"

# --- troupe launch --max-restarts: every process again, each resuming from --save ------------------
lpar=(--train-iters 10 --pipeline-model-parallel-size 2)
launch2 -- train "${model[@]}" "${lpar[@]}" --log-interval 1 --metrics-file l_straight.jsonl > l_straight.log 2>&1 ||
  { cat l_straight.log; fail "the 2-process run failed"; }
last_losses l_straight.jsonl > l_straight.txt
TROUPE_FAULT_THROW=rank1@6 launch2 --max-restarts 1 -- train "${model[@]}" "${lpar[@]}" --save ck_l --save-interval 2 \
  --metrics-file l_thrown.jsonl > l_thrown.log 2>&1 || { cat l_thrown.log; fail "the relaunched job failed"; }
grep -q "rank 1 failed: std::runtime_error" l_thrown.log || fail "the launched rank's failure was not named"
grep -q "troupe launch: restart 1 of 1" l_thrown.log || fail "troupe launch did not restart"
diff l_straight.txt <(last_losses l_thrown.jsonl) || fail "relaunched after a throw: losses differ"

# Bad input is not restarted: every attempt would refuse it again.
if launch2 --max-restarts 3 -- train "${model[@]}" "${lpar[@]}" --lr -1 > l_bad.log 2>&1; then fail "a bad flag was accepted"; fi
grep -q "not restarting: .*refused their input" l_bad.log || { cat l_bad.log; fail "the launcher restarted a bad input"; }
grep -q "restart 1 of" l_bad.log && fail "the launcher restarted a bad input"
# train --max-restarts under troupe launch points to the launcher's flag.
if launch2 -- train "${model[@]}" "${lpar[@]}" --save ck_x --max-restarts 1 > l_flag.log 2>&1; then fail "accepted"; fi
grep -q "pass --max-restarts to troupe launch" l_flag.log || { cat l_flag.log; fail "no pointer to the launcher's flag"; }

# A rank killed with SIGKILL at some moment of a longer run: relaunched, resumed, equal.
long=(--train-iters 1500 --pipeline-model-parallel-size 2 --log-interval 100)
launch2 -- train "${model[@]}" "${long[@]}" --metrics-file k_straight.jsonl > /dev/null 2>&1 || fail "1500-iteration run failed"
"$troupe" launch --nproc-per-node 2 --max-restarts 1 -- train "${model[@]}" "${long[@]}" --save ck_k --save-interval 50 \
  --metrics-file k_killed.jsonl > k_killed.log 2>&1 &
launcher=$!
for _ in $(seq 1 600); do
  [[ -f ck_k/latest_checkpointed_iteration.txt ]] && (( $(cat ck_k/latest_checkpointed_iteration.txt) >= 200 )) && break
  sleep 0.05
done
victim=$(pgrep -P "$launcher" | tail -1)
kill -9 "$victim"
wait "$launcher" || { cat k_killed.log; fail "the job did not survive a killed rank with --max-restarts 1"; }
grep -q "was killed by signal 9" k_killed.log || fail "the killed rank was not reported"
grep -q "troupe launch: restart 1 of 1" k_killed.log || fail "troupe launch did not restart after the kill"
diff <(last_losses k_straight.jsonl) <(last_losses k_killed.jsonl) || fail "after a SIGKILL and a restart the losses differ"

# --- a stuck rank (alive, never answering; TROUPE_FAULT_HANG): --distributed-timeout-minutes ------
# One process: the local fabric's timeout (whichever wait expires first) names the ranks that were not
# waiting for any peer: the stuck one.
start=$SECONDS
if TROUPE_FAULT_HANG=rank1@4 train "${par[@]}" --distributed-timeout-minutes 0.05 --inspect-stall-seconds 1 --save ck_stall \
  > stuck.log 2>&1; then
  fail "a job with a stuck rank succeeded"
fi
grep -Eq "(waited|within) 3000 ms" stuck.log || { cat stuck.log; fail "no timeout message"; }
grep -q "rank(s) not waiting for any peer at that moment (computing, or stuck): \[1\]" stuck.log ||
  { cat stuck.log; fail "the stuck rank 1 was not named"; }
grep -q "actor(s) did not stop (stuck in a handler)" stuck.log || fail "the stuck actors were not reported"
# Where the ranks were (engine/activity.hpp): the wait-for graph names the stuck rank 1, which never
# began step 4, and who waits on it (its tensor-parallel partner in the all-reduce, and through it
# the next stage).
grep -q "where the ranks were: rank 1 (pp 0, tp 1, dp 0) step 3: idle .* -- ranks 0, 3 wait on it, 3 ranks in all" stuck.log ||
  { cat stuck.log; fail "the wait-for graph did not name the stuck rank"; }
grep -q "rank 0 (pp 0, tp 0, dp 0) step 4: waiting for the GPT layers' tensor-parallel all-reduce" stuck.log ||
  { cat stuck.log; fail "rank 0's wait in the tensor-parallel all-reduce was not shown"; }
# The stall explainer (--inspect-stall-seconds 1) spoke first, before the 3 s timeout, in one line
# and in a JSON file in --save.
grep -q "stall: no rank of this process made progress for 1\.[0-9] s after iteration 3: rank 1 (pp 0, tp 1, dp 0)" stuck.log ||
  { cat stuck.log; fail "no stall report naming rank 1"; }
(( $(grep -n "stall: no rank" stuck.log | cut -d: -f1) < $(grep -nE "(did not complete within|waited) 3000 ms" stuck.log | head -1 | cut -d: -f1) )) ||
  fail "the stall report came after the timeout"
python3 - ck_stall/troupe-stall-*.json <<'PY' || fail "the stall file does not name rank 1"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["culprits"] == [1] and not r["deadlock"] and r["after_iteration"] == 3, r
ranks = {a["rank"]: a for a in r["ranks"]}
assert sorted(ranks) == [0, 1, 2, 3] and ranks[1]["doing"] == "idle" and ranks[1]["step"] == 3, ranks
assert ranks[0]["doing"] == "waiting" and ranks[0]["waiting_on"] == [1] and ranks[0]["collective"], ranks[0]
assert {(e["from"], e["to"]) for e in r["edges"]} == {(0, 1), (2, 0), (3, 1)}, r["edges"]
print("ok: the stall file names rank 1 and the waits on it")
PY
(( SECONDS - start < 60 )) || fail "a stuck rank took $((SECONDS - start)) s to stop the job"
# One rank and no peer to time out on: the trainer's watchdog names it.
TROUPE_FAULT_HANG=rank0@3 expect_failure stuck_rank0 "no progress for 0.05 minute(s) after iteration 2: rank(s) 0 did not finish iteration 3" \
  train --train-iters 6 --distributed-timeout-minutes 0.05
# Two processes with restarts: the stuck process ends itself, troupe launch starts both again, and the
# run resumes from its checkpoint with the uninterrupted losses.
TROUPE_FAULT_HANG=rank1@6 launch2 --max-restarts 1 -- train "${model[@]}" "${lpar[@]}" --save ck_h --save-interval 2 \
  --distributed-timeout-minutes 0.05 --metrics-file l_hung.jsonl > l_hung.log 2>&1 || { cat l_hung.log; fail "the relaunched job failed"; }
# Each process names its own unfinished ranks; the stuck rank 1's process and rank 0's (waiting for
# it) both time out, and whichever ends first makes troupe launch stop the other.
grep -Eq "rank\(s\) [01] did not finish iteration 6" l_hung.log || { cat l_hung.log; fail "the unfinished ranks were not named"; }
diff l_straight.txt <(last_losses l_hung.jsonl) || fail "relaunched after a stuck rank: losses differ"

# --- a process that stops answering (SIGSTOP): the job ends, naming it -------------------------------
"$troupe" launch --nproc-per-node 2 -- train "${model[@]}" --train-iters 1000000 --pipeline-model-parallel-size 2 \
  --log-interval 20 > hung.log 2>&1 &
launcher=$!
for _ in $(seq 1 300); do grep -q "iteration  *20/" hung.log && break; sleep 0.1; done
stopped=$(pgrep -P "$launcher" | tail -1)
kill -STOP "$stopped"
start=$SECONDS
if wait "$launcher"; then fail "the job with a stopped rank exited 0"; fi
took=$((SECONDS - start))
kill -9 "$stopped" 2>/dev/null || true
grep -q "rank 1 (host .*pid $stopped) disconnected without leaving the job" hung.log || { cat hung.log; fail "the hung rank was not named"; }
(( took < 60 )) || fail "the job took $took s to stop after a rank hung"
echo "hung rank: the job stopped $took s after SIGSTOP"
echo PASS
