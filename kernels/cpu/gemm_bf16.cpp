#include "kernels/cpu/gemm_bf16.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "kernels/cpu/gemm.hpp"
#include "troupe/check.hpp"

// Only the functions marked TROUPE_AVX512_BF16 use AVX-512; they run only where
// bf16_kernel_supported says so, so the rest of the file (and the binary) runs on any x86-64.
#define TROUPE_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace troupe::cpu {

namespace {

// Register block: kMR rows x kNR columns of C, 6 x 4 zmm accumulators (24 of the 32 registers; 4
// hold op(B)'s pairs, the A pairs are broadcast from memory). Cache block: kKC pairs of K per pass,
// so a B slice (kKC x kNR pairs, 24 KiB) stays in L1 while the task's kMC rows pass over it; a
// task is kMC x kNC of C (its accumulators between passes: 96 KiB).
constexpr int64_t kMR = 6;
constexpr int64_t kNR = 64;
constexpr int64_t kKC = 96;
constexpr int64_t kMC = 16 * kMR;  // 96
constexpr int64_t kNC = 4 * kNR;   // 256
constexpr int64_t kPackPanelsA = 32;  // panels per packing task
constexpr int64_t kPackPanelsB = 4;
constexpr double kSmallFlops = 4e6;  // below this: everything on the calling thread

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// 64-byte aligned scratch that grows and is kept for the next call (one per thread).
class Scratch {
 public:
  void* get(size_t bytes) {
    if (bytes > cap_) {
      mem_.reset();
      mem_.reset(static_cast<std::byte*>(::operator new(bytes, std::align_val_t{64})));
      cap_ = bytes;
    }
    return mem_.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte, Free> mem_;
  size_t cap_ = 0;
};

uint32_t pair_of(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// The unpacks and lane shuffle through their masked forms with every lane selected (the same
// instruction): GCC 12 warns of the plain forms' undefined pass-through operand.
TROUPE_AVX512_BF16 inline __m512i unpacklo32(__m512i a, __m512i b) {
  return _mm512_mask_unpacklo_epi32(a, 0xffff, a, b);
}
TROUPE_AVX512_BF16 inline __m512i unpackhi32(__m512i a, __m512i b) {
  return _mm512_mask_unpackhi_epi32(a, 0xffff, a, b);
}
TROUPE_AVX512_BF16 inline __m512i unpacklo64(__m512i a, __m512i b) {
  return _mm512_mask_unpacklo_epi64(a, 0xff, a, b);
}
TROUPE_AVX512_BF16 inline __m512i unpackhi64(__m512i a, __m512i b) {
  return _mm512_mask_unpackhi_epi64(a, 0xff, a, b);
}
template <int imm>
TROUPE_AVX512_BF16 inline __m512i lanes(__m512i a, __m512i b) {
  return _mm512_mask_shuffle_i32x4(a, 0xffff, a, b, imm);
}

// 16 x 16 words, rows src + i * ld_src (uint16 units, 16 pairs each) -> rows out + j * ld_out: in
// 128-bit lanes (unpack of words, then of pairs of words), then across lanes (two lane shuffles).
TROUPE_AVX512_BF16 void transpose_16x16(const uint16_t* src, int64_t ld_src, uint32_t* out,
                                        int64_t ld_out) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ld_src);
  for (int i = 0; i < 16; i += 2) {
    t[i] = unpacklo32(r[i], r[i + 1]);
    t[i + 1] = unpackhi32(r[i], r[i + 1]);
  }
  // r[4g + j], lane L: word 4L + j of rows 4g .. 4g+3.
  for (int g = 0; g < 16; g += 4) {
    r[g] = unpacklo64(t[g], t[g + 2]);
    r[g + 1] = unpackhi64(t[g], t[g + 2]);
    r[g + 2] = unpacklo64(t[g + 1], t[g + 3]);
    r[g + 3] = unpackhi64(t[g + 1], t[g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i v = lanes<0x88>(r[j], r[4 + j]);   // lanes 0, 2 of rows 0-7
    const __m512i w = lanes<0xdd>(r[j], r[4 + j]);   // lanes 1, 3
    const __m512i v2 = lanes<0x88>(r[8 + j], r[12 + j]);
    const __m512i w2 = lanes<0xdd>(r[8 + j], r[12 + j]);
    _mm512_storeu_si512(out + (j + 0) * ld_out, lanes<0x88>(v, v2));
    _mm512_storeu_si512(out + (j + 4) * ld_out, lanes<0x88>(w, w2));
    _mm512_storeu_si512(out + (j + 8) * ld_out, lanes<0xdd>(v, v2));
    _mm512_storeu_si512(out + (j + 12) * ld_out, lanes<0xdd>(w, w2));
  }
}

// Where word j of the k-th 16-word vector of a (16, kMR) block of a panel comes from: pair
// idx[k][j] of row (16 k + j) % kMR, the rows selected by mask[k][row].
struct InterleaveTables {
  alignas(64) int32_t idx[kMR][16];
  __mmask16 mask[kMR][kMR];
  constexpr InterleaveTables() : idx{}, mask{} {
    for (int k = 0; k < kMR; ++k)
      for (int j = 0; j < 16; ++j) {
        idx[k][j] = (16 * k + j) / kMR;
        mask[k][(16 * k + j) % kMR] = static_cast<__mmask16>(mask[k][(16 * k + j) % kMR] | (1u << j));
      }
  }
};
constexpr InterleaveTables kInterleave;

// Packing. A panel of op(A): rows m0 .. m0+rows (rows <= kMR), out (Kp, kMR) pairs, out[p][r] =
// (op(A)[m0+r][2p], op(A)[m0+r][2p+1]); rows past `rows` and the element past an odd K are 0.
TROUPE_AVX512_BF16 void pack_a_panel(bool ta, const uint16_t* A, int64_t lda, int64_t m0,
                                     int64_t rows, int64_t K, uint32_t* out) {
  const int64_t Kp = ceil_div(K, 2), full = K / 2;
  if (!ta) {  // A (M, K): a row's pairs are adjacent
    int64_t done = 0;  // pairs interleaved 16 at a time
    if (rows == kMR) {
      done = full / 16 * 16;
      for (int64_t p0 = 0; p0 < done; p0 += 16) {
        __m512i row[kMR];
        for (int r = 0; r < kMR; ++r) row[r] = _mm512_loadu_si512(A + (m0 + r) * lda + 2 * p0);
        for (int k = 0; k < kMR; ++k) {
          const __m512i idx = _mm512_load_si512(kInterleave.idx[k]);
          __m512i v = _mm512_setzero_si512();
          for (int r = 0; r < kMR; ++r)
            v = _mm512_mask_permutexvar_epi32(v, kInterleave.mask[k][r], idx, row[r]);
          _mm512_storeu_si512(out + p0 * kMR + 16 * k, v);
        }
      }
    }
    std::fill(out + done * kMR, out + Kp * kMR, 0u);
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* src = A + (m0 + r) * lda;
      for (int64_t p = done; p < full; ++p) out[p * kMR + r] = pair_of(src[2 * p], src[2 * p + 1]);
      if (K % 2) out[full * kMR + r] = pair_of(src[K - 1], 0);
    }
  } else {  // A (K, M): a pair is two rows of A
    for (int64_t p = 0; p < Kp; ++p) {
      const uint16_t* r0 = A + 2 * p * lda + m0;
      const uint16_t* r1 = 2 * p + 1 < K ? r0 + lda : nullptr;
      for (int64_t r = 0; r < kMR; ++r)
        out[p * kMR + r] = r < rows ? pair_of(r0[r], r1 ? r1[r] : 0) : 0u;
    }
  }
}

// kGroupA panels of op(A) = A^T at once, rows m0 .. m0 + kGroupA kMR (all inside M): each pair
// of rows of A gives 48 pairs in three vectors, six of them per panel. out: the first panel; the
// others follow it Kp kMR words apart.
constexpr int64_t kGroupA = 8;
TROUPE_AVX512_BF16 void pack_a_group_transposed(const uint16_t* A, int64_t lda, int64_t m0,
                                                int64_t K, uint32_t* out) {
  static_assert(kGroupA * kMR == 48, "three vectors of 16 pairs");
  const int64_t Kp = ceil_div(K, 2), full = K / 2;
  // Panel q's six pairs are words 6q .. 6q+5 of the 48: from vector 6q / 16 and the next.
  __m512i idx[kGroupA];
  for (int q = 0; q < kGroupA; ++q) {
    alignas(64) int32_t w[16] = {};
    for (int r = 0; r < kMR; ++r) w[r] = (6 * q + r) % 16 + ((6 * q + r) / 16 - (6 * q) / 16) * 16;
    idx[q] = _mm512_load_si512(w);
  }
  for (int64_t p = 0; p < full; ++p) {
    const uint16_t* r0 = A + 2 * p * lda + m0;
    const uint16_t* r1 = r0 + lda;
    __m512i v[4];
    for (int i = 0; i < 3; ++i) {  // maskz forms: see unpacklo32
      const __m512i lo = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + 16 * i)));
      const __m512i hi = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + 16 * i)));
      v[i] = _mm512_or_si512(lo, _mm512_maskz_slli_epi32(0xffff, hi, 16));
    }
    v[3] = v[2];
    for (int q = 0; q < kGroupA; ++q) {
      const int first = 6 * q / 16;
      const __m512i panel = _mm512_permutex2var_epi32(v[first], idx[q], v[first + 1]);
      // A full store writes 10 words past the six, which the next pairs overwrite; only the last
      // two pairs of a panel, whose spill would reach the next panel, are stored masked.
      if (p + 2 < full)
        _mm512_storeu_si512(out + q * Kp * kMR + p * kMR, panel);
      else
        _mm512_mask_storeu_epi32(out + q * Kp * kMR + p * kMR, 0x3f, panel);
    }
  }
  if (K % 2) {
    const uint16_t* r0 = A + (K - 1) * lda + m0;
    for (int q = 0; q < kGroupA; ++q)
      for (int r = 0; r < kMR; ++r) out[q * Kp * kMR + full * kMR + r] = pair_of(r0[6 * q + r], 0);
  }
}

