# Two hosts on one machine for the CLI tests (sourced after common.bash): network namespaces host0
# and host1, each with its own hostname (a UTS namespace), a veth link and 10.77.0.x addresses, names
# in /etc/netns/<ns>/hosts; everything removed on exit. Skips the test (77) where namespaces cannot
# be made. Gives: on_host K COMMAND... (COMMAND as host K), launch_both OUT_PREFIX LAUNCH_FLAGS --
# SUBCOMMAND... (one `troupe launch --nnodes 2` per host in the background, $nproc_per_node ranks
# each, default 2; their shells' pids in launchers[]), wait_both, tx_bytes (bytes host0 sent over the veth), the corpus (make_corpus),
# TROUPE_JOB_TOKEN, $shm (a folder on the tmpfs /dev/shm for the hosts' --save-memory-dir, as users give
# it: under $work, on the disk, every snapshot is synced and a disk loaded by other tests stalls it) and
# show_stuck (each process of the namespaces: its threads' states and kernel wait channels), host_model
# (the two-host tests' model: each adds its iterations, log interval and the rest of its layout),
# iteration_reached METRICS, wait_for_iteration METRICS N, wait_for_line FILE TEXT SECONDS WHAT and
# close_losses REF GOT (the elastic tests' comparison), no_orphans (nothing left in the namespaces),
# processes_of LAUNCHER_SHELL and iterations_lost METRICS.
[[ $(id -u) -eq 0 ]] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip > /dev/null || { echo "SKIP: no ip command (iproute2; scripts/setup.sh installs it)"; exit 77; }
command -v unshare > /dev/null || { echo "SKIP: no unshare (util-linux)"; exit 77; }

ns=(troupe-h0-$$ troupe-h1-$$)
shm=$(mktemp -d /dev/shm/troupe-cli.XXXXXX)
veth=(tr$$a tr$$b)
addr=(10.77.0.1 10.77.0.2)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  for n in "${ns[@]}"; do
    ip netns pids "$n" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
    ip netns del "$n" 2> /dev/null || true
    rm -rf "/etc/netns/$n"
  done
  rm -rf "$work" "$shm"
}
trap cleanup EXIT
if ! err=$(ip netns add "${ns[0]}" 2>&1); then
  echo "SKIP: cannot create a network namespace here (ip netns add: $err)"
  exit 77
fi
ip netns add "${ns[1]}"
ip link add "${veth[0]}" type veth peer name "${veth[1]}"
for k in 0 1; do
  ip link set "${veth[k]}" netns "${ns[k]}"
  ip -n "${ns[k]}" addr add "${addr[k]}/24" dev "${veth[k]}"
  ip -n "${ns[k]}" link set "${veth[k]}" up
  ip -n "${ns[k]}" link set lo up
  mkdir -p "/etc/netns/${ns[k]}"
  printf '127.0.0.1 localhost\n%s host0\n%s host1\n' "${addr[0]}" "${addr[1]}" > "/etc/netns/${ns[k]}/hosts"
done
if ! err=$(ip netns exec "${ns[0]}" unshare --uts sh -c 'hostname host0 && hostname' 2>&1) || [[ "$err" != host0 ]]; then
  echo "SKIP: cannot give a namespace its own hostname (unshare --uts: $err)"
  exit 77
fi
make_corpus
export TROUPE_JOB_TOKEN=$("$troupe" launch --new-token)

# on_host K COMMAND...: runs COMMAND as host K (its network namespace, hostname hostK).
on_host() {
  local k=$1
  shift
  ip netns exec "${ns[k]}" unshare --uts sh -c 'hostname "$0"; exec "$@"' "host$k" "$@"
}
# launch_both OUT_PREFIX LAUNCH_FLAGS -- SUBCOMMAND...: one launcher per host, in the background.
launch_both() {
  local out=$1
  shift
  local flags=()
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  for k in 0 1; do
    on_host "$k" "$troupe" launch --nnodes 2 --node-rank "$k" --master-addr host0 --nproc-per-node "${nproc_per_node:-2}" \
      "${flags[@]}" -- "$@" > "$out.$k.log" 2>&1 &
    pids+=($!)
    launchers[k]=$!
  done
}
wait_both() {
  local rc=0
  wait "${launchers[0]}" || rc=1
  wait "${launchers[1]}" || rc=1
  return $rc
}
tx_bytes() { ip netns exec "${ns[0]}" cat "/sys/class/net/${veth[0]}/statistics/tx_bytes"; }

