#!/usr/bin/env bash
# Every libFuzzer target (fuzz/, docs/FUZZING.md), built with clang into a build directory of its own
# next to this build's, runs for a bounded time from its seed corpus and its regressions; any crash,
# leak, hang, out-of-memory or allocation over the limit fails the test (fuzz/run.sh says where the
# input was kept). TROUPE_FUZZ_SECONDS sets the seconds per target (default 10).
set -euo pipefail
src_dir=${TROUPE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
if ! command -v clang++-14 >/dev/null && ! command -v clang++ >/dev/null; then
  echo "SKIP: clang is not installed (scripts/setup.sh installs clang, libclang-rt-14-dev and llvm)"
  exit 77
fi
bin=${TROUPE_BIN:-$src_dir/build/bin/troupe}
build=${TROUPE_FUZZ_BUILD_DIR:-$(dirname "$(dirname "$bin")")/fuzz-build}
exec "$src_dir/fuzz/run.sh" --build-dir "$build" --time "${TROUPE_FUZZ_SECONDS:-10}" --jobs 2
