#!/usr/bin/env bash
# The job's own CPU per inspector request (issue 12): what answering `status` costs the training
# process, apart from the client's CPU and from the spread of step times between runs. A job on the
# reference benchmark's layers (4 x 384, 6 heads, sequence 256, micro-batch 8) is paused (no step
# runs, its watchdogs and server go on), then its CPU time (utime + stime, /proc/PID/stat) is read
# over a quiet window and over a window of N requests of the same length; the difference over N is
# the CPU the job spends per answered request: the TLS handshake, the command, the snapshots of every
# board. At one request a second that is the share of one core that polling takes from training.
#   bench/inspect_request_cost.sh [N] [COMMAND]   (default 200 requests of "status"; TROUPE_BIN as usual)
set -euo pipefail
troupe=$(realpath "${TROUPE_BIN:-build/bin/troupe}")
n=${1:-200}
command=${2:-status}
work=$(mktemp -d /tmp/troupe-inspect-cost.XXXXXX)
trap 'kill -9 $job 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
"$troupe" train --num-layers 4 --hidden-size 384 --num-attention-heads 6 --seq-length 256 --max-position-embeddings 256 \
  --micro-batch-size 8 --global-batch-size 8 --mock-data --tokenizer-type ByteLevelTokenizer --train-iters 100000 \
  --log-interval 1000 --eval-interval 1000 --tensor-model-parallel-size "${TP:-1}" --pipeline-model-parallel-size "${PP:-1}" \
  --inspect 0 --inspect-file insp.json > job.log 2>&1 &
job=$!
for _ in $(seq 1 600); do [[ -s insp.json ]] && break; sleep 0.1; done
[[ -s insp.json ]] || { cat job.log; echo "no inspect file" >&2; exit 1; }
"$troupe" inspect insp.json --exec pause > /dev/null
sleep 1
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$job/stat"; }  # utime + stime of the whole process, in ticks
# The requests' window, then a quiet window of the same length.
c0=$(cpu); t0=$(date +%s.%N)
for _ in $(seq 1 "$n"); do "$troupe" inspect insp.json --exec "$command" > /dev/null; done
c1=$(cpu); t1=$(date +%s.%N)
wall=$(python3 -c "print($t1 - $t0)")
sleep "$wall"
c2=$(cpu)
python3 - "$c0" "$c1" "$c2" "$ticks" "$n" "$wall" "$command" <<'PY'
import sys
c0, c1, c2, ticks, n, wall = (float(x) for x in sys.argv[1:7])
busy, quiet = (c1 - c0) / ticks, (c2 - c1) / ticks
per = (busy - quiet) / n
print(f"{int(n)} requests of {sys.argv[7]!r} in {wall:.1f} s: the job used {busy:.2f} CPU s, {quiet:.2f} CPU s in a quiet "
      f"window as long")
print(f"the job's CPU per request: {per * 1e3:.2f} ms; polled once a second: {per * 100:.2f}% of one core")
PY
"$troupe" inspect insp.json --exec resume > /dev/null
