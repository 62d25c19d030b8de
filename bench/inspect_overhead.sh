#!/usr/bin/env bash
# The inspector's cost (issue 12): troupe train on the reference benchmark's layers (4 x 384, 6
# heads, sequence 256, micro-batch 8; the byte-level vocabulary, so no vocabulary files), without
# --inspect against with --inspect and a client asking `status` every second, side by side with
# farm-bench (pairs in turn). The client runs at nice 19 (on a cluster it runs elsewhere; on this
# 2-core machine it shares the training's cores). Prints farm-bench's table (whole processes: the
# polled one also waits up to a second for its client loop to notice the end) and the training's
# own step time: each run's median ms per iteration over iterations 6 to 30 (its metrics file),
# compared pair by pair; docs/PERFORMANCE.md keeps the result.
#   bench/inspect_overhead.sh [PAIRS]      (TROUPE_BIN: the troupe binary; default build/bin/troupe)
#   PIN=1 bench/inspect_overhead.sh [PAIRS]  the job on core 0 with one compute thread, the client on
#                                            core 1: the job's own cost of being asked, without the
#                                            client's CPU on the job's core
set -euo pipefail
troupe=$(realpath "${TROUPE_BIN:-build/bin/troupe}")
job_pin="" client_pin="" threads=2 iters=30
if [[ "${PIN:-0}" == 1 ]]; then job_pin="taskset -c 0" client_pin="taskset -c 1" threads=1 iters=20; fi
pairs=${1:-8}
args="train --num-layers 4 --hidden-size 384 --num-attention-heads 6 --seq-length 256 --max-position-embeddings 256 \
--micro-batch-size 8 --global-batch-size 8 --mock-data --tokenizer-type ByteLevelTokenizer --train-iters $iters \
--log-interval 1000 --eval-interval 1000 --num-threads $threads"
work=$(mktemp -d /tmp/troupe-inspect-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/polled.sh" <<POLL
#!/bin/sh
f=\$(mktemp -u $work/insp.XXXXXX)
$job_pin "$troupe" $args --inspect 0 --inspect-file "\$f" --metrics-file "\$f.metrics" > /dev/null &
job=\$!
while kill -0 \$job 2>/dev/null; do
  [ -s "\$f" ] && $client_pin nice -n 19 "$troupe" inspect "\$f" --exec status > /dev/null 2>&1
  sleep 1
done
wait \$job
python3 $work/median.py "\$f.metrics" >> "$work/polled.log"
POLL
cat > "$work/plain.sh" <<PLAIN
#!/bin/sh
f=\$(mktemp -u $work/plain.XXXXXX)
$job_pin "$troupe" $args --metrics-file "\$f.metrics" > /dev/null
python3 $work/median.py "\$f.metrics" >> "$work/plain.log"
PLAIN
cat > "$work/median.py" <<'PY'
import json, statistics, sys
ms = [j["ms_per_iter"] for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "train" and j["iteration"] > 5]
print(statistics.median(ms))
PY
chmod +x "$work/polled.sh" "$work/plain.sh"
farm-bench -n "$pairs" --timeout 1800 --vs "$work/plain.sh" -- "$work/polled.sh"
python3 - "$work/polled.log" "$work/plain.log" <<'PY'
import re, statistics, sys
def ms(path):
    return [float(l) for l in open(path) if l.strip()]
polled, plain = ms(sys.argv[1]), ms(sys.argv[2])
n = min(len(polled), len(plain))
ratios = sorted(a / b for a, b in zip(polled[-n:], plain[-n:]))  # the counted pairs (the warm-up pair first)
print(f"step time, ms per iteration: polled median {statistics.median(polled):.1f}, plain {statistics.median(plain):.1f}")
print(f"polled / plain, pair by pair ({n} pairs, warm-up included): median {statistics.median(ratios):.4f}, "
      f"min {ratios[0]:.4f}, max {ratios[-1]:.4f}")
PY
