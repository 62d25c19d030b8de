// GEMM for the CPU backend, row-major: C (M,N) = alpha op(A) op(B) + beta C, op = transpose or not.
//
// gemm() cuts the product into tiles chosen from the shape (M, N, K) alone (gemm_tiling below),
// runs each tile as one single-threaded OpenBLAS call and hands the tiles to the pool's threads in
// any order. One thread computes the same tiles. The cut must not depend on the thread count
// because OpenBLAS is not bitwise under cutting: with 0.3.21's Haswell, Zen, SkylakeX and
// Cooperlake kernels an element of C gets other bits when a call's edges fall elsewhere (a kernel
// treats a call's last rows and columns, or a small call, its own way). Each tile is the same call
// whatever the pool, so the result is bitwise the same for every pool size, on every OpenBLAS
// kernel family (tests/kernels/test_determinism.cpp, run once per core type by
// tests/cli/openblas_coretypes.sh). It is not bitwise one cblas_sgemm over the whole product
// (gemm_serial), which cuts elsewhere.
//
// gemm_serial() is one OpenBLAS call on the calling thread (for callers that already parallelise,
// such as attention over heads, with a cut of their own that depends only on the shape).
#pragma once
#include <cstdint>

#include "kernels/thread_pool.hpp"

namespace troupe::cpu {

// How gemm() cuts an (M,N,K) product. rows: `tiles` row blocks of C, each re-packing all of op(B);
// cols: column blocks, each re-packing all of op(A); depth: chunks of K whose products are summed
// in chunk order (chunk 0 into C with beta, the others added to it one after another). Block edges
// fall on multiples of 16 (the last on the end). tiles == 1: one call.
struct GemmTiling {
  enum class Axis { rows, cols, depth };
  Axis axis = Axis::rows;
  int64_t tiles = 1;
};
GemmTiling gemm_tiling(int64_t M, int64_t N, int64_t K);

template <class T>
void gemm_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                 int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// As gemm_serial, computed in gemm_tiling(M, N, K)'s tiles on `pool`. The depth cut needs
// scratch for (tiles - 1) x M x N elements (bounded: a few MiB).
template <class T>
void gemm(ThreadPool& pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha,
          const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

}  // namespace troupe::cpu
