// bf16 and f16 reductions: the conversions (comm/half_convert.hpp) against the formats' definition
// (tests/comm/half_reference.hpp) for every 16-bit pattern and a sweep of fp32 values (ties,
// overflow, subnormals), every bulk (vectorised) implementation the CPU has against the scalar
// ones; then the local backend's all_reduce and reduce_scatter(_v) for 1..8 ranks and odd counts
// against the contract's rule (fp32 accumulation in rank order, one rounding) bitwise on every
// rank, with Inf/NaN propagation and fp16 overflow of finite sums. The ucx backend's 16-bit
// collectives are checked by tests/comm/workers/ucx_worker.cpp (tests/comm/test_ucx_comm.cpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <thread>

#include "comm/half_convert.hpp"
#include "comm/local/local_kernels.hpp"
#include "comm/local/local_world.hpp"
#include "tests/comm/half_reference.hpp"

using namespace troupe;
using namespace troupe::comm;
namespace ref = troupe::test::half_ref;

namespace {

const DType kHalves[] = {DType::bf16, DType::f16};
const detail::HalfIsa kIsas[] = {detail::HalfIsa::scalar, detail::HalfIsa::f16c,
                                 detail::HalfIsa::avx512};

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float scalar_widen(uint16_t h, DType t) {
  return t == DType::bf16 ? detail::bf16_to_f32(h) : detail::f16_to_f32(h);
}
uint16_t scalar_narrow(float f, DType t) {
  return t == DType::bf16 ? detail::f32_to_bf16(f) : detail::f32_to_f16(f);
}

// The narrowing of x matches the reference (NaN: a quiet NaN of x's sign).
bool narrows_right(float x, uint16_t got, DType t) {
  if (std::isnan(x)) return ref::is_quiet_nan(got, t) && ((got & 0x8000) != 0) == std::signbit(x);
  return got == ref::encode(x, t);
}

}  // namespace

TEST_CASE("16-bit widening is exact for every pattern; NaNs stay (quiet) NaNs", "[comm][half]") {
  for (DType t : kHalves) {
    std::vector<uint16_t> all(65536);
    std::iota(all.begin(), all.end(), uint16_t{0});
    std::vector<std::vector<float>> bulk;  // one per implementation this CPU has
    for (detail::HalfIsa isa : kIsas) {
      if (!detail::half_isa_available(isa)) continue;
      bulk.emplace_back(all.size());
      detail::widen_to_f32(bulk.back().data(), all.data(), all.size(), t, isa);
    }
    std::vector<float> plain(all.size());
    detail::widen_to_f32(plain.data(), all.data(), all.size(), t);
    bulk.push_back(plain);
    for (uint32_t h = 0; h < 65536; ++h) {
      INFO(dtype_name(t) << " pattern " << h);
      const float s = scalar_widen(static_cast<uint16_t>(h), t);
      for (const auto& b : bulk) REQUIRE(bits_of(b[h]) == bits_of(s));
      if (ref::is_nan(static_cast<uint16_t>(h), t)) {
        REQUIRE(std::isnan(s));
        REQUIRE((bits_of(s) & 0x00400000u) != 0);  // quiet
        REQUIRE(std::signbit(s) == ((h & 0x8000) != 0));
      } else {
        REQUIRE(bits_of(s) == bits_of(ref::widen(static_cast<uint16_t>(h), t)));
        // Narrowing a widened value gives the pattern back.
        REQUIRE(scalar_narrow(s, t) == h);
      }
    }
  }
}

