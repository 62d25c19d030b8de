#include "kernels/cpu/gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <memory>

#include "troupe/check.hpp"
#include "kernels/context.hpp"

extern "C" void openblas_set_num_threads(int);

namespace troupe {
void configure_blas_threads() {
  openblas_set_num_threads(1);
}
}  // namespace troupe

namespace troupe::cpu {

namespace {

CBLAS_TRANSPOSE tr(bool t) {
  return t ? CblasTrans : CblasNoTrans;
}

// The tiling's constants. Each extra row tile re-packs all of op(B) (each column tile all of
// op(A)), so tiles stay wide: on the reference model's GEMMs, 8 row tiles of 256 rows do 1-8% more
// work than two halves would, which the head's K chunks and 64 dW tiles win back
// (docs/PERFORMANCE.md).
constexpr double kSmallFlops = 4e6;    // a whole product below this: one call, not worth a hand-off
constexpr double kMinTileFlops = 1e6;  // no tile below this
constexpr int64_t kMinTile = 256;      // rows or columns per tile on a wide output
constexpr int64_t kMinNarrowTile = 64;  // a narrow output's tiles, at most kMaxNarrowTiles of them
constexpr int64_t kMaxNarrowTiles = 4;
constexpr int64_t kMaxTiles = 64;
constexpr int64_t kMinKChunk = 1024;  // depth per chunk
constexpr int64_t kMaxKChunks = 16;
constexpr int64_t kScratchElems = int64_t{1} << 21;  // depth chunks' partial products, in all
constexpr int64_t kCombineElems = 16384;             // elements of C per task when adding chunks

// Tile counts are taken from this list (rounding down), so that common thread counts share tiles
// evenly: every count but 1 is even, most are multiples of 4, 12 and 24 also of 3.
int64_t even_count(int64_t n) {
  static constexpr int64_t kCounts[] = {64, 48, 32, 24, 16, 12, 8, 4, 2};
  for (int64_t c : kCounts)
    if (n >= c) return c;
  return 1;
}

// Edge t of `tiles` near-equal blocks of [0, extent), on a multiple of 16 except the end.
int64_t edge(int64_t extent, int64_t tiles, int64_t t) {
  if (t >= tiles) return extent;
  return std::min(extent, (extent * t / tiles + 8) / 16 * 16);
}

}  // namespace

GemmTiling gemm_tiling(int64_t M, int64_t N, int64_t K) {
  const double flops =
      2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  if (flops < kSmallFlops) return {};
  const int64_t by_work = static_cast<int64_t>(flops / kMinTileFlops);
  const bool rows = M >= N;
  const GemmTiling::Axis axis = rows ? GemmTiling::Axis::rows : GemmTiling::Axis::cols;
  const int64_t extent = rows ? M : N;
  const int64_t wide = even_count(std::min({extent / kMinTile, by_work, kMaxTiles}));
  if (wide >= 4) return {axis, wide};
  // A narrow output: finer tiles would re-pack the other operand for little work each. When K is
  // long (a vocabulary-sized sum, say), chunks of K give more and cheaper tasks.
  const int64_t narrow = even_count(std::min({extent / kMinNarrowTile, by_work, kMaxNarrowTiles}));
  const int64_t chunks =
      even_count(std::min({K / kMinKChunk, kScratchElems / (M * N) + 1, kMaxKChunks, by_work}));
  if (chunks > narrow) return {GemmTiling::Axis::depth, chunks};
  return {axis, narrow};
}

template <>
void gemm_serial<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                        float* C, int64_t ldc) {
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
  if (M == 0 || N == 0) return;
  const GemmTiling tiling = gemm_tiling(M, N, K);
  const int64_t tiles = tiling.tiles;
  if (tiles == 1) {
    gemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Row-major offsets: op(A) row m starts at A + m * lda (A + m when transposed), its column k at
  // A + k (A + k * lda); op(B) row k at B + k * ldb (B + k), column n at B + n (B + n * ldb).
  switch (tiling.axis) {
    case GemmTiling::Axis::rows:
      pool.for_each_task(tiles, [&](int64_t t) {
        const int64_t m0 = edge(M, tiles, t), m1 = edge(M, tiles, t + 1);
        const T* a = ta ? A + m0 : A + m0 * lda;
        gemm_serial(ta, tb, m1 - m0, N, K, alpha, a, lda, B, ldb, beta, C + m0 * ldc, ldc);
      });
      return;
    case GemmTiling::Axis::cols:
      pool.for_each_task(tiles, [&](int64_t t) {
        const int64_t n0 = edge(N, tiles, t), n1 = edge(N, tiles, t + 1);
        const T* b = tb ? B + n0 * ldb : B + n0;
        gemm_serial(ta, tb, M, n1 - n0, K, alpha, A, lda, b, ldb, beta, C + n0, ldc);
      });
      return;
    case GemmTiling::Axis::depth: {
      // partial (tiles-1, M, N): chunk t >= 1's product; chunk 0 goes into C with the caller's
      // beta. Not zeroed: every element is written (beta 0) before it is read.
      const auto partial_buf =
          std::make_unique_for_overwrite<T[]>(static_cast<size_t>((tiles - 1) * M * N));
      T* const partial = partial_buf.get();
      pool.for_each_task(tiles, [&](int64_t t) {
        const int64_t k0 = edge(K, tiles, t), k1 = edge(K, tiles, t + 1);
        const T* a = ta ? A + k0 * lda : A + k0;
        const T* b = tb ? B + k0 : B + k0 * ldb;
        if (t == 0) {
          gemm_serial(ta, tb, M, N, k1 - k0, alpha, a, lda, b, ldb, beta, C, ldc);
        } else {
          gemm_serial(ta, tb, M, N, k1 - k0, alpha, a, lda, b, ldb, T(0), partial + (t - 1) * M * N,
                      N);
        }
      });
      // C += partial[0] + partial[1] + ..., in that order for every element (plain adds: no
      // contraction can make one element's arithmetic differ from another's).
      const int64_t rows_per_task = std::max<int64_t>(1, kCombineElems / N);
      pool.for_each_task((M + rows_per_task - 1) / rows_per_task, [&](int64_t task) {
        const int64_t m0 = task * rows_per_task, m1 = std::min(M, m0 + rows_per_task);
        for (int64_t c = 0; c < tiles - 1; ++c) {
          const T* p = partial + c * M * N;
          for (int64_t m = m0; m < m1; ++m) {
            T* cr = C + m * ldc;
            const T* pr = p + m * N;
            for (int64_t n = 0; n < N; ++n) cr[n] += pr[n];
          }
        }
      });
      return;
    }
  }
  TROUPE_CHECK(false, "gemm: unknown tiling axis");
}

template void gemm<float>(ThreadPool&, bool, bool, int64_t, int64_t, int64_t, float, const float*,
                          int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm<double>(ThreadPool&, bool, bool, int64_t, int64_t, int64_t, double,
                           const double*, int64_t, const double*, int64_t, double, double*,
                           int64_t);

}  // namespace troupe::cpu
