#!/usr/bin/env bash
# troupe plan against the published large runs (docs/PLAN.md, "Published runs"; issue 30): every row
# of Table 1 of Narayanan et al. 2021 and BLOOM-176B under --profile megatron, the TFLOP/s per GPU
# within 15% of the published figure (bench/plan_published.sh --check holds the rows and the bound).
source "$(dirname "$0")/common.bash"

TROUPE_BIN="$troupe" bash "$src_dir/bench/plan_published.sh" --check > published.md 2>&1 \
  || { cat published.md; fail "a published run is predicted outside 15%"; }
grep -q '^| BLOOM-176B' published.md || { cat published.md; fail "the BLOOM row is missing"; }
[[ $(grep -c '^| GPT ' published.md) == 10 ]] || { cat published.md; fail "Table 1 has ten rows"; }
echo "PASS"
