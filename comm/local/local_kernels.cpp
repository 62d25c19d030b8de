// Chunked reduce-to-many and copy-to-many (see comm/local/local_kernels.hpp for the contract).
#include "comm/local/local_kernels.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/half.hpp"
#include "troupe/status.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TROUPE_STREAMING_STORES 1
#endif

namespace troupe::comm::detail {

namespace {

// Bytes per chunk: the accumulator and a chunk of every source stay in L1/L2 while the chunk is
// written to every destination. On a Zen 4 (32 KiB L1, 1 MiB L2) 4-32 KiB measured alike for
// buffers in DRAM; 8 KiB was best for buffers that fit in L3 (up to 2x faster than 16 KiB).
constexpr size_t kChunkBytes = 8192;

// The length of the chunk that starts `base` units into a run of `count` units (of `unit` bytes)
// written to `anchor`. Chunks end where the anchor's address is a multiple of kChunkBytes, so in
// every destination aligned like the anchor (buffers from one allocator usually are) only the
// run's first and last 64-byte lines are partial. A partial line in mid-run is written with
// ordinary stores, which read the line from DRAM and stall the streaming stores behind them:
// 16-byte-misaligned buffers measured 1.6x slower before chunks were aligned.
size_t chunk_length(const void* anchor, size_t base, size_t count, size_t unit) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(anchor) + base * unit;
  size_t len = (kChunkBytes - at % kChunkBytes) / unit;
  if (len == 0) len = kChunkBytes / unit;  // an anchor not aligned to its unit
  return std::min(len, count - base);
}

// dst[0..bytes) = src[0..bytes) with non-temporal stores for the whole 64-byte lines of dst (the
// partial lines at either end are ordinary stores, so neighbours' bytes are never rewritten).
void stream_copy(void* dst, const void* src, size_t bytes) {
#ifdef TROUPE_STREAMING_STORES
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
#elif defined(__AVX__)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32)));
#else
    for (int q = 0; q < 64; q += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + q),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + q)));
    }
#endif
  }
  std::memcpy(d, s, bytes);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Non-temporal stores are weakly ordered: without this, a peer that sees our barrier arrival might
