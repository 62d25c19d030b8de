// CRC-32 (storage/crc32.cpp): the carry-less-multiplication path and zlib's give a bit-by-bit table
// CRC's value for every length (the folding's 64- and 16-byte steps and the tail), alignment and
// split into crc32_update pieces; and the check value of "123456789" (0xCBF43926).
#include <catch2/catch.hpp>

#include <array>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "storage/h5_file.hpp"

namespace troupe::h5 {

namespace {
uint32_t table_crc(const unsigned char* p, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}
}  // namespace

TEST_CASE("crc32: every length, alignment and split gives the table CRC", "[crc32]") {
  INFO("implementation: " << crc32_implementation());
#if defined(__x86_64__)
  if (std::getenv("TROUPE_CRC32") == nullptr && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1"))
    CHECK(std::string(crc32_implementation()) == "pclmul");  // the fast path is the one under test here
#endif
  const std::string check = "123456789";
  CHECK(crc32(check.data(), check.size()) == 0xCBF43926u);
  std::mt19937_64 rng(20261206);
  std::vector<unsigned char> buf(5000 + 64);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t n = 0; n <= 700; ++n)
    for (size_t offset : {size_t{0}, size_t{3}}) {
      const unsigned char* p = buf.data() + offset;
      INFO("length " << n << ", offset " << offset);
      REQUIRE(crc32(p, n) == table_crc(p, n));
      REQUIRE(crc32_update_zlib(0, p, n) == table_crc(p, n));
    }
  for (int trial = 0; trial < 200; ++trial) {  // long buffers cut into pieces at random points
    const size_t n = 64 + rng() % 5000, offset = rng() % 64;
    const unsigned char* p = buf.data() + offset;
    const size_t cut = rng() % (n + 1);
    INFO("length " << n << ", cut " << cut);
    REQUIRE(crc32_update(crc32(p, cut), p + cut, n - cut) == table_crc(p, n));
  }
  // All ones and all zeros (carry-less products of extreme registers).
  for (unsigned char fill : {0x00, 0xFF}) {
    std::vector<unsigned char> same(4096 + 48, fill);
    CHECK(crc32(same.data(), same.size()) == table_crc(same.data(), same.size()));
  }
}

}  // namespace troupe::h5
