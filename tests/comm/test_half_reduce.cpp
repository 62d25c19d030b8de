// bf16 and f16 reductions (the conversions, kernels/half.hpp, are tested by
// tests/kernels/test_mixed_convert.cpp): the local backend's all_reduce and reduce_scatter(_v) for
// 1..8 ranks and odd counts against the contract's rule (fp32 accumulation in rank order, one rounding) bitwise on every
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

#include "comm/local/local_kernels.hpp"
#include "comm/local/local_world.hpp"
#include "tests/comm/half_reference.hpp"

using namespace troupe;
using namespace troupe::comm;
namespace ref = troupe::test::half_ref;

namespace {

const DType kHalves[] = {DType::bf16, DType::f16};

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