TEST_CASE("16-bit narrowing rounds to nearest even: ties, overflow, subnormals, NaN",
          "[comm][half]") {
  for (DType t : kHalves) {
    std::vector<float> xs;
    // Every pattern's value, the midpoints to its upper neighbour and one fp32 ulp either side.
    for (uint32_t h = 0; h < 0x7fff; ++h) {
      const uint16_t lo = static_cast<uint16_t>(h), hi = static_cast<uint16_t>(h + 1);
      if (ref::is_nan(lo, t) || ref::is_nan(hi, t) || std::isinf(ref::decode(lo, t))) continue;
      const float mid = static_cast<float>((ref::decode(lo, t) + ref::decode(hi, t)) / 2);
      for (float x :
           {ref::widen(lo, t), mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY)}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
    // Random fp32 patterns of every exponent, and the specials.
    std::mt19937 rng(7);
    for (int i = 0; i < 200000; ++i) xs.push_back(float_of(rng()));
    for (float x : {0.f, -0.f, INFINITY, -INFINITY, std::numeric_limits<float>::max(),
                    std::numeric_limits<float>::denorm_min(), 65504.f, 65519.996f, 65520.f,
                    -65520.f, 65536.f, 1e30f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f}) {
      xs.push_back(x);
    }
    xs.push_back(float_of(0x7fa00001u));  // a signalling NaN
    xs.push_back(float_of(0xffc12345u));  // a quiet negative NaN
    std::vector<std::vector<uint16_t>> bulk;
    for (detail::HalfIsa isa : kIsas) {
      if (!detail::half_isa_available(isa)) continue;
      bulk.emplace_back(xs.size());
      detail::narrow_from_f32(bulk.back().data(), xs.data(), xs.size(), t, isa);
    }
    std::vector<uint16_t> plain(xs.size());
    detail::narrow_from_f32(plain.data(), xs.data(), xs.size(), t);
    bulk.push_back(plain);
    for (size_t i = 0; i < xs.size(); ++i) {
      INFO(dtype_name(t) << " x=" << xs[i] << " bits " << bits_of(xs[i]));
      const uint16_t s = scalar_narrow(xs[i], t);
      for (const auto& b : bulk) REQUIRE(b[i] == s);
      REQUIRE(narrows_right(xs[i], s, t));
    }
  }
  // The f16 overflow threshold: 65504 is the largest finite value; from 65520 up it is Inf.
  REQUIRE(detail::f32_to_f16(65519.996f) == 0x7bff);
  REQUIRE(detail::f32_to_f16(65520.f) == 0x7c00);
  REQUIRE(detail::f32_to_f16(-1e6f) == 0xfc00);
}

namespace {

LocalFabric make_fabric(int n) {
  auto f = LocalFabric::create(n);
  REQUIRE(f.is_ok());
  return f.value();
}

// Runs body(rank) on n threads (Catch2 is not thread-safe: bodies return an error text).
std::vector<std::string> run_ranks(int n,
                                   const std::function<std::string(int, Communicator&)>& body) {
  LocalFabric fabric = make_fabric(n);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto world = fabric.world(r);
      auto comm = world->everyone();
      errors[static_cast<size_t>(r)] =
          comm.is_ok() ? body(r, *comm.value()) : comm.status().message();
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void require_all_ok(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r] == "");
  }
}

std::string text(const Status& s) {
  return s.is_ok() ? "" : s.message();
}

// Random non-zero 16-bit values of magnitudes spread over [2^-8, 2^8) * scale, both signs.
std::vector<uint16_t> random_halves(size_t count, DType t, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> expo(-8, 7), sign(0, 1);
  std::vector<uint16_t> v(count);
  for (auto& h : v) {
    const float x = std::ldexp(mant(rng), expo(rng)) * scale * (sign(rng) ? -1.f : 1.f);
    h = ref::encode(x, t);
  }
  return v;
}

// The contract's result for the local backend: over the ranks in order 0..n-1, in fp32, rounded
// once.
std::vector<uint16_t> expected_once(const std::vector<std::vector<uint16_t>>& in, size_t begin,
                                    size_t count, DType t, ReduceOp op) {
  std::vector<uint16_t> out(count), xs(in.size());
  for (size_t k = 0; k < count; ++k) {
    for (size_t r = 0; r < in.size(); ++r) xs[r] = in[r][begin + k];
    out[k] = ref::reduce_once(xs, t, op);
  }
  return out;
}

std::string where(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  for (size_t k = 0; k < got.size() && k < want.size(); ++k) {
    if (got[k] != want[k])
      return "element " + std::to_string(k) + ": " + std::to_string(got[k]) + " vs " +
             std::to_string(want[k]);
  }
  return got.size() == want.size() ? "" : "sizes differ";
}

void check_all_reduce(int n, size_t count, DType t, ReduceOp op,
                      std::vector<std::vector<uint16_t>> in) {
  INFO("n=" << n << " count=" << count << " " << dtype_name(t) << " " << reduce_op_name(op));
  const std::vector<uint16_t> want = expected_once(in, 0, count, t, op);
  require_all_ok(run_ranks(n, [&](int r, Communicator& c) {
    return text(c.all_reduce(in[static_cast<size_t>(r)].data(), count, t, op)->wait());
  }));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << " " << where(in[static_cast<size_t>(r)], want));
    REQUIRE(in[static_cast<size_t>(r)] == want);  // so also bitwise equal across ranks
  }
}

}  // namespace

