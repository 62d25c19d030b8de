#!/usr/bin/env bash
# GFLOP/s of gemm_bf16 (avx512_bf16 kernel), its widen + sgemm fallback and fp32 gemm() on the
# reference models' linear-layer shapes and 2048^3, on 1 and 2 threads, plus troupe's sgemm peak
# (docs/PERFORMANCE.md keeps the figures).
#   bench/bf16_gemm.sh [threads ...]        (default: 1 2)
# Needs the bench_bf16_gemm target (TROUPE_TARGET=bench_bf16_gemm scripts/build.sh); run it alone on
# the machine, the figures are best-of timings.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${TROUPE_BUILD_DIR:-build}/bench/bench_bf16_gemm"
[[ -x "$bin" ]] || { echo "bf16_gemm.sh: no $bin (build the bench_bf16_gemm target)" >&2; exit 2; }
echo "# bf16 GEMM vs fp32 ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) logical CPUs;" \
     "AVX512-BF16: $(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no)"
threads=("$@")
[[ ${#threads[@]} -gt 0 ]] || threads=(1 2)
echo "- command: bench/bf16_gemm.sh ${threads[*]}"
for t in "${threads[@]}"; do
  echo
  "$bin" "$t"
done
