#!/usr/bin/env bash
# troupe launch with torchrun's flags, running programs that are not troupe (docs/COMM.md "Starting a
# job", docs/COMPAT.md "troupe launch vs torchrun"):
#   - `-- python3 script.py` under --nproc-per-node 3: each rank sees torchrun's environment (RANK,
#     LOCAL_RANK, WORLD_SIZE, GROUP_RANK, ROLE_*, MASTER_*, TORCHELASTIC_*, OMP_NUM_THREADS=1 when
#     unset), checked by Python against what torchrun defines; --max-restarts restarts a failing rank
#     with TORCHELASTIC_RESTART_COUNT raised; --log-dir/--tee/--redirects write torchrun's layout;
#   - torch.distributed (gloo, init_method env://) all-reduces across the 3 ranks over loopback;
#   - --nproc-per-node cpu / auto, --standalone, PET_ variables, --no-python, --run-path;
#   - bad flags: every problem in one message, exit 2, nothing started;
#   - a rank 0 whose peers never arrive says every 10 s which are missing, until the rendezvous timeout.
source "$(dirname "$0")/common.bash"
PY=/usr/bin/python3
[[ -x $PY ]] || { echo "SKIP: no $PY"; exit 77; }
scripts=$src_dir/tests/cli/scripts
mkdir out

# --- torchrun's environment, restarts, log files ---------------------------------------------------
env -u OMP_NUM_THREADS "$troupe" launch --nproc-per-node 3 --role trainer --rdzv-id job42 --max-restarts 1 \
  --log-dir "$work/logs" --tee 3 -- "$PY" "$scripts/torchrun_env.py" "$work/out" 1 > env.out 2> env.err ||
  { cat env.out env.err >&2; fail "the launch with a restart failed"; }
grep -q "restart 1 of 1" env.err || { cat env.err >&2; fail "no restart after rank 1 exited 3"; }
"$PY" - "$work" <<'PY' || fail "the ranks' environment is not torchrun's"
import glob, json, os, sys
work = sys.argv[1]
ports = set()
for attempt in (0, 1):
    for rank in range(3):
        d = json.load(open(f"{work}/out/env.{rank}.{attempt}.json"))
        e = d["env"]
        want = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": 3, "LOCAL_WORLD_SIZE": 3, "GROUP_RANK": 0,
                "GROUP_WORLD_SIZE": 1, "ROLE_RANK": rank, "ROLE_WORLD_SIZE": 3, "TORCHELASTIC_RESTART_COUNT": attempt,
                "TORCHELASTIC_MAX_RESTARTS": 1, "OMP_NUM_THREADS": 1}
        for k, v in want.items():
            assert int(e[k]) == v, (rank, attempt, k, e.get(k), v)
        assert e["ROLE_NAME"] == "trainer" and e["TORCHELASTIC_RUN_ID"] == "job42", e
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["TORCHELASTIC_USE_AGENT_STORE"] == "False", e
        assert 0 < int(e["MASTER_PORT"]) < 65536
        ports.add((attempt, e["MASTER_PORT"]))
        assert d["argv"][1:] == [f"{work}/out", "1"], d["argv"]
        # torchrun's layout: <log dir>/<run id>_<random>/attempt_<n>/<local rank>/
        err_file = e["TORCHELASTIC_ERROR_FILE"]
        run_dir = os.path.dirname(os.path.dirname(os.path.dirname(err_file)))
        assert os.path.dirname(run_dir) == f"{work}/logs" and os.path.basename(run_dir).startswith("job42_"), err_file
        assert err_file == f"{run_dir}/attempt_{attempt}/{rank}/error.json", err_file
        out = open(f"{run_dir}/attempt_{attempt}/{rank}/stdout.log").read()
        err = open(f"{run_dir}/attempt_{attempt}/{rank}/stderr.log").read()
        assert out == f"stdout line of rank {rank} attempt {attempt}\n", out
        assert err == f"stderr line of rank {rank} attempt {attempt}\n", err
assert len({p for a, p in ports if a == 0}) == 1 and len({p for a, p in ports if a == 1}) == 1, ports
PY
# --tee: the console has the lines too, prefixed [<role><local rank>]: as torchrun's
for r in 0 1 2; do
  grep -qx "\[trainer$r\]:stdout line of rank $r attempt 1" env.out || { cat env.out >&2; fail "tee'd stdout of rank $r missing"; }
  grep -qx "\[trainer$r\]:stderr line of rank $r attempt 1" env.err || { cat env.err >&2; fail "tee'd stderr of rank $r missing"; }
done
grep -q "OMP_NUM_THREADS=1 for every rank" env.err || fail "no note on OMP_NUM_THREADS"
echo "ok: torchrun's environment on 3 ranks, a restart, --log-dir with --tee 3"

