#include "comm/ucx/ucx_reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/half.hpp"
#include "troupe/check.hpp"

namespace troupe::comm::ucx {

namespace {

// Integer sums go through the unsigned type so overflow wraps instead of being undefined.
template <class T, class Acc>
void sum_loop(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<T>(static_cast<Acc>(a[i]) + static_cast<Acc>(b[i]));
}

template <class T>
void max_loop(T* out, const T* a, const T* b, size_t n) {
  // `a > b ? a : b` is exactly x86's max instruction (b when unordered), so it vectorises.
  for (size_t i = 0; i < n; ++i) out[i] = a[i] > b[i] ? a[i] : b[i];
}

template <class T, class Acc>
void apply(void* out, const void* a, const void* b, size_t n, ReduceOp op) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  if (op == ReduceOp::sum) {
    sum_loop<T, Acc>(o, x, y, n);
  } else {
    max_loop<T>(o, x, y, n);
  }
}

constexpr size_t kTileBytes = 8 << 10;  // stays in L1 while every input is folded into it

// The 16-bit floats in tiles of fp32: both operands widened, the op applied as for f32 (the same
// loops), the result rounded once. Each tile is read whole before its output is written, so out
// may alias a or b exactly.
void apply_half(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  constexpr size_t per_tile = kTileBytes / sizeof(float);
  alignas(64) float x[per_tile];
  alignas(64) float y[per_tile];
  for (size_t i = 0; i < n; i += per_tile) {
    const size_t m = std::min(per_tile, n - i);
    half::convert_array(DType::f32, x, dtype, static_cast<const uint16_t*>(a) + i, static_cast<int64_t>(m));
    half::convert_array(DType::f32, y, dtype, static_cast<const uint16_t*>(b) + i, static_cast<int64_t>(m));
    apply<float, float>(x, x, y, m, op);
    half::convert_array(dtype, static_cast<uint16_t*>(out) + i, DType::f32, x, static_cast<int64_t>(m));
  }
}

// reduce_many for the 16-bit floats: all k inputs folded in fp32, rounded once.
void reduce_many_half(void* out, const void* const* in, int k, size_t n, DType dtype, ReduceOp op,
                      bool nontemporal) {
  constexpr size_t per_tile = kTileBytes / sizeof(float);
  alignas(64) float acc[per_tile];
  alignas(64) float x[per_tile];
  alignas(64) uint16_t result[per_tile];
  for (size_t i = 0; i < n; i += per_tile) {
    const size_t m = std::min(per_tile, n - i);
    half::convert_array(DType::f32, acc, dtype, static_cast<const uint16_t*>(in[0]) + i, static_cast<int64_t>(m));
    for (int j = 1; j < k; ++j) {
      half::convert_array(DType::f32, x, dtype, static_cast<const uint16_t*>(in[j]) + i, static_cast<int64_t>(m));
      apply<float, float>(acc, acc, x, m, op);
    }
    half::convert_array(dtype, result, DType::f32, acc, static_cast<int64_t>(m));
    copy_bytes(static_cast<uint16_t*>(out) + i, result, m * sizeof(uint16_t), nontemporal);
  }
}

}  // namespace

bool reducible(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::i32 || dtype == DType::i64 ||
         is_16bit(dtype);
}

void reduce(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  if (n == 0) return;
  switch (dtype) {
    case DType::f32:
      return apply<float, float>(out, a, b, n, op);
    case DType::f64:
      return apply<double, double>(out, a, b, n, op);
    case DType::i32:
      return apply<int32_t, uint32_t>(out, a, b, n, op);
    case DType::i64:
      return apply<int64_t, uint64_t>(out, a, b, n, op);
    case DType::bf16:
    case DType::f16:
      return apply_half(out, a, b, n, dtype, op);
    default:
      break;
  }
  TROUPE_CHECK(false,
               "ucx reduce called with a dtype that cannot be reduced; callers check reducible()");
}

void reduce_many(void* out, const void* const* in, int k, size_t n, DType dtype, ReduceOp op,
                 bool nontemporal) {
  TROUPE_CHECK(k >= 1, "reduce_many needs at least one input");
  const size_t esz = dtype_size(dtype);
  if (n == 0) return;
  if (k == 1) {
    if (out != in[0]) std::memmove(out, in[0], n * esz);
    return;
  }
  if (is_16bit(dtype)) return reduce_many_half(out, in, k, n, dtype, op, nontemporal);
  alignas(64) char tile[kTileBytes];
  const size_t per_tile = kTileBytes / esz;
  for (size_t i = 0; i < n; i += per_tile) {
    const size_t m = std::min(per_tile, n - i);
    const size_t off = i * esz;
    reduce(tile, static_cast<const char*>(in[0]) + off, static_cast<const char*>(in[1]) + off, m,
           dtype, op);
    for (int j = 2; j < k; ++j)
      reduce(tile, tile, static_cast<const char*>(in[j]) + off, m, dtype, op);
    copy_bytes(static_cast<char*>(out) + off, tile, m * esz, nontemporal);
  }
}

void copy_bytes(void* dst, const void* src, size_t bytes, bool nontemporal) {
#if defined(__x86_64__)
  if (nontemporal && bytes >= 256) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    // Head up to a 64-byte boundary of the destination with plain stores.
    const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    const size_t body = bytes / 64 * 64;
    for (size_t i = 0; i < body; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    _mm_sfence();
    std::memcpy(d + body, s + body, bytes - body);
    return;
  }
#endif
  (void)nontemporal;
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

}  // namespace troupe::comm::ucx
