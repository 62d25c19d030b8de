#!/usr/bin/env bash
# Every libFuzzer target (fuzz/, docs/FUZZING.md), built with clang into a build directory of its own
# next to this build's: first each input of its seed corpus and its regressions once, then a fixed
# number of mutated inputs from a fixed seed (fuzz/run.sh --runs; a slow target's cap in
# fuzz/options/<target>.runs), so the test fuzzes the same inputs every time and fails only for
# what the targets' own code does, never for a finding luck brings to an unrelated change. Any
# crash, leak, hang, out-of-memory or allocation over the limit fails it (fuzz/run.sh says where the
# input was kept). Exploratory fuzzing (--time) stays with fuzz/run.sh. TROUPE_FUZZ_RUNS sets the
# runs per target (default 20000).
set -euo pipefail
src_dir=${TROUPE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
if ! command -v clang++-14 >/dev/null && ! command -v clang++ >/dev/null; then
  echo "SKIP: clang is not installed (scripts/setup.sh installs clang, libclang-rt-14-dev and llvm)"
  exit 77
fi
bin=${TROUPE_BIN:-$src_dir/build/bin/troupe}
build=${TROUPE_FUZZ_BUILD_DIR:-$(dirname "$(dirname "$bin")")/fuzz-build}
"$src_dir/fuzz/run.sh" --build-dir "$build" --replay --jobs 2
exec "$src_dir/fuzz/run.sh" --build-dir "$build" --no-build --runs "${TROUPE_FUZZ_RUNS:-20000}" --seed 1 --jobs 2
