#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (CTest). GPU tests are reported as
# skipped on machines without a GPU. Extra arguments go to ctest (e.g. -R model).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/setup.sh"
"$here/scripts/build.sh"
build=$(cd "${TROUPE_BUILD_DIR:-$here/build}" && pwd)
cd "$build"
rc=0
ctest --output-on-failure -j "${TROUPE_TEST_JOBS:-2}" --timeout 900 "$@" || rc=$?
# No test may leave a process behind: a CLI test's job (a program of this build running in a
# tests/cli scratch folder) still alive now was leaked; it would train on and slow whatever runs next.
leaked=()
for proc in /proc/[0-9]*; do
  exe=$(readlink "$proc/exe" 2> /dev/null) || continue
  cwd=$(readlink "$proc/cwd" 2> /dev/null) || continue
  [[ $exe == "$build"/* && $cwd == /tmp/troupe-cli.* ]] || continue
  leaked+=("${proc#/proc/}: $(tr '\0' ' ' < "$proc/cmdline" 2> /dev/null | cut -c1-160)")
  kill -9 "${proc#/proc/}" 2> /dev/null || true
done
if ((${#leaked[@]} > 0)); then
  echo "scripts/test.sh: ${#leaked[@]} process(es) of this build outlived the tests (killed now) -- a test leaks its job:" >&2
  printf '  %s\n' "${leaked[@]}" >&2
  rc=1
fi
exit $rc
