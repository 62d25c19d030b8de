#!/usr/bin/env bash
# Configures (once) and builds troupe into build/ (or $TROUPE_BUILD_DIR). Extra arguments go to CMake's
# configure step, e.g. scripts/build.sh -DTROUPE_CUDA=off. TROUPE_TARGET=troupe builds only the CLI.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${TROUPE_BUILD_DIR:-$here/build}
jobs=${TROUPE_JOBS:-$(nproc)}
if [[ ! -f "$build/build.ninja" || $# -gt 0 ]]; then
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$build" -j "$jobs" ${TROUPE_TARGET:+--target "$TROUPE_TARGET"}
