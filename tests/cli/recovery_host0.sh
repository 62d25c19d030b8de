#!/usr/bin/env bash
# Node 0's host lost under in-job recovery with warm spares (docs/RESILIENCE.md, "The rendezvous
# moves"), over two hosts (tests/cli/two_hosts.bash: network namespaces): nodes 0 (host0) and 1
# (host1) run tp 2 x dp 2 with in-memory snapshots, the spare node 2 (its own launcher and folder,
# in host1's namespace) waits with its 2 processes. Rank 0's process hosts the job's rendezvous.
# First host0 is lost whole: its network first (nothing closes a connection: the others find out by
# the heartbeat), then every process on it, launcher included, and its snapshot folder. The
# rendezvous's standby -- rank 2, the lowest rank on another host -- hosts the next generation on
# host1, node 2's spares take ranks 0 and 1. Then the rendezvous's process, rank 2, is killed: the
# new standby -- every rank is on host1 now, so the lowest other one, rank 0 (node 2's former spare)
# -- hosts the next at the master's port, and the spare node 1's launcher starts in rank 2's stead
# finds it from its node's hint file and takes rank 2's place. The job finishes with the
# uninterrupted run's losses, bitwise; rank 3's process stays the same throughout; both launchers
# left end well; nothing is left in the namespaces or the tmpfs. Fixed seed.
# Needs root and iproute2; skips (77) where network namespaces cannot be created.
source "$(dirname "$0")/common.bash"
source "$(dirname "$0")/two_hosts.bash"

iters=300
model=("${host_model[@]}" --train-iters "$iters" --log-interval 50 --distributed-timeout-minutes 0.25 --seed 7)

# --- the uninterrupted run ---------------------------------------------------------------------------
launch_both ref --max-restarts 1 -- train "${model[@]}" --metrics-file "$work/ref.jsonl"
wait_both || { cat ref.*.log; fail "the uninterrupted run failed"; }

# --- nodes 0 and 1 and the spare node 2 ---------------------------------------------------------------
flags=(--nnodes 2 --spares 1 --master-addr host0 --nproc-per-node 2 --max-restarts 2 --in-job-recovery)
start_node() {  # HOST NODE_RANK
  on_host "$1" "$troupe" launch "${flags[@]}" --node-rank "$2" -- train "${model[@]}" --save-memory-interval 20 \
    --save-memory-dir "$shm/shm$2" --metrics-file "$work/h0.jsonl" > "h0.$2.log" 2>&1 &
  pids+=($!)
  node[$2]=$!
}
start_node 0 0
start_node 1 1
start_node 1 2
wait_for_iteration "$work/h0.jsonl" 90
# The rendezvous named its standby: rank 2, on host1, at the port after the master's.
wait_for_line h0.0.log "should this rendezvous be lost, rank 2 (host host1" 10 "rank 0's rendezvous named no standby on host1"
node1_ranks=$(processes_of "${node[1]}")
# Each node's hint file (the launcher's, TROUPE_RDZV_HINT): host0's goes with it, node 1's launcher removes its own.
hint_of() { tr '\0' '\n' < "/proc/$(head -n 1 <<< "$(processes_of "$1")")/environ" | sed -n 's/^TROUPE_RDZV_HINT=//p'; }
hint0=$(hint_of "${node[0]}")
hint1=$(hint_of "${node[1]}")
[[ -n $hint0 && -n $hint1 && $hint0 != "$hint1" ]] || fail "the launchers gave their processes no hint files of their own"
grep -q "^standby 10.77.0.2 " "$hint1" || { cat "$hint1"; fail "node 1's hint file does not name the standby on host1"; }

# Host0 lost: its link down (no connection is closed), then everything on it killed, its folder gone.
ip -n "${ns[0]}" link set "${veth[0]}" down
struck=$(date +%s.%N)
ip netns pids "${ns[0]}" | xargs -r kill -9
rm -rf "$shm/shm0" "$hint0"
wait "${node[0]}" 2> /dev/null || true
lines=$(wc -l < "$work/h0.jsonl")
last=$(iteration_reached "$work/h0.jsonl")
deadline=$((SECONDS + 90))
until (($(grep -c "troupe train: a spare takes the place of rank" h0.2.log) == 2)) &&
      resumed_since "$work/h0.jsonl" "$lines" "$last"; do
  ((SECONDS < deadline)) || { cat h0.*.log; show_stuck; fail "the spares did not take host0's ranks and train on"; }
  sleep 0.05
