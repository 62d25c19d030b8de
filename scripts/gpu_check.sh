#!/usr/bin/env bash
# The GPU checks, run on a machine with a GPU from a bundle made by scripts/device_bundle.sh (or from
# a local CUDA build when build/ exists and no bundle is there). Writes its log to ${OUT:-.}/gpu_check.log.
#   what: nvidia-smi, `troupe info` (sees the GPUs), the [gpu]/[nccl] Catch2 cases of test_comm and
#   the [gpu] cases of test_kernels (CUDA ops vs the CPU, the device allocator) and of test_engine
#   (one rank on the GPU against the CPU: fp32, bf16, fp16, checkpoints both ways),
#   tests/cli/gpu_devices.sh and tests/cli/gpu_train.sh (`troupe train --device cuda`), then the
#   benchmark bench/run_gpu_bench.sh (GPT-2 124M / 350M bf16 vs PyTorch eager and compiled), whose
#   table goes to ${OUT:-.}/gpu_bench.md. Exit status: the number of failed checks.
set -uo pipefail
cd "$(dirname "$0")/.."
log="${OUT:-.}/gpu_check.log"
exec > >(tee "$log") 2>&1
bin=build/bin; tests=build/tests
if [[ -f .devcarry/lib.tar.xz ]]; then
  tar -C .devcarry -xJf .devcarry/lib.tar.xz
  bin=.devcarry/bin; tests=.devcarry/bin
  # NCCL and the CUDA runtime come from the GPU machine: its CUDA toolkit, or PyTorch's wheels.
  pydir=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
  libs=""
  for want in libnccl.so.2 libcudart.so.13 libcublasLt.so.13 libcublas.so.13; do
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu ${pydir:+$pydir/nccl/lib $pydir/cuda_runtime/lib $pydir/cublas/lib $pydir/cu13/lib}; do
      if [[ -f "$d/$want" ]]; then libs="$libs$d:"; break; fi
    done
  done
  export LD_LIBRARY_PATH="$PWD/.devcarry/lib:$libs${LD_LIBRARY_PATH:-}"
  export UCX_MODULE_DIR="$PWD/.devcarry/lib"
fi
echo "== $(date -u +%FT%TZ) LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
fails=0
step() {  # a check; exit 77 is a skip (the CLI tests' convention), anything else non-zero a failure
  echo; echo "== $*"
  "$@"
  local rc=$?
  if [[ $rc -eq 77 ]]; then echo "-- skipped: $*"; elif [[ $rc -ne 0 ]]; then echo "!! FAILED ($rc): $*"; fails=$((fails + 1)); fi
}
step nvidia-smi -L
step "$bin/troupe" info
step "$tests/test_comm" "[nccl]" --durations yes
step "$tests/test_comm" "[gpu]" -s --durations yes
# The CUDA op backend and the caching allocator against the CPU backend (tests/kernels/test_cuda_*.cpp).
step "$tests/test_kernels" "[gpu]" --durations yes
# The engine on the GPU against the CPU (tests/engine/test_parallel.cpp, the "gpu:" cases).
step "$tests/test_engine" "[gpu]" --durations yes
step env TROUPE_BIN="$PWD/$bin/troupe" bash tests/cli/gpu_devices.sh
step env TROUPE_BIN="$PWD/$bin/troupe" bash tests/cli/gpu_train.sh
# The benchmark last: the checks above say whether its figures mean anything.
# One device command may run 10 minutes: the benchmark gets about 5 of them (each run at most 75 s;
# troupe and PyTorch eager first, then the per-op table, the compiled runs last).
step env TROUPE_BIN="$PWD/$bin/troupe" bash bench/run_gpu_bench.sh --out "${OUT:-.}/gpu_bench.md" \
  --iters 5 --warmup-iters 2 --timeout 75 --budget 300
echo; echo "== $fails failed check(s)"
exit "$fails"
