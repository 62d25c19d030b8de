#!/usr/bin/env bash
# Asynchronous checkpoint saves: the step time while the offload actor writes a checkpoint in the
# background, against the same run without saving (docs/PERFORMANCE.md keeps the figures).
#   bench/run_save_bench.sh [--layers 8] [--hidden 512] [--iters 24] [--interval 6] [--threads 2]
# A run of --iters iterations saves every --interval (a parallel layout: ZeRO-1 on one rank, so the
# sharded, background path is used); "during a save" are the iterations that overlap a background
# write (from the snapshot to the commit, read from the metrics file's checkpoint lines), compared by
# median ms/iter with the same iterations of a run without --save. TROUPE_SAVE_DUTY (0.01..1) sets
# the writer's duty cycle when no core is idle (default 0.1; 1: no pacing).
set -euo pipefail
cd "$(dirname "$0")/.."
L=8 H=512 N=24 K=6 T=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --layers) L="$2"; shift 2 ;;
    --hidden) H="$2"; shift 2 ;;
    --iters) N="$2"; shift 2 ;;
    --interval) K="$2"; shift 2 ;;
    --threads) T="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "run_save_bench.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
troupe="${TROUPE_BIN:-build/bin/troupe}"
work=$(mktemp -d /tmp/troupe-savebench.XXXXXX)
trap 'rm -rf "$work"' EXIT
args=(--num-layers "$L" --hidden-size "$H" --num-attention-heads 8 --seq-length 128 --micro-batch-size 4
      --global-batch-size 4 --mock-data --tokenizer-type ByteLevelTokenizer --lr 1e-3 --lr-warmup-iters 1
      --train-iters "$N" --eval-interval 100000 --eval-iters 0 --log-interval 1000 --num-threads "$T"
      --zero-stage 1)
"$troupe" train "${args[@]}" --metrics-file "$work/plain.jsonl" > "$work/plain.log" 2>&1
"$troupe" train "${args[@]}" --save "$work/ckpt" --save-interval "$K" --metrics-file "$work/save.jsonl" \
  > "$work/save.log" 2>&1
du -sh "$work/ckpt/iter_$(printf %07d "$K")" | cut -f1 > "$work/size"
python3 - "$work" "$K" "$N" <<'PY'
import json, statistics, sys
work, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def read(path):
    return [json.loads(l) for l in open(path)]
plain = {j["iteration"]: j["ms_per_iter"] for j in read(f"{work}/plain.jsonl") if j.get("type") == "train"}
# In the save run's metrics file, in time order: iterations, snapshots, commits. An iteration whose
# line comes after a snapshot and not after that save's commit overlapped the background write.
save, during, writing, snap, bg = {}, [], False, [], []
for j in read(f"{work}/save.jsonl"):
    t = j.get("type")
    if t == "checkpoint_snapshot":
        writing = True
        snap.append(j["seconds"])
    elif t == "checkpoint_committed":
        writing = False
        bg.append(j["seconds"])
    elif t == "train":
        save[j["iteration"]] = j["ms_per_iter"]
        if writing:
            during.append(j["iteration"])
        # the iteration whose end the commit follows also overlapped: counted above
rest = [i for i in range(3, n + 1) if i not in during and i % k != 0]
size = open(f"{work}/size").read().strip()
p_d, s_d = statistics.median(plain[i] for i in during), statistics.median(save[i] for i in during)
p_r, s_r = statistics.median(plain[i] for i in rest), statistics.median(save[i] for i in rest)
print(f"checkpoint size {size}; snapshot in the training path: median {statistics.median(snap)*1e3:.0f} ms; "
      f"background write + commit: median {statistics.median(bg):.2f} s")
print(f"iterations overlapping a background save {during}: {s_d:.1f} ms/iter vs {p_d:.1f} without saving "
      f"({100 * (s_d / p_d - 1):+.1f}%)")
print(f"other iterations: {s_r:.1f} vs {p_r:.1f} ms/iter ({100 * (s_r / p_r - 1):+.1f}%)")
PY
