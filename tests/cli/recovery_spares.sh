#!/usr/bin/env bash
# Warm spares under in-job recovery (`troupe launch --in-job-recovery --spares 1`, docs/RESILIENCE.md)
# over two hosts (tests/cli/two_hosts.bash: network namespaces): nodes 0 (host0) and 1 (host1) run
# tp 2 x dp 2 with in-memory snapshots; the spare node 2 (its own launcher and snapshot folder, here in
# host1's namespace) starts its 2 processes at once, and they wait at the rendezvous with their data
# open. First rank 0's process -- the job's rendezvous with it -- is killed: the rendezvous moves to
# its standby, rank 2 on host1 ("The rendezvous moves"), node 0's launcher starts rank 0 again, which
# (the rendezvous having moved) joins as a spare, and a spare takes rank 0's place -- one of node
# 2's, or node 0's new one, whichever asks first -- while the other processes stay. Then node 1 is
# lost for good (its launcher and processes killed, its folder gone), the rendezvous's host with it:
# the rendezvous moves back to host0, to the standby rank 2's named, and the spares take ranks 2 and
# 3; the job -- now over nodes 0 and 2 -- finishes with the uninterrupted run's losses, bitwise. Rank
# 1's process stays the same throughout; a spare the job did not need ends well when it finishes;
# both launchers left end well; nothing is left in the namespaces or the tmpfs. Fixed seed.
# Needs root and iproute2; skips (77) where network namespaces cannot be created.
source "$(dirname "$0")/common.bash"
source "$(dirname "$0")/two_hosts.bash"

iters=600
model=("${host_model[@]}" --train-iters "$iters" --log-interval 50 --distributed-timeout-minutes 0.25 --seed 7)

# --- the uninterrupted run ---------------------------------------------------------------------------
launch_both ref --max-restarts 1 -- train "${model[@]}" --metrics-file "$work/ref.jsonl"
wait_both || { cat ref.*.log; fail "the uninterrupted run failed"; }

# --- nodes 0 and 1 and the spare node 2 ---------------------------------------------------------------
flags=(--nnodes 2 --spares 1 --master-addr host0 --nproc-per-node 2 --max-restarts 2 --in-job-recovery)
start_node() {  # HOST NODE_RANK
  on_host "$1" "$troupe" launch "${flags[@]}" --node-rank "$2" -- train "${model[@]}" --save-memory-interval 20 \
    --save-memory-dir "$shm/shm$2" --metrics-file "$work/sp.jsonl" > "sp.$2.log" 2>&1 &
  pids+=($!)
  node[$2]=$!
}
start_node 0 0
start_node 1 1
start_node 1 2
wait_for_iteration "$work/sp.jsonl" 60
spares_before=$(processes_of "${node[2]}")
(($(wc -w <<< "$spares_before") == 2)) || { cat sp.*.log; fail "the spare node did not start its 2 spares at once"; }
grep -q "a spare takes" sp.2.log && fail "a spare took a place before any failure"
wait_for_line sp.0.log "should this rendezvous be lost, rank 2 (host host1" 10 "rank 0's rendezvous named no standby on host1"
rank_pid() {  # NODE RANK: the pid of that node's process of RANK
  for p in $(processes_of "${node[$1]}"); do tr '\0' '\n' < "/proc/$p/environ" | grep -qx "TROUPE_RANK=$2" && echo "$p"; done
  true
}
rank1=$(rank_pid 0 1)
[[ -n $rank1 ]] || fail "node 0 runs no rank 1"

# Rank 0's process killed: the rendezvous moves to rank 2, a spare takes rank 0's place.
victim=$(rank_pid 0 0)
kill -9 "$victim"
struck=$(date +%s.%N)
lines=$(wc -l < "$work/sp.jsonl")
last=$(iteration_reached "$work/sp.jsonl")
taken() { cat sp.*.log 2> /dev/null | grep -c "troupe train: a spare takes the place of rank" || true; }
deadline=$((SECONDS + 60))
until (($(taken) == 1)); do
  ((SECONDS < deadline)) || { cat sp.*.log; show_stuck; fail "no spare took rank 0's place"; }
  sleep 0.02
done
deadline=$((SECONDS + 60))
until resumed_since "$work/sp.jsonl" "$lines" "$last"; do
  ((SECONDS < deadline)) || { cat sp.*.log; show_stuck; fail "the job did not train on after the spare took the place"; }
  sleep 0.02
