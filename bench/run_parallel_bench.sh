#!/usr/bin/env bash
# Pipeline bubbles and ZeRO memory, measured (docs/PERFORMANCE.md keeps the figures):
#  (a) bubble: `troupe train` with --pipeline-model-parallel-size P and M micro-batches for each
#      schedule (gpipe, 1f1b, interleaved with 2 chunks per stage, zb-h1), a timeline of 20
#      iterations, bench/pipeline_bubble.py on it, beside the theory (include/troupe/schedule.hpp:
#      theoretical_bubble). The stages need a core (or more) each: run it where cores >= P.
#  (b) memory: every ZeRO stage with --data-parallel-size D, each rank's model-state bytes against
#      ZeRO's formula (the job prints them at the end).
#
#   bench/run_parallel_bench.sh [--stages 4] [--micro-batches 8] [--dp 4] [--threads-per-stage 1]
#                               [--layers 8] [--hidden 512] [--out bench/results/parallel_latest.md]
set -euo pipefail
cd "$(dirname "$0")/.."
P=4 M=8 D=4 TPS=1 L=8 H=512 out=bench/results/parallel_latest.md
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stages) P="$2"; shift 2 ;;
    --micro-batches) M="$2"; shift 2 ;;
    --dp) D="$2"; shift 2 ;;
    --threads-per-stage) TPS="$2"; shift 2 ;;
    --layers) L="$2"; shift 2 ;;
    --hidden) H="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "run_parallel_bench.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
troupe="${TROUPE_BIN:-build/bin/troupe}"
py=python3
work=$(mktemp -d /tmp/troupe-pbench.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"

common=(--num-layers "$L" --hidden-size "$H" --num-attention-heads 8 --seq-length 128
        --mock-data --tokenizer-type ByteLevelTokenizer --lr 1e-3 --lr-warmup-iters 1
        --eval-interval 1000 --eval-iters 0 --log-interval 1000)
theory() {  # schedule p m v f b w -> theoretical bubble
  $py - "$@" <<'PY'
import sys
s, p, m, v, f, b, w = sys.argv[1], *map(float, sys.argv[2:])
if s in ("gpipe", "1f1b"): print((p - 1) / (m + p - 1))
elif s == "interleaved": print((p - 1) / (v * m + p - 1))
else: print((p - 1) * (f + b - w) / (m * (f + b + w) + (p - 1) * (f + b - w)))
PY
}
{
  echo "# Pipeline bubble and ZeRO memory"
  echo
  echo "- date: $(date -u +%FT%TZ); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "- model: $L layers, hidden $H, 8 heads, seq 128, byte vocabulary, mock data; micro-batch 1"
  echo "- command: bench/run_parallel_bench.sh --stages $P --micro-batches $M --dp $D --threads-per-stage $TPS --layers $L --hidden $H"
  echo
  echo "## (a) Pipeline bubble, p = $P, m = $M (median of iterations 3-20)"
  echo
  echo "| schedule | measured bubble | theory | measured / theory | mean F / B / W (ms) | stage imbalance | ms per iteration |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
} > "$out"
for sched in gpipe 1f1b interleaved zb-h1; do
  extra=(--pipeline-schedule "$sched")
  v=1
  if [[ $sched == interleaved ]]; then v=2; extra+=(--num-layers-per-virtual-pipeline-stage $((L / (P * 2)))); fi
  echo ">> $sched" >&2
  "$troupe" train "${common[@]}" "${extra[@]}" --pipeline-model-parallel-size "$P" --micro-batch-size 1 \
    --global-batch-size "$M" --train-iters 20 --num-threads $((P * TPS)) --timeline "$work/$sched.json" \
    --metrics-file "$work/$sched.jsonl" > "$work/$sched.log" 2>&1 || { cat "$work/$sched.log" >&2; exit 1; }
  measured=$($py bench/pipeline_bubble.py "$work/$sched.json" --json)
  get() { $py -c "import json,sys; print(json.loads(sys.argv[1])['$1'])" "$measured"; }
  med=$(get median)
  # The theory with the measured mean action costs (only zb-h1's depends on them).
  th=$(theory "$sched" "$P" "$M" "$v" "$(get f)" "$(get b)" "$(get w)")
  fbw=$($py -c "import json,sys; j=json.loads(sys.argv[1]); print(f\"{j['f']/1e3:.1f} / {j['b']/1e3:.1f} / {j['w']/1e3:.1f}\")" "$measured")
  imb=$($py -c "import json,sys; print(f\"{json.loads(sys.argv[1])['imbalance']:.3f}\")" "$measured")
  ms=$($py -c "
import json,sys,statistics
v=[json.loads(l)['ms_per_iter'] for l in open(sys.argv[1]) if json.loads(l).get('type')=='train'][2:]
print(f'{statistics.median(v):.1f}')" "$work/$sched.jsonl")
  printf '| %s | %.4f | %.4f | %.3f | %s | %s | %s |\n' "$sched" "$med" "$th" "$($py -c "print($med/$th)")" "$fbw" "$imb" "$ms" >> "$out"
done
{
  echo
  echo "Theory: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v m+p-1) for interleaved (v = 2), and for zb-h1"
  echo "(p-1)(f+b-w)/(m(f+b+w)+(p-1)(f+b-w)) with the measured mean F, B, W costs. Stage imbalance: the"
  echo "busiest stage's compute time over the mean stage's (the formulas assume 1.000)."
  echo
  echo "## (b) Model-state bytes per rank, dp = $D"
  echo
  echo "| ZeRO stage | parameters MiB | gradients MiB | optimizer MiB | total MiB | formula MiB | total / formula | ZeRO buffers peak MiB |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
} >> "$out"
for z in 0 1 2 3; do
  "$troupe" train "${common[@]}" --data-parallel-size "$D" --zero-stage "$z" --micro-batch-size 1 \
    --global-batch-size "$((2 * D))" --train-iters 2 --num-threads "$D" > "$work/z$z.log" 2>&1 || { cat "$work/z$z.log" >&2; exit 1; }
  line=$(grep "rank 0 model states" "$work/z$z.log")
  $py - "$z" "$line" >> "$out" <<'PY'
import re, sys
z, line = sys.argv[1], sys.argv[2]
num = lambda key: float(re.search(key + r" ([0-9.]+) MiB", line).group(1))
formula = float(re.search(r"formula ([0-9.]+) MiB", line).group(1))
ratio = re.search(r"\(x([0-9.]+)\)", line).group(1)
total = num("optimizer [0-9.]+ MiB =")  if False else float(re.search(r"= ([0-9.]+) MiB", line).group(1))
print(f"| {z} | {num('parameters'):.2f} | {num('gradients'):.2f} | {num('optimizer'):.2f} | {total:.2f} | {formula:.2f} | {ratio} | {num('peak'):.2f} |")
PY
done
cat "$out"
