#!/usr/bin/env bash
# The MoE layer against an independent float64 PyTorch oracle (tests/moe/moe_oracle.py, written from
# the anchors' code: docs/MOE_SEMANTICS.md): the oracle's self-checks (finite differences, hand-made
# cases), then troupe's MoE layer in f64 (test_model "[moe_dump]": DeepSpeed's top-1 with PR-MoE,
# top-2, top-3; Megatron-Core's top-2 by probability, top-3 by position, a Mixtral-like SwiGLU layer
# with a shared expert and the sequence aux loss, top-1 dropless) fed to the oracle: output, losses,
# counts, input and weight gradients within 1e-9 relative.
# Exit 0 pass, 1 fail, 77 skip (no torch/h5py in /usr/bin/python3, or no test_model binary).
set -uo pipefail
PY=/usr/bin/python3
src="${TROUPE_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
bin="${TROUPE_TEST_MODEL_BIN:-$src/build/tests/test_model}"
if [[ ! -x "$PY" ]] || ! "$PY" -c 'import torch, h5py, numpy' >/dev/null 2>&1; then
  echo "SKIP: $PY lacks torch, h5py or numpy"
  exit 77
fi
if [[ ! -x "$bin" ]]; then
  echo "SKIP: test_model '$bin' not found (set TROUPE_TEST_MODEL_BIN)"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" "$src/tests/moe/test_moe_oracle_self.py" || { echo "FAIL: the oracle's self-checks"; exit 1; }
TROUPE_MOE_DUMP_DIR="$work" "$bin" "[moe_dump]" >"$work/dump.log" 2>&1 || { cat "$work/dump.log"; echo "FAIL: dump"; exit 1; }
status=0
cases=0
for dir in "$work"/*/; do
  cases=$((cases + 1))
  "$PY" "$src/tests/moe/compare_dump.py" "$dir" --rtol 1e-9 || status=1
done
[[ $cases -ge 7 ]] || { echo "FAIL: expected 7 cases, got $cases"; exit 1; }
[[ $status -eq 0 ]] && echo "PASS: $cases MoE layers equal the float64 oracle" || echo "FAIL"
exit $status
