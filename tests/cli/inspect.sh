#!/usr/bin/env bash
# troupe train --inspect and troupe inspect (docs/INSPECT.md): a running tp 2 x pp 2 job answers
# status and where for its 4 ranks through its inspect file (mode 0600) and through HOST:PORT with
# TROUPE_JOB_TOKEN; a client with another token, no token or an unknown command is refused with the
# reason and exit code 2; the file goes when the job ends. And a stuck rank: where names it while
# the job is stalled.
source "$(dirname "$0")/common.bash"
model=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
       --global-batch-size 6 --mock-data --tokenizer-type ByteLevelTokenizer --log-interval 1000
       --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)

"$troupe" train "${model[@]}" --train-iters 100000 --inspect 0 --inspect-file run/insp.json > train.log 2>&1 &
job=$!
kill_on_exit $job
wait_for_file run/insp.json
[[ $(stat -c %a run/insp.json) == 600 ]] || fail "the inspect file is mode $(stat -c %a run/insp.json), not 600"
"$troupe" inspect run/insp.json --exec status --json > status.json || { cat train.log; fail "status failed"; }
"$troupe" inspect run/insp.json --exec where --json > where.json || fail "where failed"
python3 - status.json where.json <<'PY' || fail "the answers are not what docs/INSPECT.md says"
import json, sys
s = json.load(open(sys.argv[1]))
w = json.load(open(sys.argv[2]))
ranks = {r["rank"]: r for r in s["ranks"]}
assert sorted(ranks) == [0, 1, 2, 3], ranks.keys()
for r, a in ranks.items():
    assert (a["pp"], a["tp"], a["dp"]) == (r // 2, r % 2, 0), a
    assert a["doing"] in ("idle", "forward", "backward", "waiting", "reducing gradients", "optimizer step",
                          "gathering parameters", "evaluating"), a
    assert a["step"] >= 0 and a["actions"] in (0, 4), a
    assert a["step"] == 0 or a["mailbox"] >= 0, a  # read by the rank's own thread once it ran
assert s["iteration"] >= 0
job = s["job"]
assert job["offload"]["mailbox"] >= 0 and (job["trainer_mailbox"] >= 0 or job["trainer"] == "starting"), job
assert set(w) >= {"summary", "deadlock", "culprits", "edges", "ranks"} and len(w["ranks"]) == 4, w
print("ok: status and where describe the 4 ranks")
PY
grep -q "inspector on 127.0.0.1:[0-9]*: troupe inspect run/insp.json --exec status" train.log || fail "the address was not printed"
echo status | "$troupe" inspect run/insp.json > human.txt || fail "status through the prompt (a pipe) failed"
grep -q "^  rank 3 (pp 1, tp 1, dp 0) step [0-9]*: " human.txt || { cat human.txt; fail "status for people lacks rank 3"; }

# The prompt on a terminal (a pseudo-terminal here): readline completes "stat" to status and a
# parameter's name after "tensor ", and answers both.
python3 - "$troupe" run/insp.json <<'PY' || fail "the interactive prompt (completion) does not work"
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.environ["HOME"] = os.getcwd()
    os.execv(sys.argv[1], [sys.argv[1], "inspect", sys.argv[2]])
out = b""
def read_until(marker, seconds=20):
    global out
    end = time.time() + seconds
    while marker not in out and time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try: out += os.read(fd, 65536)
            except OSError: break
    return marker in out
assert read_until(b"troupe> "), out
os.write(fd, b"stat\t\n")
assert read_until(b"rank 3 (pp 1, tp 1, dp 0)"), out
os.write(fd, b"tensor transformer.h.1.ln_2.bi\t\n")
assert read_until(b"transformer.h.1.ln_2.bias (value) after iteration"), out
os.write(fd, b"quit\n")
os.waitpid(pid, 0)
assert os.path.exists(".troupe_inspect_history") and b"status" in open(".troupe_inspect_history", "rb").read()
print("ok: the prompt completes commands and tensor names, and keeps a history")
PY

# trace start, then stop: a Chrome trace of the window, every rank's F and B of both micro-batches
# in every iteration of it.
"$troupe" inspect run/insp.json --exec "trace start" > /dev/null || fail "trace start"
sleep 1.5
"$troupe" inspect run/insp.json --exec "trace stop window.trace.json" --json > trace.json || { cat trace.json; fail "trace stop"; }
python3 - window.trace.json <<'PY' || fail "the trace is not a Chrome trace of every rank's passes"
import json, sys, collections
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
assert names == {r: f"rank {r} (pp {r // 2}, tp {r % 2}, dp 0)" for r in range(4)}, names
passes = collections.defaultdict(list)
for e in events:
    if e["ph"] == "X" and e["cat"] in ("forward", "backward"):
        assert e["dur"] >= 0 and e["ts"] > 0, e
        passes[(e["pid"], e["args"]["iteration"])].append(e["name"])
iterations = {it for (_, it) in passes}
assert len(iterations) >= 2, iterations
for r in range(4):
    for it in iterations:
        if (r, it) in passes:
            assert sorted(passes[(r, it)]) == ["B0", "B1", "F0", "F1"], (r, it, passes[(r, it)])
print(f"ok: trace of {len(iterations)} iterations, every rank's F0 F1 B0 B1 in each")
PY

address=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['address'])" run/insp.json)
token=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['token'])" run/insp.json)
TROUPE_JOB_TOKEN=$token "$troupe" inspect "$address" --exec status > by_address.txt || fail "HOST:PORT with the token failed"
grep -q "^iteration [0-9]*" by_address.txt || fail "no status by address"
set +e
TROUPE_JOB_TOKEN=0123456789abcdef0123456789abcdef "$troupe" inspect "$address" --exec status > wrong.txt 2> wrong.err
rc_wrong=$?
"$troupe" inspect "$address" --exec status > none.txt 2> none.err
rc_none=$?
"$troupe" inspect run/insp.json --exec frobnicate > unknown.txt 2>&1
rc_unknown=$?
set -e
(( rc_wrong == 2 )) && grep -q "the job refused the connection (wrong job token" wrong.err ||
  { cat wrong.err; fail "another token was not refused (rc $rc_wrong)"; }
