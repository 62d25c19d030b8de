#!/usr/bin/env bash
# In-job recovery whose restarts run out, over two hosts (tests/cli/two_hosts.bash: network
# namespaces): `troupe launch --in-job-recovery --max-restarts 1`, one rank per host, host1's rank killed and the job
# recovered, then host1's rank killed again. The job has spent its one recovery: every rank --
# host0's survivors and a replacement alike, which count the job's recoveries, not their own -- ends
# at this same failure saying so, with exit code 76, which no launcher restarts (host1's launcher,
# its restart spent, stops its own ranks as before). Both launchers fail
# within 30 s of the second kill (before, host0's rank ended with exit code 1, its launcher started it
# again, and as rank 0 it waited out the 600 s join timeout for host1's, which never came); nothing is
# left behind. Then the job started again by hand resumes from its checkpoint on disk and finishes.
# Last, two processes of one node killed in two sweeps of its launcher within one recovery: each
# process place has its own --max-restarts, so both come back and the job finishes. Fixed seed.
# Needs root and iproute2; skips (77) where network namespaces cannot be created.
source "$(dirname "$0")/common.bash"
source "$(dirname "$0")/two_hosts.bash"

# One rank per host (tp 2 over the hosts): host0's rank is rank 0, whose rendezvous a restarted
# process of it would hold open for the join timeout.
nproc_per_node=1
model=("${host_model[@]}" --train-iters 400 --log-interval 100 --distributed-timeout-minutes 0.25
       --save "$work/ck" --save-interval 20)
ranks_of() { pgrep -P "$(pgrep -P "${launchers[$1]}")" || true; }
for k in 0 1; do
  on_host "$k" "$troupe" launch --nnodes 2 --node-rank "$k" --master-addr host0 --nproc-per-node 1 --max-restarts 1 \
    --in-job-recovery -- train "${model[@]}" --save-memory-interval 10 --save-memory-dir "$shm/shm$k" --metrics-file "$work/m.jsonl" > "gu.$k.log" 2>&1 &
  pids+=($!)
  launchers[k]=$!
done
wait_for_iteration "$work/m.jsonl" 30
RANDOM=76
victims=($(ranks_of 1))
kill -9 "${victims[$((RANDOM % ${#victims[@]}))]}"
wait_for_line gu.1.log "in-job recovery 1 of 1: starting it again" 30 "host1's launcher did not start the killed rank again"
lines=$(grep -c '"type":"train"' "$work/m.jsonl")
deadline=$((SECONDS + 60))
until (($(grep -c '"type":"train"' "$work/m.jsonl") > lines + 5)); do
  ((SECONDS < deadline)) || { cat gu.*.log; show_stuck; fail "the job did not train on after the first recovery"; }
  sleep 0.05
done
# A checkpoint on disk to resume from at the end: the offload actor writes at nice 19, so on a busy
# machine (ctest -j) the save at iteration 20 may not have finished before the first kill, and
# the recovered job may not have finished one since.
wait_for_file "$work/ck/latest_checkpointed_iteration.txt"
victims=($(ranks_of 1))
kill -9 "${victims[$((RANDOM % ${#victims[@]}))]}"
struck=$SECONDS
rc=(0 0)
wait "${launchers[0]}" || rc[0]=$?
wait "${launchers[1]}" || rc[1]=$?
took=$((SECONDS - struck))
echo "both launchers ended $took s after the second kill (exit codes ${rc[0]} ${rc[1]})"
((took <= 30)) || { cat gu.*.log; fail "the launchers took $took s to end after host1 spent its restart (the join timeout?)"; }
((rc[0] != 0 && rc[1] != 0)) || { cat gu.*.log; fail "a launcher reported success for a job given up"; }
# host0's ranks (which would have rejoined and waited) end saying why, with 76; host1's launcher,
# whose restart is spent, stops its own.
grep -q "the job was given up: it failed again after 1 recovery(ies) in the job, the launch's --max-restarts" gu.0.log ||
  { cat gu.0.log; fail "host0's ranks did not say the job was given up, and why"; }
grep -q "exited with code 76" gu.0.log || { cat gu.0.log; fail "host0's launcher did not see exit code 76"; }
grep -q "not restarting: in-job recovery spent its 1 restart(s)" gu.1.log || { cat gu.1.log; fail "host1's launcher did not stop"; }
restarts=$(cat gu.*.log | grep -c "starting it again" || true)
((restarts == 1)) || { cat gu.*.log; fail "$restarts ranks were started again (only the first kill's should be)"; }
no_orphans || fail "processes left behind in the namespaces"
[[ -z $(ls -d "$shm"/shm*/troupe-memory-* 2> /dev/null) ]] || fail "a snapshot folder was left behind"

# Started again by hand, the job resumes from its latest checkpoint on disk and finishes.
saved=$(cat "$work/ck/latest_checkpointed_iteration.txt")
launch_both again --in-job-recovery --max-restarts 1 -- train "${model[@]}" --load "$work/ck" --metrics-file "$work/again.jsonl"
wait_both || { cat again.*.log; fail "the job started again after it was given up failed"; }
grep -q "finished at iteration 400/400" again.0.log || { cat again.0.log; fail "the job started again did not finish"; }
first=$(grep -m 1 '"type":"train"' "$work/again.jsonl" | grep -o '"iteration":[0-9]*' | cut -d: -f2)
((first == saved + 1)) || fail "the job started again resumed at iteration $first, not after its checkpoint $saved"
# Two processes of one node lost in two sweeps of its launcher within one recovery (the second
# killed before the job re-formed): each place is started again -- a launcher counts --max-restarts
# per process place, not per sweep (before 2026-12-07 its one restart went to the first, it stopped,
# and the job waited at its rendezvous for the join timeout) -- and the job, recovered once, finishes.
nproc_per_node=2
launch_both twice --in-job-recovery --max-restarts 1 -- train "${host_model[@]}" --train-iters 400 --log-interval 100 \
  --distributed-timeout-minutes 0.25 --save-memory-interval 10 --save-memory-dir "$shm/twice" --metrics-file "$work/twice.jsonl"
wait_for_iteration "$work/twice.jsonl" 30
victims=($(ranks_of 1))
((${#victims[@]} == 2)) || fail "host1 does not run 2 processes"
kill -9 "${victims[0]}"
sleep 0.05
kill -9 "${victims[1]}"
wait_both || { cat twice.*.log; fail "the job did not recover from two processes of one node lost in two sweeps"; }
grep -q "finished at iteration 400/400" twice.0.log || { cat twice.0.log; fail "the job did not finish"; }
restarts=$(grep -c "in-job recovery 1 of 1: starting it again" twice.1.log || true)
((restarts == 2)) || { cat twice.1.log; fail "$restarts of host1's 2 places were started again"; }
grep -q "spent its" twice.1.log && { cat twice.1.log; fail "host1's launcher spent its restarts"; }
echo "ok: host1's 2 processes killed 50 ms apart (two sweeps of its launcher), each started again; the job recovered once and finished"
echo PASS
