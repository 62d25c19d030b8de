#!/usr/bin/env bash
# In-memory snapshots (--save-memory-interval): what they cost a run, as a fraction of its step time,
# against the same run without them (docs/PERFORMANCE.md keeps the figures).
#   bench/memory_snapshot_bench.sh [--layers 8] [--hidden 512] [--iters 60] [--interval 10] [--threads 2] [--repeat 2]
#                                  [--hosts 2]
# --hosts 2: the job over two hosts made of network namespaces on this machine (root; the CLI tests'
# tests/cli/two_hosts.bash), one process per host with --threads / 2 threads each, data-parallel, so
# every snapshot also copies each process's shard to the other host.
# The model is run_save_bench.sh's (a 292 MiB checkpoint: parameters and both Adam moments; ZeRO-1 on
# one rank). The cost of the snapshots = (the snapshot run's step times + its snapshots' time in the
# training path) - the plain run's step times, over iterations 3..N, as a fraction of the plain run's;
# each figure is the median over --repeat pairs of runs (plain, then with snapshots).
set -euo pipefail
cd "$(dirname "$0")/.."
L=8 H=512 N=60 K=10 T=2 R=2 HOSTS=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --layers) L="$2"; shift 2 ;;
    --hidden) H="$2"; shift 2 ;;
    --iters) N="$2"; shift 2 ;;
    --interval) K="$2"; shift 2 ;;
    --threads) T="$2"; shift 2 ;;
    --repeat) R="$2"; shift 2 ;;
    --hosts) HOSTS="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "memory_snapshot_bench.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
troupe="${TROUPE_BIN:-$PWD/build/bin/troupe}"
MB=4 THREADS=$T
if [[ $HOSTS == 2 ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "memory_snapshot_bench.sh: --hosts 2 needs root (network namespaces)" >&2; exit 2; }
  export TROUPE_BIN=$troupe TROUPE_SOURCE_DIR=$PWD
  source "$TROUPE_SOURCE_DIR/tests/cli/common.bash"  # a scratch folder and a trap that removes it and the namespaces
  source "$TROUPE_SOURCE_DIR/tests/cli/two_hosts.bash"
  nproc_per_node=1 MB=2 THREADS=$((T / 2 > 0 ? T / 2 : 1))
else
  work=$(mktemp -d /tmp/troupe-membench.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
args=(--num-layers "$L" --hidden-size "$H" --num-attention-heads 8 --seq-length 128 --micro-batch-size "$MB"
      --global-batch-size 4 --mock-data --tokenizer-type ByteLevelTokenizer --lr 1e-3 --lr-warmup-iters 1
      --train-iters "$N" --eval-interval 100000 --eval-iters 0 --log-interval 1000 --num-threads "$THREADS"
      --zero-stage 1)
for r in $(seq "$R"); do
  if [[ $HOSTS == 2 ]]; then
    launch_both "$work/plain.$r" -- train "${args[@]}" --metrics-file "$work/plain.$r.jsonl"
    wait_both || { cat "$work"/plain."$r".*.log; exit 1; }
    launch_both "$work/mem.$r" -- train "${args[@]}" --save-memory-interval "$K" --metrics-file "$work/mem.$r.jsonl"
    wait_both || { cat "$work"/mem."$r".*.log; exit 1; }
  else
    "$troupe" train "${args[@]}" --metrics-file "$work/plain.$r.jsonl" > "$work/plain.$r.log" 2>&1
    "$troupe" train "${args[@]}" --save-memory-interval "$K" --metrics-file "$work/mem.$r.jsonl" > "$work/mem.$r.log" 2>&1
  fi
done
python3 - "$work" "$N" "$R" "$K" "$T" <<'PY'
import json, statistics, sys
work, n, repeat, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
costs, snaps, steps, writes, cpus, in_place = [], [], [], [], [], []
for r in range(1, repeat + 1):
    def read(kind):
        return [json.loads(l) for l in open(f"{work}/{kind}.{r}.jsonl")]
    plain = sum(j["ms_per_iter"] for j in read("plain") if j.get("type") == "train" and j["iteration"] >= 3)
    mem_rows = read("mem")
    mem = sum(j["ms_per_iter"] for j in mem_rows if j.get("type") == "train" and j["iteration"] >= 3)
    snap = [j["seconds"] for j in mem_rows if j.get("type") == "memory_snapshot"]
    committed = [j for j in mem_rows if j.get("type") == "memory_snapshot_committed"]
    writes += [j["seconds"] for j in committed]
    cpus += [j["writer_cpu_seconds"] for j in committed]
    in_place += [j["shards_in_place"] for j in committed]
    costs.append((mem + 1e3 * sum(snap) - plain) / plain)
    snaps += snap
    steps.append(plain / (n - 2))
print(f"snapshots every {k} iterations over {n}: cost {100 * statistics.median(costs):+.2f}% of the step time "
      f"(runs: {', '.join(f'{100 * c:+.2f}%' for c in costs)}); step {statistics.median(steps):.0f} ms; "
      f"snapshot in the training path: median {1e3 * statistics.median(snaps):.0f} ms; "
      f"background write to the tmpfs: median {statistics.median(writes):.2f} s, {1e3 * statistics.median(cpus):.0f} ms of CPU; "
      f"shards written where the previous snapshot's file lay: {sum(1 for x in in_place if x > 0)} of {len(in_place)}")
# The snapshots' work as a share of the machine between two snapshots: the training path's time on every
# training thread, plus the writer's CPU time, over the interval's time on every training thread. It
# counts work, not the step time it costs (above, whose noise on a busy VM is several percent).
threads = int(sys.argv[5])
work = (statistics.median(snaps) * threads + statistics.median(cpus)) / (k * statistics.median(steps) / 1e3 * threads)
print(f"snapshot work per interval: {100 * work:.2f}% of the machine ({threads} training threads: "
      f"{1e3 * statistics.median(snaps):.0f} ms in the path on each, {1e3 * statistics.median(cpus):.0f} ms of the writer)")
PY
