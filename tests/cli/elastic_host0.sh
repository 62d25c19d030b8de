#!/usr/bin/env bash
# Node 0's host lost in an elastic job (troupe launch --nnodes MIN:MAX, docs/RESILIENCE.md "Elastic:
# the rounds' host moves") over two hosts (tests/cli/two_hosts.bash: network namespaces): node 0 on
# host0, nodes 1 and 2 on host1, one process each (dp 3) with in-memory snapshots. Node 0's launcher
# hosts the rounds and names its standby: node 1, the lowest node on another host. Host0 is lost
# whole -- its link down first (nothing closes a connection), then every process on it, launcher
# included, and its snapshot folder. Node 1's launcher hears nothing from node 0 for 5 s and hosts
# the rounds at its own place, taking over the round number and the job's run; node 2's launcher
# finds it there; the next round -- nodes 1 and 2, more than half of round 0's three -- trains on as
# dp 2 with the same global batch, resumed from the in-memory snapshot on host1 (node 0's shards from
# their copies), and finishes with the losses of the uninterrupted single-process run within 1e-5,
# every iteration trained. Then host0 comes back: node 0's launcher, started again, hears from node 1's
# where the rounds are and joins them (not a job of its own); round 2 is all three again. Fixed seed. Needs root and iproute2; skips (77) where network namespaces
# cannot be created.
source "$(dirname "$0")/common.bash"
source "$(dirname "$0")/two_hosts.bash"

iters=320
# GPT-2 of 2 layers, hidden 48, global batch 12 of 1-sample micro-batches of 64 tokens: dp 3 x 4 steps,
# dp 2 x 6, dp 1 x 12 (a step long enough for node 0's return to be taken in before the end).
model=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 64 --micro-batch-size 1
       --global-batch-size 12 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 3
       --data-path "$work/d_text_document" --tokenizer-type ByteLevelTokenizer --eval-interval 100000
       --num-threads 1 --train-iters "$iters" --log-interval 40 --use-distributed-optimizer
       --distributed-timeout-minutes 0.25 --seed 11)

# --- the uninterrupted run: one process (dp 1) ---------------------------------------------------------
"$troupe" train "${model[@]}" --metrics-file "$work/ref.jsonl" > ref.log 2>&1 || { cat ref.log; fail "the reference run failed"; }

# --- nodes 0 (host0), 1 and 2 (host1) ------------------------------------------------------------------
elastic=(--nnodes 1:3 --master-addr host0 --nproc-per-node 1 --max-restarts 2 --rdzv-conf last_call_timeout=2)
start_node() {  # HOST NODE_RANK
  on_host "$1" "$troupe" launch "${elastic[@]}" --node-rank "$2" -- train "${model[@]}" --save-memory-interval 20 \
    --save-memory-dir "$shm/shm$2" --metrics-file "$work/el.jsonl" > "el.$2.log" 2>&1 &
  pids+=($!)
  node[$2]=$!
}
start_node 0 0
start_node 1 1
start_node 1 2
wait_for_line el.0.log "round 0: 3 of 1..3 node(s), node ranks 0, 1, 2; this node is node 0" 60 "round 0 was not all three nodes"
wait_for_line el.0.log "round 0: should this launcher be lost, node 1 hosts the rounds at 10.77.0.2:29500" 5 \
  "node 0 named no standby on host1"
wait_for_line el.1.log "round 0: this launcher is the standby: should the rounds' host be lost, it hosts them at 10.77.0.2:29500" \
  5 "node 1 did not hear that it is the standby"
wait_for_iteration "$work/el.jsonl" 70

# Host0 lost: its link down, then everything on it killed, its snapshot folder gone.
ip -n "${ns[0]}" link set "${veth[0]}" down
struck=$(date +%s.%N)
last=$(iteration_reached "$work/el.jsonl")
lines=$(wc -l < "$work/el.jsonl")
ip netns pids "${ns[0]}" | xargs -r kill -9
rm -rf "$shm/shm0"
wait "${node[0]}" 2> /dev/null || true
wait_for_line el.1.log "hosting the rounds of the job from now on at 10.77.0.2:29500 (this launcher, --node-rank 1, is the standby of round 0)" \
  60 "node 1 did not take over the rounds"
wait_for_line el.1.log "round 1: 2 of 1..3 node(s), node ranks 1, 2; this launcher (--node-rank 1) hosts the rounds and is node 0" \
  30 "no round of nodes 1 and 2"
