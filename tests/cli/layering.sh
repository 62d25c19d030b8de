#!/usr/bin/env bash
# The layers' include rules (docs/ARCHITECTURE.md, docs/COMM.md "Layout"): every #include "..." of a
# folder's sources names only the folders that folder may use. The CMake targets enforce the same
# direction at link time (a library links only what it may use); this catches an include of a
# header-only part or of an inline function, which the linker would not notice.
#   include/troupe/              include/troupe/ only: the public headers are self-contained
#   every folder below           also include/troupe/ (the public vocabulary: Status, configs, reports)
#   base/                        base/ (check.cpp: nothing but the standard library)
#   kernels/ (cpu/, cuda/)       base/, kernels/
#   model/                       base/, kernels/, model/, comm/'s interface headers (comm/*.hpp)
#   storage/                     base/, kernels/, storage/
#   config/                      base/, kernels/, model/, storage/, config/
#   engine/                      base/, kernels/, model/, storage/, config/, comm/*.hpp, comm/local/, engine/
#   reference/                   base/, kernels/, model/, engine/, reference/ (nothing but tests uses it)
#   plan/                        base/, kernels/, model/, storage/, config/, plan/ (troupe plan's model)
#   inspect/                     base/, kernels/, model/, storage/, config/, comm/ (any part), engine/, inspect/
#   actors/                      all of the above, comm/ (any backend), inspect/, actors/ -- never apps/
#   api/                         everything but reference/ (troupe::train's set-up)
#   apps/cli/                    base/, kernels/, model/, storage/, config/, apps/cli/
#   comm/ (the interface)        base/, kernels/, comm/*.hpp
#   comm/local|ucx|nccl|bootstrap/  base/, kernels/, comm/*.hpp, its own sub-folder
# No backend includes another backend or the bootstrap's implementation.
set -euo pipefail
src=${TROUPE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$src"

# allowed FOLDER: the regular expression an included path must match.
allowed() {
  case "$1" in
    include/troupe) echo '^troupe/' ;;
    base) echo '^(troupe/|base/)' ;;
    kernels|kernels/*) echo '^(troupe/|base/|kernels/)' ;;
    model) echo '^(troupe/|base/|kernels/|model/|comm/[a-z_]+\.hpp$)' ;;
    storage) echo '^(troupe/|base/|kernels/|storage/)' ;;
    comm) echo '^(troupe/|base/|kernels/|comm/[a-z_]+\.hpp$)' ;;
    config) echo '^(troupe/|base/|kernels/|model/|storage/|config/)' ;;
    engine) echo '^(troupe/|base/|kernels/|model/|storage/|config/|comm/[a-z_]+\.hpp$|comm/local/|engine/)' ;;
    inspect) echo '^(troupe/|base/|kernels/|model/|storage/|config/|comm/|engine/|inspect/)' ;;
    actors) echo '^(troupe/|base/|kernels/|model/|storage/|config/|comm/|engine/|inspect/|actors/)' ;;
    reference) echo '^(troupe/|base/|kernels/|model/|engine/|reference/)' ;;
    plan) echo '^(troupe/|base/|kernels/|model/|storage/|config/|plan/)' ;;
    api) echo '^(troupe/|base/|kernels/|model/|storage/|config/|comm/|engine/|inspect/|actors/|apps/cli/|api/)' ;;
    apps/cli) echo '^(troupe/|base/|kernels/|model/|storage/|config/|apps/cli/)' ;;
    comm/*) echo "^(troupe/|base/|kernels/|comm/[a-z_]+\\.hpp\$|$1/)" ;;
  esac
}

bad=0 checked=0
for folder in base kernels kernels/cpu kernels/cuda model storage comm comm/local comm/ucx comm/nccl comm/bootstrap \
    config engine reference plan inspect actors api apps/cli include/troupe; do
  [[ -d $folder ]] || { echo "layering: no folder $folder (update this test's rules)" >&2; exit 1; }
  rule=$(allowed "$folder")
  # Only the folder's own files (not its sub-folders, which have their own rule).
  while IFS= read -r file; do
    while IFS= read -r line; do
      inc=${line#*\"}; inc=${inc%%\"*}
      checked=$((checked + 1))
      # A path of the project (it names a top-level folder); system and library headers use <>.
      [[ $inc == */* ]] || continue
      if ! [[ $inc =~ $rule ]]; then
        echo "layering: $file includes \"$inc\", which $folder/ may not use" >&2
        bad=$((bad + 1))
      fi
    done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$file" || true)
  done < <(find "$folder" -maxdepth 1 -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)
done
# actors/ holds only code that is an actor or speaks CAF; nothing below it (the engine, config,
# storage, model, kernels, base) knows CAF exists. Of the public headers only troupe/actors.hpp
# (the training actor for a user's actor system) does.
for file in actors/*.cpp actors/*.hpp; do
  grep -q 'caf' "${file%.*}".[ch]pp || { echo "layering: $file never mentions CAF: it belongs in engine/ or config/" >&2; bad=$((bad + 1)); }
done
while IFS= read -r file; do
  echo "layering: $file uses CAF, which only actors/, comm/bootstrap/ and include/troupe/actors.hpp may" >&2; bad=$((bad + 1))
done < <(grep -rlE '#[[:space:]]*include[[:space:]]*<caf/' include base kernels model storage config engine reference plan inspect apps/cli |
         grep -v '^include/troupe/actors\.hpp$' || true)
# The reference model is the tests' yardstick: no folder but tests/ and reference/ includes it.
while IFS= read -r file; do
  echo "layering: $file includes reference/, which only the tests may" >&2; bad=$((bad + 1))
done < <(grep -rlE '#[[:space:]]*include[[:space:]]*"reference/' include base kernels model storage comm config engine plan actors api apps bench examples 2>/dev/null || true)
((checked > 50)) || { echo "layering: only $checked includes seen -- is $src the source tree?" >&2; exit 1; }
((bad == 0)) || { echo "layering: $bad problem(s) against the layers' rules" >&2; exit 1; }
echo "ok: $checked includes follow the layers' rules"
