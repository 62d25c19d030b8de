#!/usr/bin/env bash
# In-memory snapshots (docs/RESILIENCE.md, "Memory snapshots"): with --save-memory-interval N the job
# snapshots its state every N iterations into a folder on a tmpfs, in the background; a restart
# (--max-restarts) resumes from the newest of that snapshot and the latest save in --save. A rank
# that throws at iteration 17 with snapshots every 5 iterations loses only iteration 16, and the
# losses after the restart equal an uninterrupted run's bitwise (one rank, and pp 2 x dp 2); an older
# snapshot than the latest save is not taken; the folder is gone when the run ends. Under troupe
# launch (two processes, no --save) the restarted processes resume from the run's snapshot. A failed
# attempt in one process commits the snapshot it handed over last before the restart (the job
# flushes the writer's queue), so the restart point does not depend on the writer's speed.
source "$(dirname "$0")/common.bash"
make_corpus
lost() { python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "\"goodput\"" in l][-1]["iterations_lost"])' "$1"; }

small_train --train-iters 30 --log-interval 1 --metrics-file plain.jsonl > plain.log 2>&1 || { cat plain.log; fail "the plain run failed"; }
mkdir shm
TROUPE_FAULT_THROW=rank0@17 small_train --train-iters 30 --log-interval 1 --save-memory-interval 5 --save-memory-dir "$work/shm" \
  --max-restarts 1 --metrics-file mem.jsonl > mem.log 2>&1 || { cat mem.log; fail "the job with memory snapshots failed"; }
grep -q "restart 1 of 1: every actor anew, from the in-memory snapshot of iteration 15" mem.log ||
  { cat mem.log; fail "the restart did not resume from the snapshot of iteration 15"; }
same_losses plain.jsonl mem.jsonl || fail "the losses after the restart from memory differ"
[[ $(lost mem.jsonl) == 1 ]] || fail "the restart from memory lost $(lost mem.jsonl) iterations, not 1"
[[ $(grep -c '"memory_snapshot"' mem.jsonl) -ge 5 ]] || fail "the metrics file misses the snapshots"
[[ -z $(ls -A shm) ]] || { ls -laR shm; fail "the snapshot folder outlived the run"; }
# A folder on a disk works, synced as a save is, and the job says so (tests/cli/multihost.sh: none on /dev/shm).
if [[ $(stat -f -c %T "$work") == tmpfs ]]; then
  ! grep -q "is not on a tmpfs" mem.log || fail "a tmpfs folder was taken for a disk"
else
  grep -q "folder $work/shm/troupe-memory-[0-9]* is not on a tmpfs" mem.log || { cat mem.log; fail "no word that the snapshots go to a disk"; }
fi

# Snapshot files reused (engine/buffer_recycler.hpp): with pieces of 64 KiB or more, from the third
# snapshot on each rank's shard is written where the one two snapshots before lay (its pages took
# the copies in the training path); a restart from such a snapshot gives the uninterrupted run's
# losses bitwise. One rank (ZeRO 0: the padded embedding's moments are views into larger copies),
# and pp 2 x dp 2 with ZeRO-1 (four ranks, each its own files).
in_place() { python3 -c 'import json,sys; print(",".join(str(j["shards_in_place"]) for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "memory_snapshot_committed"))' "$1"; }
# restart_in_place NAME FAULT INTERVAL RESUMED EXPECTED_IN_PLACE TRAIN_ARGS...: the plain run, then the
# run that fails at FAULT and resumes from the snapshot of RESUMED, with the same losses, whose
# committed snapshots' shards written in place match EXPECTED_IN_PLACE (a glob).
restart_in_place() {
  local name=$1 fault=$2 interval=$3 resumed=$4 expected=$5
  shift 5
  "$troupe" train "$@" --metrics-file "${name}_plain.jsonl" > "${name}_plain.log" 2>&1 || { cat "${name}_plain.log"; fail "$name: the plain run failed"; }
  TROUPE_FAULT_THROW=$fault "$troupe" train "$@" --save-memory-interval "$interval" --save-memory-dir "$work/shm" \
    --max-restarts 1 --metrics-file "$name.jsonl" > "$name.log" 2>&1 || { cat "$name.log"; fail "$name: the run with snapshots failed"; }
  grep -q "from the in-memory snapshot of iteration $resumed" "$name.log" || { cat "$name.log"; fail "$name: no resumption from $resumed"; }
  same_losses "${name}_plain.jsonl" "$name.jsonl" || fail "$name: the losses after a restart from a snapshot written in place differ"
  [[ $(in_place "$name.jsonl") == $expected ]] || fail "$name: shards written in place per snapshot: $(in_place "$name.jsonl"), not $expected"
  [[ -z $(ls -A shm) ]] || { ls -laR shm; fail "$name: the snapshot folder (or a kept file) outlived the run"; }
}
wide=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3 --global-batch-size 6
      --lr 3e-3 --lr-warmup-iters 3 --data-path d_text_document --tokenizer-type ByteLevelTokenizer --eval-interval 1000
      --log-interval 1 --train-iters 30)
