#!/usr/bin/env bash
# Communication benchmark: troupe's collectives (backend local: ranks are threads of one process;
# backend ucx: one process per rank) side by side with Open MPI on the same machine, measured the
# nccl-tests way (bus bandwidth, busbw). Prints one Markdown table per op and writes it to --out.
#
#   bench/run_comm_bench.sh [--ranks "2 4 8"] [--min-bytes 4096] [--max-bytes 268435456]
#                           [--ops all_reduce,reduce_scatter,all_gather,all_to_all]
#                           [--out bench/results/comm_latest.md]
#                           [--timeout 1800]
#   env: TROUPE_BIN (default build/bin/troupe), MPI_BENCH (default build/bench/mpi_coll_bench),
#        MPIRUN_ARGS (default "--mca pml ob1 --mca btl self,vader": Open MPI 4's shared-memory path on
#        one host; Open MPI 5 calls it "sm").
#
# Every program prints JSON lines {"impl","op","ranks","bytes","time_us","algbw_GBps","busbw_GBps"}
# (rank 0 only); the raw lines go to <out without .md>.jsonl. A program that is missing or fails
# leaves its column "n/a" and the reason in the notes; without mpirun or build/bench/mpi_coll_bench
# troupe's side still runs and the notes (and stderr) say Open MPI was skipped. all_to_all is
# troupe's all_to_all (equal counts) against MPI_Alltoallv. Build first: scripts/build.sh (and
# scripts/setup.sh --bench for Open MPI, then rebuild so CMake finds it).
set -euo pipefail

cd "$(dirname "$0")/.."
ranks_list="2 4 8"
min_bytes=4096
max_bytes=268435456
ops="all_reduce,reduce_scatter,all_gather"
out="bench/results/comm_latest.md"
run_timeout=1800
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks_list="$2"; shift 2 ;;
    --min-bytes) min_bytes="$2"; shift 2 ;;
    --max-bytes) max_bytes="$2"; shift 2 ;;
    --ops) ops="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --timeout) run_timeout="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "run_comm_bench.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done

TROUPE_BIN="${TROUPE_BIN:-build/bin/troupe}"
MPI_BENCH="${MPI_BENCH:-build/bench/mpi_coll_bench}"
MPIRUN_ARGS="${MPIRUN_ARGS:---mca pml ob1 --mca btl self,vader}"
command -v python3 >/dev/null || { echo "run_comm_bench.sh: needs python3 for the tables" >&2; exit 2; }

mkdir -p "$(dirname "$out")"
raw="${out%.md}.jsonl"
notes="$(mktemp)"
: > "$raw"
trap 'rm -f "$notes"' EXIT

# run LABEL CMD...: appends the JSON lines CMD prints to $raw; a failure becomes a note.
run() {
  local label="$1"; shift
  echo ">> $label: $*" >&2
  local log rc=0
  log="$(mktemp)"
  timeout "$run_timeout" "$@" > "$log" 2> "$log.err" || rc=$?
  grep -o '{.*"impl".*}' "$log" >> "$raw" || true
  if [[ $rc -ne 0 ]]; then
    local why="exit $rc"
    [[ $rc -eq 124 ]] && why="timed out after ${run_timeout} s"
    echo "- $label: $why: $(tail -n 3 "$log.err" | tr '\n' ' ' | cut -c1-300)" >> "$notes"
  fi
  rm -f "$log" "$log.err"
}