[[ ! -s wrong.txt ]] || fail "a client with another token got an answer"
(( rc_none == 2 )) && grep -q "TROUPE_JOB_TOKEN is not set" none.err || { cat none.err; fail "no token: rc $rc_none"; }
(( rc_unknown == 2 )) && grep -q "unknown command" unknown.txt || { cat unknown.txt; fail "unknown command: rc $rc_unknown"; }
# The job went on meanwhile, and ends cleanly on SIGINT; its inspect file goes with it.
kill -INT $job
wait $job || true
kill_on_exit
grep -q "stopped early" train.log || { cat train.log; fail "the job did not stop cleanly"; }
[[ ! -e run/insp.json ]] || fail "the inspect file outlived the job"

# A stuck rank (TROUPE_FAULT_HANG=rank1@3): while the job is stalled, where names it, with the waits
# of the three others on it (rank 0 in the tensor-parallel all-reduce, ranks 2 and 3 for
# activations). stuck_job NAME [COMMAND...]: the job started by COMMAND (default: troupe train in
# this process) with its inspect file NAME.json.
stuck_job() {
  local name=$1
  shift
  TROUPE_FAULT_HANG=rank1@3 "$troupe" "$@" train "${model[@]}" --train-iters 8 --inspect 0 --inspect-file "$work/$name.json" \
    --distributed-timeout-minutes 1 > "$name.log" 2>&1 &
  job=$!
  kill_on_exit $job "$work/$name.json"
  wait_for_file "$name.json"
  for _ in $(seq 1 400); do  # a loaded machine starts 4 processes slowly
    "$troupe" inspect "$name.json" --exec where --json > "${name}_where.json" 2>/dev/null || true
    python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get('culprits') == [1] else 1)" \
      "${name}_where.json" 2>/dev/null && break
    sleep 0.1
  done
  python3 - "${name}_where.json" <<'PY' || { cat "$name.log"; fail "$name: where did not name the stuck rank 1"; }
import json, sys
w = json.load(open(sys.argv[1]))
assert sorted(r["rank"] for r in w["ranks"]) == [0, 1, 2, 3] and "unreachable" not in w, w
assert w["culprits"] == [1] and not w["deadlock"], w["summary"]
assert {(e["from"], e["to"]) for e in w["edges"]} == {(0, 1), (2, 0), (3, 1)}, w["edges"]
print("ok: where names the stuck rank 1:", w["summary"])
PY
  { pkill -9 -f "inspect-file $work/$name.json" || true; kill -9 $job || true; wait $job || true; } 2>/dev/null
  kill_on_exit
}
stuck_job stuck
# Under troupe launch (4 processes, one rank each): every process serves its own rank and rank 0's
# answers for the job; the stuck rank 1 lives in another process than the ranks waiting on it.
stuck_job launched launch --nproc-per-node 4 --master-port "$(free_port)" --
echo "PASS: troupe inspect status and where, token checks, a stuck rank named, in one process and under launch"