// A panel of op(B): columns n0 .. n0+cols (cols <= kNR), out (Kp, kNR) pairs, out[p][c] =
// (op(B)[2p][n0+c], op(B)[2p+1][n0+c]), zero-padded likewise.
TROUPE_AVX512_BF16 void pack_b_panel(bool tb, const uint16_t* B, int64_t ldb, int64_t n0,
                                     int64_t cols, int64_t K, uint32_t* out) {
  const int64_t Kp = ceil_div(K, 2), full = K / 2;
  if (!tb) {  // B (K, N): a pair is two rows of B
    for (int64_t p = 0; p < Kp; ++p) {
      const uint16_t* r0 = B + 2 * p * ldb + n0;
      uint32_t* o = out + p * kNR;
      if (2 * p + 1 < K) {
        const uint16_t* r1 = r0 + ldb;
        for (int64_t c = 0; c < cols; ++c) o[c] = pair_of(r0[c], r1[c]);
      } else {
        for (int64_t c = 0; c < cols; ++c) o[c] = pair_of(r0[c], 0);
      }
      std::fill(o + cols, o + kNR, 0u);
    }
  } else {  // B (N, K): a column's pairs are adjacent; 16 x 16 blocks are transposed in registers
    const int64_t vec_cols = cols / 16 * 16, vec_pairs = full / 16 * 16;
    for (int64_t c0 = 0; c0 < vec_cols; c0 += 16)
      for (int64_t p0 = 0; p0 < vec_pairs; p0 += 16)
        transpose_16x16(B + (n0 + c0) * ldb + 2 * p0, ldb, out + p0 * kNR + c0, kNR);
    for (int64_t c = 0; c < kNR; ++c) {
      const uint16_t* src = B + (n0 + c) * ldb;
      for (int64_t p = c < vec_cols ? vec_pairs : 0; p < Kp; ++p) {
        uint32_t v = 0;
        if (c < cols) v = 2 * p + 1 < K ? pair_of(src[2 * p], src[2 * p + 1]) : pair_of(src[K - 1], 0);
        out[p * kNR + c] = v;
      }
    }
  }
}