done
recovery=$(echo "$(date +%s.%N) - $struck" | bc)
[[ $(processes_of "${node[1]}") == "$node1_ranks" ]] || fail "node 1's processes did not stay through the recovery"
wait_for_line h0.1.log "should this rendezvous be lost, rank 0" 10 "the rendezvous on host1 named no standby"

# The rendezvous's process (rank 2, node 1's local rank 0) killed on a live host: it moves again.
wait_for_iteration "$work/h0.jsonl" 180
rank_pid() { for p in $node1_ranks; do tr '\0' '\n' < "/proc/$p/environ" | grep -qx "TROUPE_RANK=$1" && echo "$p"; done; true; }
rank3=$(rank_pid 3)
owner=$(rank_pid 2)
[[ -n $rank3 && -n $owner ]] || fail "node 1's processes are not ranks 2 and 3"
kill -9 "$owner"
struck=$(date +%s.%N)
lines=$(wc -l < "$work/h0.jsonl")
last=$(iteration_reached "$work/h0.jsonl")
deadline=$((SECONDS + 60))
until (($(grep -c "troupe train: a spare takes the place of rank 2" h0.1.log) == 1)) &&
      resumed_since "$work/h0.jsonl" "$lines" "$last"; do
  ((SECONDS < deadline)) || { cat h0.*.log; show_stuck; fail "node 1's new spare did not take rank 2's place"; }
  sleep 0.05
done
second=$(echo "$(date +%s.%N) - $struck" | bc)
grep -q "local rank 0 (pid $owner)" h0.1.log || { cat h0.1.log; fail "node 1's launcher did not start a spare for rank 2"; }
processes_of "${node[1]}" | grep -qx "$rank3" || fail "rank 3's process did not stay through the second recovery"

rc=(0 0)
wait "${node[1]}" || rc[0]=$?
wait "${node[2]}" || rc[1]=$?
((rc[0] == 0 && rc[1] == 0)) || { cat h0.*.log; fail "node 1's launcher or the spare node's ended with ${rc[*]}"; }
cat h0.1.log h0.2.log | grep -q "finished at iteration $iters/$iters" || { cat h0.*.log; fail "the job did not finish"; }
grep -c "recovering in the job" h0.1.log | grep -qx 3 ||
  { cat h0.1.log; fail "node 1's processes did not recover in the job 3 times (2, then rank 3)"; }
# Rank 2 hosted the next generation, at host1's address.
grep -q "hosts the next at 10.77.0.2:" h0.1.log h0.2.log ||
  { cat h0.*.log; fail "the new rendezvous on host1 named no next standby"; }
grep -q "restarted: resuming this run's in-memory snapshot" h0.1.log h0.2.log ||
  { cat h0.*.log; fail "the job did not resume its in-memory snapshot"; }
grep -q "fetched from the other hosts" h0.1.log h0.2.log || { cat h0.*.log; fail "the spares' folder was not filled from the others'"; }
same_losses "$work/ref.jsonl" "$work/h0.jsonl" || fail "after host0's loss the losses differ from the uninterrupted run"
no_orphans || fail "processes left behind in the namespaces"
[[ -z $(ls -d "$shm"/shm*/troupe-memory-* 2> /dev/null) ]] || fail "a snapshot folder was left behind"
[[ ! -e $hint1 ]] || fail "node 1's launcher left its rendezvous hint behind"
lost=$(iterations_lost "$work/h0.jsonl")
printf 'ok: host0 lost (rank 0 and the rendezvous with it): the job trained on %.2f s later on host1 (heartbeat 5 s), the spares in ranks 0 and 1; the rendezvous process killed: %.2f s; iterations lost %s; the losses bitwise\n' \
  "$recovery" "$second" "$lost"
echo PASS
