#!/usr/bin/env bash
# GPU training end to end (label gpu; skipped where the build has no CUDA backend or no GPU is
# usable): `troupe train --device cuda` against the same run on the CPU.
#   - fp32: 10 iterations' losses within 1e-5 relative of the CPU's (dropout on: the masks are the
#     CPU's Philox rule), and the evaluation loss;
#   - a checkpoint saved on the GPU resumes on the CPU with the straight CPU run's losses, and one
#     saved on the CPU resumes on the GPU;
#   - --offload-optimizer cpu on the GPU (moments on the host, AdamW on the CPU) as the CPU's run;
#   - bf16 on the GPU follows bf16 on the CPU within 16-bit rounding (1e-3 relative per iteration);
#   - with two GPUs or more: tensor parallelism, data parallelism + ZeRO-2 and pipeline parallelism
#     (1f1b, zb-h1, interleaved) over two processes (troupe launch, NCCL) equal the same layouts on the CPU within
#     1e-5.
source "$(dirname "$0")/common.bash"
info=$("$troupe" info)
grep -q "CUDA backend: built" <<< "$info" || { echo "SKIP: built without CUDA"; exit 77; }
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIP: no GPU on this machine"
  exit 77
fi
make_corpus
run() {  # run NAME FLAGS...: a small run writing NAME.jsonl and NAME.log
  local name=$1
  shift
  small_train --train-iters 10 --eval-interval 5 --eval-iters 2 --hidden-dropout 0.1 --attention-dropout 0.1 \
    --metrics-file "$work/$name.jsonl" "$@" > "$name.log" 2>&1 || { cat "$name.log"; fail "run $name ($*) failed"; }
}
compare() {  # compare A B BOUND [FIRST]: train losses (and eval losses) of A and B from iteration FIRST on
  python3 - "$work/$1.jsonl" "$work/$2.jsonl" "$3" "${4:-1}" <<'PY'
import json, sys
def read(path, kind):
    key = "lm_loss" if kind == "train" else "validation_loss"
    return {j["iteration"]: j[key] for j in map(json.loads, open(path)) if j.get("type") == kind}
bound, first = float(sys.argv[3]), int(sys.argv[4])
for kind in ("train", "eval"):
    a, b = read(sys.argv[1], kind), read(sys.argv[2], kind)
    its = [i for i in sorted(a) if i >= first]
    assert its and all(i in b for i in its), f"{kind}: iterations differ: {sorted(a)} vs {sorted(b)}"
    worst = max(abs(a[i] - b[i]) / abs(a[i]) for i in its)
    print(f"ok: {kind} losses of {sys.argv[2]} within {worst:.2e} of {sys.argv[1]} (iterations {its[0]}..{its[-1]})")
    assert worst <= bound, f"{kind}: {worst} > {bound}"
PY
}
run cpu
run gpu --device cuda
grep -q "device: GPU 0 .*Adam moments in GPU memory" gpu.log || { cat gpu.log; fail "the GPU run's moments are not in GPU memory"; }
compare cpu gpu 1e-5 || fail "the GPU's fp32 losses differ from the CPU's"

run gpu_half --device cuda --save "$work/ck_gpu" --save-interval 5 --exit-interval 5
run cpu_resumed --load "$work/ck_gpu" --save "$work/ck_gpu"
compare cpu cpu_resumed 1e-5 6 || fail "a checkpoint saved on the GPU did not resume on the CPU"
run cpu_half --save "$work/ck_cpu" --save-interval 5 --exit-interval 5
run gpu_resumed --device cuda --load "$work/ck_cpu" --save "$work/ck_cpu"
compare cpu gpu_resumed 1e-5 6 || fail "a checkpoint saved on the CPU did not resume on the GPU"

# ZeRO-Offload: the moments in host memory, AdamW on the CPU, parameters and gradients copied.
run gpu_offload --device cuda --offload-optimizer cpu
compare cpu gpu_offload 1e-5 || fail "--offload-optimizer cpu on the GPU differs from the CPU"

run cpu_bf16 --bf16
run gpu_bf16 --bf16 --device cuda
compare cpu_bf16 gpu_bf16 1e-3 || fail "bf16 on the GPU does not follow bf16 on the CPU"
# Several GPUs (skipped with one): one process per GPU under troupe launch, the groups NCCL's;
# tensor, data (ZeRO-2) and pipeline parallelism against the same layouts on the CPU.
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)
if ((gpus >= 2)); then
  flags=(--hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
         --global-batch-size 6 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 3 --weight-decay 0.1
         --data-path "$work/d_text_document" --tokenizer-type ByteLevelTokenizer --eval-interval 5 --eval-iters 2
         --log-interval 1000 --train-iters 10 --hidden-dropout 0.1 --attention-dropout 0.1)
  for layout in "--num-layers 2 --tensor-model-parallel-size 2" "--num-layers 2 --data-parallel-size 2 --zero-stage 2" \
                "--num-layers 2 --pipeline-model-parallel-size 2" \
                "--num-layers 2 --pipeline-model-parallel-size 2 --pipeline-schedule zb-h1" \
                "--num-layers 4 --pipeline-model-parallel-size 2 --pipeline-schedule interleaved --num-layers-per-virtual-pipeline-stage 1"; do
    name=$(tr -c 'a-z0-9' _ <<< "$layout")
    # shellcheck disable=SC2086 # the layout's words are flags
    "$troupe" train "${flags[@]}" $layout --metrics-file "$work/cpu$name.jsonl" > "cpu$name.log" 2>&1 ||
      { cat "cpu$name.log"; fail "CPU run $layout failed"; }
    # shellcheck disable=SC2086
    "$troupe" launch --nproc-per-node 2 -- train "${flags[@]}" $layout --device cuda \
      --metrics-file "$work/gpu$name.jsonl" > "gpu$name.log" 2>&1 || { cat "gpu$name.log"; fail "GPU run $layout failed"; }
    grep -q "collectives through NCCL" "gpu$name.log" || { cat "gpu$name.log"; fail "the GPU run $layout did not use NCCL"; }
    compare "cpu$name" "gpu$name" 1e-5 || fail "$layout on two GPUs differs from the CPU"
  done
else
  echo "note: $gpus GPU(s): the multi-GPU layouts need 2 (skipped)"
fi
echo PASS
