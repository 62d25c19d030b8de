#!/usr/bin/env bash
# The CPU benchmarks that need more cores than this 2-core machine has (bench/run_parallel_bench.sh
# at p = 4 wants a core per stage), run on a bigger machine from a bundle made by
# scripts/device_bundle.sh. Writes ${OUT:-.}/parallel_bench.md and its log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
tar -C .devcarry -xJf .devcarry/lib.tar.xz
export LD_LIBRARY_PATH="$PWD/.devcarry/lib:${LD_LIBRARY_PATH:-}"
export UCX_MODULE_DIR="$PWD/.devcarry/lib"
export TROUPE_BIN="$PWD/.devcarry/bin/troupe"
nproc; "$TROUPE_BIN" info
bash bench/run_parallel_bench.sh --stages 4 --micro-batches 8 --dp 4 --threads-per-stage 2 --layers 8 \
  --hidden 512 --out "$out/parallel_bench.md" 2>&1 | tee "$out/parallel_bench.log"