TEST_CASE("local all_reduce bf16/f16 sum and max: fp32 in rank order, one rounding, every rank",
          "[comm][local][half]") {
  for (int n = 1; n <= 8; ++n) {
    for (size_t count : {size_t{1}, size_t{7}, static_cast<size_t>(n > 1 ? n - 1 : 1), size_t{1001},
                         size_t{4 * 4096 + 17}}) {
      for (DType t : kHalves) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
          std::vector<std::vector<uint16_t>> in;
          for (int r = 0; r < n; ++r)
            in.push_back(random_halves(count, t, count * 131 + n * 7 + r));
          check_all_reduce(n, count, t, op, in);
        }
      }
    }
  }
}

TEST_CASE("local all_reduce bf16/f16 rounds once, not per rank", "[comm][local][half]") {
  // 1 + 8 * 2^-9 in bf16: each addend (2^-9) is a quarter of bf16's ulp at 1 (2^-7), so a sum
  // rounded after every step stays 1, while the fp32 sum 1 + 2^-6 is exact in bf16.
  for (int n : {5, 9}) {
    const size_t count = 33;
    std::vector<std::vector<uint16_t>> in(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      in[static_cast<size_t>(r)].assign(
          count, ref::encode(r == 0 ? 1.0 : std::ldexp(1.0, -9), DType::bf16));
    }
    const uint16_t once = ref::encode(1.0 + (n - 1) * std::ldexp(1.0, -9), DType::bf16);
    REQUIRE(once != ref::encode(1.0, DType::bf16));
    REQUIRE(expected_once(in, 0, 1, DType::bf16, ReduceOp::sum)[0] == once);
    std::vector<uint16_t> column;
    for (const auto& v : in) column.push_back(v[0]);
    REQUIRE(ref::reduce_each(column, DType::bf16, ReduceOp::sum) == ref::encode(1.0, DType::bf16));
    check_all_reduce(n, count, DType::bf16, ReduceOp::sum, in);
  }
}

TEST_CASE("local bf16/f16 reductions propagate Inf and NaN; fp16 finite sums past 65504 are Inf",
          "[comm][local][half]") {
  for (int n : {2, 3, 5}) {
    for (DType t : kHalves) {
      const size_t count = 1003;
      std::vector<std::vector<uint16_t>> in;
      for (int r = 0; r < n; ++r) in.push_back(random_halves(count, t, 40 + r));
      const uint16_t inf = ref::encode(INFINITY, t), ninf = ref::encode(-INFINITY, t);
      const uint16_t nan = ref::encode(NAN, t);
      in[static_cast<size_t>(n - 1)][5] = inf;  // one rank's overflow: Inf
      in[0][6] = inf;                           // +Inf and -Inf: NaN
      in[static_cast<size_t>(n - 1)][6] = ninf;
      in[static_cast<size_t>(n / 2)][1000] = nan;  // a NaN input: NaN
      // Finite values whose sum overflows the format: f16 40000 each (>= 80000), bf16 3e38 each.
      const double big = t == DType::f16 ? 40000.0 : 3e38;
      for (int r = 0; r < n; ++r) in[static_cast<size_t>(r)][9] = ref::encode(big, t);
      std::vector<std::vector<uint16_t>> sums = in, maxes = in;
      require_all_ok(run_ranks(n, [&](int r, Communicator& c) {
        Status s =
            c.all_reduce(sums[static_cast<size_t>(r)].data(), count, t, ReduceOp::sum)->wait();
        if (!s.is_ok()) return s.message();
        return text(
            c.all_reduce(maxes[static_cast<size_t>(r)].data(), count, t, ReduceOp::max)->wait());
      }));
      INFO("n=" << n << " " << dtype_name(t));
      for (int r = 0; r < n; ++r) {
        const auto& s = sums[static_cast<size_t>(r)];
        REQUIRE(s[5] == inf);
        REQUIRE(ref::is_nan(s[6], t));
        REQUIRE(ref::is_nan(s[1000], t));
        REQUIRE(s[9] == inf);
        REQUIRE(maxes[static_cast<size_t>(r)][5] == inf);
        REQUIRE(maxes[static_cast<size_t>(r)][9] == ref::encode(big, t));
        // Elsewhere the contract's values, bitwise (NaN patterns apart).
        const auto want = expected_once(in, 0, count, t, ReduceOp::sum);
        for (size_t k = 0; k < count; ++k) {
          if (k != 6 && k != 1000) REQUIRE(s[k] == want[k]);
        }
      }
    }
  }
  // f16: a finite sum just past 65504 rounds to Inf from 65520 up, and stays finite below.
  {
    const int n = 2;
    std::vector<std::vector<uint16_t>> in = {
        {ref::encode(32768.0, DType::f16), ref::encode(32768.0, DType::f16)},
        {ref::encode(32736.0, DType::f16), ref::encode(32752.0, DType::f16)}};
    // 65504 exactly, and 65520 (the tie between 65504 and 2^16: even is 2^16, so Inf).
    require_all_ok(run_ranks(n, [&](int r, Communicator& c) {
      return text(
          c.all_reduce(in[static_cast<size_t>(r)].data(), 2, DType::f16, ReduceOp::sum)->wait());
    }));
    for (int r = 0; r < n; ++r) {
      REQUIRE(in[static_cast<size_t>(r)][0] == ref::encode(65504.0, DType::f16));
      REQUIRE(in[static_cast<size_t>(r)][1] == ref::encode(INFINITY, DType::f16));
    }
  }
}