// What a task needs: the packed operands and the output.
template <class Out>
struct Problem {
  int64_t M, N, K, Kp;
  const uint32_t* a_packed;  // (ceil(M/kMR), Kp, kMR)
  const uint32_t* b_packed;  // (ceil(N/kNR), Kp, kNR)
  float alpha, beta;
  Out* C;
  int64_t ldc;
};

// C's values as fp32, and back.
TROUPE_AVX512_BF16 inline __m512 load_c(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
TROUPE_AVX512_BF16 inline __m512 load_c(const uint16_t* p, __mmask16 m) {
  // maskz forms: GCC 12 warns of the unmasked ones' undefined pass-through operand.
  const __m512i h = _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(m, h, 16));
}
TROUPE_AVX512_BF16 inline void store_c(float* p, __mmask16 m, __m512 v) {
  _mm512_mask_storeu_ps(p, m, v);
}
TROUPE_AVX512_BF16 inline void store_c(uint16_t* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// One kMR x kNR block over kc pairs: the accumulators start at zero (first) or from acc (ld kNC),
// and end in acc, or (last) as alpha * s + beta * c in C's rows x cols.
template <class Out>
TROUPE_AVX512_BF16 void micro_kernel(int64_t kc, const uint32_t* a, const uint32_t* b, float* acc,
                                     bool first, bool last, const Problem<Out>& pr, int64_t rows,
                                     int64_t cols, Out* c) {
  __m512 s[kMR][4];
  if (first) {
#pragma GCC unroll 6
    for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) s[r][j] = _mm512_setzero_ps();
  } else {
#pragma GCC unroll 6
    for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) s[r][j] = _mm512_load_ps(acc + r * kNC + 16 * j);
  }
  for (int64_t p = 0; p < kc; ++p) {
    const uint32_t* bp = b + p * kNR;
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_load_si512(bp));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + 16));
    const __m512bh b2 = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + 32));
    const __m512bh b3 = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + 48));
    const uint32_t* ap = a + p * kMR;
