// Bulk fp32 <-> bf16/f16 conversions (see comm/half_convert.hpp). The CPU is asked once, at run
// time, and the vector functions carry their own target attribute, so the build needs no -mavx512f
// or -mf16c: AVX-512F (bf16 and f16), else F16C (f16), else the scalar functions.
//
// MERGE: replace with kernels/half.hpp
#include "comm/half_convert.hpp"

#include "troupe/check.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TROUPE_HALF_X86 1
#endif

namespace troupe::comm::detail {

namespace {

void widen_bf16(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void narrow_bf16(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
void widen_f16_scalar(float* dst, const uint16_t* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
void narrow_f16_scalar(uint16_t* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

#ifdef TROUPE_HALF_X86
// VCVTPH2PS is exact and quiets NaNs; VCVTPS2PH with round-to-nearest-even matches f32_to_f16
// bit for bit (tests/comm/test_half_reduce.cpp compares every f16 value and a sweep of fp32 ones).
__attribute__((target("avx,f16c"))) void widen_f16_f16c(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  widen_f16_scalar(dst + i, src + i, n - i);
}
__attribute__((target("avx,f16c"))) void narrow_f16_f16c(uint16_t* dst, const float* src,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  narrow_f16_scalar(dst + i, src + i, n - i);
}

bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized takes
// for an uninitialised read once they are inlined into a target("avx512f") function.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// AVX-512F: 16 elements a step. bf16 with integer operations (the scalar functions' arithmetic,
// lane by lane; AVX512_BF16's VCVTNEPS2BF16 flushes subnormals, so it is not used); f16 with the
// 512-bit forms of the F16C conversions.
__attribute__((target("avx512f"))) void widen_bf16_avx512(float* dst, const uint16_t* src,
                                                          size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    u = _mm512_mask_or_epi32(u, nan, u, quiet);
    _mm512_storeu_si512(dst + i, u);
  }
  widen_bf16(dst + i, src + i, n - i);
}
__attribute__((target("avx512f"))) void narrow_bf16_avx512(uint16_t* dst, const float* src,
                                                           size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x0040);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(src + i);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  narrow_bf16(dst + i, src + i, n - i);
}
__attribute__((target("avx512f"))) void widen_f16_avx512(float* dst, const uint16_t* src,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  widen_f16_scalar(dst + i, src + i, n - i);
}
__attribute__((target("avx512f"))) void narrow_f16_avx512(uint16_t* dst, const float* src,
                                                          size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  narrow_f16_scalar(dst + i, src + i, n - i);
}

#pragma GCC diagnostic pop

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
#endif

}  // namespace

bool half_isa_available(HalfIsa isa) {
  switch (isa) {
    case HalfIsa::scalar:
      return true;
#ifdef TROUPE_HALF_X86
    case HalfIsa::f16c:
      return has_f16c();
    case HalfIsa::avx512:
      return has_avx512();
#endif
    default:
      return false;
  }
}

HalfIsa best_half_isa() {
  static const HalfIsa best = half_isa_available(HalfIsa::avx512) ? HalfIsa::avx512
                              : half_isa_available(HalfIsa::f16c) ? HalfIsa::f16c
                                                                  : HalfIsa::scalar;
  return best;
}

void widen_to_f32(float* dst, const uint16_t* src, size_t n, DType dtype, HalfIsa isa) {
  TROUPE_CHECK(is_half(dtype), "widen_to_f32 takes bf16 or f16");
  TROUPE_CHECK(half_isa_available(isa), "widen_to_f32: instruction set not available here");
  const bool bf16 = dtype == DType::bf16;
#ifdef TROUPE_HALF_X86
  if (isa == HalfIsa::avx512)
    return bf16 ? widen_bf16_avx512(dst, src, n) : widen_f16_avx512(dst, src, n);
  if (isa == HalfIsa::f16c && !bf16) return widen_f16_f16c(dst, src, n);
#endif
  bf16 ? widen_bf16(dst, src, n) : widen_f16_scalar(dst, src, n);
}

void narrow_from_f32(uint16_t* dst, const float* src, size_t n, DType dtype, HalfIsa isa) {
  TROUPE_CHECK(is_half(dtype), "narrow_from_f32 takes bf16 or f16");
  TROUPE_CHECK(half_isa_available(isa), "narrow_from_f32: instruction set not available here");
  const bool bf16 = dtype == DType::bf16;
#ifdef TROUPE_HALF_X86
  if (isa == HalfIsa::avx512)
    return bf16 ? narrow_bf16_avx512(dst, src, n) : narrow_f16_avx512(dst, src, n);
  if (isa == HalfIsa::f16c && !bf16) return narrow_f16_f16c(dst, src, n);
#endif
  bf16 ? narrow_bf16(dst, src, n) : narrow_f16_scalar(dst, src, n);
}

void widen_to_f32(float* dst, const uint16_t* src, size_t n, DType dtype) {
  widen_to_f32(dst, src, n, dtype, best_half_isa());
}

void narrow_from_f32(uint16_t* dst, const float* src, size_t n, DType dtype) {
  narrow_from_f32(dst, src, n, dtype, best_half_isa());
}

}  // namespace troupe::comm::detail
