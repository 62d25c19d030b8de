// Test-side reference for the 16-bit float reductions (tests/comm/test_half_reduce.cpp and the ucx
// worker): the bf16/f16 formats decoded and encoded from their definition in double arithmetic
// (ldexp, frexp, nearbyint under the default round-to-nearest-even mode), independent of the bit
// tricks in kernels/half.hpp, and the reductions the communicator contract states:
//   once    fp32 accumulation over the ranks in the given order, one rounding at the end;
//   ring    the ucx ring: block b is op(...op(op(x[b+1], x[b+2]), x[b+3])..., x[b]), rounded
//           after every op (each hop sends its partial sum in 16 bits);
//   tree    the ucx recursive doubling (small all_reduce): pairs fold, rounded after every op.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"

namespace troupe::test::half_ref {

struct Format {
  int exp_bits, man_bits;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  uint16_t exp_mask() const { return static_cast<uint16_t>(((1 << exp_bits) - 1) << man_bits); }
};
inline Format format_of(DType t) {
  return t == DType::bf16 ? Format{8, 7} : Format{5, 10};
}

inline bool is_nan(uint16_t bits, DType t) {
  const Format f = format_of(t);
  return (bits & f.exp_mask()) == f.exp_mask() && (bits & ((1u << f.man_bits) - 1)) != 0;
}
// A NaN whose quiet bit (the mantissa's top bit) is set.
inline bool is_quiet_nan(uint16_t bits, DType t) {
  return is_nan(bits, t) && (bits & (1u << (format_of(t).man_bits - 1))) != 0;
}

// The value of a 16-bit pattern (NaN: a NaN).
inline double decode(uint16_t bits, DType t) {
  const Format f = format_of(t);
  const int e = (bits >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int m = bits & ((1 << f.man_bits) - 1);
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  if (e == (1 << f.exp_bits) - 1) return m == 0 ? sign * INFINITY : NAN;
  if (e == 0) return sign * std::ldexp(m, 1 - f.bias() - f.man_bits);
  return sign * std::ldexp(m + (1 << f.man_bits), e - f.bias() - f.man_bits);
}

// x rounded to the format, to nearest with ties to even, as a bit pattern (NaN: the canonical
// quiet NaN; compare NaNs with is_nan).
inline uint16_t encode(double x, DType t) {
  const Format f = format_of(t);
  const uint16_t inf = f.exp_mask();
  if (std::isnan(x)) return static_cast<uint16_t>(inf | (1u << (f.man_bits - 1)));
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | inf;
  const int min_exp = 1 - f.bias();  // of the smallest normal
  int k = 0;
  std::frexp(a, &k);  // a = frac * 2^k, frac in [0.5, 1)
  const int quantum = (a < std::ldexp(1.0, min_exp) ? min_exp : k - 1) - f.man_bits;
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, -quantum)), quantum);
  const int max_exp = (1 << f.exp_bits) - 2 - f.bias();
  if (r >= std::ldexp(1.0, max_exp + 1)) return sign | inf;
  if (r < std::ldexp(1.0, min_exp))  // subnormal (or zero)
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(r, f.man_bits - min_exp)));
  std::frexp(r, &k);
  const int e = k - 1 + f.bias();
  const int m = static_cast<int>(std::ldexp(r, f.man_bits - (k - 1))) - (1 << f.man_bits);
  return static_cast<uint16_t>(sign | (e << f.man_bits) | m);
}

inline float widen(uint16_t bits, DType t) {
  return static_cast<float>(decode(bits, t));
}

// The op on fp32 values, with the left operand first (max: a when unordered, as the backends').
inline float apply(float a, float b, comm::ReduceOp op) {
  return op == comm::ReduceOp::sum ? a + b : (b > a ? b : a);
}

// once: in[order[0]] op in[order[1]] op ... in fp32, rounded once.
inline uint16_t reduce_once(const std::vector<uint16_t>& xs, DType t, comm::ReduceOp op) {
  float acc = widen(xs[0], t);
  for (size_t j = 1; j < xs.size(); ++j) acc = apply(acc, widen(xs[j], t), op);
  return encode(acc, t);
}

// Left fold rounding after every op: ((x0 op x1) op x2) ..., each step rounded.
inline uint16_t reduce_each(const std::vector<uint16_t>& xs, DType t, comm::ReduceOp op) {
  uint16_t acc = xs[0];
  for (size_t j = 1; j < xs.size(); ++j) acc = encode(apply(widen(acc, t), widen(xs[j], t), op), t);
  return acc;
}

// The ucx ring's result for an element of block b over p ranks: x[b+1], x[b+2], ..., x[b] folded
// with a rounding after each op. x[r]: rank r's input.
inline uint16_t reduce_ring(const std::vector<uint16_t>& x, int b, DType t, comm::ReduceOp op) {
  const int p = static_cast<int>(x.size());
  std::vector<uint16_t> order;
  for (int i = 1; i <= p; ++i) order.push_back(x[static_cast<size_t>((b + i) % p)]);
  return reduce_each(order, t, op);
}

// The ucx recursive doubling's result: with p = 2^k + rem, ranks 2i, 2i+1 (i < rem) fold first
// (op(x[2i], x[2i+1]), rounded), then 2^k values combine pairwise over k rounds as op(lower,
// higher), rounded each time.
inline uint16_t reduce_tree(const std::vector<uint16_t>& x, DType t, comm::ReduceOp op) {
  const int p = static_cast<int>(x.size());
  int p2 = 1;
  while (p2 * 2 <= p) p2 *= 2;
  const int rem = p - p2;
  std::vector<uint16_t> w(static_cast<size_t>(p2));
  auto combine = [&](uint16_t a, uint16_t b) {
    return encode(apply(widen(a, t), widen(b, t), op), t);
  };
  for (int n = 0; n < p2; ++n) {
    w[static_cast<size_t>(n)] =
        n < rem ? combine(x[static_cast<size_t>(2 * n)], x[static_cast<size_t>(2 * n + 1)])
                : x[static_cast<size_t>(n + rem)];
  }
  for (int bit = 1; bit < p2; bit *= 2) {
    for (int n = 0; n < p2; ++n) {
      if ((n & bit) == 0) {
        const uint16_t v = combine(w[static_cast<size_t>(n)], w[static_cast<size_t>(n | bit)]);
        w[static_cast<size_t>(n)] = w[static_cast<size_t>(n | bit)] = v;
      }
    }
  }
  return w[0];
}

}  // namespace troupe::test::half_ref