# Host0 comes back (its link up, node 0's launcher started again): told by node 1's launcher where the
# rounds are, it joins them instead of starting a job of its own; the round running stops at its next
# snapshot and the next takes node 0 in.
ip -n "${ns[0]}" link set "${veth[0]}" up
start_back() {
  on_host 0 "$troupe" launch "${elastic[@]}" --node-rank 0 -- train "${model[@]}" --save-memory-interval 20 \
    --save-memory-dir "$shm/shm0" --metrics-file "$work/el.jsonl" > el.back.log 2>&1 &
  pids+=($!)
  node[3]=$!
}
start_back
until resumed_since "$work/el.jsonl" "$lines" "$last"; do
  (($(echo "$(date +%s.%N) - $struck < 120" | bc))) || { cat el.*.log; show_stuck; fail "the job did not train again"; }
  sleep 0.05
done
took=$(echo "$(date +%s.%N) - $struck" | bc)
wait "${node[1]}" || { cat el.1.log; fail "node 1's launcher failed"; }
wait "${node[2]}" || { cat el.2.log; fail "node 2's launcher failed"; }
wait "${node[3]}" || { cat el.back.log; fail "node 0's second launcher failed"; }
grep -q "the job's rounds are hosted at 10.77.0.2:29500 (node 0's standby took them over when node 0 was lost; its last round 1): this launcher joins there as --node-rank 0" \
  el.back.log || { cat el.back.log; fail "node 0's second launcher did not follow the rounds to host1"; }
grep -q "a node asks to join: the ranks stop at the job's next snapshot" el.1.log ||
  { cat el.1.log; fail "node 1's launcher did not take node 0 in"; }
stopped=$(grep -oE "stopped at iteration [0-9]+ for a node that asks to join" el.1.log | grep -oE "[0-9]+" | head -n 1)
[[ -n $stopped ]] && ((stopped % 20 == 0 && stopped < iters)) ||
  { cat el.1.log; fail "round 1 did not stop at a snapshot for node 0: ${stopped:-never}"; }
grep -q "round 2: 3 of 1..3 node(s), node ranks 1, 0, 2; this launcher (--node-rank 1) hosts the rounds" el.1.log ||
  { cat el.1.log; fail "round 2 was not all three nodes"; }
grep -q "round 2: node 1 of 3 (this launcher's --node-rank 0)" el.back.log || { cat el.back.log; fail "node 0 was not node 1 of round 2"; }
[[ $(grep -c "x 4 accumulation steps x 3 data-parallel = global 12" el.1.log) == 1 ]] ||
  { cat el.1.log; fail "round 2 was not dp 3"; }
grep -q "the rounds are hosted at 10.77.0.2:29500 now (the standby's place)" el.2.log ||
  { cat el.2.log; fail "node 2 did not find the rounds at the standby's place"; }
grep -q "round 1: node 1 of 2 (this launcher's --node-rank 2)" el.2.log || { cat el.2.log; fail "node 2 was not node 1 of round 1"; }
grep -q "finished at iteration $iters/$iters" el.1.log || { cat el.1.log; fail "the job did not finish"; }
grep -q "x 4 accumulation steps x 3 data-parallel = global 12" el.0.log || { cat el.0.log; fail "round 0 was not dp 3"; }
grep -q "x 6 accumulation steps x 2 data-parallel = global 12" el.1.log || { cat el.1.log; fail "round 1 was not dp 2"; }
# The job's run went on: the snapshot of node 0's run, not a fresh start.
resumed=$(grep -oE "restarted: resuming this run's in-memory snapshot of iteration [0-9]+" el.1.log | head -n 1 | grep -oE "[0-9]+$")
[[ -n $resumed ]] && ((resumed >= last - 40 && resumed <= last)) ||
  { cat el.1.log; fail "round 1 did not resume the in-memory snapshot before iteration $last: ${resumed:-none}"; }
close_losses "$work/ref.jsonl" "$work/el.jsonl" || fail "the losses differ from the uninterrupted run's"
[[ -z $(ls -d "$shm"/shm*/troupe-memory-* 2> /dev/null) ]] || fail "a snapshot folder was left behind"
no_orphans || fail "processes were left in the namespaces"
echo "ok: host0 lost after iteration $last; node 1 hosted the rounds; trained again $(printf %.2f "$took") s later from the snapshot of iteration $resumed (dp 2); node 0 back: round 1 stopped at $stopped, round 2 of all three (dp 3); the losses of the uninterrupted run"
echo PASS
