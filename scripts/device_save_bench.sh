#!/usr/bin/env bash
# The asynchronous-save benchmark on a machine with more cores than this one (the writer then has a
# core of its own, as on a GPU server), from a bundle made by scripts/device_bundle.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
tar -C .devcarry -xJf .devcarry/lib.tar.xz
export LD_LIBRARY_PATH="$PWD/.devcarry/lib:${LD_LIBRARY_PATH:-}"
export TROUPE_BIN="$PWD/.devcarry/bin/troupe"
nproc
for t in 8 16; do
  echo "== --threads $t"
  bash bench/run_save_bench.sh --threads "$t" 2>&1
done | tee "$out/save_bench.txt"
