#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (CTest). GPU tests are reported as
# skipped on machines without a GPU. Extra arguments go to ctest (e.g. -R model).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/setup.sh"
"$here/scripts/build.sh"
cd "${TROUPE_BUILD_DIR:-$here/build}"
ctest --output-on-failure -j "${TROUPE_TEST_JOBS:-2}" --timeout 900 "$@"
