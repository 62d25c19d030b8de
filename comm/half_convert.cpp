// Bulk fp32 <-> bf16/f16 conversions (see comm/half_convert.hpp). f16 uses F16C when the CPU has
// it (checked once, at run time; the functions carry their own target attribute, so the build
// needs no -mf16c); bf16 and the fallback are the scalar functions, in loops simple enough for the
// compiler to vectorise with the baseline instruction set.
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
__attribute__((target("avx,f16c"))) void widen_f16_f16c(float* dst, const uint16_t* src,
                                                         size_t n) {
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
#endif

}  // namespace

void widen_to_f32(float* dst, const uint16_t* src, size_t n, DType dtype) {
  if (dtype == DType::bf16) return widen_bf16(dst, src, n);
  TROUPE_CHECK(dtype == DType::f16, "widen_to_f32 takes bf16 or f16");
#ifdef TROUPE_HALF_X86
  if (has_f16c()) return widen_f16_f16c(dst, src, n);
#endif
  widen_f16_scalar(dst, src, n);
}

void narrow_from_f32(uint16_t* dst, const float* src, size_t n, DType dtype) {
  if (dtype == DType::bf16) return narrow_bf16(dst, src, n);
  TROUPE_CHECK(dtype == DType::f16, "narrow_from_f32 takes bf16 or f16");
#ifdef TROUPE_HALF_X86
  if (has_f16c()) return narrow_f16_f16c(dst, src, n);
#endif
  narrow_f16_scalar(dst, src, n);
}

}  // namespace troupe::comm::detail
