#!/usr/bin/env bash
# GPU smoke test (label gpu): a CUDA build sees the GPUs nvidia-smi lists. Skipped (exit 77) where the
# build has no CUDA backend or no GPU is usable.
source "$(dirname "$0")/common.bash"
info=$("$troupe" info)
echo "$info"
grep -q "CUDA backend: built" <<< "$info" || { echo "SKIP: built without CUDA"; exit 77; }
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > gpus.txt 2> /dev/null || [[ ! -s gpus.txt ]]; then
  echo "SKIP: no GPU on this machine"
  exit 77
fi
want=$(grep -c '^GPU ' gpus.txt)
grep -q "$want GPU(s)" <<< "$info" || fail "nvidia-smi lists $want GPU(s) but troupe info says: $info"
echo PASS