# OMP_NUM_THREADS of the user's stays; --redirects per local rank: 0 stdout, 1 stderr, 2 nothing
rm -rf out/* logs
OMP_NUM_THREADS=7 "$troupe" launch --nproc-per-node 3 --redirects 0:1,1:2 --log-dir "$work/logs" -- \
  "$PY" "$scripts/torchrun_env.py" "$work/out" > red.out 2> red.err || { cat red.err >&2; fail "--redirects launch"; }
"$PY" -c "import json,sys; assert json.load(open('$work/out/env.0.0.json'))['env']['OMP_NUM_THREADS'] == '7'" ||
  fail "OMP_NUM_THREADS=7 was not kept"
grep -q "stdout line of rank 0" red.out && fail "rank 0's stdout reached the console under --redirects 0:1"
grep -q "stderr line of rank 0" red.err || fail "rank 0's stderr should be on the console"
grep -q "stderr line of rank 1" red.err && fail "rank 1's stderr reached the console under --redirects 1:2"
grep -q "stdout line of rank 1" red.out || fail "rank 1's stdout should be on the console"
grep -q "stdout line of rank 2" red.out && grep -q "stderr line of rank 2" red.err || fail "rank 2 should be on the console"
run_dir=$(echo logs/none_*)
[[ -f $run_dir/attempt_0/0/stdout.log && ! -e $run_dir/attempt_0/0/stderr.log ]] || fail "rank 0's files: $(ls -R logs)"
[[ -f $run_dir/attempt_0/1/stderr.log && ! -e $run_dir/attempt_0/1/stdout.log ]] || fail "rank 1's files: $(ls -R logs)"
[[ -d $run_dir/attempt_0/2 && -z $(ls "$run_dir/attempt_0/2") ]] || fail "rank 2 should have an empty folder"
grep -qx "stdout line of rank 0 attempt 0" "$run_dir/attempt_0/0/stdout.log" || fail "rank 0's stdout.log"
echo "ok: --redirects 0:1,1:2 and a user's OMP_NUM_THREADS"

# --local-ranks-filter 0: only local rank 0 reaches the console
rm -rf out/*
"$troupe" launch --nproc-per-node 3 --local-ranks-filter 0 -- "$PY" "$scripts/torchrun_env.py" "$work/out" \
  > filt.out 2> filt.err || fail "--local-ranks-filter launch"
[[ $(grep -c "stdout line" filt.out) -eq 1 ]] && grep -q "rank 0" filt.out || { cat filt.out >&2; fail "--local-ranks-filter 0"; }
echo "ok: --local-ranks-filter"

# --- torch.distributed over the environment ---------------------------------------------------------
if "$PY" -c "import torch.distributed as d; assert d.is_available() and d.is_gloo_available()" 2> /dev/null; then
  rm -rf out/*
  "$troupe" launch --nproc-per-node 3 -- "$PY" "$scripts/torch_allreduce.py" "$work/out" > ar.out 2> ar.err ||
    { cat ar.out ar.err >&2; fail "torch.distributed all_reduce under troupe launch failed"; }
  for r in 0 1 2; do grep -qx "ok 3" "out/allreduce.$r" || fail "rank $r did not all-reduce"; done
  echo "ok: torch.distributed (gloo, env://) all-reduces across 3 ranks"
else
  echo "skip: torch.distributed with gloo is not importable by $PY"
fi

# --- --nproc-per-node cpu / auto, --standalone, PET_ variables, --no-python, --run-path --------------
cpus=$("$PY" -c "import os; print(os.cpu_count())")
rm -rf out/*
"$troupe" launch --nproc-per-node cpu --standalone -- "$PY" "$scripts/torchrun_env.py" "$work/out" > /dev/null 2> cpu.err ||
  fail "--nproc-per-node cpu"
[[ $(ls out | wc -l) -eq $cpus ]] || fail "--nproc-per-node cpu started $(ls out | wc -l) ranks, os.cpu_count() is $cpus"
"$PY" - "$work" "$cpus" <<'PY' || fail "--standalone's environment"
import json, re, sys
ids = {json.load(open(f"{sys.argv[1]}/out/env.{r}.0.json"))["env"]["TORCHELASTIC_RUN_ID"] for r in range(int(sys.argv[2]))}
assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", ids.pop()), ids
PY
gpus_visible=$("$troupe" info | grep -c "GPU(s)" || true)
if [[ $gpus_visible -eq 0 ]]; then
  rm -rf out/*
  "$troupe" launch --nproc-per-node auto -- "$PY" "$scripts/torchrun_env.py" "$work/out" > /dev/null 2> auto.err ||
    fail "--nproc-per-node auto"
  [[ $(ls out | wc -l) -eq $cpus ]] || fail "--nproc-per-node auto without a GPU started $(ls out | wc -l), want $cpus"
  set +e
  "$troupe" launch --nproc-per-node gpu -- /bin/true 2> gpu.err
  rc=$?
  set -e
  [[ $rc -eq 2 ]] && grep -q "no CUDA device is visible" gpu.err || { cat gpu.err >&2; fail "--nproc-per-node gpu without a GPU: exit $rc"; }
fi
rm -rf out/*
PET_NPROC_PER_NODE=2 "$troupe" launch -- "$PY" "$scripts/torchrun_env.py" "$work/out" > /dev/null 2>&1 || fail "PET_NPROC_PER_NODE"
[[ $(ls out | wc -l) -eq 2 ]] || fail "PET_NPROC_PER_NODE=2 started $(ls out | wc -l) ranks"
printf '#!/bin/sh\necho "$RANK/$WORLD_SIZE" > "$1/sh.$RANK"\n' > ranks.sh
chmod +x ranks.sh
"$troupe" launch --nproc-per-node 2 --no-python -- ./ranks.sh "$work/out" || fail "--no-python"
[[ $(cat out/sh.0 out/sh.1) == $'0/2\n1/2' ]] || fail "--no-python ranks wrote $(cat out/sh.*)"
rm -rf out/*
PYTHON_EXEC=$PY "$troupe" launch --nproc-per-node 2 --run-path "$scripts/torchrun_env.py" "$work/out" > /dev/null 2>&1 ||
  fail "--run-path"
[[ -f out/env.1.0.json ]] || fail "--run-path did not run the script"
echo "ok: --nproc-per-node cpu/auto/gpu, --standalone, PET_NPROC_PER_NODE, --no-python, --run-path"

# --- bad flags: everything at once, exit 2, nothing started ---------------------------------------------
set +e
"$troupe" launch --nnodes 1:4 --nproc-per-node 2 --rdzv-backend etcd --tee 5 --start-method thread --rdzv-conf \
  bogus=1 --nproc-pre-node 2 -m -- /usr/bin/touch "$work/started" > bad.out 2> bad.err
rc=$?
set -e
[[ $rc -eq 2 ]] || { cat bad.err >&2; fail "bad flags: exit $rc, want 2"; }
[[ ! -e started ]] || fail "bad flags still started the command"
for want in "8 problems" "--nnodes 1:4 needs each node's --node-rank" "--nnodes 4 needs the host of node 0" "--rdzv-backend etcd" "--tee 5" \
  "--start-method thread" "bogus=1" "--nproc-pre-node: not a flag of troupe launch -- did you mean --nproc-per-node?" \
  "--module: troupe cannot run Python modules in-process"; do
  grep -qF -- "$want" bad.err || { cat bad.err >&2; fail "the refusal does not say '$want'"; }
done
set +e
"$troupe" launch --nproc-per-node 2 -- train.py > /dev/null 2> py.err
rc=$?
set -e
[[ $rc -eq 2 ]] && grep -qF "write -- python3 train.py" py.err || { cat py.err >&2; fail "a bare script.py: exit $rc"; }
echo "ok: bad flags refused at once (exit 2), nothing started"

# --- rank 0 says who is missing every 10 s, until the rendezvous timeout ---------------------------------
# A world of 3 started by hand (torchrun's variables), rank 2 never: rank 0 reports it, then gives up
# after the rendezvous timeout, and so does rank 1.
export TROUPE_JOB_TOKEN=$("$troupe" launch --new-token)
port=$(free_port)
for r in 0 1; do
  TROUPE_RDZV_TIMEOUT=14 RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$troupe" comm-check > "miss.$r.log" 2>&1 &
  pids[r]=$!
done
for r in 0 1; do
  set +e
  wait "${pids[r]}"
  rc=$?
  set -e
  [[ $rc -eq 1 ]] || { cat "miss.$r.log" >&2; fail "rank $r of a world missing rank 2 exited $rc, want 1"; }
done
waiting=$(grep -n "waiting for 1 of 3 ranks to join" miss.0.log | head -1 | cut -d: -f1)
gave_up=$(grep -n "1 of 3 ranks never joined the rendezvous" miss.0.log | head -1 | cut -d: -f1)
[[ -n $waiting && -n $gave_up && $waiting -lt $gave_up ]] || { cat miss.0.log >&2; fail "no missing-rank report before the timeout"; }
grep -q "waiting for 1 of 3 ranks to join.*: rank 2 of node 0 " miss.0.log || { cat miss.0.log >&2; fail "the report does not name rank 2"; }
grep -q "never joined the rendezvous.*within 14 s: rank 2 of node 0" miss.1.log || { cat miss.1.log >&2; fail "rank 1 was not told"; }
echo "ok: rank 0 named the missing rank 2, then gave up at the rendezvous timeout"
pass 2> /dev/null || echo PASS
