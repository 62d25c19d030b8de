#!/usr/bin/env bash
# A run never resumes another run's state by accident (config/run_identity.hpp):
#  - --save into a folder holding another run's checkpoints, without --load, is refused (exit 2, the
#    folder untouched): the reproducer where a restart resumed an earlier run and printed
#    "finished at iteration 30/20";
#  - a restarted process (TROUPE_RESTART_COUNT, as troupe launch sets it) resumes the latest
#    checkpoint in --save only when TROUPE_RUN_ID names the run that wrote it;
#  - --load follows Megatron's rules: another --seed, model shape or learning-rate schedule is
#    refused naming every difference at once; --override-opt_param-scheduler and
#    --use-checkpoint-opt_param-scheduler resolve a schedule change (the latter continues the
#    checkpoint's schedule exactly); batch size and layout may change.
source "$(dirname "$0")/common.bash"
make_corpus

expect_refusal() {  # name, expected text, command...
  local name=$1 text=$2
  shift 2
  local rc=0
  "$@" > "$name.log" 2>&1 || rc=$?
  [[ $rc -eq 2 ]] || { cat "$name.log" >&2; fail "$name: exit $rc, want 2"; }
  grep -qF -- "$text" "$name.log" || { cat "$name.log" >&2; fail "$name: no message \"$text\""; }
}
run_id_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run"]["id"])' "$1"; }

# --- the reproducer: another run's checkpoint in --save --------------------------------------------
small_train --train-iters 30 --seed 7 --save CK --save-interval 30 > first.log
[[ $(cat CK/latest_checkpointed_iteration.txt) == 30 ]] || fail "the first run did not save iteration 30"
first_id=$(run_id_of CK/iter_0000030/metadata.json)
[[ ${#first_id} == 32 ]] || fail "metadata.json has no 32-digit run id: $first_id"
before=$(find CK -type f | sort | xargs md5sum)
TROUPE_FAULT_THROW=rank0@5 expect_refusal other_run "holds the checkpoints of another run" \
  small_train --train-iters 20 --seed 99 --save CK --save-interval 10 --max-restarts 1
grep -qF -- "--load CK" other_run.log || fail "the refusal does not name the fix --load CK"
[[ "$(find CK -type f | sort | xargs md5sum)" == "$before" ]] || fail "the refused run changed CK"

# --- a restarted process resumes only its own run ------------------------------------------------
# What troupe launch does on a restart: TROUPE_RESTART_COUNT > 0 and the launch's TROUPE_RUN_ID.
TROUPE_RESTART_COUNT=1 TROUPE_RUN_ID=0123456789abcdef0123456789abcdef expect_refusal restart_other \
  "holds the checkpoints of another run" small_train --train-iters 40 --seed 7 --save CK
grep -q "not this run's" restart_other.log || fail "the restart did not say the checkpoint is not its run's"
TROUPE_RESTART_COUNT=1 TROUPE_RUN_ID=$first_id small_train --train-iters 40 --seed 7 --save CK --lr-decay-iters 30 \
  --metrics-file restart_own.jsonl > restart_own.log 2>&1 || { cat restart_own.log; fail "the restart of its own run failed"; }
grep -q "resuming this run's latest checkpoint, CK/iter_0000030" restart_own.log || { cat restart_own.log; fail "no resume note"; }
[[ $(losses restart_own.jsonl | head -1 | cut -d' ' -f1) == 31 ]] || fail "the restarted run did not continue at iteration 31"
[[ $(run_id_of CK/iter_0000040/metadata.json) == "$first_id" ]] || fail "the resumed run changed its run id"

# In one process (--max-restarts): the failed attempt restarts from this run's checkpoint.
TROUPE_FAULT_THROW=rank0@7 small_train --train-iters 8 --save own --save-interval 5 --max-restarts 1 \
  --metrics-file own.jsonl > own.log 2>&1 || { cat own.log; fail "the restarted job failed"; }
grep -q "restart 1 of 1: every actor anew, from own/iter_0000005" own.log || { cat own.log; fail "no restart note"; }

# --- --load: Megatron's rules ----------------------------------------------------------------------
small_train --train-iters 10 --seed 7 --save base --save-interval 5 --exit-interval 5 --metrics-file straight.jsonl > /dev/null
expect_refusal seed "--seed is 8 but the checkpoint's run used 7" \
  small_train --train-iters 10 --seed 8 --load base --save base
expect_refusal shape "--hidden-size is 60" \
  small_train --train-iters 10 --seed 7 --load base --save other --hidden-size 60 --num-layers 3
grep -qF -- "--num-layers is 3" shape.log || fail "the shape refusal does not list every difference"
expect_refusal schedule "--lr is 0.001 but the checkpoint's run used 0.003" \
  small_train --train-iters 10 --seed 7 --load base --save sched --lr 1e-3
grep -qF -- "--use-checkpoint-opt_param-scheduler" schedule.log || fail "the schedule refusal names no fix"
expect_refusal longer "the decay length" small_train --train-iters 20 --seed 7 --load base --save longer
expect_refusal both "are both given" small_train --train-iters 10 --seed 7 --load base --save both \
  --override-opt_param-scheduler --use-checkpoint-opt_param-scheduler

# --use-checkpoint-opt_param-scheduler keeps the checkpoint's schedule: with other schedule flags the
# resumed iterations equal the straight run's exactly.
small_train --train-iters 10 --seed 7 --save s10 --metrics-file s10.jsonl > /dev/null
cp -r base keep
small_train --train-iters 10 --seed 7 --load keep --save keep --lr 1 --min-lr 0.5 --lr-decay-style linear \
  --use-checkpoint-opt_param-scheduler --metrics-file keep.jsonl > keep.log
losses s10.jsonl | tail -5 > a.txt
losses keep.jsonl > b.txt
diff a.txt b.txt || fail "--use-checkpoint-opt_param-scheduler did not continue the checkpoint's schedule"
# --override-opt_param-scheduler takes this run's schedule from the checkpoint's iteration on.
cp -r base over
small_train --train-iters 10 --seed 7 --load over --save over --lr 1e-3 --lr-decay-style constant \
  --override-opt_param-scheduler --metrics-file over.jsonl > over.log
grep -q "resuming with changes: .*--lr 0.003 -> 0.001" over.log || { cat over.log; fail "the schedule change was not reported"; }
python3 - over.jsonl <<'PY' || fail "--override-opt_param-scheduler did not use this run's learning rate"
import json, sys
lrs = [json.loads(l)["lr"] for l in open(sys.argv[1]) if json.loads(l).get("type") == "train"]
assert lrs and all(abs(lr - 1e-3) < 1e-15 for lr in lrs), lrs
PY
# Allowed changes (batch size, layout) resume and are reported.
cp -r base wider
small_train --train-iters 10 --seed 7 --load wider --save wider --global-batch-size 12 \
  --tensor-model-parallel-size 3 > wider.log || { cat wider.log; fail "an allowed change was refused"; }
grep -q "resuming with changes: .*global batch size 6 -> 12" wider.log || { cat wider.log; fail "no change note"; }
echo PASS
