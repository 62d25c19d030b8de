#!/usr/bin/env bash
# Packs what the GPU checks need into .devcarry/ (ignored by git) for a machine that has the CUDA
# driver, toolkit and NCCL but none of troupe's Debian libraries (CAF, UCX, HDF5, OpenBLAS, ...):
# the built troupe binary and test executables, and every shared library they load except the C
# library and CUDA's own (cudart, NCCL, cuBLAS come from the GPU machine, found by gpu_check.sh).
# Build first (scripts/build.sh with TROUPE_CUDA=on); then run scripts/gpu_check.sh over there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.devcarry
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >> .git/info/exclude
rm -rf "$out"; mkdir -p "$out/bin" "$out/lib"
bins=(build/bin/troupe build/tests/test_comm build/tests/test_kernels build/tests/test_engine build/bench/bench_cuda_ops)
cp "${bins[@]}" "$out/bin/"
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libcuda|libcudart|libnccl|libcublas)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  cp -L "$path" "$out/lib/$name"
done
ucx_plugins=/usr/lib/x86_64-linux-gnu/ucx
[[ -d "$ucx_plugins" ]] && cp -L "$ucx_plugins"/*.so.0 "$out/lib/" 2>/dev/null || true
tar -C "$out" -cJf "$out/lib.tar.xz" lib && rm -rf "$out/lib"
du -sh "$out"
