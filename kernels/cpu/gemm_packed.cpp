#include "kernels/cpu/gemm_packed.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include "kernels/cpu/scratch.hpp"
#include "troupe/check.hpp"

// Only the functions marked TROUPE_AVX512 / TROUPE_AVX2 use those instructions; they run only where
// packed_kernel_supported says so, so the rest of the file runs on any x86-64.
#define TROUPE_AVX512 __attribute__((target("avx512f")))
#define TROUPE_AVX2 __attribute__((target("avx2,fma")))

namespace troupe::cpu {

namespace {

// Register block: kMR rows of A (read in place, one element broadcast per row and k) x kNR columns
// of C (one packed panel of W). Cache block: kKC values of K per pass, so a panel's slice (kKC x kNR,
// 24 KiB) stays in L1 while the task's rows pass over it; a task is up to kMC x kNC of C, its
// accumulators kept between passes.
constexpr int64_t kMR = 6;
constexpr int64_t kNR = 64;
constexpr int64_t kKC = 96;
constexpr int64_t kMC = 16 * kMR;  // 96
constexpr int64_t kNC = 4 * kNR;   // 256
constexpr double kSmallFlops = 4e6;  // below this: everything on the calling thread

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

struct AlignedFree {
  void operator()(float* p) const { ::operator delete(p, std::align_val_t{64}); }
};
float* aligned_floats(size_t n) {
  return static_cast<float*>(::operator new(std::max<size_t>(n, 16) * sizeof(float), std::align_val_t{64}));
}

// The accumulators of one task (kMC x kNC, row stride kNC): the pool thread's scratch (not 64-byte
// aligned: the blocks load and store them unaligned).
float* task_accumulators() {
  return thread_scratch<float>(kMC * kNC, 0);
}

// What a task needs.
struct Problem {
  int64_t M, N, K;
  const float* A;
  int64_t lda;
  const float* w;  // packed: (ceil(N/kNR), K, kNR)
  const float* bias;
  float* C;
  int64_t ldc;
  int64_t nc;  // columns per task: a multiple of kNR, at most kNC
};

// ---- avx512: R x 64 in R x 4 zmm ---------------------------------------------------------------------

// One R x kNR block over kc values of K: the accumulators start at zero (first) or from acc (row
// stride kNC) and end in acc, or (last) in C's R x cols (+ bias).
template <int R>
TROUPE_AVX512 void block_avx512(int64_t kc, const float* a, int64_t lda, const float* b, float* acc, bool first,
                                bool last, const float* bias, int64_t cols, float* c, int64_t ldc) {
  __m512 s[R][4];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) s[r][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * kNC + 16 * j);
  for (int64_t k = 0; k < kc; ++k) {
    const float* bk = b + k * kNR;
    const __m512 b0 = _mm512_load_ps(bk), b1 = _mm512_load_ps(bk + 16);
    const __m512 b2 = _mm512_load_ps(bk + 32), b3 = _mm512_load_ps(bk + 48);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + k]);
      s[r][0] = _mm512_fmadd_ps(ar, b0, s[r][0]);
      s[r][1] = _mm512_fmadd_ps(ar, b1, s[r][1]);
      s[r][2] = _mm512_fmadd_ps(ar, b2, s[r][2]);
      s[r][3] = _mm512_fmadd_ps(ar, b3, s[r][3]);
    }
  }
  if (!last) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc + r * kNC + 16 * j, s[r][j]);
    return;
  }
  __mmask16 mask[4];
  __m512 bv[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t n = std::clamp<int64_t>(cols - 16 * j, 0, 16);
    mask[j] = static_cast<__mmask16>((1u << n) - 1u);
    bv[j] = bias ? _mm512_maskz_loadu_ps(mask[j], bias + 16 * j) : _mm512_setzero_ps();
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512 v = bias ? _mm512_add_ps(s[r][j], bv[j]) : s[r][j];
      _mm512_mask_storeu_ps(c + r * ldc + 16 * j, mask[j], v);
    }
}

// ---- avx2: R x 16 in R x 2 ymm, four per panel --------------------------------------------------------

__attribute__((target("avx2"))) inline __m256i first_lanes(int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane);
}