flags=(--ops "$ops" --min-bytes "$min_bytes" --max-bytes "$max_bytes")
for n in $ranks_list; do
  if [[ -x "$TROUPE_BIN" ]]; then
    run "troupe local, $n ranks" "$TROUPE_BIN" bench comm --backend local --ranks "$n" "${flags[@]}" --json
    run "troupe ucx, $n ranks" "$TROUPE_BIN" launch --nproc-per-node "$n" -- bench comm --backend ucx "${flags[@]}" --json
  else
    echo "- troupe, $n ranks: $TROUPE_BIN not found (build it: scripts/build.sh)" >> "$notes"
  fi
  if [[ -x "$MPI_BENCH" ]] && command -v mpirun >/dev/null; then
    # shellcheck disable=SC2086  # MPIRUN_ARGS is a list of words
    run "Open MPI, $n ranks" mpirun --allow-run-as-root --oversubscribe -np "$n" $MPIRUN_ARGS \
      "$MPI_BENCH" "${flags[@]}"
  else
    echo "- Open MPI, $n ranks: skipped, $MPI_BENCH or mpirun not found (scripts/setup.sh --bench, then rebuild)" >> "$notes"
    echo ">> Open MPI, $n ranks: skipped ($MPI_BENCH or mpirun not found)" >&2
  fi
done

cores="$(nproc)"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)"
python3 - "$raw" "$notes" "$out" "$cores" "${cpu:-unknown CPU}" "$ops" "$ranks_list" "$MPIRUN_ARGS" <<'EOF'
import json, sys, datetime
raw, notes_path, out, cores, cpu, ops, ranks_list, mpirun_args = sys.argv[1:]
cores = int(cores)
ranks = [int(r) for r in ranks_list.split()]
busbw = {}  # (impl, op, ranks, bytes) -> GB/s
for line in open(raw):
    try:
        r = json.loads(line)
        busbw[(r["impl"], r["op"], int(r["ranks"]), int(r["bytes"]))] = float(r["busbw_GBps"])
    except (ValueError, KeyError):
        pass

def cell(v):
    return "n/a" if v is None else f"{v:.3f}"

def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"

def human(b):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size and b % size == 0:
            return f"{b // size} {unit}"
    return f"{b} B"

lines = ["# troupe vs Open MPI: collective bus bandwidth (host memory, one machine)", "",
         f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
         f"- machine: {cpu}, {cores} logical CPUs (nproc)",
         "- troupe-local: ranks are threads of one process; troupe-ucx: one process per rank "
         "(`troupe launch`); Open MPI: `mpirun " + mpirun_args + "`",
         "- busbw as nccl-tests defines it: algbw = size / time, x 2(n-1)/n for all_reduce, "
         "x (n-1)/n for reduce_scatter, all_gather and all_to_all; time = max over ranks of the mean; GB/s = 1e9 B/s",
         "- size: all_reduce the buffer; reduce_scatter the send buffer; all_gather the recv buffer; "
         "all_to_all each rank's send buffer (equal blocks; Open MPI: MPI_Alltoallv)"]
over = [n for n in ranks if n > cores]
if over:
    lines.append(f"- **note**: {cores} cores, so {', '.join(map(str, over))} ranks are oversubscribed "
                 "(busy-polling ranks share cores): those rows measure the scheduler as much as the transport")
lines.append("")
for op in ops.split(","):
    lines += [f"## {op}", "",
              "| ranks | bytes | local busbw GB/s | ucx busbw GB/s | Open MPI busbw GB/s | ucx / Open MPI | local / ucx |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    sizes = sorted({k[3] for k in busbw if k[1] == op})
    for n in ranks:
        for b in sizes:
            local = busbw.get(("troupe-local", op, n, b))
            ucx = busbw.get(("troupe-ucx", op, n, b))
            mpi = busbw.get(("openmpi", op, n, b))
            if local is None and ucx is None and mpi is None:
                continue
            lines.append(f"| {n} | {human(b)} | {cell(local)} | {cell(ucx)} | {cell(mpi)} | "
                         f"{ratio(ucx, mpi)} | {ratio(local, ucx)} |")
    lines.append("")
notes = open(notes_path).read().strip()
if notes:
    lines += ["## Notes", "", notes, ""]
text = "\n".join(lines)
open(out, "w").write(text)
print(text)
EOF
echo "wrote $out (raw lines: $raw)" >&2
