// Test-side reference for all_to_all_v (tests/comm/test_all_to_all.cpp, the ucx worker, the nccl
// test): a counts matrix, every rank's send buffer, and the serial exchange that gives every rank's
// expected recv from all ranks' send buffers. Everything is a function of a seed, so each process
// of a multi-process job builds the same matrix and buffers without talking to the others.
//
// all_to_all only copies, so element values are raw bits: random bytes, whatever the dtype (f32 and
// bf16 patterns include NaNs and Infs; results are compared bytewise). The dtype matters through
// its size, which sets every offset.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace troupe::test::a2a {

// counts[i][j]: elements rank i sends to rank j (so rank j's recv_counts[i]).
using Matrix = std::vector<std::vector<size_t>>;
using Bytes = std::vector<unsigned char>;

inline uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// n x n counts in [0, max]: about a quarter of the pairs (the diagonal too) get 0, the rest any
// size, odd ones included.
inline Matrix random_counts(int n, uint64_t seed, size_t max) {
  Matrix m(static_cast<size_t>(n), std::vector<size_t>(static_cast<size_t>(n)));
  uint64_t z = mix(seed ^ 0xa2a);
  for (auto& row : m) {
    for (size_t& c : row) {
      z = mix(z);
      c = (z & 3) == 0 ? 0 : static_cast<size_t>((z >> 8) % (max + 1));
    }
  }
  return m;
}

inline Matrix equal_counts(int n, size_t count) {
  return Matrix(static_cast<size_t>(n), std::vector<size_t>(static_cast<size_t>(n), count));
}

// Rank r's send_counts (row r) and recv_counts (column r).
inline std::vector<size_t> send_counts(const Matrix& m, int r) {
  return m[static_cast<size_t>(r)];
}
inline std::vector<size_t> recv_counts(const Matrix& m, int r) {
  std::vector<size_t> c;
  for (const auto& row : m) c.push_back(row[static_cast<size_t>(r)]);
  return c;
}

inline size_t total(const std::vector<size_t>& counts) {
  size_t t = 0;
  for (size_t c : counts) t += c;
  return t;
}

// Rank r's send buffer: sum(row r) elements of esz bytes, random bytes from (seed, r).
inline Bytes send_buffer(const Matrix& m, int r, size_t esz, uint64_t seed) {
  Bytes b(total(send_counts(m, r)) * esz);
  uint64_t z = mix(seed * 1000003 + static_cast<uint64_t>(r));
  for (size_t i = 0; i < b.size(); i += 8) {
    z = mix(z);
    std::memcpy(b.data() + i, &z, std::min<size_t>(8, b.size() - i));
  }
  return b;
}

// The exchange done serially: rank j's recv is, for i = 0..n-1 in order, the block of sends[i]
// that starts at sum(counts[i][:j]) elements and has counts[i][j] of them.
inline std::vector<Bytes> serial_all_to_all(const std::vector<Bytes>& sends, const Matrix& m,
                                            size_t esz) {
  const size_t n = m.size();
  std::vector<Bytes> recvs(n);
  for (size_t j = 0; j < n; ++j) {
    for (size_t i = 0; i < n; ++i) {
      size_t offset = 0;
      for (size_t k = 0; k < j; ++k) offset += m[i][k];
      const unsigned char* block = sends[i].data() + offset * esz;
      recvs[j].insert(recvs[j].end(), block, block + m[i][j] * esz);
    }
  }
  return recvs;
}

// Every rank's send buffer and expected recv for one case.
struct Case {
  Matrix counts;
  std::vector<Bytes> sends, expected;
};
inline Case make_case(Matrix counts, size_t esz, uint64_t seed) {
  Case c;
  c.counts = std::move(counts);
  for (int r = 0; r < static_cast<int>(c.counts.size()); ++r)
    c.sends.push_back(send_buffer(c.counts, r, esz, seed));
  c.expected = serial_all_to_all(c.sends, c.counts, esz);
  return c;
}

// "" when got equals want, else where they first differ (as element and byte).
inline std::string first_difference(const Bytes& got, const Bytes& want, size_t esz) {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " bytes, want " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return "element " + std::to_string(i / esz) + " (byte " + std::to_string(i) + ") is " +
             std::to_string(got[i]) + ", want " + std::to_string(want[i]);
    }
  }
  return "";
}

}  // namespace troupe::test::a2a
