// CRC-32 (storage/h5_file.hpp): zlib's, or on x86-64 CPUs with PCLMULQDQ and SSE4.1 the same CRC by
// carry-less multiplication (Gopal et al., Intel, "Fast CRC Computation for Generic Polynomials
// Using PCLMULQDQ Instruction", 2009): four 128-bit lanes folded over 64 bytes at a time, folded to
// one, reduced to 64 and 32 bits, and a Barrett reduction, with the bit-reflected constants of the
// IEEE polynomial (x^(4*128+32) mod P and so on, as the paper derives them). Which one runs is decided
// once per process from the CPU (TROUPE_CRC32=portable forces zlib's); both give the same value for
// every input (tests/storage/test_crc32.cpp checks them against each other and a table CRC).
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "storage/h5_file.hpp"

namespace troupe::h5 {

namespace {
bool use_pclmul();
}  // namespace

uint32_t crc32_update_zlib(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uLong c = crc;
  while (bytes > 0) {  // zlib takes 32-bit lengths
    const size_t n = std::min<size_t>(bytes, size_t{1} << 30);
    c = ::crc32(c, p, static_cast<uInt>(n));
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(c);
}

namespace {

#if defined(__x86_64__)
#define TROUPE_PCLMUL __attribute__((target("pclmul,sse4.1")))

TROUPE_PCLMUL inline __m128i load16(const unsigned char* q) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}

// x * (x^(n+32) mod P, x^(n-32) mod P) + data: the register folded over n bits onto the next data.
TROUPE_PCLMUL inline __m128i fold(__m128i x, __m128i k, __m128i data) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), data);
}

// The reflected CRC register over the first 16 * (bytes / 16) bytes (bytes >= 64), starting from
// `reg` (zlib's running CRC, inverted); returns the register after them.
TROUPE_PCLMUL uint32_t fold_pclmul(uint32_t reg, const unsigned char* p, size_t bytes) {
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);  // x^(4*128+32), x^(4*128-32) mod P, reflected
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);  // x^(128+32), x^(128-32)
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);              // x^64
  const __m128i poly_mu = _mm_set_epi64x(0x1f7011641, 0x1db710641);  // u' = x^64 / P, and P
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  __m128i x0 = _mm_xor_si128(load16(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
  __m128i x1 = load16(p + 16), x2 = load16(p + 32), x3 = load16(p + 48);
  p += 64;
  bytes -= 64;
  for (; bytes >= 64; p += 64, bytes -= 64) {
    x0 = fold(x0, k1k2, load16(p));
    x1 = fold(x1, k1k2, load16(p + 16));
    x2 = fold(x2, k1k2, load16(p + 32));
    x3 = fold(x3, k1k2, load16(p + 48));
  }
  x0 = fold(x0, k3k4, x1);
  x0 = fold(x0, k3k4, x2);
  x0 = fold(x0, k3k4, x3);
  for (; bytes >= 16; p += 16, bytes -= 16) x0 = fold(x0, k3k4, load16(p));
  // 128 -> 64 bits, 64 -> 32 bits, then Barrett's reduction to the 32-bit remainder.
  x0 = _mm_xor_si128(_mm_clmulepi64_si128(x0, k3k4, 0x10), _mm_srli_si128(x0, 8));
  x0 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k5, 0x00), _mm_srli_si128(x0, 4));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), poly_mu, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly_mu, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(x0, t), 1));
}

bool use_pclmul() {
  static const bool yes = [] {
    const char* forced = std::getenv("TROUPE_CRC32");
    if (forced != nullptr && std::strcmp(forced, "portable") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  }();
  return yes;
}
#else
bool use_pclmul() { return false; }
#endif

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (bytes >= 64 && use_pclmul()) {
    const size_t folded = bytes / 16 * 16;
    crc = ~fold_pclmul(~crc, p, folded);
    p += folded;
    bytes -= folded;
  }
#endif
  return crc32_update_zlib(crc, p, bytes);
}

uint32_t crc32(const void* data, size_t bytes) { return crc32_update(0, data, bytes); }

static_assert(sizeof(z_off_t) >= 8, "zlib's lengths must hold a shard's size");

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b) {
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(bytes_b)));
}

const char* crc32_implementation() { return use_pclmul() ? "pclmul" : "zlib"; }

}  // namespace troupe::h5
