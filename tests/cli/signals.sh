#!/usr/bin/env bash
# Signals (README, exit codes): SIGTERM behaves as SIGINT does -- the current iteration finishes, a
# checkpoint is saved with --save, and troupe train exits 143 (SIGTERM) or 130 (SIGINT); the saved
# checkpoint resumes to the uninterrupted run's losses. Megatron's --exit-duration-in-mins stops and
# saves the same way (exit 0) and --exit-signal-handler is accepted. Under troupe launch the
# processes agree on the iteration they stop after, even when only one of them got the signal, so
# the checkpoint is complete.
source "$(dirname "$0")/common.bash"
make_corpus

constant=(--lr-decay-style constant --lr-warmup-iters 0 --num-threads 1)
# small_train's model, run without a shell function in between (so that $! is troupe itself).
model=(--num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 32 --micro-batch-size 3
       --global-batch-size 6 --lr 3e-3 --data-path d_text_document --tokenizer-type ByteLevelTokenizer
       --eval-interval 1000 --log-interval 1000)
wait_iterations() {  # metrics file, count: waits until that many training lines are written
  local deadline=$((SECONDS + 60))
  until [[ -f $1 && $(grep -c '"type":"train"' "$1" 2>/dev/null || true) -ge $2 ]]; do
    ((SECONDS < deadline)) || fail "no $2 iterations in $1 within 60 s"
    sleep 0.1
  done
}
latest_of() { cat "$1/latest_checkpointed_iteration.txt"; }
last_iteration() { losses "$1" | tail -1 | cut -d' ' -f1; }

# --- SIGTERM and SIGINT in one process -------------------------------------------------------------
for sig in TERM INT; do
  want=$([[ $sig == TERM ]] && echo 143 || echo 130)
  "$troupe" train "${model[@]}" "${constant[@]}" --train-iters 100000 --save "ck_$sig" --metrics-file "$sig.jsonl" \
    > "$sig.log" 2>&1 &
  pid=$!
  wait_iterations "$sig.jsonl" 3
  kill -s "$sig" "$pid"
  rc=0
  wait "$pid" || rc=$?
  [[ $rc -eq $want ]] || { cat "$sig.log" >&2; fail "SIG$sig: exit $rc, want $want"; }
  grep -q "stopping after the current iteration and saving a checkpoint" "$sig.log" || fail "SIG$sig: no stop note"
  [[ $(latest_of "ck_$sig") == $(last_iteration "$sig.jsonl") ]] ||
    fail "SIG$sig: the checkpoint ($(latest_of "ck_$sig")) is not the last iteration ($(last_iteration "$sig.jsonl"))"
  echo "ok: SIG$sig -> exit $rc, saved iteration $(latest_of "ck_$sig")"
done

# The SIGTERM checkpoint resumes exactly: its iterations plus 3 more equal a straight run.
n=$(latest_of ck_TERM)
total=$((n + 3))
"$troupe" train "${model[@]}" "${constant[@]}" --train-iters "$total" --metrics-file straight.jsonl > /dev/null
"$troupe" train "${model[@]}" "${constant[@]}" --train-iters "$total" --load ck_TERM --save ck_TERM --metrics-file resumed.jsonl > resumed.log
losses straight.jsonl | tail -3 > a.txt
losses resumed.jsonl > b.txt
diff a.txt b.txt || fail "resuming the SIGTERM checkpoint differs from the straight run"

# --- --exit-duration-in-mins and --exit-signal-handler -----------------------------------------------
rc=0
"$troupe" train "${model[@]}" "${constant[@]}" --train-iters 100000 --save ck_dur --exit-duration-in-mins 0.03 --exit-signal-handler \
  --metrics-file dur.jsonl > dur.log 2>&1 || rc=$?
[[ $rc -eq 0 ]] || { cat dur.log >&2; fail "--exit-duration-in-mins: exit $rc, want 0"; }
grep -q "(stopped early)" dur.log || fail "--exit-duration-in-mins: the run did not stop early"
[[ $(latest_of ck_dur) == $(last_iteration dur.jsonl) ]] || fail "--exit-duration-in-mins: no checkpoint of the last iteration"

# --- under troupe launch: the processes stop after the same iteration --------------------------------
par=(--data-parallel-size 2 --global-batch-size 6 --micro-batch-size 3)
# The signal to the launcher, passed on to both ranks.
"$troupe" launch --nproc-per-node 2 -- train "${model[@]}" "${constant[@]}" "${par[@]}" --train-iters 100000 --save ck_launch --metrics-file launch.jsonl > launch.log 2>&1 &
launcher=$!
wait_iterations launch.jsonl 3
kill -TERM "$launcher"
rc=0
wait "$launcher" || rc=$?
[[ $rc -eq 143 ]] || { cat launch.log >&2; fail "launch SIGTERM: exit $rc, want 143"; }
"$troupe" ckpt info ck_launch > info.txt || { cat launch.log >&2; fail "launch SIGTERM: the checkpoint does not load"; }
[[ $(latest_of ck_launch) == $(last_iteration launch.jsonl) ]] || fail "launch SIGTERM: not the last iteration"

# The signal to one rank only (as when a node is preempted): both stop after the same iteration.
"$troupe" launch --nproc-per-node 2 -- train "${model[@]}" "${constant[@]}" "${par[@]}" --train-iters 100000 --save ck_one --metrics-file one.jsonl > one.log 2>&1 &
launcher=$!
wait_iterations one.jsonl 3
rank1=""
for child in $(pgrep -P "$launcher"); do
  if tr '\0' '\n' < "/proc/$child/environ" | grep -qx "RANK=1"; then rank1=$child; fi
done
[[ -n $rank1 ]] || fail "rank 1's process not found"
kill -TERM "$rank1"
wait "$launcher" || true
it=$(latest_of ck_one)
[[ -f ck_one/iter_$(printf %07d "$it")/metadata.json ]] || { cat one.log >&2; fail "one rank signalled: no complete checkpoint"; }
"$troupe" ckpt info ck_one > /dev/null || fail "one rank signalled: the checkpoint does not load"
echo "ok: one rank signalled, both stopped after iteration $it"
echo PASS
