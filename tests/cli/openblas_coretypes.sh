#!/usr/bin/env bash
# Thread-count determinism on every OpenBLAS kernel family this CPU can run. Debian's OpenBLAS picks
# its kernels at run time (DYNAMIC_ARCH) and OPENBLAS_CORETYPE forces a family; some families
# (Haswell, Zen) give other bits when a GEMM is cut elsewhere, so the [determinism] cases of
# test_kernels and test_model run once per family: Prescott, Nehalem, Sandybridge, Haswell, Zen,
# SkylakeX, Cooperlake on x86-64 (those whose instructions /proc/cpuinfo lists), the native one
# elsewhere. Each run must report the family it asked for ("Core: <name>" under OPENBLAS_VERBOSE=2).
# Exit 0 all passed, 1 a run failed or got another family, 77 the test binaries are not built.
# Environment: TROUPE_BIN (its build tree holds the test binaries), or TROUPE_TEST_KERNELS_BIN and
# TROUPE_TEST_MODEL_BIN.
source "$(dirname "$0")/common.bash"

build=$(cd "$(dirname "$troupe")/.." && pwd)
kernels_bin=${TROUPE_TEST_KERNELS_BIN:-$build/tests/test_kernels}
model_bin=${TROUPE_TEST_MODEL_BIN:-$build/tests/test_model}
for b in "$kernels_bin" "$model_bin"; do
  if [[ ! -x "$b" ]]; then
    echo "SKIP: test binary $b not found (build the test_kernels and test_model targets)"
    exit 77
  fi
done

flags=$(grep -m1 -E '^(flags|Features)[[:space:]]*:' /proc/cpuinfo | cut -d: -f2)
has() {
  local f
  for f in "$@"; do
    [[ " $flags " == *" $f "* ]] || return 1
  done
}

# "name:flags the kernels need" (cpuinfo spellings: pni is SSE3).
candidates=()
case "$(uname -m)" in
  x86_64)
    candidates=("Prescott:pni" "Nehalem:pni ssse3 sse4_1 sse4_2" "Sandybridge:avx" "Haswell:avx2 fma"
                "Zen:avx2 fma" "SkylakeX:avx512f avx512bw avx512dq avx512vl"
                "Cooperlake:avx512f avx512bw avx512dq avx512vl avx512_bf16") ;;
  *) candidates=("native:") ;;
esac

ran=()
skipped=()
failed=()
for c in "${candidates[@]}"; do
  name=${c%%:*}
  need=${c#*:}
  # shellcheck disable=SC2086
  if ! has $need; then
    skipped+=("$name (the CPU lacks one of: $need)")
    continue
  fi
  env_core=()
  [[ $name != native ]] && env_core=(OPENBLAS_CORETYPE="$name")
  for b in "$kernels_bin" "$model_bin"; do
    what="$name $(basename "$b")"
    start=$SECONDS
    status=ok
    out=$(env "${env_core[@]}" OPENBLAS_VERBOSE=2 OPENBLAS_NUM_THREADS=1 "$b" "[determinism]" 2>&1) || status=failed
    got=$(sed -n 's/^Core: *//p' <<<"$out" | head -n 1)
    if [[ $name != native && "$got" != "$name" ]]; then
      failed+=("$what: OpenBLAS selected core '${got:-none reported}', not $name")
      echo "FAILED:  ${failed[-1]}"
      continue
    fi
    grep -q '^All tests passed' <<<"$out" || status=failed  # also when no case has the tag
    if [[ $status == ok ]]; then
      ran+=("$what${got:+ (Core: $got)}, $((SECONDS - start)) s")
      echo "passed:  ${ran[-1]}"
    else
      failed+=("$what")
      echo "FAILED:  $what [determinism]:"
      tail -n 40 <<<"$out"
    fi
  done
done

# End to end on one family that cuts differently (Haswell, else the native one): `troupe train` on 1,
# 2 and 3 threads, a model whose GEMMs take the parallel path, gives bitwise the same losses and
# gradient norms.
e2e=native
for c in "${candidates[@]}"; do
  # shellcheck disable=SC2086
  [[ ${c%%:*} == Haswell ]] && has ${c#*:} && e2e=Haswell
done
e2e_env=()
[[ $e2e != native ]] && e2e_env=(OPENBLAS_CORETYPE="$e2e")
# The layouts of the custom-stage models against their single-stage runs (within 1e-5) on the same
# family: the layouts' summation orders differ by kernel family.
engine_bin=${TROUPE_TEST_ENGINE_BIN:-$build/tests/test_engine}
if [[ -x $engine_bin ]]; then
  if env "${e2e_env[@]}" "$engine_bin" "[custom]" > engine_custom.log 2>&1; then
    ran+=("$e2e custom-stage layouts equal their single-stage runs (test_engine [custom])")
    echo "passed:  ${ran[-1]}"
  else
    cat engine_custom.log
    failed+=("$e2e custom-stage layouts differ from their single-stage runs")
  fi
fi
make_corpus
for t in 1 2 3; do
  env "${e2e_env[@]}" "$troupe" train --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 \
    --micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --train-iters 3 --data-path d_text_document \
    --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --log-interval 1000 --num-threads "$t" \
    --metrics-file "train$t.jsonl" >"train$t.log" 2>&1 || { cat "train$t.log"; fail "troupe train on $t threads failed"; }
  losses "train$t.jsonl" >"losses$t.txt"
done
[[ -s losses1.txt ]] || fail "troupe train wrote no training metrics"
if diff losses1.txt losses2.txt && diff losses1.txt losses3.txt; then
  ran+=("$e2e troupe train: 1, 2 and 3 threads, bitwise the same losses and gradient norms")
  echo "passed:  ${ran[-1]}"
else
  failed+=("$e2e troupe train: losses differ between 1, 2 and 3 threads")
  echo "FAILED:  ${failed[-1]}"
fi

echo "== ${#ran[@]} run(s) passed, ${#failed[@]} failed; core types skipped: ${#skipped[@]}"
for s in "${skipped[@]}"; do echo "skipped: $s"; done
for f in "${failed[@]}"; do echo "FAILED:  $f"; done
[[ ${#failed[@]} -eq 0 ]] || fail "${#failed[@]} run(s) failed"
[[ ${#ran[@]} -gt 0 ]] || fail "no OpenBLAS core type could run"
echo "PASS: thread-count determinism on ${#ran[@]} runs"