// One R x 16 strip of a panel: b and acc already at the strip's first column; cols <= 16.
template <int R>
TROUPE_AVX2 void strip_avx2(int64_t kc, const float* a, int64_t lda, const float* b, float* acc, bool first, bool last,
                            const float* bias, int64_t cols, float* c, int64_t ldc) {
  __m256 s[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) s[r][j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * kNC + 8 * j);
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b + k * kNR), b1 = _mm256_load_ps(b + k * kNR + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * lda + k);
      s[r][0] = _mm256_fmadd_ps(ar, b0, s[r][0]);
      s[r][1] = _mm256_fmadd_ps(ar, b1, s[r][1]);
    }
  }
  if (!last) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) _mm256_storeu_ps(acc + r * kNC + 8 * j, s[r][j]);
    return;
  }
  __m256i mask[2];
  __m256 bv[2];
  for (int j = 0; j < 2; ++j) {
    mask[j] = first_lanes(std::clamp<int64_t>(cols - 8 * j, 0, 8));
    bv[j] = bias ? _mm256_maskload_ps(bias + 8 * j, mask[j]) : _mm256_setzero_ps();
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      const __m256 v = bias ? _mm256_add_ps(s[r][j], bv[j]) : s[r][j];
      _mm256_maskstore_ps(c + r * ldc + 8 * j, mask[j], v);
    }
}

template <int R>
void block_avx2(int64_t kc, const float* a, int64_t lda, const float* b, float* acc, bool first, bool last,
                const float* bias, int64_t cols, float* c, int64_t ldc) {
  for (int64_t j = 0; j < kNR / 16 && 16 * j < cols; ++j)
    strip_avx2<R>(kc, a, lda, b + 16 * j, acc + 16 * j, first, last, bias ? bias + 16 * j : nullptr,
                  std::min<int64_t>(16, cols - 16 * j), c + 16 * j, ldc);
}

// ---- the blocks of C ------------------------------------------------------------------------------------

using BlockFn = void (*)(int64_t, const float*, int64_t, const float*, float*, bool, bool, const float*, int64_t,
                         float*, int64_t);

// The block function of each row count 1..kMR.
struct Blocks {
  BlockFn by_rows[kMR + 1];
};
template <template <int> class F>
constexpr Blocks blocks_of() {
  return {{nullptr, F<1>::fn, F<2>::fn, F<3>::fn, F<4>::fn, F<5>::fn, F<6>::fn}};
}
template <int R>
struct Avx512Of {
  static constexpr BlockFn fn = block_avx512<R>;
};
template <int R>
struct Avx2Of {
  static constexpr BlockFn fn = block_avx2<R>;
};
constexpr Blocks kAvx512 = blocks_of<Avx512Of>();
constexpr Blocks kAvx2 = blocks_of<Avx2Of>();

// Task (row block ib, column block jb): kMC x nc of C over all of K, in kKC passes.
void run_task(const Blocks& blocks, const Problem& pr, int64_t ib, int64_t jb) {
  const int64_t m0 = ib * kMC, m1 = std::min(pr.M, m0 + kMC);
  const int64_t n0 = jb * pr.nc, n1 = std::min(pr.N, n0 + pr.nc);
  float* const acc = task_accumulators();
  int64_t pc = 0;
  do {  // K == 0 makes one pass over nothing: C = bias
    const int64_t kc = std::min(kKC, pr.K - pc);
    const bool first = pc == 0, last = pc + kc == pr.K;
    for (int64_t n = n0; n < n1; n += kNR) {
      const float* b = pr.w + (n / kNR) * pr.K * kNR + pc * kNR;
      const float* bias = pr.bias ? pr.bias + n : nullptr;
      for (int64_t m = m0; m < m1; m += kMR) {
        const int64_t rows = std::min(kMR, pr.M - m);
        blocks.by_rows[rows](kc, pr.A + m * pr.lda + pc, pr.lda, b, acc + (m - m0) * kNC + (n - n0), first, last, bias,
                             std::min(kNR, pr.N - n), pr.C + m * pr.ldc + n, pr.ldc);
      }
    }
    pc += kc;
  } while (pc < pr.K);
}

}  // namespace

bool packed_kernel_supported(PackedKernel kernel) {
  static const bool avx512 = [] {
    __builtin_cpu_init();  // libgcc's checks include the OS's saving of the zmm and mask registers
    return __builtin_cpu_supports("avx512f");
  }();
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  switch (kernel) {
    case PackedKernel::none: return true;
    case PackedKernel::avx2: return avx2;
    case PackedKernel::avx512: return avx512;
  }
  return false;
}

