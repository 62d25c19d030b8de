#!/usr/bin/env bash
# Background saves are bounded (--max-saves-in-flight, default 1): a save waits until the writer has
# committed the one before, so the snapshots held in memory and the distance to the latest durable
# checkpoint stay bounded even with --save-interval 1 (the issue: the latest checkpoint fell 282
# iterations behind, resident memory grew 58 -> 291 MB, ~160 empty iter_* folders were left).
# Checked from the metrics file's checkpoint_snapshot / checkpoint_committed lines, the folders left,
# and the peak resident memory against a run that saves nothing.
source "$(dirname "$0")/common.bash"
make_corpus

# How many snapshots were ever not yet committed at once (in the order the job reported them).
max_pending() {
  python3 - "$1" <<'PY'
import json, sys
pending, worst = set(), 0
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("type") == "checkpoint_snapshot":
        pending.add(j["iteration"])
        worst = max(worst, len(pending))
    elif j.get("type") == "checkpoint_committed":
        pending.discard(j["iteration"])
print(worst)
PY
}
no_empty_iterations() {
  for d in "$1"/iter_*; do
    [[ -f $d/metadata.json ]] || fail "$d has no metadata.json (an empty or unfinished save was left)"
  done
}

# A slow writer (TROUPE_SAVE_DUTY: it works 5% of the time while the cores are busy) and a save per
# iteration, across two processes.
model=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3 --global-batch-size 6
       --lr 3e-3 --data-path d_text_document --tokenizer-type ByteLevelTokenizer --eval-interval 1000
       --log-interval 1000 --num-threads 1 --train-iters 16 --save-interval 1)
TROUPE_SAVE_DUTY=0.05 "$troupe" launch --nproc-per-node 2 -- train "${model[@]}" --tensor-model-parallel-size 2 \
  --save q1 --metrics-file q1.jsonl > q1.log 2>&1 || { cat q1.log; fail "the job with a save per iteration failed"; }
[[ $(max_pending q1.jsonl) -eq 1 ]] || fail "more than one save was in flight: $(max_pending q1.jsonl)"
[[ $(cat q1/latest_checkpointed_iteration.txt) == 16 ]] || fail "the last save is not the latest"
[[ $(grep -c checkpoint_committed q1.jsonl) -eq 16 ]] || fail "not every save was committed"
no_empty_iterations q1

TROUPE_SAVE_DUTY=0.05 "$troupe" train "${model[@]}" --max-saves-in-flight 2 --save q2 --metrics-file q2.jsonl > q2.log 2>&1 ||
  { cat q2.log; fail "--max-saves-in-flight 2 failed"; }
[[ $(max_pending q2.jsonl) -le 2 ]] || fail "more than two saves were in flight: $(max_pending q2.jsonl)"
no_empty_iterations q2

# Memory: a model whose checkpoint is ~40 MB, saved every iteration, holds at most about one extra
# snapshot over a run that saves nothing (an unbounded queue would hold one per iteration behind).
big=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 64 --micro-batch-size 2 --global-batch-size 2
     --lr 1e-4 --data-path d_text_document --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --log-interval 1000
     --num-threads 2 --train-iters 20)
peak_mib() { sed -n 's/.*peak resident memory of this process: \([0-9]*\) MiB.*/\1/p' "$1"; }
"$troupe" train "${big[@]}" > nosave.log 2>&1 || fail "the run without saves failed"
TROUPE_SAVE_DUTY=0.05 "$troupe" train "${big[@]}" --save big --save-interval 1 --metrics-file big.jsonl > big.log 2>&1 ||
  { cat big.log; fail "the run saving every iteration failed"; }
ckpt_mib=$(du -sm big/iter_0000020 | cut -f1)
extra=$(($(peak_mib big.log) - $(peak_mib nosave.log)))
echo "peak resident memory: $(peak_mib nosave.log) MiB without saves, $(peak_mib big.log) MiB saving every iteration; checkpoint $ckpt_mib MiB"
((extra <= 3 * ckpt_mib)) || fail "saving every iteration added $extra MiB (checkpoint $ckpt_mib MiB): the queue is not bounded"
[[ $(max_pending big.jsonl) -eq 1 ]] || fail "more than one save was in flight"
no_empty_iterations big

# The job's last save is written unpaced once training is over, even when every core is busy with
# other work (the writer used to pace itself for a step that no longer runs: a 400 MB last save took
# over ten minutes beside a build). Busy loops at the lowest priority fill every core; at duty 0.01
# the paced write of this ~85 MB checkpoint would take over 20 s.
busy=()
for _ in $(seq "$(nproc)"); do nice -n 19 bash -c 'while :; do :; done' & busy+=($!); done
trap 'kill ${busy[*]} 2>/dev/null || true; rm -rf "$work"' EXIT
TROUPE_SAVE_DUTY=0.01 "$troupe" train --num-layers 4 --hidden-size 384 --num-attention-heads 4 --seq-length 64 \
  --micro-batch-size 2 --global-batch-size 2 --lr 1e-4 --data-path d_text_document --tokenizer-type ByteLevelTokenizer \
  --num-threads 2 --train-iters 1 --save last --metrics-file last.jsonl > last.log 2>&1 || { cat last.log; fail "the job on busy cores failed"; }
kill "${busy[@]}" 2>/dev/null || true
written=$(python3 -c 'import json,sys; print(next(json.loads(l)["seconds"] for l in open(sys.argv[1]) if "checkpoint_committed" in l))' last.jsonl)
echo "the last save of $(du -sm last/iter_0000001 | cut -f1) MiB beside busy cores: written in $written s"
python3 -c "import sys; sys.exit(0 if $written < 8 else 1)" || fail "the last save took $written s: it was paced after training"
echo PASS
