#!/usr/bin/env bash
# The inspector's flight and stacks (docs/INSPECT.md) on a running tp 2 x pp 2 job, in one process
# (the local fabric) and under troupe launch --nproc-per-node 4 (UCX, one rank per process):
# `flight` gives every rank's last operations, and every member of a group numbers the group's
# collectives alike (the same seq has the same kind and bytes on all of them); `flight 2 --last 5`
# only rank 2's last 5; `stacks` every process, each with threads that answered with frames, some
# naming troupe's own functions. Then a stuck rank (TROUPE_FAULT_HANG=rank1@3): the stall file holds
# the flight records, where rank 0 waits in a tensor-parallel all-reduce its partner rank 1 never
# reached, and the process's stacks.
source "$(dirname "$0")/common.bash"
model=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
       --global-batch-size 6 --mock-data --tokenizer-type ByteLevelTokenizer --log-interval 1000
       --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)

# check_job NAME PROCESSES [LAUNCH...]: a running job started by `troupe [LAUNCH...] train`.
check_job() {
  local name=$1 processes=$2
  shift 2
  "$troupe" "$@" train "${model[@]}" --train-iters 100000 --inspect 0 --inspect-file "$work/$name.json" > "$name.log" 2>&1 &
  job=$!
  kill_on_exit $job "$work/$name.json"
  wait_for_file "$name.json"
  # A few steps in: every group has recorded collectives.
  for _ in $(seq 1 100); do
    "$troupe" inspect "$name.json" --exec status --json > "${name}_status.json" 2>/dev/null &&
      python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['iteration'] >= 2 else 1)" \
        "${name}_status.json" 2>/dev/null && break
    sleep 0.2
  done
  "$troupe" inspect "$name.json" --exec flight --json > "${name}_flight.json" || { cat "$name.log"; fail "$name: flight failed"; }
  "$troupe" inspect "$name.json" --exec "flight 2 --last 5" --json > "${name}_flight2.json" || fail "$name: flight 2 failed"
  "$troupe" inspect "$name.json" --exec stacks --json > "${name}_stacks.json" || fail "$name: stacks failed"
  "$troupe" inspect "$name.json" --exec "flight 1 --last 3" > "${name}_flight1.txt" || fail "$name: flight for people failed"
  "$troupe" inspect "$name.json" --exec stacks > "${name}_stacks.txt" || fail "$name: stacks for people failed"
  set +e
  "$troupe" inspect "$name.json" --exec "flight 9" > "${name}_flight9.txt" 2>&1
  local rc9=$?
  set -e
  python3 - "${name}_flight.json" "${name}_flight2.json" "${name}_stacks.json" "$processes" <<'PY' ||
import json, sys
from collections import defaultdict
flight, two, stacks = (json.load(open(f)) for f in sys.argv[1:4])
processes = int(sys.argv[4])
assert "unreachable" not in flight and "unreachable" not in stacks, (flight.get("unreachable"), stacks.get("unreachable"))
ranks = {r["rank"]: r for r in flight["ranks"]}
assert sorted(ranks) == [0, 1, 2, 3], ranks.keys()
# Each collective as every member recorded it: (group, members, seq) -> {rank: (kind, bytes, dtype)}.
seen = defaultdict(dict)
groups = set()
sends, recvs = {}, {}
for r, rec in ranks.items():
    assert rec["capacity"] == 256 and rec["recorded"] >= len(rec["ops"]) > 0, rec["recorded"]
    ids = [op["id"] for op in rec["ops"]]
    assert ids == sorted(ids) and ids[-1] == rec["recorded"] - 1, "ops not the newest, oldest first"
    for op in rec["ops"]:
        assert r in op["members"], op
        assert op["state"] in ("scheduled", "started", "completed", "failed"), op
        assert op["state"] != "failed", op
        if op["kind"] in ("send", "recv"):
            assert op["peer"] in op["members"] and op["peer"] != r and op["tag"] is not None, op
            if op["kind"] == "send":
                sends[(r, op["peer"], op["seq"])] = (op["tag"], op["bytes"])
            else:
                recvs[(op["peer"], r, op["seq"])] = (op["tag"], op["bytes"])
            continue
        groups.add(op["group"])
        seen[(op["group"], tuple(op["members"]), op["seq"])][r] = (op["kind"], op["bytes"], op["dtype"])
assert {"tp", "world", "embedding"} <= groups, groups
complete = 0
for key, by_rank in seen.items():
    assert len(set(by_rank.values())) == 1, ("members disagree", key, by_rank)
    complete += len(by_rank) == len(key[1])