// still read stale destination bytes.
void store_fence() {
#ifdef TROUPE_STREAMING_STORES
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

void store(void* dst, const void* src, size_t bytes, bool streaming) {
  if (streaming) {
    stream_copy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

struct Sum {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {  // wraps instead of signed-overflow UB
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
struct Max {
  template <class T>
  T operator()(T a, T b) const {
    return b > a ? b : a;
  }
};

// acc[k] = f(...f(f(x[k], s[0][k]), s[1][k])..., s[m-1][k]) for k < len, where x is s[0] (and
// the sources start at s[1]) for the first pass, and acc itself afterwards. Fixed arity, up to 4
// streams per pass, so the loop vectorises and keeps partial results in registers: folding 8
// sources in one at a time would store and reload the accumulator 7 times. (Sources are only read,
// so they may alias one another; acc is the caller's local buffer.)
template <bool kFirst, class T, class F>
void fold(T* __restrict acc, const T* const* s, int m, size_t len, F f) {
  const T* __restrict x = kFirst ? *s++ : nullptr;
  if (kFirst) --m;
  auto in = [&](size_t k) {
    if constexpr (kFirst) {
      return x[k];
    } else {
      return acc[k];
    }
  };
  const T* __restrict a = m > 0 ? s[0] : nullptr;
  const T* __restrict b = m > 1 ? s[1] : nullptr;
  const T* __restrict c = m > 2 ? s[2] : nullptr;
  switch (m) {
    case 0:
      if constexpr (kFirst) std::memcpy(acc, x, len * sizeof(T));
      break;
    case 1:
      for (size_t k = 0; k < len; ++k) acc[k] = f(in(k), a[k]);
      break;
    case 2:
      for (size_t k = 0; k < len; ++k) acc[k] = f(f(in(k), a[k]), b[k]);
      break;
    default:
      for (size_t k = 0; k < len; ++k) acc[k] = f(f(f(in(k), a[k]), b[k]), c[k]);
      break;
  }
}

template <class T, class F>
void reduce_typed(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count, F f,
                  bool streaming) {
  constexpr size_t chunk = kChunkBytes / sizeof(T);
  alignas(64) T acc[chunk];
  const int n = static_cast<int>(srcs.size());
  std::vector<const T*> s(n);
  const void* anchor = dsts.empty() ? srcs[0] : dsts[0];
  for (size_t base = 0, len = 0; base < count; base += len) {
    len = chunk_length(anchor, base, count, sizeof(T));
    for (int j = 0; j < n; ++j) s[j] = static_cast<const T*>(srcs[j]) + base;
    const int first = std::min(n, 4);
    fold<true>(acc, s.data(), first, len, f);
    for (int j = first; j < n; j += 3) fold<false>(acc, s.data() + j, std::min(3, n - j), len, f);
    for (void* d : dsts) store(static_cast<T*>(d) + base, acc, len * sizeof(T), streaming);
  }
}

// The 16-bit float dtypes: every source's chunk is widened to fp32 and folded into an fp32
// accumulator in source order, and the result is rounded to the 16-bit type once (round to nearest
// even), then written to every destination. One source is a plain copy (no NaN quieting).
template <class F>
void reduce_half(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count,
                 DType dtype, F f, bool streaming) {
  // Sub-chunks of kChunkBytes / 4 elements keep the fp32 accumulator, one widened source and the
  // rounded result (20 KiB) in L1; the destination writes still follow the chunks' alignment.
  constexpr size_t sub = kChunkBytes / sizeof(float);
  alignas(64) float acc[sub];
  alignas(64) float in[sub];
  alignas(64) uint16_t out[sub];
  const size_t n = srcs.size();
  const void* anchor = dsts.empty() ? srcs[0] : dsts[0];
  for (size_t base = 0, len = 0; base < count; base += len) {
    len = chunk_length(anchor, base, count, sizeof(uint16_t));
    for (size_t at = base, m = 0; at < base + len; at += m) {
      m = std::min(sub, base + len - at);
      auto src = [&](size_t j) { return static_cast<const uint16_t*>(srcs[j]) + at; };
      if (n == 1) {
        std::memcpy(out, src(0), m * sizeof(uint16_t));
      } else {
        half::convert_array(DType::f32, acc, dtype, src(0), static_cast<int64_t>(m));
        for (size_t j = 1; j < n; ++j) {
          half::convert_array(DType::f32, in, dtype, src(j), static_cast<int64_t>(m));
          for (size_t k = 0; k < m; ++k) acc[k] = f(acc[k], in[k]);
        }
        half::convert_array(dtype, out, DType::f32, acc, static_cast<int64_t>(m));
      }
      for (void* d : dsts)
        store(static_cast<uint16_t*>(d) + at, out, m * sizeof(uint16_t), streaming);
    }
  }
}

template <class F>
void reduce_with(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count,
                 DType dtype, F f, bool streaming) {
  switch (dtype) {
    case DType::f32:
      return reduce_typed<float>(dsts, srcs, count, f, streaming);
    case DType::f64:
      return reduce_typed<double>(dsts, srcs, count, f, streaming);
    case DType::i32:
      return reduce_typed<int32_t>(dsts, srcs, count, f, streaming);
    case DType::i64:
      return reduce_typed<int64_t>(dsts, srcs, count, f, streaming);
    case DType::bf16:
    case DType::f16:
      return reduce_half(dsts, srcs, count, dtype, f, streaming);
    default:
      TROUPE_CHECK(false,
                   "reduce of a dtype the local backend does not reduce (checked at the call)");
  }
}

}  // namespace

void reduce_to(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count,
               DType dtype, ReduceOp op, bool streaming) {
  TROUPE_CHECK(!srcs.empty(), "reduce_to needs at least one source");
  if (op == ReduceOp::sum) {
    reduce_with(dsts, srcs, count, dtype, Sum{}, streaming);
  } else {
    reduce_with(dsts, srcs, count, dtype, Max{}, streaming);
  }
  store_fence();
}

void copy_to(std::span<void* const> dsts, const void* src, size_t bytes, bool streaming) {
  const char* s = static_cast<const char*>(src);
  const void* anchor = src;
  for (void* d : dsts) {
    if (d != src) {
      anchor = d;
      break;
    }
  }
  for (size_t base = 0, len = 0; base < bytes; base += len) {
    len = chunk_length(anchor, base, bytes, 1);
    for (void* d : dsts) {
      if (d != src) store(static_cast<char*>(d) + base, s + base, len, streaming);
    }
  }
  store_fence();
}

}  // namespace troupe::comm::detail
