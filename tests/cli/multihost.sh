#!/usr/bin/env bash
# Two hosts on one machine (docs/COMM.md, "Several hosts"): network namespaces host0 and host1, each
# with its own hostname (a UTS namespace), a veth link and 10.77.0.x addresses, names in
# /etc/netns/<ns>/hosts. One `troupe launch --nnodes 2 --node-rank k --master-addr host0` per host:
#   - the ranks meet through MASTER_ADDR given as a hostname, each on its host;
#   - tp 2 x dp 2 across the hosts gives the in-process losses within 1e-5, and the data-parallel
#     gradients really cross the veth (its byte counter grows by at least their volume);
#   - troupe generate on tp 2 x pp 2 across the hosts prints what one process prints;
#   - train --auto-layout: rank 0 plans for both hosts once the ranks met, every rank runs its choice;
#   - rank 0 and UCX listen on host0's 10.77.0.1 only;
#   - in-memory snapshots (--save-memory-interval) over the hosts: each host's folder holds its
#     shards and the other host's copies; when host1 loses its memory with its ranks, the restart
#     refills its folder from host0's and resumes the snapshot with the uninterrupted losses;
#   - cutting the link mid-run (ip link set down) ends the job on both hosts within
#     --distributed-timeout-minutes with messages naming the unreachable host, and --max-restarts
#     resumes from the shared --save folder once the link is back, finishing every iteration with
#     the uninterrupted losses.
# Needs root and iproute2; skips (77) where network namespaces cannot be created.
source "$(dirname "$0")/common.bash"
source "$(dirname "$0")/two_hosts.bash"

# --- the ranks meet through a hostname, each on its own host --------------------------------------
launch_both check -- comm-check
wait_both || { cat check.*.log; fail "comm-check across the two hosts failed"; }
for r in 0 1; do grep -q "rank $r/4 on host host0" check.0.log || { cat check.0.log; fail "rank $r is not on host0"; }; done
for r in 2 3; do grep -q "rank $r/4 on host host1" check.0.log || { cat check.0.log; fail "rank $r is not on host1"; }; done
grep -q "comm-check: all 4 rank(s) ok" check.0.log || fail "comm-check did not pass"
echo "ok: 4 ranks on host0 and host1 met at MASTER_ADDR=host0"

# --- tp 2 x dp 2 across the hosts equals the in-process run --------------------------------------
model=("${host_model[@]}" --train-iters 600 --log-interval 200 --data-parallel-size 2)
"$troupe" train "${model[@]}" --metrics-file "$work/inproc.jsonl" --save "$work/ck_gen" > inproc.log 2>&1 ||
  { cat inproc.log; fail "in-process run failed"; }
tx0=$(tx_bytes)
launch_both two -- train "${model[@]}" --metrics-file "$work/two.jsonl"
listening=""
for _ in $(seq 1 100); do
  listening=$(ip netns exec "${ns[0]}" ss -ltnpH 2> /dev/null | grep troupe || true)
  [[ $(echo "$listening" | grep -c .) -ge 3 ]] && break  # the rendezvous and both ranks' UCX
  sleep 0.05
done
wait_both || { cat two.*.log; fail "the two-host training run failed"; }
tx1=$(tx_bytes)
python3 - "$work/inproc.jsonl" "$work/two.jsonl" <<'PY' || fail "two hosts differ from the in-process run"
import json, sys
def losses(path):
    return {j["iteration"]: j["lm_loss"] for j in map(json.loads, open(path)) if j.get("type") == "train"}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(a) == sorted(b) == list(range(1, 601)), "iterations differ"
worst = max(abs(a[i] - b[i]) for i in a)
print(f"ok: tp 2 x dp 2 over two hosts: 600 losses within {worst:.2e} of the in-process run")
assert worst <= 1e-5, worst
PY
# Every iteration all-reduces each host0 rank's gradient shard (its parameter bytes) with host1.
shard_mib=$(sed -n 's/.*rank 0 model states: parameters \([0-9.]*\) MiB.*/\1/p' two.0.log | head -1)
[[ -n "$shard_mib" ]] || fail "no parameter size in the log of host0"
moved=$((tx1 - tx0))
python3 -c "import sys; need = 0.5 * 600 * 2 * $shard_mib * 2**20; print(f'veth: {$moved} bytes sent by host0, gradients need >= {need:.0f}'); sys.exit(0 if $moved >= need else 1)" ||
  fail "the gradients did not cross the veth (shared memory between the namespaces?)"
[[ -n "$listening" ]] || fail "nothing of the job listened on host0"
echo "$listening" | awk '{print $4}' | while read -r local; do
  [[ "$local" == "${addr[0]}":* ]] || fail "host0 listens on $local, not on ${addr[0]} only"
done
echo "ok: host0 listens on ${addr[0]} only: $(echo "$listening" | awk '{print $4}' | tr '\n' ' ')"

# --- troupe generate on tp 2 x pp 2 over the two hosts (stage 0 on host0, stage 1 on host1): the
# bytes the same layout prints in one process, greedy and sampled ------------------------------------
gen=(--load "$work/ck_gen" --prompt "The " --prompt "Q: Why did the chicken" --tokens-to-generate 9 --no-stop-on-eod
     --json --num-threads 1 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)
