#!/usr/bin/env bash
# Faults during a save (issue 10, item 5), end to end with `troupe train --save`: a full disk (a
# real 2 MiB tmpfs, filled by the run's own checkpoints), ENOSPC and EIO injected into the n-th write
# or fsync of the checkpoint writer (TROUPE_FAULT_IO, storage/durable.hpp) on one process and on a
# tensor 2 x data 2 layout, and a read-only folder (a read-only bind mount; the injected EROFS of a
# rename where mounts are not allowed). Each time: a message naming the reason, exit code 1, no
# signal, no temporary file, no iter_* folder without metadata.json, the latest pointer still names
# the previous complete checkpoint and it loads; a resume on the same still-full disk fails the same
# clean way; after freeing space the resume completes with the uninterrupted run's losses, bitwise.
source "$(dirname "$0")/common.bash"
make_corpus

args=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
      --global-batch-size 6 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 3
      --weight-decay 0.1 --data-path d_text_document --tokenizer-type ByteLevelTokenizer
      --eval-interval 1000 --log-interval 1000 --num-threads 1 --train-iters 12 --save-interval 4)
run() { "$troupe" train "${args[@]}" "$@"; }
par=(--tensor-model-parallel-size 2 --data-parallel-size 2 --zero-stage 1)

# expect_failed_save LOG DIR LATEST REASON: the run (exit code in $rc) failed cleanly.
expect_failed_save() {
  local log=$1 dir=$2 latest=$3 reason=$4
  [[ $rc -eq 1 ]] || { cat "$log" >&2; fail "exit $rc, wanted 1 (a run-time failure, no signal): $log"; }
  grep -q "error: .*$reason" "$log" || { cat "$log" >&2; fail "$log does not say '$reason'"; }
  if find "$dir" -name '*.tmp' | grep -q .; then find "$dir" >&2; fail "temporaries left in $dir"; fi
  for d in "$dir"/iter_*; do
    [[ -f $d/metadata.json ]] || { ls -la "$d" >&2; fail "$d was left without metadata.json"; }
  done
  [[ $(cat "$dir/latest_checkpointed_iteration.txt") == "$latest" ]] || fail "latest is not $latest in $dir"
  "$troupe" ckpt info "$dir" > /dev/null || fail "the previous checkpoint in $dir does not load"
  echo "ok: $log failed cleanly ($reason), $dir still at iteration $latest"
}

# same_losses REF GOT: every iteration GOT ran has REF's loss and gradient norm, bitwise.
same_losses() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def read(path):
    return {j["iteration"]: (j["lm_loss"], j["grad_norm"]) for j in map(json.loads, open(path)) if j.get("type") == "train"}
ref, got = read(sys.argv[1]), read(sys.argv[2])
assert got, f"{sys.argv[2]} has no training lines"
for it in sorted(got):
    assert it in ref and got[it] == ref[it], f"iteration {it}: {got[it]} vs the uninterrupted run's {ref.get(it)}"
print(f"ok: {sys.argv[2]} matches the uninterrupted run bitwise at iterations {sorted(got)}")
PY
}

run --metrics-file ref1.jsonl > ref1.log 2>&1 || { cat ref1.log; fail "the reference run failed"; }
run "${par[@]}" --metrics-file ref4.jsonl > ref4.log 2>&1 || { cat ref4.log; fail "the tp2 x dp2 reference failed"; }

# 1. A real full disk.
mkdir -p full
if mount -t tmpfs -o size=2m tmpfs full 2> /dev/null; then
  trap 'umount "$work/full" 2> /dev/null || true; umount "$work/ro" 2> /dev/null || true; rm -rf "$work"' EXIT
  set +e
  run --save full/ck --metrics-file f1.jsonl > f1.log 2>&1
  rc=$?
  set -e
  expect_failed_save f1.log full/ck 8 "No space left on device"
  # A resume on the same full disk: the same clean failure.
  set +e
  run --load full/ck --save full/ck > f2.log 2>&1
  rc=$?
  set -e
  expect_failed_save f2.log full/ck 8 "No space left on device"
  # The message says how much the file needs and how much the disk has, as df and du see them.
  python3 - f2.log full/ck/iter_0000008/shard_00000.h5 full <<'PY' || { cat f2.log; fail "the full disk's message lacks the figures"; }
