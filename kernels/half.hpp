// 16-bit floating storage: bf16 (1-8-7, f32's exponent range) and IEEE fp16 (1-5-10), each held as
// a uint16_t bit pattern. troupe computes in f32; these are the conversions between the storage types
// and f32 (and f64, for tests and checkpoints).
//
// Rules (docs/PRECISION.md):
// - Narrowing (f32 or f64 -> 16 bits) rounds to nearest, ties to even (RNE), in one rounding (an f64
//   source is not first rounded to f32). Inf stays Inf; a finite value at or past the midpoint between
//   the largest finite value and 2^(emax+1) rounds to Inf, as IEEE RNE does. fp16 subnormals are
//   produced exactly (values below half the smallest subnormal round to a signed zero). f32 subnormals
//   narrowed to bf16 round like any other value (bf16 has subnormals too; the hardware's flush to zero
//   is undone, see convert.cpp).
// - NaN narrows to a quiet NaN of the same sign, its payload truncated to the top bits, exactly as the
//   hardware instructions do: bf16 = (f32 bits >> 16) | 0x0040 (vcvtneps2bf16), fp16 = sign | 0x7e00 |
//   (f32 mantissa >> 13) (vcvtps2ph).
// - Widening (16 bits -> f32 or f64) is exact. bf16 -> f32 is the bit pattern shifted by 16 (a NaN keeps
//   its payload and its signalling bit); fp16 -> f32 quiets a signalling NaN, as vcvtph2ps does.
//
// The bulk conversions run on the fastest path this CPU has, chosen once at the first call:
//   avx512: AVX-512F/BW/VL + AVX512-BF16 (vcvtne2ps2bf16) and F16C's vcvtps2ph/vcvtph2ps on 512 bits;
//   avx2:   AVX2 + F16C (bf16 narrowing by integer RNE on 256 bits);
//   generic: the scalar functions below.
// The environment variable TROUPE_CPU_FEATURES=generic (read once, at the first call) forces the
// generic path. Every path gives the same bits for every input (tests/kernels/test_mixed_ops.cpp).
// Nothing requires the instructions: the fast paths are separate target-attributed functions.
//
// Thread safety: all functions may be called from any thread; the path is chosen under a static
// initialiser.
#pragma once
#include <cstdint>

#include "kernels/tensor.hpp"

namespace troupe::half {

uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);
uint16_t f64_to_bf16(double x);
uint16_t f64_to_f16(double x);

// Bulk conversions of n elements on the chosen path; dst and src do not overlap.
void bf16_from_f32(uint16_t* dst, const float* src, int64_t n);
void f32_from_bf16(float* dst, const uint16_t* src, int64_t n);
void f16_from_f32(uint16_t* dst, const float* src, int64_t n);
void f32_from_f16(float* dst, const uint16_t* src, int64_t n);
// f64 sources and destinations (tests, checkpoints): scalar, one rounding.
void bf16_from_f64(uint16_t* dst, const double* src, int64_t n);
void f64_from_bf16(double* dst, const uint16_t* src, int64_t n);
void f16_from_f64(uint16_t* dst, const double* src, int64_t n);
void f64_from_f16(double* dst, const uint16_t* src, int64_t n);

// n elements of any of f32, f64, bf16, f16 into any of them (one rounding; bf16 <-> f16 through the
// exact f32), on the calling thread. dst and src do not overlap.
void convert_array(DType dst_type, void* dst, DType src_type, const void* src, int64_t n);
// Whether t is one of the four floating types convert_array takes.
bool is_float_dtype(DType t);

// ---- the paths, for tests and for reporting which one runs ----------------------------------------
enum class CpuPath : uint8_t { generic, avx2, avx512 };
const char* cpu_path_name(CpuPath p);
// The path the bulk conversions use (TROUPE_CPU_FEATURES=generic, else the best supported).
CpuPath active_cpu_path();
// Whether this CPU can run path p (generic: always).
bool cpu_path_supported(CpuPath p);
// The four f32 <-> 16-bit bulk conversions of one path, so tests can run every supported path against
// the generic one in one process. Calling a path's functions on a CPU without it is undefined.
struct ConvertFns {
  void (*bf16_from_f32)(uint16_t*, const float*, int64_t);
  void (*f32_from_bf16)(float*, const uint16_t*, int64_t);
  void (*f16_from_f32)(uint16_t*, const float*, int64_t);
  void (*f32_from_f16)(float*, const uint16_t*, int64_t);
};
const ConvertFns& convert_fns(CpuPath p);

}  // namespace troupe::half