PackedKernel choose_packed_kernel(const char* cpu_features) {
  const std::string_view f = cpu_features ? cpu_features : "";
  if (f == "generic") return PackedKernel::none;
  if (f != "avx2" && packed_kernel_supported(PackedKernel::avx512)) return PackedKernel::avx512;
  if (packed_kernel_supported(PackedKernel::avx2)) return PackedKernel::avx2;
  return PackedKernel::none;
}

PackedKernel packed_gemm_kernel() {
  static const PackedKernel kernel = choose_packed_kernel(std::getenv("TROUPE_CPU_FEATURES"));
  return kernel;
}

const char* packed_kernel_name(PackedKernel kernel) {
  switch (kernel) {
    case PackedKernel::none: return "none";
    case PackedKernel::avx2: return "avx2";
    case PackedKernel::avx512: return "avx512";
  }
  return "?";
}

size_t PackedWeight::bytes() const {
  return static_cast<size_t>(ceil_div(n_, kNR) * k_ * kNR) * sizeof(float);
}

PackedWeight PackedWeight::pack(ThreadPool& pool, const float* w, int64_t N, int64_t K, int64_t ldw) {
  TROUPE_CHECK(N >= 0 && K >= 0 && ldw >= std::max<int64_t>(1, K), "PackedWeight::pack: bad sizes");
  PackedWeight p;
  p.n_ = N;
  p.k_ = K;
  const int64_t panels = ceil_div(N, kNR);
  p.data_ = std::shared_ptr<float[]>(aligned_floats(static_cast<size_t>(panels * K * kNR)), AlignedFree{});
  float* const out = p.data_.get();
  constexpr int64_t kSpan = 16;  // values of K per sweep over a panel's rows: 16 cache lines written
  pool.parallel_for(panels, [&](int64_t p0, int64_t p1) {
    for (int64_t q = p0; q < p1; ++q) {
      float* o = out + q * K * kNR;
      for (int64_t k0 = 0; k0 < K; k0 += kSpan) {
        const int64_t k1 = std::min(K, k0 + kSpan);
        for (int64_t c = 0; c < kNR; ++c) {
          const int64_t row = q * kNR + c;
          if (row < N) {
            const float* src = w + row * ldw;
            for (int64_t k = k0; k < k1; ++k) o[k * kNR + c] = src[k];
          } else {
            for (int64_t k = k0; k < k1; ++k) o[k * kNR + c] = 0.0f;
          }
        }
      }
    }
  });
  return p;
}

void linear_packed(PackedKernel kernel, ThreadPool& pool, int64_t M, const float* A, int64_t lda,
                   const PackedWeight& w, const float* bias, float* C, int64_t ldc) {
  const int64_t N = w.rows(), K = w.depth();
  TROUPE_CHECK(kernel != PackedKernel::none && packed_kernel_supported(kernel),
               "linear_packed: the kernel is not supported on this CPU");
  TROUPE_CHECK(!w.empty() && M >= 0 && lda >= std::max<int64_t>(1, K) && ldc >= std::max<int64_t>(1, N),
               "linear_packed: leading dimension below the matrix width");
  if (M == 0 || N == 0) return;
  const Blocks& blocks = kernel == PackedKernel::avx512 ? kAvx512 : kAvx2;
  const int64_t panels = ceil_div(N, kNR), blocks_m = ceil_div(M, kMC);
  // Columns per task: kNC, or fewer panels when that leaves under four tasks per thread (a decode
  // step's few rows). The cut changes no bits (see the header).
  const int64_t want = 4 * static_cast<int64_t>(pool.size());
  const int64_t per_task = std::clamp<int64_t>(panels * blocks_m / want, 1, kNC / kNR);
  const Problem pr{M, N, K, A, lda, w.data(), bias, C, ldc, per_task * kNR};
  const int64_t blocks_n = ceil_div(N, pr.nc);
  // Neighbouring tasks share a block of W (the larger operand): a thread walking them in order
  // streams W once and re-reads the rows of A, which stay in cache.
  auto compute = [&](int64_t t) { run_task(blocks, pr, t % blocks_m, t / blocks_m); };
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  if (flops < kSmallFlops) {
    for (int64_t t = 0; t < blocks_m * blocks_n; ++t) compute(t);
  } else {
    pool.for_each_task(blocks_m * blocks_n, compute);
  }
}

void linear_packed(ThreadPool& pool, int64_t M, const float* A, int64_t lda, const PackedWeight& w,
                   const float* bias, float* C, int64_t ldc) {
  linear_packed(packed_gemm_kernel(), pool, M, A, lda, w, bias, C, ldc);
}

}  // namespace troupe::cpu