for how in "--top-k 1" "--top-p 0.95 --temperature 1.3 --seed 7"; do
  read -r -a how_flags <<< "$how"
  "$troupe" generate "${gen[@]}" "${how_flags[@]}" > gen_inproc.jsonl 2> gen_inproc.err ||
    { cat gen_inproc.err; fail "generate in one process failed"; }
  launch_both gen -- generate "${gen[@]}" "${how_flags[@]}"
  wait_both || { cat gen.*.log; fail "generate over two hosts ($how) failed"; }
  grep '^{' gen.0.log > gen_two.jsonl || true
  cmp -s gen_inproc.jsonl gen_two.jsonl || { cat gen.0.log gen.1.log; fail "generate over two hosts ($how) printed other than one process"; }
  [[ ! -s gen.1.log ]] || grep -qv '^{' gen.1.log || fail "host1 printed a generation (only rank 0 prints)"
done
echo "ok: troupe generate on tp 2 x pp 2 over two hosts prints what one process prints, greedy and sampled"

# --- train --auto-layout over the two hosts: rank 0 plans for 2 hosts x 2 ranks once the ranks met
# (host0 measured), every rank takes its choice, and the job runs the layout the plan printed -----
auto=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --global-batch-size 8 --mock-data
      --tokenizer-type NullTokenizer --vocab-size 300 --log-interval 1 --train-iters 3 --num-threads 1 --auto-layout)
launch_both auto -- train "${auto[@]}"
wait_both || { cat auto.0.log auto.1.log; fail "--auto-layout over two hosts failed"; }
chosen=$(sed -n "s/.*auto-layout (troupe plan's model of this host[^)]*): tp \([0-9]*\), pp \([0-9]*\), dp \([0-9]*\),.*/\1 \2 \3/p" auto.0.log)
[[ $(echo "$chosen" | grep -c .) == 1 ]] || { cat auto.0.log; fail "rank 0 did not print one auto-layout choice"; }
read -r tp pp dp <<< "$chosen"
(( tp * pp * dp == 4 )) || fail "the choice tp $tp pp $pp dp $dp is not 4 ranks"
grep -q "layout tp $tp, pp $pp, dp $dp" auto.0.log || { cat auto.0.log; fail "the job did not run the chosen layout"; }
grep -q "finished at iteration 3/3" auto.0.log || { cat auto.0.log; fail "--auto-layout over two hosts did not train"; }
! grep -q "auto-layout (troupe plan" auto.1.log || { cat auto.1.log; fail "host1 planned too"; }
echo "ok: --auto-layout over two hosts: rank 0 chose tp $tp, pp $pp, dp $dp and every rank trained it"

# --- namespaces that share one hostname (containers often do) are still two hosts ------------------
# Troupe's same-host shared memory must not bridge them: the gradients still cross the veth.
tx2=$(tx_bytes)
for k in 0 1; do
  ip netns exec "${ns[k]}" "$troupe" launch --nnodes 2 --node-rank "$k" --master-addr host0 --nproc-per-node 2 \
    -- train "${model[@]}" --train-iters 50 --metrics-file "$work/shared.jsonl" > "shared.$k.log" 2>&1 &
  pids+=($!)
  launchers[k]=$!
done
wait_both || { cat shared.*.log; fail "the run on two namespaces with one hostname failed"; }
moved=$(($(tx_bytes) - tx2))
python3 -c "import sys; need = 0.5 * 50 * 2 * $shard_mib * 2**20; print(f'one hostname: {$moved} bytes over the veth, gradients need >= {need:.0f}'); sys.exit(0 if $moved >= need else 1)" ||
  fail "with one hostname the gradients did not cross the veth (troupe's shared memory bridged the namespaces)"

# --- in-memory snapshots over the two hosts: each host's folder holds its own shards and copies of
# the other host's; host1's memory is lost with its ranks (a host that rebooted): the restarted job
# refills host1's folder from host0's copies and resumes the snapshot with the uninterrupted losses --
mem_launch=()
for k in 0 1; do
  on_host "$k" "$troupe" launch --nnodes 2 --node-rank "$k" --master-addr host0 --nproc-per-node 2 --max-restarts 1 \
    -- train "${model[@]}" --save-memory-interval 50 --save-memory-dir "$shm/shm$k" \
    --metrics-file "$work/mem.jsonl" > "mem.$k.log" 2>&1 &
  pids+=($!)
  launchers[k]=$!
done
snapshot_at() { cat "$shm"/shm"$1"/troupe-memory-*/latest_checkpointed_iteration.txt 2> /dev/null || echo 0; }
for _ in $(seq 1 600); do
  (($(snapshot_at 0) >= 150 && $(snapshot_at 1) >= 150)) && break
  sleep 0.05