# show_stuck: what each process left in the namespaces is doing (for a test's failure message).
show_stuck() {
  local n p
  for n in "${ns[@]}"; do
    for p in $(ip netns pids "$n" 2> /dev/null); do
      echo "== $n pid $p: $(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null | cut -c1-120)"
      ps -L -o tid,stat,wchan:32,comm -p "$p" 2> /dev/null
      cat /proc/"$p"/task/*/stack 2> /dev/null | sort | uniq -c | sort -rn | head -n 12
    done
  done
}

# GPT-2 of 2 layers, hidden 48, global batch 12 of 3-sample micro-batches, tp 2, a 5 s heartbeat.
host_model=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
            --global-batch-size 12 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 3
            --data-path "$work/d_text_document" --tokenizer-type ByteLevelTokenizer --eval-interval 100000
            --num-threads 1 --tensor-model-parallel-size 2)
# iteration_reached METRICS: the last iteration of its train lines (0 before the first).
iteration_reached() { { grep '"type":"train"' "$1" 2> /dev/null || true; } | tail -n 1 | grep -o '"iteration":[0-9]*' |
  cut -d: -f2 | grep . || echo 0; }
# wait_for_line FILE TEXT SECONDS WHAT: until FILE has a line with TEXT (a fixed string); after
# SECONDS the logs and the namespaces' processes are shown and the test fails, naming WHAT.
wait_for_line() {
  local deadline=$((SECONDS + $3))
  until grep -qF -- "$2" "$1" 2> /dev/null; do
    ((SECONDS < deadline)) || { cat ./*.log; show_stuck; fail "$4 (within $3 s)"; }
    sleep 0.05
  done
}
# resumed_since METRICS LINES LAST: the job trained again after a failure -- a train line past the
# first LINES has an iteration at most LAST (the last trained before it: recovery resumes a snapshot
# at or before it; a line of an iteration finished as the failure struck is later than LAST).
resumed_since() {
  tail -n "+$(($2 + 1))" "$1" 2> /dev/null | grep '"type":"train"' | grep -o '"iteration":[0-9]*' | cut -d: -f2 |
    awk -v last="$3" '$1 <= last { found = 1 } END { exit !found }'
}
# wait_for_iteration METRICS N: until the job has trained iteration N (the last line's: since its last
# restart); fails after 120 s.
wait_for_iteration() {
  local deadline=$((SECONDS + 120))
  until (($(iteration_reached "$1") >= $2)); do
    ((SECONDS < deadline)) || { cat ./*.log; fail "the job never reached iteration $2"; }
    sleep 0.05
  done
}
# close_losses REF GOT: every iteration 1..N in GOT (those trained again after a restart twice), each loss within 1e-5 of REF's.
close_losses() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def losses(path):
    out = {}
    for j in map(json.loads, open(path)):
        if j.get("type") == "train":
            out.setdefault(j["iteration"], []).append(j["lm_loss"])
    return out
ref, got = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(got) == list(range(1, len(ref) + 1)), f"iterations {min(got)}..{max(got)}, {len(got)} of {len(ref)}"
worst = max(abs(v - ref[i][0]) for i, vs in got.items() for v in vs)
print(f"{len(got)} iterations, largest loss difference {worst:.2e}")
assert worst <= 1e-5
PY
}
# no_orphans: no process is left in the namespaces (else they are listed and it fails).
no_orphans() {
  for n in "${ns[@]}"; do
    [[ -z $(ip netns pids "$n" 2> /dev/null) ]] || { ps -ef | grep troupe; return 1; }
  done
}
# The processes a launcher started (on_host's shell -> the launcher -> its processes).
processes_of() { pgrep -P "$(pgrep -P "$1")" | sort || true; }
# iterations_lost METRICS: the iterations each recovery trained again ("25 and 18"; "none").
iterations_lost() {
  python3 - "$1" <<'PY'
import json, sys
its = [j["iteration"] for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "train"]
print(" and ".join(str(a - b + 1) for a, b in zip(its, its[1:]) if b <= a) or "none")
PY
}
