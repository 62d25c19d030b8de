// Dropout masks from a counter-based generator: whether an element is kept is a pure function of
// where it sits in the model (seed, tensor stream, iteration, global sample, element index within
// the sample), never of which rank computes it or in which order. So every parallel layout, every
// schedule and every recompute draws the same masks, and a mask is regenerated instead of stored.
//
// Generator: Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as
// 1, 2, 3", SC'11): 10 rounds on a 128-bit counter with a 64-bit key, round multipliers 0xD2511F53,
// 0xCD9E8D57, key bumps 0x9E3779B9, 0xBB67AE85. One call gives four 32-bit words.
//
// The mask rule (DropoutMask::factor), for element e of sample s:
//   counter = (floor(e / 4), s, iteration, stream)   (four 32-bit words, word 0 first)
//   key     = (seed mod 2^32, floor(seed / 2^32))
//   bits    = word (e mod 4) of Philox-4x32-10(counter, key)
//   kept    = (bits >> 8) >= ceil(p * 2^24)          (a 24-bit uniform u = (bits >> 8) / 2^24, kept
//                                                     when u >= p: drop probability p, exactly
//                                                     ceil(p 2^24) / 2^24)
//   factor  = kept ? 1 / (1 - p) : 0                 (inverted dropout, as torch: kept values are
//                                                     scaled so the expectation is unchanged)
// The forward multiplies by the factor; the backward multiplies the gradient by the same factor.
// Limits (checked by the ops): e / 4, s and iteration below 2^32.
#pragma once
#include <cmath>
#include <cstdint>

namespace troupe {

// One Philox-4x32-10 block: ctr is replaced by the four output words.
inline void philox4x32_10(uint32_t ctr[4], uint32_t key0, uint32_t key1) {
  constexpr uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = kM0 * c0, p1 = kM1 * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ key0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ key1;
    c3 = lo0;
    key0 += kW0;
    key1 += kW1;
  }
  ctr[0] = c0;
  ctr[1] = c1;
  ctr[2] = c2;
  ctr[3] = c3;
}

// The masks of one tensor of one training micro-batch. p == 0 means no dropout: callers skip the
// ops entirely (the dropout-free path costs nothing).
struct DropoutMask {
  double p = 0;               // drop probability, 0 <= p < 1
  uint64_t seed = 0;          // the run's --seed: Philox's key
  uint32_t stream = 0;        // which tensor of which layer (model/dropout.hpp numbers them)
  uint32_t iteration = 0;     // the training iteration
  int64_t first_sample = 0;   // global sample index of the micro-batch's sample 0

  bool active() const { return p > 0; }
  // ceil(p * 2^24): exact, since p * 2^24 is p with its exponent moved.
  uint32_t threshold() const { return static_cast<uint32_t>(std::ceil(p * 16777216.0)); }
  // The four words of element group g = e / 4 of global sample s.
  void words(int64_t sample, int64_t group, uint32_t out[4]) const {
    out[0] = static_cast<uint32_t>(group);
    out[1] = static_cast<uint32_t>(sample);
    out[2] = iteration;
    out[3] = stream;
    philox4x32_10(out, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  }
  // Whether element e of global sample s is kept (the rule above); for tests and single elements.
  bool kept(int64_t sample, int64_t element) const {
    uint32_t w[4];
    words(sample, element / 4, w);
    return (w[element % 4] >> 8) >= threshold();
  }
  // factors[i] = the factor of element e0 + i of global sample s, i < n (0 or scale).
  template <class T>
  void factors(int64_t sample, int64_t e0, int64_t n, T scale, T* out) const {
    const uint32_t th = threshold();
    int64_t e = e0;
    const int64_t end = e0 + n;
    while (e < end) {
      uint32_t w[4];
      words(sample, e / 4, w);
      for (int64_t lane = e % 4; lane < 4 && e < end; ++lane, ++e) *out++ = (w[lane] >> 8) >= th ? scale : T(0);
    }
  }
};

}  // namespace troupe
