// GEMM for the CPU backend, row-major: C (M,N) = alpha op(A) op(B) + beta C, op = transpose or not.
// gemm() splits the larger of M and N into one block per pool thread and runs single-threaded
// OpenBLAS on each block; gemm_serial() runs on the calling thread (for callers that already
// parallelise, such as attention over heads).
#pragma once
#include <cstdint>

#include "kernels/thread_pool.hpp"

namespace troupe::cpu {

template <class T>
void gemm_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                 int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

template <class T>
void gemm(ThreadPool& pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha,
          const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

}  // namespace troupe::cpu