#pragma GCC unroll 6
    for (int r = 0; r < kMR; ++r) {
      const __m512bh ar = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ap[r])));
      s[r][0] = _mm512_dpbf16_ps(s[r][0], ar, b0);
      s[r][1] = _mm512_dpbf16_ps(s[r][1], ar, b1);
      s[r][2] = _mm512_dpbf16_ps(s[r][2], ar, b2);
      s[r][3] = _mm512_dpbf16_ps(s[r][3], ar, b3);
    }
  }
  if (!last) {
#pragma GCC unroll 6
    for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) _mm512_store_ps(acc + r * kNC + 16 * j, s[r][j]);
    return;
  }
  const __m512 alpha = _mm512_set1_ps(pr.alpha), beta = _mm512_set1_ps(pr.beta);
  __mmask16 mask[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t n = std::clamp<int64_t>(cols - 16 * j, 0, 16);
    mask[j] = static_cast<__mmask16>((1u << n) - 1u);
  }
  // Unrolled, so that s stays in registers (a loop over `rows` would index it at run time).
#pragma GCC unroll 6
  for (int r = 0; r < kMR; ++r) {
    if (r >= rows) break;
    Out* cr = c + r * pr.ldc;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      if (!mask[j]) break;
      __m512 v = _mm512_mul_ps(alpha, s[r][j]);
      if (pr.beta != 0.0f) v = _mm512_fmadd_ps(beta, load_c(cr + 16 * j, mask[j]), v);
      store_c(cr + 16 * j, mask[j], v);
    }
  }
}

// The accumulators of one task, per pool thread.
float* task_accumulators() {
  thread_local Scratch scratch;
  return static_cast<float*>(scratch.get(kMC * kNC * sizeof(float)));
}

