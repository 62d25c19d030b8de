#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (a build directory of their own, every library instrumented
# for coverage, ASan and UBSan) and runs each from its corpus for a bounded time. Fails when any
# target crashes, leaks, times out, runs out of memory or allocates more than the limit.
#
#   fuzz/run.sh [--time SECONDS | --runs N [--seed S] | --replay] [--jobs N] [--build-dir DIR] [--keep DIR]
#               [--no-build] [TARGET...]
#
#   --time S      seconds per target (default 20): exploratory, each run differs
#   --runs N      N executions per target instead (at most fuzz/options/<target>.runs for a slow one),
#                 from --seed S (default 1), without compare tables or corpus reloads and without
#                 ASLR (setarch -R): the same code fuzzes the same inputs every time, so a run fails
#                 only for what its target's code does (CI, docs/FUZZING.md)
#   --replay      each input of the target's corpus and regressions once, nothing mutated
#   --jobs N      targets run at once (default 2)
#   --build-dir   the fuzz build (default $TROUPE_FUZZ_BUILD_DIR, else build-fuzz/ in the source tree)
#   --keep DIR    keep what the runs found (new corpus entries, crash inputs, logs) under DIR
#   --no-build    use the fuzzers already built
#   TARGET        run only these (default: every fuzz_* the build has)
#
# Limits of each run: -rss_limit_mb=2048, -malloc_limit_mb=512 (one allocation larger than that is a
# finding: no reader may allocate more than its input could hold), -timeout=10 s per input. A
# target's libFuzzer options may add to these (fuzz/options/<target>.options, one -flag=value a line),
# and fuzz/dict/<target>.dict is passed as -dict. Crash inputs are written as <target>-crash-<sha1>
# under the keep directory (or a temporary one, printed); copy them to fuzz/regressions/<target>/
# once fixed.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
seconds=20 runs="" seed=1 replay=0 jobs=2 build_dir=${TROUPE_FUZZ_BUILD_DIR:-$src/build-fuzz} keep="" do_build=1
targets=()
while (($#)); do
  case "$1" in
    --time) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --replay) replay=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    -*) echo "fuzz/run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

cxx=$(command -v clang++-14 || command -v clang++ || true)
cc=$(command -v clang-14 || command -v clang || true)
if [[ -z "$cxx" || -z "$cc" ]]; then
  echo "fuzz/run.sh: clang is not installed -- run scripts/setup.sh (it installs clang, libclang-rt-14-dev, llvm)" >&2
  exit 3
fi

if ((do_build)); then
  if [[ ! -f "$build_dir/build.ninja" ]]; then
    CC=$cc CXX=$cxx cmake -S "$src" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_FUZZ=ON \
      -DTROUPE_BUILD_TESTS=OFF -DTROUPE_CUDA=off -DTROUPE_NATIVE=OFF ${TROUPE_FUZZ_CMAKE_ARGS:-} >/dev/null
  fi
  cmake --build "$build_dir" --target troupe_fuzzers -j "${TROUPE_JOBS:-$(nproc)}"
fi

if ((${#targets[@]} == 0)); then
  for f in "$build_dir"/fuzz/fuzz_*; do [[ -x "$f" ]] && targets+=("${f##*/fuzz_}"); done
fi
if ((${#targets[@]} == 0)); then
  echo "fuzz/run.sh: no fuzzers in $build_dir/fuzz" >&2
  exit 1
fi

out=${keep:-$(mktemp -d /tmp/troupe-fuzz-run.XXXXXX)}
mkdir -p "$out"
symbolizer=$(command -v llvm-symbolizer-14 || command -v llvm-symbolizer || echo /usr/lib/llvm-14/bin/llvm-symbolizer)
export ASAN_SYMBOLIZER_PATH=$symbolizer
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_one() {
  local t=$1 bin=$build_dir/fuzz/fuzz_$1
  local work=$out/$t
  mkdir -p "$work/new"
  local args=(-rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -print_final_stats=1 -artifact_prefix="$work/$t-")
  local what="${seconds}s"
  if ((replay)); then
    args+=(-runs=0)  # the corpus and the regressions, each once
    what="replay"
  elif [[ -n "$runs" ]]; then
    local n=$runs
    if [[ -f "$src/fuzz/options/$t.runs" ]]; then
      local cap
      cap=$(tr -dc '0-9' < "$src/fuzz/options/$t.runs")
      [[ -n "$cap" ]] && ((cap < n)) && n=$cap
    fi
    # Determinism: no compare tables (they hold operands such as addresses) and no corpus reloads
    # (timed); the addresses themselves fixed by running without ASLR where the kernel allows it.
    args+=(-runs="$n" -seed="$seed" -use_cmp=0 -reload=0)
    what="$n runs from seed $seed"
  else
    args+=(-max_total_time="$seconds")
  fi
  [[ -f "$src/fuzz/dict/$t.dict" ]] && args+=(-dict="$src/fuzz/dict/$t.dict")
  if [[ -f "$src/fuzz/options/$t.options" ]]; then
    while read -r opt; do [[ -n "$opt" && "$opt" != \#* ]] && args+=("$opt"); done < "$src/fuzz/options/$t.options"
  fi
  local dirs=("$work/new")  # new inputs go to the first directory, never into the source tree
  for d in corpus regressions; do [[ -d "$src/fuzz/$d/$t" ]] && dirs+=("$src/fuzz/$d/$t"); done
  if (cd "$work" && "${launch[@]}" "$bin" "${args[@]}" "${dirs[@]}") > "$work/log" 2>&1; then
    local stats
    stats=$(grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$work/log" | tail -2 | tr '\n' ' ')
    echo "fuzz $t: ok, $what: $stats"
    return 0
  fi
  echo "fuzz $t: FAILED -- log $work/log, inputs $work/$t-*" >&2
  grep -E 'ERROR|SUMMARY|==[0-9]+==|runtime error|TROUPE_CHECK|check failed' "$work/log" | head -20 >&2
  return 1
}

# --runs: the same inputs every time needs the same addresses (ASan's allocations, the compare
# operands): setarch -R turns ASLR off for the fuzzer where the kernel lets it.
launch=()
# and targets that would start threads run on one (fuzz/targets/preprocess_input.cpp).
[[ -n "$runs" ]] && ! ((replay)) && export TROUPE_FUZZ_ONE_THREAD=1
if [[ -n "$runs" ]] && ! ((replay)) && setarch "$(uname -m)" -R true 2> /dev/null; then
  launch=(setarch "$(uname -m)" -R)
elif [[ -n "$runs" ]] && ! ((replay)); then
  echo "fuzz/run.sh: setarch -R is refused here: the runs from seed $seed may differ from run to run" >&2
fi

failed=0 running=0
for t in "${targets[@]}"; do
  if [[ ! -x "$build_dir/fuzz/fuzz_$t" ]]; then
    echo "fuzz/run.sh: no fuzzer fuzz_$t in $build_dir/fuzz" >&2; failed=1; continue
  fi
  run_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while ((running > 0)); do wait -n || failed=1; running=$((running - 1)); done
[[ -z "$keep" ]] && ((failed == 0)) && rm -rf "$out"
((failed == 0)) || echo "fuzz/run.sh: findings kept in $out" >&2
exit "$failed"
