// Conversions between fp32 and the 16-bit float formats the host backends reduce (bf16, f16);
// private to comm/. The reductions widen every 16-bit input to fp32, accumulate there, and narrow
// the result once with these (comm/local/local_kernels.cpp, comm/ucx/ucx_reduce.cpp).
//
// Semantics (both formats):
//   widening   exact (every bf16 and f16 value, subnormals included, is an fp32 value); a NaN stays
//              a NaN with its sign and payload, made quiet.
//   narrowing  round to nearest, ties to even; a finite value past the format's largest (bf16
//              3.39e38, f16 65504) rounds to Inf when it is at least halfway to the next power of
//              two (f16: |x| >= 65520), as IEEE 754 says; Inf stays Inf; NaN stays a quiet NaN
//              (sign and the top payload bits kept); f16 subnormals are produced exactly rounded.
// Independent of the floating-point environment (integer arithmetic on the bits), so the bulk
// forms' vectorised paths (AVX-512F, F16C; chosen at run time, never required at compile time)
// give bitwise the scalar results.
//
// MERGE: replace with kernels/half.hpp
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>

#include "kernels/tensor.hpp"

namespace troupe::comm::detail {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;  // NaN: quiet
  return std::bit_cast<float>(u);
}

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the kept lsb rounds to nearest even; a carry into the exponent is the
  // correct result (up to Inf).
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) {  // Inf, or NaN (made quiet)
    return std::bit_cast<float>(sign | 0x7f800000u | (man << 13) | (man != 0 ? 0x00400000u : 0u));
  }
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return std::bit_cast<float>(sign);
  // Subnormal: man * 2^-24. Normalise: shift the leading 1 up to bit 10.
  int e = 113;  // the exponent (biased for fp32) of 2^-14, the subnormals' scale
  uint32_t m = man;
  while ((m & 0x400u) == 0) {
    m <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(e) << 23) | ((m & 0x3ffu) << 13));
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (or Inf): Inf
  if (a >= 0x38800000u) {  // normal in f16 (>= 2^-14): rebias the exponent, round 13 bits off
    const uint32_t r = a - (112u << 23);
    return static_cast<uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25, half the smallest subnormal: ties to even 0
  // Subnormal in f16: the value in units of 2^-24 is m * 2^(e - 126), e in [102, 112].
  const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14 .. 24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 1024 is the smallest normal: right
  return static_cast<uint16_t>(sign | q);
}

// True for the 16-bit float dtypes (bf16, f16).
inline bool is_half(DType dtype) {
  return dtype == DType::bf16 || dtype == DType::f16;
}

// The bulk forms' implementations: the scalar functions, F16C (256-bit; f16 only, bf16 falls back
// to scalar), AVX-512F (both). All give the scalar functions' bits.
enum class HalfIsa : uint8_t { scalar, f16c, avx512 };
bool half_isa_available(HalfIsa isa);  // whether this CPU (and build) has it
HalfIsa best_half_isa();               // the one the plain forms use

// dst[i] = widened src[i] for i < n; dtype bf16 or f16 (a broken invariant otherwise). Thread-safe.
void widen_to_f32(float* dst, const uint16_t* src, size_t n, DType dtype);
// dst[i] = narrowed src[i] for i < n (round to nearest even); dtype bf16 or f16. Thread-safe.
void narrow_from_f32(uint16_t* dst, const float* src, size_t n, DType dtype);
// The same with a given implementation (tests run every one available; unavailable: a bug).
void widen_to_f32(float* dst, const uint16_t* src, size_t n, DType dtype, HalfIsa isa);
void narrow_from_f32(uint16_t* dst, const float* src, size_t n, DType dtype, HalfIsa isa);

}  // namespace troupe::comm::detail
