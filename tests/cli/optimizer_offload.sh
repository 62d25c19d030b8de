#!/usr/bin/env bash
# Optimizer offload changes where the Adam moments live, never the numbers: --offload-optimizer cpu
# and nvme train bitwise like none (one process, and tp/dp ZeRO layouts), also when set from the
# DeepSpeed JSON; a run saved without offload resumes with nvme offload bitwise; the swap files
# are gone after the run; a bad --offload-path is refused before anything runs.
source "$(dirname "$0")/common.bash"
make_corpus
mkdir swap

run() {  # name, then flags
  local name=$1
  shift
  small_train --train-iters 6 --num-threads 2 --metrics-file "$name.jsonl" "$@" > "$name.log" 2>&1 ||
    { cat "$name.log"; fail "$name: the run failed"; }
  losses "$name.jsonl" > "$name.txt"
  [[ $(wc -l < "$name.txt") == 6 ]] || fail "$name: expected 6 iterations"
}

run none --save ck_none
run cpu --offload-optimizer cpu --save ck_cpu
run nvme --offload-optimizer nvme --offload-path swap --save ck_nvme
# One engine for every layout: with or without offload the same numbers, gradient norms included.
diff none.txt cpu.txt || fail "--offload-optimizer cpu changed the losses"
diff cpu.txt nvme.txt || fail "--offload-optimizer nvme differs from cpu"
grep -q "optimizer offload: nvme" nvme.log || fail "the nvme run did not report its offload"
[[ -z $(ls -A swap) ]] || fail "swap files left behind: $(ls swap)"
# The checkpoints hold the same model and optimizer state.
for ck in ck_cpu ck_nvme; do
  ea=$("$troupe" eval --load ck_none --data-path d_text_document --eval-samples 20 --json)
  eb=$("$troupe" eval --load $ck --data-path d_text_document --eval-samples 20 --json)
  [[ "${ea/ck_none/X}" == "${eb/$ck/X}" ]] || fail "$ck evaluates differently: $ea vs $eb"
done

# Parallel layouts: pp 2 x dp 2 with ZeRO-1 and dp 2 with ZeRO-3, nvme against in memory.
run tpdp --pipeline-model-parallel-size 2 --data-parallel-size 2 --zero-stage 1
run tpdp_nvme --pipeline-model-parallel-size 2 --data-parallel-size 2 --zero-stage 1 --offload-optimizer nvme --offload-path swap
diff tpdp.txt tpdp_nvme.txt || fail "pp2 dp2 ZeRO-1: nvme offload changed the losses"
run z3 --data-parallel-size 2 --zero-stage 3
cat > ds.json <<JSON
{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "swap", "pin_memory": true, "buffer_count": 4}}}
JSON
run z3_ds --data-parallel-size 2 --deepspeed-config ds.json
grep -q "optimizer offload: nvme" z3_ds.log || fail "the DeepSpeed offload_optimizer block was not applied"
diff z3.txt z3_ds.txt || fail "dp2 ZeRO-3 with DeepSpeed's nvme offload changed the losses"

# Saved without offload at 3, resumed with nvme offload: the moments go into the swap file.
small_train --train-iters 6 --exit-interval 3 --num-threads 2 --save half --metrics-file resumed.jsonl > /dev/null
small_train --train-iters 6 --num-threads 2 --load half --offload-optimizer nvme --offload-path swap \
  --metrics-file resumed.jsonl > resumed.log 2>&1 || { cat resumed.log; fail "resume with nvme offload failed"; }
losses resumed.jsonl > resumed.txt
diff none.txt resumed.txt || fail "a resume with nvme offload differs from the straight run"
[[ -z $(ls -A swap) ]] || fail "swap files left behind: $(ls swap)"

# Bad input: refused before anything runs, naming the flag.
if small_train --train-iters 6 --offload-optimizer nvme --offload-path nowhere > bad.log 2>&1; then
  fail "a missing --offload-path directory was accepted"
fi
grep -q -- "--offload-path nowhere is not a directory" bad.log || { cat bad.log; fail "unclear error"; }
if small_train --train-iters 6 --offload-optimizer nvme > bad.log 2>&1; then fail "nvme without a path was accepted"; fi
grep -q -- "no --offload-path is given" bad.log || { cat bad.log; fail "unclear error"; }
echo "losses equal with and without offload: $(tail -1 none.txt)"
echo PASS
