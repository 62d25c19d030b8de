// f32/f64 <-> bf16/fp16 conversions (kernels/half.hpp): the scalar rules, and the AVX2+F16C and
// AVX-512 paths, each a target-attributed function so the binary runs on any x86-64 CPU.
#include <cpuid.h>
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics start some results from a self-initialised `__Y = __Y` (an undefined
// vector on purpose), which -Wmaybe-uninitialized reports once inlined here: a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/half.hpp"

namespace troupe::half {

namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// x rounded to f32 by truncation, with the last bit set when inexact ("round to odd"). f32 has at
// least 2 more significant bits than bf16 or fp16 at every magnitude either can hold (f32's subnormal
// step 2^-149 is far below bf16's 2^-133), so RNE of this to 16 bits equals RNE of x: one rounding.
float f64_to_f32_odd(double x) {
  float f = static_cast<float>(x);
  if (std::isnan(x) || static_cast<double>(f) == x) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);  // Inf -> FLT_MAX
  return float_of(bits_of(f) | 1u);
}

// ---- generic path ----------------------------------------------------------------------------------
void generic_bf16_from_f32(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
void generic_f32_from_bf16(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void generic_f16_from_f32(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}
void generic_f32_from_f16(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

// ---- AVX2 + F16C -------------------------------------------------------------------------------------
#define TROUPE_AVX2 __attribute__((target("avx2,f16c")))

// Eight f32 bit patterns -> bf16 in the low 16 bits of each lane, by the scalar rule.
TROUPE_AVX2 __m256i avx2_bf16_rne(__m256i u) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

TROUPE_AVX2 void avx2_bf16_from_f32(uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = avx2_bf16_rne(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i b = avx2_bf16_rne(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus works within 128-bit lanes: [a0 b0 a1 b1] -> reorder the 64-bit quarters to [a0 a1 b0 b1].
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

TROUPE_AVX2 void avx2_f32_from_bf16(float* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(w, 16));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

TROUPE_AVX2 void avx2_f16_from_f32(uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

TROUPE_AVX2 void avx2_f32_from_f16(float* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

// ---- AVX-512 (F, BW, VL, BF16) + F16C -----------------------------------------------------------------
#define TROUPE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")))

// vcvtne2ps2bf16 treats f32 subnormal inputs as zero (measured here, and so documented by Intel);
// those lanes take the integer rule instead: the same bits as the scalar path.
TROUPE_AVX512 __m256i avx512_bf16_rne_int(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_cvtepi32_epi16(
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16));
}
TROUPE_AVX512 __mmask16 avx512_subnormal(__m512i u) {
  return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
         _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
}

TROUPE_AVX512 void avx512_bf16_from_f32(uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(src + i), b = _mm512_loadu_ps(src + i + 16);
    // _mm512_cvtne2ps_pbh(hi, lo): elements 0..15 of the result come from the second operand.
    __m512i r = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
    const __m512i ua = _mm512_castps_si512(a), ub = _mm512_castps_si512(b);
    const __mmask32 sub = static_cast<__mmask32>(avx512_subnormal(ua)) |
                          (static_cast<__mmask32>(avx512_subnormal(ub)) << 16);
    if (sub) {
      const __m512i exact =
          _mm512_inserti64x4(_mm512_castsi256_si512(avx512_bf16_rne_int(ua)), avx512_bf16_rne_int(ub), 1);
      r = _mm512_mask_blend_epi16(sub, r, exact);
    }
    _mm512_storeu_si512(dst + i, r);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

TROUPE_AVX512 void avx512_f32_from_bf16(float* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(w, 16));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

TROUPE_AVX512 void avx512_f16_from_f32(uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

TROUPE_AVX512 void avx512_f32_from_f16(float* dst, const uint16_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

const ConvertFns kGeneric{generic_bf16_from_f32, generic_f32_from_bf16, generic_f16_from_f32, generic_f32_from_f16};
const ConvertFns kAvx2{avx2_bf16_from_f32, avx2_f32_from_bf16, avx2_f16_from_f32, avx2_f32_from_f16};
const ConvertFns kAvx512{avx512_bf16_from_f32, avx512_f32_from_bf16, avx512_f16_from_f32, avx512_f32_from_f16};

CpuPath choose_path() {
  const char* forced = std::getenv("TROUPE_CPU_FEATURES");
  if (forced != nullptr && std::strcmp(forced, "generic") == 0) return CpuPath::generic;
  if (cpu_path_supported(CpuPath::avx512)) return CpuPath::avx512;
  if (cpu_path_supported(CpuPath::avx2)) return CpuPath::avx2;
  return CpuPath::generic;
}

const ConvertFns& active() {
  static const ConvertFns& fns = convert_fns(active_cpu_path());
  return fns;
}

}  // namespace

// ---- scalar rules -------------------------------------------------------------------------------------
uint16_t f32_to_bf16(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the kept part's last bit rounds the dropped 16 bits to nearest, ties to even;
  // a carry moves into the exponent (and past the largest finite value to Inf), as RNE does.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_f16(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: Inf (tie goes to even)
  if (a >= 0x38800000u) {                                              // >= 2^-14: normal
    const uint32_t r = a - (112u << 23);                               // rebias 127 -> 15
    return static_cast<uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 (the tie goes to 0)
  // Subnormal: a = m 2^(e-150) in units of 2^-24 is m >> (126 - e), rounded to nearest even.
  const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;  // shift in [14, 24]
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // may carry into the smallest normal
  return static_cast<uint16_t>(sign | q);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 31) return float_of(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u));  // Inf, quiet NaN
  if (e == 0) return float_of(sign | bits_of(static_cast<float>(m) * 0x1p-24f));      // 0, subnormal: exact
  return float_of(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t f64_to_bf16(double x) { return f32_to_bf16(f64_to_f32_odd(x)); }
uint16_t f64_to_f16(double x) { return f32_to_f16(f64_to_f32_odd(x)); }

// ---- bulk ----------------------------------------------------------------------------------------------
void bf16_from_f32(uint16_t* dst, const float* src, int64_t n) { active().bf16_from_f32(dst, src, n); }
void f32_from_bf16(float* dst, const uint16_t* src, int64_t n) { active().f32_from_bf16(dst, src, n); }
void f16_from_f32(uint16_t* dst, const float* src, int64_t n) { active().f16_from_f32(dst, src, n); }
void f32_from_f16(float* dst, const uint16_t* src, int64_t n) { active().f32_from_f16(dst, src, n); }

void bf16_from_f64(uint16_t* dst, const double* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f64_to_bf16(src[i]);
}
void f64_from_bf16(double* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void f16_from_f64(uint16_t* dst, const double* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f64_to_f16(src[i]);
}
void f64_from_f16(double* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

namespace {
// One f32 <-> storage step for convert_array: widen `src` of type t into f32, or narrow f32 into t.
void widen_to_f32(float* dst, DType t, const void* src, int64_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(static_cast<const double*>(src)[i]);
      return;
    case DType::bf16: f32_from_bf16(dst, static_cast<const uint16_t*>(src), n); return;
    case DType::f16: f32_from_f16(dst, static_cast<const uint16_t*>(src), n); return;
    default: TROUPE_CHECK(false, "convert: floating dtypes only (f32, f64, bf16, f16)");
  }
}
void narrow_from_f32(DType t, void* dst, const float* src, int64_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i) static_cast<double*>(dst)[i] = src[i];
      return;
    case DType::bf16: bf16_from_f32(static_cast<uint16_t*>(dst), src, n); return;
    case DType::f16: f16_from_f32(static_cast<uint16_t*>(dst), src, n); return;
    default: TROUPE_CHECK(false, "convert: floating dtypes only (f32, f64, bf16, f16)");
  }
}
}  // namespace

bool is_float_dtype(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

void convert_array(DType dst_type, void* dst, DType src_type, const void* src, int64_t n) {
  TROUPE_CHECK(is_float_dtype(dst_type) && is_float_dtype(src_type),
               "convert: floating dtypes only (f32, f64, bf16, f16)");
  if (n <= 0) return;
  if (dst_type == src_type) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dst_type));
  } else if (src_type == DType::f32) {
    narrow_from_f32(dst_type, dst, static_cast<const float*>(src), n);
  } else if (dst_type == DType::f32) {
    widen_to_f32(static_cast<float*>(dst), src_type, src, n);
  } else if (src_type == DType::f64) {  // f64 -> 16 bits: one rounding, not through a rounded f32
    auto* d = static_cast<uint16_t*>(dst);
    (dst_type == DType::bf16 ? bf16_from_f64 : f16_from_f64)(d, static_cast<const double*>(src), n);
  } else if (dst_type == DType::f64) {  // 16 bits -> f64: exact
    auto* s = static_cast<const uint16_t*>(src);
    (src_type == DType::bf16 ? f64_from_bf16 : f64_from_f16)(static_cast<double*>(dst), s, n);
  } else {  // bf16 <-> f16 through f32, which holds either exactly
    float buffer[1024];
    const size_t in = dtype_size(src_type), out = dtype_size(dst_type);
    for (int64_t i = 0; i < n; i += 1024) {
      const int64_t m = n - i < 1024 ? n - i : 1024;
      widen_to_f32(buffer, src_type, static_cast<const char*>(src) + i * in, m);
      narrow_from_f32(dst_type, static_cast<char*>(dst) + i * out, buffer, m);
    }
  }
}

// ---- paths ---------------------------------------------------------------------------------------------
const char* cpu_path_name(CpuPath p) {
  switch (p) {
    case CpuPath::generic: return "generic";
    case CpuPath::avx2: return "avx2+f16c";
    case CpuPath::avx512: return "avx512+bf16";
  }
  return "?";
}

namespace {
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
}
}  // namespace

bool cpu_path_supported(CpuPath p) {
  switch (p) {
    case CpuPath::generic: return true;
    case CpuPath::avx2: return __builtin_cpu_supports("avx2") && cpu_has_f16c();
    case CpuPath::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") && cpu_has_f16c();
  }
  return false;
}

CpuPath active_cpu_path() {
  static const CpuPath path = choose_path();
  return path;
}

const ConvertFns& convert_fns(CpuPath p) {
  switch (p) {
    case CpuPath::avx2: return kAvx2;
    case CpuPath::avx512: return kAvx512;
    case CpuPath::generic: break;
  }
  return kGeneric;
}

}  // namespace troupe::half