assert complete >= 20, f"only {complete} collectives seen by all their members"
# The k-th send of a to b is b's k-th receive from a (the schedule posts them in the same order).
# Under launch the processes' rings are copied one after the other, tens of milliseconds apart (a
# TLS connection each), and the sends and receives of the same seq may no longer overlap.
pairs = [k for k in sends if k in recvs]
assert (len(pairs) >= 10 or processes > 1) and all(sends[k] == recvs[k] for k in pairs), [(k, sends[k], recvs[k]) for k in pairs if sends[k] != recvs[k]] or (len(sends), len(recvs))
# tp's all-reduces carry the activations: (micro-batch 3, seq 32, hidden 48) floats.
assert any(k[0] == "tp" and v == ("all_reduce", 3 * 32 * 48 * 4, "f32") for k, by in seen.items() for v in by.values())
assert [r["rank"] for r in two["ranks"]] == [2] and 1 <= len(two["ranks"][0]["ops"]) <= 5, two
procs = stacks["processes"]
assert len(procs) == processes, [p["pid"] for p in procs]
assert sorted(r for p in procs for r in p["ranks"]) == [0, 1, 2, 3], procs
named = False
for p in procs:
    assert p["signal"] > 0 and "error" not in p, p.get("error")
    answered = [t for t in p["threads"] if t["answered"]]
    assert len(answered) >= 1 and all(t["frames"] for t in answered), p["pid"]
    assert sum(t["caller"] for t in p["threads"]) == 1
    named = named or any((f["function"] or "").startswith("troupe::") for t in answered for f in t["frames"])
assert named, "no frame names a troupe function (is troupe linked with -rdynamic?)"
print(f"ok: flight of 4 ranks ({complete} collectives agreed on by all members, {len(pairs)} send/recv pairs), flight 2, stacks of {len(procs)} process(es)")
PY
    { cat "$name.log"; fail "$name: flight or stacks is not what docs/INSPECT.md says"; }
  grep -Eq "^rank 1: [0-9]+ operations recorded, the last 3:" "${name}_flight1.txt" &&
    (( $(grep -c "^  [a-z]* \[[0-9, ]*\] seq [0-9]* " "${name}_flight1.txt") == 3 )) ||
    { cat "${name}_flight1.txt"; fail "$name: flight for people is not one line per operation"; }
  grep -q "^process [0-9]* on .*(ranks [0-9, ]*): [0-9]* threads" "${name}_stacks.txt" &&
    grep -q "^    #0 " "${name}_stacks.txt" || { head -20 "${name}_stacks.txt"; fail "$name: stacks for people"; }
  (( rc9 == 2 )) && grep -q "no rank 9 in this job (its ranks are 0 to 3)" "${name}_flight9.txt" ||
    { cat "${name}_flight9.txt"; fail "$name: flight 9 was not refused (rc $rc9)"; }
  # The signals of stacks disturbed nothing: the job goes on (two more iterations) and stops cleanly.
  local at
  at=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['iteration'])" "${name}_status.json")
  for _ in $(seq 1 100); do
    "$troupe" inspect "$name.json" --exec status --json > "${name}_after.json" 2>/dev/null &&
      python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['iteration'] >= int(sys.argv[2]) + 2 else 1)" \
        "${name}_after.json" "$at" 2>/dev/null && break
    sleep 0.2
  done
  python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['iteration'] >= int(sys.argv[2]) + 2 else 1)" \
    "${name}_after.json" "$at" || { cat "$name.log"; fail "$name: the job stopped moving after stacks"; }
  kill -INT $job
  wait $job || true
  grep -q "stopped early" "$name.log" || { cat "$name.log"; fail "$name: the job did not stop cleanly after stacks"; }
  { pkill -9 -f "inspect-file $work/$name.json" || true; } 2>/dev/null
  kill_on_exit
}
check_job one 1
check_job launched 4 launch --nproc-per-node 4 --master-port "$(free_port)" --

# A stuck rank: rank 0 waits in a tensor-parallel all-reduce that rank 1 never reaches. The stall
# file (after 2 s) has every rank's flight record and this process's stacks.
mkdir stall && cd stall
set +e
TROUPE_FAULT_HANG=rank1@3 "$troupe" train "${model[@]}" --train-iters 8 --inspect-stall-seconds 2 \
  --distributed-timeout-minutes 0.1 > stall.log 2>&1
set -e
grep -q "stall: no rank of this process made progress" stall.log || { cat stall.log; fail "no stall report"; }
python3 - troupe-stall-*.json <<'PY' || { cat stall.log; fail "the stall file lacks the flight record or the stacks"; }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["culprits"] == [1], r["summary"]
ranks = {f["rank"]: f for f in r["flight"]["ranks"]}
assert sorted(ranks) == [0, 1, 2, 3], ranks.keys()
tp = {k: [op for op in ranks[k]["ops"] if op["group"] == "tp"] for k in (0, 1)}
last0, last1 = tp[0][-1], tp[1][-1]
# Rank 0 is in a collective of its tp group that rank 1 never issued: waiting on it (started).
assert last0["members"] == [0, 1] and last0["state"] == "started" and last0["wait_us"] > 1e6, last0
assert last1["seq"] < last0["seq"] and last1["state"] == "completed", (last0, last1)
stacks = r["stacks"]
assert stacks["pid"] > 0 and stacks["ranks"] == [0, 1, 2, 3], stacks.get("ranks")
threads = [t for t in stacks["threads"] if t["answered"] and t["frames"]]
assert len(threads) >= 5, len(threads)
# The stuck rank's thread sleeps in the fault injection: its stack shows it.
assert any("hang_if_asked" in (f["function"] or "") for t in threads for f in t["frames"]), "no thread in hang_if_asked"
print(f"ok: the stall file has rank 0 waiting in tp seq {last0['seq']} (rank 1 last completed {last1['seq']}) and {len(threads)} stacks")
PY
echo "PASS: flight and stacks in one process and under launch, groups agree on sequence numbers, the stall file has both"
