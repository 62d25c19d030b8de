#!/usr/bin/env bash
# Several troupe launch nodes meeting at torchrun's --rdzv-endpoint, in a network namespace of this
# test's own (a veth pair with 10.79.0.1 and 10.79.0.2, so the master address is not loopback):
#   - --nnodes 3 with only nodes 0 and 1 started: rank 0 says every 10 s that rank 2 of node 2 has not
#     joined (no rank of that node has: start its launcher), and at the rendezvous timeout
#     (--rdzv-conf join_timeout) every started rank ends naming it;
#   - two launchers with different --rdzv-id: node 1's rank is refused, naming both ids, and rank 0
#     logs the refusal;
#   - the same --rdzv-id on both: the ranks meet (comm-check).
# Needs root and iproute2; skips (77) where a network namespace cannot be created.
source "$(dirname "$0")/common.bash"
[[ $(id -u) -eq 0 ]] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip > /dev/null || { echo "SKIP: no ip command (iproute2)"; exit 77; }

ns=troupe-rdzv-$$
veth=(trz$$a trz$$b)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  ip netns pids "$ns" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
  ip netns del "$ns" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if ! err=$(ip netns add "$ns" 2>&1); then
  echo "SKIP: cannot create a network namespace here (ip netns add: $err)"
  exit 77
fi
ip -n "$ns" link add "${veth[0]}" type veth peer name "${veth[1]}"
ip -n "$ns" addr add 10.79.0.1/24 dev "${veth[0]}"
ip -n "$ns" addr add 10.79.0.2/24 dev "${veth[1]}"
for v in "${veth[@]}" lo; do ip -n "$ns" link set "$v" up; done
export TROUPE_JOB_TOKEN=$("$troupe" launch --new-token)
in_ns() { ip netns exec "$ns" "$@"; }

# --- node 2 never starts --------------------------------------------------------------------------
for k in 0 1; do
  in_ns "$troupe" launch --nnodes 3 --node-rank "$k" --nproc-per-node 1 --rdzv-endpoint 10.79.0.1:29411 \
    --rdzv-conf join_timeout=14 -- comm-check > "miss.$k.log" 2>&1 &
  pids+=($!)
  node[k]=$!
done
for k in 0 1; do
  set +e
  wait "${node[k]}"
  rc=$?
  set -e
  [[ $rc -eq 1 ]] || { cat "miss.$k.log" >&2; fail "node $k's launcher exited $rc, want 1"; }
done
want="rank 2 of node 2 (no rank of it has joined: start its launcher, troupe launch --node-rank 2, or check that it reaches 10.79.0.1:29411)"
grep -F "waiting for 1 of 3 ranks to join" miss.0.log | grep -qF "$want" || { cat miss.0.log >&2; fail "rank 0 did not name rank 2 of node 2"; }
waiting=$(grep -n "waiting for 1 of 3 ranks" miss.0.log | head -1 | cut -d: -f1)
gave_up=$(grep -n "never joined the rendezvous" miss.0.log | head -1 | cut -d: -f1)
[[ $waiting -lt $gave_up ]] || { cat miss.0.log >&2; fail "the report came after the timeout"; }
grep -qF "1 of 3 ranks never joined the rendezvous at 10.79.0.1:29411 within 14 s: $want" miss.1.log ||
  { cat miss.1.log >&2; fail "node 1's rank was not told which rank never joined"; }
echo "ok: rank 0 named rank 2 of node 2 every 10 s, and the job ended at the rendezvous timeout"

# --- different --rdzv-id ------------------------------------------------------------------------------
in_ns "$troupe" launch --nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint 10.79.0.1:29412 --rdzv-id jobA \
  --rdzv-conf join_timeout=12 -- comm-check > id.0.log 2>&1 &
pids+=($!)
node0=$!
set +e
in_ns "$troupe" launch --nnodes 2 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint 10.79.0.1:29412 --rdzv-id jobB \
  --rdzv-conf join_timeout=12 -- comm-check > id.1.log 2>&1
rc1=$?
wait "$node0"
rc0=$?
set -e
[[ $rc1 -eq 1 && $rc0 -eq 1 ]] || { cat id.0.log id.1.log >&2; fail "different --rdzv-id: exits $rc0 and $rc1, want 1 and 1"; }
grep -qF "rank 1 was started with --rdzv-id 'jobB' but rank 0 with --rdzv-id 'jobA' -- every launcher of a job must give the same --rdzv-id" id.1.log ||
  { cat id.1.log >&2; fail "node 1's refusal does not name both ids"; }
grep -qF "its --rdzv-id 'jobB' is not rank 0's 'jobA'" id.0.log || { cat id.0.log >&2; fail "rank 0 did not log the refusal"; }
echo "ok: a rank with another --rdzv-id was refused, naming both"

# --- the same --rdzv-id: the ranks meet ------------------------------------------------------------------
for k in 0 1; do
  in_ns "$troupe" launch --nnodes 2:2 --node-rank "$k" --rdzv-backend c10d --rdzv-endpoint 10.79.0.1:29413 \
    --rdzv-id jobC -- comm-check > same.$k.log 2>&1 &
  pids+=($!)
  node[k]=$!
done
wait "${node[0]}" && wait "${node[1]}" || { cat same.0.log same.1.log >&2; fail "two nodes with one --rdzv-id did not meet"; }
grep -q "comm-check: all 2 rank(s) ok" same.0.log || { cat same.0.log >&2; fail "no final ok line"; }
echo "ok: two nodes with the same --rdzv-id met at --rdzv-endpoint"
echo PASS