// Task (row block ib, column block jb): kMC x kNC of C over all of K, in kKC passes.
template <class Out>
TROUPE_AVX512_BF16 void run_task(const Problem<Out>& pr, int64_t ib, int64_t jb) {
  const int64_t m0 = ib * kMC, m1 = std::min(pr.M, m0 + kMC);
  const int64_t n0 = jb * kNC, n1 = std::min(pr.N, n0 + kNC);
  float* const acc = task_accumulators();
  int64_t pc = 0;
  do {  // K == 0 makes one pass of no pairs: C = beta C
    const int64_t kc = std::min(kKC, pr.Kp - pc);
    const bool first = pc == 0, last = pc + kc == pr.Kp;
    for (int64_t n = n0; n < n1; n += kNR) {
      const uint32_t* b = pr.b_packed + (n / kNR) * pr.Kp * kNR + pc * kNR;
      for (int64_t m = m0; m < m1; m += kMR) {
        const uint32_t* a = pr.a_packed + (m / kMR) * pr.Kp * kMR + pc * kMR;
        float* acc_block = acc + (m - m0) * kNC + (n - n0);
        micro_kernel<Out>(kc, a, b, acc_block, first, last, pr, std::min(kMR, pr.M - m),
                          std::min(kNR, pr.N - n), pr.C + m * pr.ldc + n);
      }
    }
    pc += kc;
  } while (pc < pr.Kp);
}

Scratch& packing_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

template <class Out>
void gemm_avx512_bf16(ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                      float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                      float beta, Out* C, int64_t ldc) {
  const int64_t Kp = ceil_div(K, 2);
  const int64_t panels_a = ceil_div(M, kMR), panels_b = ceil_div(N, kNR);
  const size_t a_words = static_cast<size_t>(panels_a * Kp * kMR);
  const size_t b_words = static_cast<size_t>(panels_b * Kp * kNR);
  // b first: its panels are 256-byte multiples, so a stays 64-byte aligned.
  auto* const b_packed = static_cast<uint32_t*>(
      packing_scratch().get(std::max<size_t>(64, (a_words + b_words) * sizeof(uint32_t))));
  uint32_t* const a_packed = b_packed + b_words;
  const Problem<Out> pr{M, N, K, Kp, a_packed, b_packed, alpha, beta, C, ldc};

  const int64_t tasks_a = ceil_div(panels_a, kPackPanelsA), tasks_b = ceil_div(panels_b, kPackPanelsB);
  auto pack = [&](int64_t t) {
    if (t < tasks_a) {
      const int64_t end = std::min(panels_a, (t + 1) * kPackPanelsA);
      for (int64_t i = t * kPackPanelsA; i < end;) {
        if (ta && i + kGroupA <= end && (i + kGroupA) * kMR <= M) {
          pack_a_group_transposed(A, lda, i * kMR, K, a_packed + i * Kp * kMR);
          i += kGroupA;
        } else {
          pack_a_panel(ta, A, lda, i * kMR, std::min(kMR, M - i * kMR), K, a_packed + i * Kp * kMR);
          ++i;
        }
      }
    } else {
      t -= tasks_a;
      for (int64_t j = t * kPackPanelsB; j < std::min(panels_b, (t + 1) * kPackPanelsB); ++j)
        pack_b_panel(tb, B, ldb, j * kNR, std::min(kNR, N - j * kNR), K, b_packed + j * Kp * kNR);
    }
  };
  // Tasks are numbered so that neighbours share the larger packed operand's block: a thread
  // walking them in order then streams that operand from memory once (a 50304-column head's B is
  // larger than the last-level cache) and re-reads the smaller one, which stays in cache.
  const int64_t blocks_m = ceil_div(M, kMC), blocks_n = ceil_div(N, kNC);
  const bool b_larger = b_words > a_words;
  auto compute = [&](int64_t t) {
    if (b_larger)
      run_task(pr, t % blocks_m, t / blocks_m);
    else
      run_task(pr, t / blocks_n, t % blocks_n);
  };
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  if (flops < kSmallFlops) {
    for (int64_t t = 0; t < tasks_a + tasks_b; ++t) pack(t);
    for (int64_t t = 0; t < blocks_m * blocks_n; ++t) compute(t);
  } else {
    pool.for_each_task(tasks_a + tasks_b, pack);
    pool.for_each_task(blocks_m * blocks_n, compute);
  }
}

// The generic kernel: widen the stored matrices (rows, cols, ld) to compact fp32, then gemm().
void widen(ThreadPool& pool, const uint16_t* src, int64_t rows, int64_t cols, int64_t ld,
           float* dst) {
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = bf16_to_float(src[r * ld + c]);
  }, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)));
}