done
first_recovery=$(echo "$(date +%s.%N) - $struck" | bc)
wait_for_line sp.0.log "this replacement joins the job as a spare" 30 "rank 0's replacement did not join as a spare"
# Who took the place: node 2's waiting spare, or node 0's replacement (a race: either is right).
grep -q "troupe train: a spare takes the place" sp.2.log && by="node 2's waiting spare" || by="node 0's replacement"
# Rank 2 hosts the rendezvous now; its standby is on host0 again.
wait_for_line sp.1.log "hosts the next at 10.77.0.1:" 10 "the rendezvous on host1 named no standby on host0"
[[ $(rank_pid 0 1) == "$rank1" ]] || fail "rank 1's process did not stay through the first recovery"

# Node 1 lost for good: its launcher paused, it and its processes killed, its folder gone.
wait_for_iteration "$work/sp.jsonl" 300
# node 2 holds the lost node's ranks at the end: both of its spares took a place (in either phase)
launcher=$(pgrep -P "${node[1]}")
kill -STOP "$launcher"
kill -9 $(pgrep -P "$launcher") "$launcher"
rm -rf "$shm/shm1"
wait "${node[1]}" 2> /dev/null || true
struck=$(date +%s.%N)
lines=$(wc -l < "$work/sp.jsonl")
last=$(iteration_reached "$work/sp.jsonl")
deadline=$((SECONDS + 60))
until (($(taken) == 3)) &&
      resumed_since "$work/sp.jsonl" "$lines" "$last"; do
  ((SECONDS < deadline)) || { cat sp.*.log; show_stuck; fail "the second spare did not take the lost node's rank"; }
  sleep 0.02
done
second_recovery=$(echo "$(date +%s.%N) - $struck" | bc)

rc=(0 0)
wait "${node[0]}" || rc[0]=$?
wait "${node[2]}" || rc[1]=$?
((rc[0] == 0 && rc[1] == 0)) || { cat sp.*.log; fail "node 0's launcher or the spare node's ended with ${rc[*]}"; }
cat sp.0.log sp.2.log | grep -q "finished at iteration $iters/$iters" || { cat sp.*.log; fail "the job did not finish"; }
[[ $(processes_of "${node[0]}") == "" ]] || fail "node 0's processes are still running"
# Survivors: ranks 1, 2, 3 at the first recovery, ranks 0 and 1 at the second.
cat sp.*.log | grep -c "recovering in the job" | grep -qx 5 ||
  { cat sp.*.log; fail "the survivors did not recover in the job 3 times, then 2"; }
cat sp.*.log | grep -q "restarted: resuming this run's in-memory snapshot" ||
  { cat sp.*.log; fail "the job did not resume its in-memory snapshot"; }
cat sp.*.log | grep -q "fetched from the other hosts" || { cat sp.*.log; fail "the spares' folder was not filled from the others'"; }
# A host fetches the shards its ranks read (metadata.json's "reads"), not the whole snapshot: ranks 2
# and 3 (dp rank 1 of tp 2 x dp 2, ZeRO-0) read dp rank 0's 2 shards only.
cat sp.*.log | grep -o "fetched from the other hosts .*" | sort | uniq -c
! cat sp.*.log | grep "fetched from the other hosts" | grep -qv "of 4 shards into node [0-9]'s folder (the shards its ranks read)" ||
  { cat sp.*.log; fail "a host fetched without the snapshot's list of the shards its ranks read"; }
! cat sp.*.log | grep -q "fetched from the other hosts.* [34] of 4 shards" || { cat sp.*.log; fail "a host fetched more than its ranks read"; }
same_losses "$work/ref.jsonl" "$work/sp.jsonl" || fail "with spares the losses differ from the uninterrupted run"
no_orphans || fail "processes left behind in the namespaces"
[[ -z $(ls -d "$shm"/shm*/troupe-memory-* 2> /dev/null) ]] || fail "a snapshot folder was left behind"
lost=$(iterations_lost "$work/sp.jsonl")
printf 'ok: rank 0 killed (the rendezvous moved) and replaced by %s in %.2f s (to the next trained iteration), a lost node (the rendezvous moved back) in %.2f s; iterations lost %s; rank 1 kept its process; the losses bitwise\n' \
  "$by" "$first_recovery" "$second_recovery" "$lost"
echo PASS
