#!/usr/bin/env bash
# Optimizer offload: peak resident memory and step time of --offload-optimizer none, cpu and nvme on
# the same run (docs/PERFORMANCE.md keeps the figures).
#   bench/run_offload_bench.sh [--layers 12] [--hidden 768] [--iters 8] [--threads 2] [--swap DIR]
# One rank, ZeRO-1 (so all three run on the rank engine), mock data; peak RSS from /usr/bin/time -v
# (the kernel's ru_maxrss of the process). The Adam moments are 8 bytes per parameter; with nvme
# they live in a swap file under --swap (default: a temporary directory on the disk of /var/tmp), so
# the peak should drop by about that much. The losses of the three runs must be identical.
set -euo pipefail
cd "$(dirname "$0")/.."
L=12 H=768 N=8 T=2 SWAP=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --layers) L="$2"; shift 2 ;;
    --hidden) H="$2"; shift 2 ;;
    --iters) N="$2"; shift 2 ;;
    --threads) T="$2"; shift 2 ;;
    --swap) SWAP="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "run_offload_bench.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
troupe="${TROUPE_BIN:-build/bin/troupe}"
[[ -x /usr/bin/time ]] || { echo "run_offload_bench.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
work=$(mktemp -d /var/tmp/troupe-offloadbench.XXXXXX)
trap 'rm -rf "$work"' EXIT
[[ -n "$SWAP" ]] || { SWAP="$work/swap"; mkdir -p "$SWAP"; }
args=(--num-layers "$L" --hidden-size "$H" --num-attention-heads 12 --seq-length 128 --micro-batch-size 1
      --global-batch-size 1 --mock-data --tokenizer-type ByteLevelTokenizer --lr 1e-4 --lr-warmup-iters 1
      --train-iters "$N" --eval-interval 100000 --eval-iters 0 --log-interval 1000 --num-threads "$T" --zero-stage 1)
for mode in none cpu nvme; do
  extra=(--offload-optimizer "$mode")
  [[ $mode == nvme ]] && extra+=(--offload-path "$SWAP")
  /usr/bin/time -v "$troupe" train "${args[@]}" "${extra[@]}" --metrics-file "$work/$mode.jsonl" \
    > "$work/$mode.log" 2> "$work/$mode.time" || { cat "$work/$mode.log" "$work/$mode.time"; exit 1; }
done
python3 - "$work" <<'PY'
import json, re, statistics, sys
work = sys.argv[1]
rows = {}
for mode in ("none", "cpu", "nvme"):
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f"{work}/{mode}.time").read()).group(1))
    it = [json.loads(l) for l in open(f"{work}/{mode}.jsonl")]
    train = [j for j in it if j.get("type") == "train"]
    opt = re.search(r"optimizer ([\d.]+) MiB", open(f"{work}/{mode}.log").read())
    rows[mode] = (rss / 1024, statistics.median(j["ms_per_iter"] for j in train[1:]),
                  [j["lm_loss"] for j in train], float(opt.group(1)) if opt else float("nan"))
assert rows["cpu"][2] == rows["none"][2] and rows["nvme"][2] == rows["none"][2], "the losses differ"
moments = rows["none"][3]
print(f"Adam moments (8 bytes/parameter): {moments:.0f} MiB; losses identical in all three runs")
print("| --offload-optimizer | peak RSS (MiB) | vs none (MiB) | ms/iter | vs none |")
print("| --- | ---: | ---: | ---: | ---: |")
for mode, (rss, ms, _, _) in rows.items():
    print(f"| {mode} | {rss:.0f} | {rss - rows['none'][0]:+.0f} | {ms:.0f} | {ms / rows['none'][1]:.2f}x |")
print(f"nvme saves {rows['none'][0] - rows['nvme'][0]:.0f} MiB of peak RSS = "
      f"{(rows['none'][0] - rows['nvme'][0]) / moments:.2f} x the moments' {moments:.0f} MiB")
PY