TEST_CASE("local reduce_scatter(_v) bf16/f16: uneven, zero and equal blocks, in place",
          "[comm][local][half]") {
  for (int n = 1; n <= 8; ++n) {
    std::vector<std::vector<size_t>> count_sets = {
        std::vector<size_t>(static_cast<size_t>(n), 3),
        std::vector<size_t>(static_cast<size_t>(n), 4097)};
    std::vector<size_t> uneven(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      uneven[static_cast<size_t>(r)] = (r % 3 == 1) ? 0 : static_cast<size_t>(r * 37 + 1);
    count_sets.push_back(uneven);
    for (const auto& counts : count_sets) {
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      std::vector<size_t> off(static_cast<size_t>(n) + 1, 0);
      for (int r = 0; r < n; ++r)
        off[static_cast<size_t>(r) + 1] =
            off[static_cast<size_t>(r)] + counts[static_cast<size_t>(r)];
      const bool equal =
          std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
      for (DType t : kHalves) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
          INFO("n=" << n << " total=" << total << " " << dtype_name(t) << " "
                    << reduce_op_name(op));
          std::vector<std::vector<uint16_t>> send;
          for (int r = 0; r < n; ++r)
            send.push_back(random_halves(total, t, total * 3 + r + n * 100, 0.01f));
          std::vector<std::vector<uint16_t>> recv(static_cast<size_t>(n)), in_place = send;
          for (int r = 0; r < n; ++r)
            recv[static_cast<size_t>(r)].assign(counts[static_cast<size_t>(r)], 0xFFFF);
          require_all_ok(run_ranks(n, [&](int r, Communicator& c) {
            const size_t ur = static_cast<size_t>(r);
            WorkPtr w = equal ? c.reduce_scatter(send[ur].data(), recv[ur].data(), counts[0], t, op)
                              : c.reduce_scatter_v(send[ur].data(), recv[ur].data(), counts, t, op);
            Status s = w->wait();
            if (!s.is_ok()) return s.message();
            return text(c.reduce_scatter_v(in_place[ur].data(), in_place[ur].data() + off[ur],
                                           counts, t, op)
                            ->wait());
          }));
          for (int r = 0; r < n; ++r) {
            const size_t ur = static_cast<size_t>(r);
            const auto want = expected_once(send, off[ur], counts[ur], t, op);
            INFO("rank " << r << " " << where(recv[ur], want));
            REQUIRE(recv[ur] == want);
            REQUIRE(std::vector<uint16_t>(
                        in_place[ur].begin() + static_cast<std::ptrdiff_t>(off[ur]),
                        in_place[ur].begin() + static_cast<std::ptrdiff_t>(off[ur + 1])) == want);
          }
        }
      }
    }
  }
}

TEST_CASE("reduce_to bf16/f16 at every alignment, streaming or not, equals the one-rounding rule",
          "[comm][local][half]") {
  for (bool streaming : {false, true}) {
    for (int n : {1, 2, 4, 7}) {
      for (size_t count : {size_t{1}, size_t{31}, size_t{4096 * 2 + 5}}) {
        for (DType t : kHalves) {
          INFO("streaming=" << streaming << " n=" << n << " count=" << count << " "
                            << dtype_name(t));
          std::vector<std::vector<uint16_t>> in;
          for (int j = 0; j < n; ++j) in.push_back(random_halves(count, t, count + j * 31, 3.f));
          const auto want = expected_once(in, 0, count, t, ReduceOp::sum);
          std::vector<const void*> srcs;
          for (auto& v : in) srcs.push_back(v.data());
          std::vector<uint16_t> out(count + 40, 0xABCD);
          void* dst = out.data() + 3;
          detail::reduce_to({&dst, 1}, srcs, count, t, ReduceOp::sum, streaming);
          REQUIRE(std::vector<uint16_t>(out.begin() + 3,
                                        out.begin() + 3 + static_cast<std::ptrdiff_t>(count)) ==
                  want);
          REQUIRE(out[2] == 0xABCD);
          REQUIRE(out[3 + count] == 0xABCD);
        }
      }
    }
  }
}