done
(($(snapshot_at 1) >= 150)) || { cat mem.*.log; fail "no in-memory snapshot of iteration 150 on both hosts"; }
for k in 0 1; do
  folder=$(echo "$shm"/shm"$k"/troupe-memory-*)
  it=$(cat "$folder/latest_checkpointed_iteration.txt")
  held=$(ls "$folder/iter_$(printf %07d "$it")" | grep -c '^shard_0000[0-3].h5$')
  ((held == 4)) || { ls -R "$folder"; fail "host$k's folder holds $held of the 4 shards of snapshot $it (own 2, the other host's 2)"; }
done
echo "ok: each host's snapshot folder holds its own 2 shards and the other host's 2"
launcher1=$(pgrep -P "${launchers[1]}")  # on_host runs in a subshell: the launcher is its child
kill -STOP "$launcher1"  # host1 goes down: its launcher paused, one rank killed, the other ends
ranks1=$(pgrep -P "$launcher1" | tr '\n' ' ')
kill -9 $(echo "$ranks1" | awk '{print $1}')
for _ in $(seq 1 400); do
  alive=0
  for p in $ranks1; do [[ $(awk '{print $3}' "/proc/$p/stat" 2> /dev/null || echo Z) != Z ]] && alive=1; done
  ((alive == 0)) && break
  sleep 0.05
done
((alive == 0)) || { cat mem.*.log; fail "host1's other rank did not end after its peer was killed"; }
lost=$(cat "$shm"/shm1/troupe-memory-*/latest_checkpointed_iteration.txt)
rm -rf "$shm"/shm1/troupe-memory-*/iter_* "$shm"/shm1/troupe-memory-*/latest_checkpointed_iteration.txt
kill -CONT "$launcher1"
wait_both || { tail -n 30 mem.*.log; fail "the job did not resume after host1 lost its memory"; }
grep -q "finished at iteration 600/600" mem.0.log || { cat mem.0.log; fail "the resumed job did not finish"; }
# tp 2 x dp 2, ZeRO-0: host1's ranks (dp rank 1) read dp rank 0's shards, which hold the replicated
# state; their own hold nothing they read (metadata.json's "reads"), so host1 fetches 2 of the 4.
grep -q "snapshot of iteration $lost is whole over the job's 2 hosts; fetched from the other hosts 2 of 4 shards into node 1's folder (the shards its ranks read)" mem.0.log ||
  { cat mem.0.log; fail "host1 did not fetch the shards its ranks read of the lost snapshot from host0"; }
grep -q "restarted: resuming this run's in-memory snapshot of iteration $lost" mem.0.log ||
  { cat mem.0.log; fail "the restarted job did not resume the in-memory snapshot of iteration $lost"; }
! grep -q "is not on a tmpfs" mem.0.log mem.1.log || fail "a folder of /dev/shm was taken for a disk"
same_losses "$work/two.jsonl" "$work/mem.jsonl" || fail "the resumed run's losses differ from the uninterrupted run"
echo "ok: host1's snapshot folder lost with its ranks: refilled from host0's copies, resumed iteration $lost, 600/600 with the uninterrupted losses"

# --- a link cut mid-run: the job ends naming the unreachable host; --max-restarts resumes ---------
launch_both cut --max-restarts 1 -- train "${model[@]}" --save "$work/ck" --save-interval 100 \
  --distributed-timeout-minutes 0.25 --metrics-file "$work/cut.jsonl"
for _ in $(seq 1 300); do
  [[ -f ck/latest_checkpointed_iteration.txt ]] && (( $(cat ck/latest_checkpointed_iteration.txt) >= 100 )) && break
  sleep 0.05
done
[[ -f ck/latest_checkpointed_iteration.txt ]] || { cat cut.*.log; fail "no checkpoint before the cut"; }
ip -n "${ns[0]}" link set "${veth[0]}" down
cut_at=$SECONDS
until grep -q "restart 1 of 1" cut.0.log && grep -q "restart 1 of 1" cut.1.log; do
  ((SECONDS - cut_at <= 40)) || { cat cut.*.log; fail "the job did not end within 40 s of the link cut"; }
  sleep 0.1
done
took=$((SECONDS - cut_at))
ip -n "${ns[0]}" link set "${veth[0]}" up
((took <= 15)) || { cat cut.*.log; fail "the job took $took s to end after the cut, more than --distributed-timeout-minutes 0.25"; }
grep -q "rank [23] (host host1, pid [0-9]*) disconnected without leaving the job" cut.0.log ||
  { cat cut.0.log; fail "host0 did not name the unreachable host1"; }
grep -q "lost the rendezvous on rank 0 at host0:" cut.1.log || { cat cut.1.log; fail "host1 did not name host0"; }
wait_both || { cat cut.*.log; fail "the job did not resume after the link came back"; }
grep -q "finished at iteration 600/600" cut.0.log || { cat cut.0.log; fail "the resumed job did not finish"; }
grep -q "loaded $work/ck/iter_" cut.0.log || fail "the restarted job did not resume from the checkpoint"
same_losses "$work/two.jsonl" "$work/cut.jsonl" || fail "the resumed run's losses differ from the uninterrupted run"
echo "ok: link cut ended the job on both hosts in $took s naming the other host; resumed and finished 600/600 with the uninterrupted losses"
echo PASS