struct Widened {
  std::unique_ptr<float[]> a, b;
};
Widened widen_operands(ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                       const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb) {
  Widened w;
  w.a = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(M * K));  // op(A) stored compact
  w.b = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(K * N));
  widen(pool, A, ta ? K : M, ta ? M : K, lda, w.a.get());
  widen(pool, B, tb ? N : K, tb ? K : N, ldb, w.b.get());
  return w;
}

void gemm_widen_sgemm(ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                      float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                      float beta, float* C, int64_t ldc) {
  const Widened w = widen_operands(pool, ta, tb, M, N, K, A, lda, B, ldb);
  // At least 1: BLAS refuses a leading dimension of 0 even where K == 0.
  const int64_t lda_w = std::max<int64_t>(1, ta ? M : K), ldb_w = std::max<int64_t>(1, tb ? K : N);
  gemm<float>(pool, ta, tb, M, N, K, alpha, w.a.get(), lda_w, w.b.get(), ldb_w, beta, C, ldc);
}

void gemm_widen_sgemm(ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                      float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                      float beta, uint16_t* C, int64_t ldc) {
  std::vector<float> c(static_cast<size_t>(M * N), 0.0f);  // (M, N)
  if (beta != 0.0f) widen(pool, C, M, N, ldc, c.data());
  gemm_widen_sgemm(pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, c.data(), N);
  pool.parallel_for(M, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t n = 0; n < N; ++n) C[r * ldc + n] = float_to_bf16(c[r * N + n]);
  }, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, N)));
}

template <class Out>
void dispatch(Bf16Kernel kernel, ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N,
              int64_t K, float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
              int64_t ldb, float beta, Out* C, int64_t ldc) {
  TROUPE_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size");
  TROUPE_CHECK(lda >= std::max<int64_t>(1, ta ? M : K) && ldb >= std::max<int64_t>(1, tb ? K : N) &&
                   ldc >= std::max<int64_t>(1, N),
               "gemm_bf16: leading dimension below the matrix width");
  TROUPE_CHECK(bf16_kernel_supported(kernel), "gemm_bf16: kernel not supported on this CPU");
  if (M == 0 || N == 0) return;
  if (kernel == Bf16Kernel::avx512_bf16)
    gemm_avx512_bf16<Out>(pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    gemm_widen_sgemm(pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

bool bf16_kernel_supported(Bf16Kernel kernel) {
  if (kernel == Bf16Kernel::widen_sgemm) return true;
  static const bool avx512_bf16 = [] {
    __builtin_cpu_init();  // libgcc's checks include the OS's saving of the zmm and mask registers
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return avx512_bf16;
}

Bf16Kernel choose_bf16_kernel(const char* cpu_features) {
  if (cpu_features && std::strcmp(cpu_features, "generic") == 0) return Bf16Kernel::widen_sgemm;
  return bf16_kernel_supported(Bf16Kernel::avx512_bf16) ? Bf16Kernel::avx512_bf16
                                                        : Bf16Kernel::widen_sgemm;
}

Bf16Kernel bf16_gemm_kernel() {
  static const Bf16Kernel kernel = choose_bf16_kernel(std::getenv("TROUPE_CPU_FEATURES"));
  return kernel;
}

const char* bf16_kernel_name(Bf16Kernel kernel) {
  return kernel == Bf16Kernel::avx512_bf16 ? "avx512_bf16" : "widen_sgemm";
}

void gemm_bf16(Bf16Kernel kernel, ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N,
               int64_t K, float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
               int64_t ldb, float beta, float* C, int64_t ldc) {
  dispatch<float>(kernel, pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_out(Bf16Kernel kernel, ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N,
                   int64_t K, float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
                   int64_t ldb, float beta, uint16_t* C, int64_t ldc) {
  dispatch<uint16_t>(kernel, pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16(ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
               float* C, int64_t ldc) {
  gemm_bf16(bf16_gemm_kernel(), pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_out(ThreadPool& pool, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                   float beta, uint16_t* C, int64_t ldc) {
  gemm_bf16_out(bf16_gemm_kernel(), pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace troupe::cpu