restart_in_place wide rank0@27 5 25 "0,0,1,1,1,0*" "${wide[@]}"  # snapshots 15, 20, 25 in place
restart_in_place wide4 rank3@22 4 20 "0,0,4,4,4,0*" "${wide[@]}" --pipeline-model-parallel-size 2 --data-parallel-size 2 \
  --num-threads 2 --zero-stage 1  # snapshots 12, 16, 20 in place by all four ranks

# Folders of processes that are gone (killed before they could remove theirs: a tmpfs keeps them in
# memory until the machine restarts) are swept when a run opens its own; a live owner's folder, one
# without an owner file, and one whose pid lives but started at another time (a reused pid) are told
# apart.
mkdir -p shm3/troupe-memory-dead/iter_0000004 shm3/troupe-memory-live shm3/troupe-memory-reused shm3/troupe-memory-noowner
sleep 0 & dead=$!; wait $dead
echo "$dead 12345" > shm3/troupe-memory-dead/owner
my_start=$(sed 's/.*) //' /proc/$$/stat | awk '{print $20}')
echo "$$ $my_start" > shm3/troupe-memory-live/owner
echo "$$ $((my_start + 1))" > shm3/troupe-memory-reused/owner
small_train --train-iters 6 --save-memory-interval 2 --save-memory-dir "$work/shm3" > sweep.log 2>&1 || { cat sweep.log; fail "the sweeping run failed"; }
[[ ! -e shm3/troupe-memory-dead && ! -e shm3/troupe-memory-reused ]] || { ls -la shm3; fail "abandoned snapshot folders stayed"; }
[[ -d shm3/troupe-memory-live && -d shm3/troupe-memory-noowner ]] || { ls -la shm3; fail "a folder with a live owner or none was removed"; }
grep -q "removed .*troupe-memory-dead: the in-memory snapshots of a process that is gone" sweep.log || { cat sweep.log; fail "no note of the sweep"; }
[[ $(ls shm3 | wc -l) == 2 ]] || { ls -la shm3; fail "the run's own folder outlived it"; }

# pp 2 x dp 2, a save every 5 on disk and a snapshot every 3 in memory: the failure at 13 resumes
# from memory's 12, not disk's 10.
par=(--pipeline-model-parallel-size 2 --data-parallel-size 2 --num-threads 2 --train-iters 16 --log-interval 1)
small_train "${par[@]}" --metrics-file par_plain.jsonl > par_plain.log 2>&1 || { cat par_plain.log; fail "pp2 x dp2 failed"; }
TROUPE_FAULT_THROW=rank1@13 small_train "${par[@]}" --save ck --save-interval 5 --save-memory-interval 3 \
  --save-memory-dir "$work/shm" --max-restarts 1 --metrics-file par.jsonl > par.log 2>&1 || { cat par.log; fail "pp2 x dp2 with snapshots failed"; }
grep -q "from the in-memory snapshot of iteration 12" par.log || { cat par.log; fail "pp2 x dp2 did not resume from memory's 12"; }
same_losses par_plain.jsonl par.jsonl || fail "pp2 x dp2: the losses after the restart from memory differ"

# A snapshot older than the latest save: the save is taken (disk 12, memory 10).
TROUPE_FAULT_THROW=rank0@14 small_train --train-iters 16 --log-interval 1 --save ck2 --save-interval 4 \
  --save-memory-interval 5 --save-memory-dir "$work/shm" --max-restarts 1 > older.log 2>&1 || { cat older.log; fail "older snapshot run failed"; }
grep -q "restart 1 of 1: every actor anew, from ck2/iter_0000012" older.log || { cat older.log; fail "the newer save was not taken"; }

# Two processes under troupe launch, no --save at all: rank 1 throws at iteration 11, the launcher
# starts both again, and they resume from the run's snapshot of iteration 8 in the tmpfs folder the
# launcher keeps across restarts (and removes at its end).
lrun=(--num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 32 --micro-batch-size 3 --global-batch-size 6
      --lr 3e-3 --data-path d_text_document --tokenizer-type ByteLevelTokenizer --train-iters 16 --num-threads 1
      --log-interval 1)
"$troupe" launch --nproc-per-node 2 -- train "${lrun[@]}" --metrics-file lplain.jsonl > lplain.log 2>&1 ||
  { cat lplain.log; fail "the launched plain run failed"; }
mkdir shm2
TROUPE_FAULT_THROW=rank1@11 "$troupe" launch --nproc-per-node 2 --max-restarts 1 -- train "${lrun[@]}" \
  --save-memory-interval 4 --save-memory-dir "$work/shm2" --metrics-file lmem.jsonl > lmem.log 2>&1 ||
  { cat lmem.log; fail "the launched job with memory snapshots failed"; }
# The snapshot of 8 (or, when the failing process went down before both had committed it, of 4).
grep -qE "restarted: resuming this run's in-memory snapshot of iteration (8|4) " lmem.log ||
  { cat lmem.log; fail "the restarted processes did not resume from a snapshot"; }
same_losses lplain.jsonl lmem.jsonl || fail "launch: the losses after the restart from memory differ"
[[ -z $(ls -A shm2) ]] || { ls -laR shm2; fail "the launched run's snapshot folder outlived the launcher"; }
echo PASS
