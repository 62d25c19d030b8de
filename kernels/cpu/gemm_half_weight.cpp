#include "kernels/cpu/gemm_half_weight.hpp"

#include <algorithm>

#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/half.hpp"
#include "troupe/check.hpp"

namespace troupe::cpu {

int64_t half_weight_block_rows(int64_t K, int64_t M) {
  constexpr int64_t kBlockFloats = 64 * 1024;     // 256 KiB of f32
  constexpr int64_t kMaxBlockFloats = 256 * 1024;  // 1 MiB
  const int64_t k = std::max<int64_t>(1, K);
  // Each block's call packs all of A again: with many rows of A a block grows to M / 2 rows of B, so
  // that packing stays a small part of the block's work, as long as it fits kMaxBlockFloats.
  const int64_t rows = std::max(kBlockFloats / k, std::min(M / 2, kMaxBlockFloats / k));
  return std::max<int64_t>(16, rows / 16 * 16);
}

void gemm_f32_half_bt(ThreadPool& pool, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      DType b_type, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  TROUPE_CHECK(b_type == DType::bf16 || b_type == DType::f16, "gemm_f32_half_bt: B is bf16 or f16");
  TROUPE_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_f32_half_bt: negative size");
  TROUPE_CHECK(lda >= std::max<int64_t>(1, K) && ldb >= std::max<int64_t>(1, K) && ldc >= std::max<int64_t>(1, N),
               "gemm_f32_half_bt: leading dimension below the matrix width");
  if (M == 0 || N == 0) return;
  const int64_t rows = half_weight_block_rows(K, M);
  const int64_t blocks = (N + rows - 1) / rows;
  const auto* b = static_cast<const uint16_t*>(B);
  pool.for_each_task(blocks, [&](int64_t t) {
    const int64_t n0 = t * rows, n1 = std::min(N, n0 + rows);
    // At least one element: BLAS wants a leading dimension of 1 or more even where K == 0.
    float* w = thread_scratch<float>(static_cast<size_t>(std::max<int64_t>(1, (n1 - n0) * K)), 0);
    for (int64_t n = n0; n < n1; ++n) half::convert_array(DType::f32, w + (n - n0) * K, b_type, b + n * ldb, K);
    gemm_serial<float>(false, true, M, n1 - n0, K, 1.0f, A, lda, w, std::max<int64_t>(1, K), beta, C + n0, ldc);
  });
}

}  // namespace troupe::cpu