import os, re, sys
m = re.search(r"shard_00000\.h5 needs ([0-9.]+) (KiB|MiB); its disk has ([0-9.]+) (KiB|MiB) free", open(sys.argv[1]).read())
assert m, "no 'needs X; its disk has Y free'"
unit = {"KiB": 1024, "MiB": 1024 * 1024}
need, free = float(m[1]) * unit[m[2]], float(m[3]) * unit[m[4]]
shard = os.path.getsize(sys.argv[2])  # the same model's shard of iteration 8
st = os.statvfs(sys.argv[3])
assert abs(need - shard) <= 0.02 * shard, (need, shard)
assert abs(free - st.f_bavail * st.f_frsize) <= 0.02 * shard, (free, st.f_bavail * st.f_frsize)
print(f"ok: the message says {m[1]} {m[2]} needed (the shard is {shard} bytes), {m[3]} {m[4]} free")
PY
  rm -rf full/ck/iter_0000004  # free space
  run --load full/ck --save full/ck --metrics-file f3.jsonl > f3.log 2>&1 || { cat f3.log; fail "resume after freeing space"; }
  [[ $(cat full/ck/latest_checkpointed_iteration.txt) == 12 ]] || fail "the resumed run did not save iteration 12"
  same_losses ref1.jsonl f3.jsonl
  # An unfinished save (a process killed while writing iteration 12: shards, no metadata.json) fills
  # the disk's last room: the resume from iteration 8 removes that debris and saves 12 in its place,
  # needing no space beyond what it writes (before: "No space left on device" until freed by hand).
  rm -rf full/ck/iter_0000012 full/ck/iter_0000004
  echo 8 > full/ck/latest_checkpointed_iteration.txt
  mkdir full/ck/iter_0000012
  cp full/ck/iter_0000008/shard_00000.h5 full/ck/iter_0000012/shard_00000.h5
  # The disk now has less free than one shard: the save of iteration 12 fits only in the debris's place.
  (( $(df -k --output=avail full | tail -1) * 1024 < $(stat -c %s full/ck/iter_0000008/shard_00000.h5) )) ||
    { df -k full; fail "the planted debris did not fill the disk"; }
  run --load full/ck --save full/ck --metrics-file f4.jsonl > f4.log 2>&1 || { cat f4.log; df -k full; fail "resume beside an unfinished save"; }
  grep -q "removed the unfinished save full/ck/iter_0000012" f4.log || { cat f4.log; fail "no note of the removed debris"; }
  [[ $(cat full/ck/latest_checkpointed_iteration.txt) == 12 && -f full/ck/iter_0000012/metadata.json ]] ||
    fail "the resume beside debris did not save iteration 12"
  same_losses ref1.jsonl f4.jsonl
else
  echo "skipped the real full disk: mount -t tmpfs is not allowed here (not root, or no CAP_SYS_ADMIN)"
fi

# 2. Injected: ENOSPC on every write from the second save's first shard on (the disk stays full),
#    on tp 2 x dp 2 in one process. A save makes 14 writes: 4 shards of 3 (a shard under 4 MiB: its
#    header's place, its data, its header), metadata.json, the pointer.
set +e
TROUPE_FAULT_IO='write@15+:ENOSPC' run "${par[@]}" --save p4 > p4.log 2>&1
rc=$?
set -e
expect_failed_save p4.log p4 4 "No space left on device"
run "${par[@]}" --load p4 --save p4 --metrics-file p4r.jsonl > p4r.log 2>&1 || { cat p4r.log; fail "resume of p4"; }
same_losses ref4.jsonl p4r.jsonl

# 3. Injected EIO on the fsync of the second save's metadata.json (after its shard is durable: the
#    commit fails, its folder goes). One save fsyncs: shard, folder; iteration folder; metadata.json,
#    folder; checkpoint folder; pointer, folder = 8.
set +e
TROUPE_FAULT_IO='fsync@12:EIO' run --save e1 > e1.log 2>&1
rc=$?
set -e
expect_failed_save e1.log e1 4 "Input/output error"

# 4. A read-only folder. Mid-save: an injected EROFS on the rename of the second save's shard.
#    Before the run: a read-only bind mount over a folder holding a checkpoint (root ignores
#    permissions, so chmod would not do): troupe train refuses --save up front (exit 2) and the
#    checkpoint there is untouched and loads.
set +e
TROUPE_FAULT_IO='rename@4:EROFS' run --save ro2 > ro2.log 2>&1
rc=$?
set -e
expect_failed_save ro2.log ro2 4 "Read-only file system"
run --train-iters 4 --save ro_src > /dev/null 2>&1 || fail "seed run for the read-only folder"
mkdir -p ro
if mount --bind ro_src ro 2> /dev/null && mount -o remount,ro,bind ro 2> /dev/null; then
  set +e
  run --load ro --save ro > ro.log 2>&1
  rc=$?
  set -e
  [[ $rc -eq 2 ]] && grep -q "error: .*ro" ro.log || { cat ro.log >&2; fail "a read-only --save: exit $rc"; }
  [[ $(cat ro/latest_checkpointed_iteration.txt) == 4 ]] && "$troupe" ckpt info ro > /dev/null || fail "ro changed"
  umount ro
  echo "ok: a read-only --save folder is refused up front (exit 2), its checkpoint intact"
else
  echo "skipped the read-only bind mount: mount is not allowed here"
fi
echo PASS
