#include "kernels/cpu/gemm.hpp"

#include <cblas.h>

#include <algorithm>

#include "kernels/context.hpp"

extern "C" void openblas_set_num_threads(int);

namespace troupe {
void configure_blas_threads() { openblas_set_num_threads(1); }
}  // namespace troupe

namespace troupe::cpu {

namespace {
CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }
}  // namespace

template <>
void gemm_serial<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void gemm_serial<double>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                         const double* A, int64_t lda, const double* B, int64_t ldb, double beta,
                         double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void gemm(ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  const int parts = pool.size();
  // Blocks smaller than this are not worth a thread hand-off.
  const bool small = 2.0 * M * N * K < 4e6;
  if (parts == 1 || small) {
    gemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (M >= N) {
    // Split rows of C; block edges on multiples of 16 rows.
    int64_t blocks = (M + 15) / 16;
    pool.parallel_for(blocks, [&](int64_t b0, int64_t b1) {
      int64_t m0 = b0 * 16, m1 = std::min(M, b1 * 16);
      const T* a = ta ? A + m0 : A + m0 * lda;
      gemm_serial(ta, tb, m1 - m0, N, K, alpha, a, lda, B, ldb, beta, C + m0 * ldc, ldc);
    });
  } else {
    int64_t blocks = (N + 15) / 16;
    pool.parallel_for(blocks, [&](int64_t b0, int64_t b1) {
      int64_t n0 = b0 * 16, n1 = std::min(N, b1 * 16);
      const T* b = tb ? B + n0 * ldb : B + n0;
      gemm_serial(ta, tb, M, n1 - n0, K, alpha, A, lda, b, ldb, beta, C + n0, ldc);
    });
  }
}

template void gemm<float>(ThreadPool&, bool, bool, int64_t, int64_t, int64_t, float, const float*,
                          int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm<double>(ThreadPool&, bool, bool, int64_t, int64_t, int64_t, double, const double*,
                           int64_t, const double*, int64_t, double, double*, int64_t);

}  // namespace troupe::cpu
