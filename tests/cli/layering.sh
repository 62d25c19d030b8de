#!/usr/bin/env bash
# The layers' include rules (README "What is where", docs/COMM.md "Layout"): every #include "..." of a
# folder's sources names only the folders that folder may use. The CMake targets enforce the same
# direction at link time (a library links only what it may use); this catches an include of a
# header-only part or of an inline function, which the linker would not notice.
#   base/                        base/ (Status, TROUPE_CHECK: nothing but the standard library)
#   kernels/ (cpu/, cuda/)       base/, kernels/
#   model/                       base/, kernels/, model/, comm/'s interface headers (comm/*.hpp)
#   storage/                     base/, kernels/, storage/
#   comm/ (the interface)        base/, kernels/, comm/*.hpp
#   comm/local|ucx|nccl|bootstrap/  base/, kernels/, comm/*.hpp, its own sub-folder
# No backend includes another backend or the bootstrap's implementation.
set -euo pipefail
src=${TROUPE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$src"

# allowed FOLDER: the regular expression an included path must match.
allowed() {
  case "$1" in
    base) echo '^base/' ;;
    kernels|kernels/*) echo '^(base/|kernels/)' ;;
    model) echo '^(base/|kernels/|model/|comm/[a-z_]+\.hpp$)' ;;
    storage) echo '^(base/|kernels/|storage/)' ;;
    comm) echo '^(base/|kernels/|comm/[a-z_]+\.hpp$)' ;;
    comm/*) echo "^(base/|kernels/|comm/[a-z_]+\\.hpp\$|$1/)" ;;
  esac
}

bad=0 checked=0
for folder in base kernels kernels/cpu kernels/cuda model storage comm comm/local comm/ucx comm/nccl comm/bootstrap; do
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
((checked > 50)) || { echo "layering: only $checked includes seen -- is $src the source tree?" >&2; exit 1; }
((bad == 0)) || { echo "layering: $bad include(s) against the layers' rules" >&2; exit 1; }
echo "ok: $checked includes follow the layers' rules"
