// all_to_all_v on the local backend against the serial exchange
// (tests/comm/all_to_all_reference.hpp): 1, 2, 3, 4 and 8 ranks (threads), random counts per
// (sender, receiver) pair with zeros and odd sizes, f32/f64/i32/bf16 (raw bits: it is a copy),
// several operations in flight at once, the equal-count shorthand; counts that disagree between a
// pair, overlapping buffers and wrong count lists fail on every member with a message and leave
// recv untouched. Seeds are fixed. Rank threads record results; the main thread checks (Catch2
// assertions are not thread-safe).
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <thread>

#include "comm/local/local_world.hpp"
#include "tests/comm/all_to_all_reference.hpp"

using namespace troupe;
using namespace troupe::comm;
namespace a2a = troupe::test::a2a;

namespace {

constexpr unsigned char kGuard = 0xCD;  // bytes past recv that nobody may write
constexpr size_t kGuardBytes = 64;

// A hang guard, not a speed bound: a rank that never arrives fails the fabric instead.
LocalFabric make_fabric(int n) {
  LocalFabricOptions options;
  options.timeout = std::chrono::seconds(60);
  auto f = LocalFabric::create(n, options);
  REQUIRE(f.is_ok());
  return f.value();
}

// Runs body(rank) on n threads; returns each rank's error text ("" = fine).
std::vector<std::string> run_ranks(int n, const std::function<std::string(int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] { errors[static_cast<size_t>(r)] = body(r); });
  for (auto& t : threads) t.join();
  return errors;
}

void require_all_ok(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r] == "");
  }
}

std::unique_ptr<Communicator> everyone(const LocalFabric& fabric, int r, std::string* error) {
  auto comm = fabric.world(r)->everyone();
  if (!comm.is_ok()) {
    *error = comm.status().message();
    return nullptr;
  }
  return std::move(comm.value());
}

// recv of `bytes` followed by the guard.
a2a::Bytes guarded(size_t bytes, unsigned char fill = 0) {
  a2a::Bytes b(bytes + kGuardBytes, kGuard);
  std::fill(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(bytes), fill);
  return b;
}
bool guard_intact(const a2a::Bytes& b, size_t bytes) {
  return std::all_of(b.begin() + static_cast<std::ptrdiff_t>(bytes), b.end(),
                     [](unsigned char c) { return c == kGuard; });
}

std::string describe(int n, DType dtype, size_t k) {
  return std::to_string(n) + " ranks, " + dtype_name(dtype) + ", case " + std::to_string(k);
}

// The cases every group size runs, for one dtype: random counts (small and larger blocks), all
// zeros, one rank receiving everything, equal counts.
std::vector<a2a::Case> cases_for(int n, DType dtype, uint64_t seed) {
  const size_t esz = dtype_size(dtype);
  std::vector<a2a::Case> cases;
  cases.push_back(a2a::make_case(a2a::random_counts(n, seed, 37), esz, seed));
  cases.push_back(a2a::make_case(a2a::random_counts(n, seed + 1, 9), esz, seed + 1));
  cases.push_back(a2a::make_case(a2a::random_counts(n, seed + 2, 5000), esz, seed + 2));
  cases.push_back(a2a::make_case(a2a::equal_counts(n, 0), esz, seed + 3));
  a2a::Matrix skew = a2a::equal_counts(n, 0);
  for (int i = 0; i < n; ++i) skew[static_cast<size_t>(i)][0] = 1001 + static_cast<size_t>(i);
  cases.push_back(a2a::make_case(skew, esz, seed + 4));
  cases.push_back(a2a::make_case(a2a::equal_counts(n, 3), esz, seed + 5));
  return cases;
}

}  // namespace

TEST_CASE(
    "local all_to_all_v equals the serial exchange: 1, 2, 3, 4 and 8 ranks, random counts, "
    "f32 f64 i32 bf16",
    "[comm][local][all_to_all]") {
  const DType dtypes[] = {DType::f32, DType::f64, DType::i32, DType::bf16};
  for (int n : {1, 2, 3, 4, 8}) {
    // Built before the threads start (each rank reads every case, writes only its own recvs).
    std::vector<std::vector<a2a::Case>> cases;
    for (size_t d = 0; d < 4; ++d) cases.push_back(cases_for(n, dtypes[d], 100 * n + 10 * d));
    LocalFabric fabric = make_fabric(n);
    require_all_ok(run_ranks(n, [&](int r) -> std::string {
      std::string err;
      auto comm = everyone(fabric, r, &err);
      if (!comm) return err;
      for (size_t d = 0; d < 4; ++d) {
        const DType dtype = dtypes[d];
        const size_t esz = dtype_size(dtype);
        // All cases of a dtype in flight at once, waited for together.
        std::vector<a2a::Bytes> recvs;
        std::vector<WorkPtr> works;
        for (const a2a::Case& c : cases[d]) {
          const std::vector<size_t> sc = a2a::send_counts(c.counts, r),
                                    rc = a2a::recv_counts(c.counts, r);
          recvs.push_back(guarded(a2a::total(rc) * esz));
          works.push_back(comm->all_to_all_v(c.sends[static_cast<size_t>(r)].data(), sc,
                                             recvs.back().data(), rc, dtype));
        }
        if (Status st = wait_all(works); !st.is_ok()) return st.message();
        for (size_t k = 0; k < cases[d].size(); ++k) {
          const a2a::Bytes& want = cases[d][k].expected[static_cast<size_t>(r)];
          if (!guard_intact(recvs[k], want.size()))
            return describe(n, dtype, k) + ": bytes past recv were written";
          recvs[k].resize(want.size());
          const std::string diff = a2a::first_difference(recvs[k], want, esz);
          if (!diff.empty()) return describe(n, dtype, k) + ": " + diff;
        }
      }
      // The equal-count shorthand: 5 elements per peer.
      const a2a::Case eq = a2a::make_case(a2a::equal_counts(n, 5), 4, 7);
      a2a::Bytes out(5 * 4 * static_cast<size_t>(n));
      if (Status st =
              comm->all_to_all(eq.sends[static_cast<size_t>(r)].data(), out.data(), 5, DType::f32)
                  ->wait();
          !st.is_ok())
        return st.message();
      if (out != eq.expected[static_cast<size_t>(r)]) return "all_to_all (equal counts) is wrong";
      return "";
    }));
  }
}

TEST_CASE(
    "local all_to_all_v: counts that disagree between a pair fail every member, naming both "
    "counts, and write nothing",
    "[comm][local][all_to_all]") {
  const int n = 3;
  const size_t esz = 4;
  const a2a::Case c = a2a::make_case(a2a::random_counts(n, 5, 20), esz, 5);
  // Rank 2 expects 2 more elements from rank 0 than rank 0 sends it; rank 0 expects 4 from
  // rank 1, which sends it none.
  a2a::Matrix expect = c.counts;
  expect[0][2] += 2;
  expect[1][0] = 4;
  const size_t sent02 = c.counts[0][2], sent10 = c.counts[1][0];
  REQUIRE(sent10 != 4);
  LocalFabric fabric = make_fabric(n);
  std::vector<std::string> failure(n);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    const std::vector<size_t> rc = a2a::recv_counts(expect, r);
    a2a::Bytes recv = guarded(a2a::total(rc) * esz, 0x11);
    const Status st = comm->all_to_all_v(c.sends[static_cast<size_t>(r)].data(),
                                         a2a::send_counts(c.counts, r), recv.data(), rc, DType::f32)
                          ->wait();
    if (st.is_ok()) return "a mismatched all_to_all_v succeeded";
    failure[static_cast<size_t>(r)] = st.message();
    if (!guard_intact(recv, a2a::total(rc) * esz) ||
        !std::all_of(recv.begin(), recv.begin() + static_cast<std::ptrdiff_t>(a2a::total(rc) * esz),
                     [](unsigned char b) { return b == 0x11; }))
      return "a failed all_to_all_v wrote into recv";
    // The group is still usable: the correct call succeeds.
    const std::vector<size_t> good = a2a::recv_counts(c.counts, r);
    a2a::Bytes out(a2a::total(good) * esz);
    if (Status ok = comm->all_to_all_v(c.sends[static_cast<size_t>(r)].data(),
                                       a2a::send_counts(c.counts, r), out.data(), good, DType::f32)
                        ->wait();
        !ok.is_ok())
      return "after the mismatch: " + ok.message();
    if (out != c.expected[static_cast<size_t>(r)]) return "after the mismatch: wrong result";
    return "";
  }));
  // Every member names the same first mismatch, pairs scanned sender-major: (0, 2) before (1, 0).
  const std::string want = "rank 0 sends " + std::to_string(sent02) +
                           " elements to rank 2, whose recv_counts[0] is " +
                           std::to_string(sent02 + 2);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << failure[static_cast<size_t>(r)]);
    CHECK(failure[static_cast<size_t>(r)].find(want) != std::string::npos);
    CHECK(failure[static_cast<size_t>(r)].find("all_to_all") != std::string::npos);
  }
}

TEST_CASE("local all_to_all_v: overlapping buffers and wrong count lists are refused",
          "[comm][local][all_to_all]") {
  const int n = 3;
  LocalFabric fabric = make_fabric(n);
  std::vector<std::string> overlap(n), short_list(n);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    std::vector<float> buf(3 * n + 1, 1.0f), other(3 * n);  // buf + 1 holds a recv too
    const std::vector<size_t> three(static_cast<size_t>(n), 3);
    // Rank 1 alone passes its send as its recv: every member is told, naming it.
    float* recv = r == 1 ? buf.data() + 1 : other.data();
    overlap[static_cast<size_t>(r)] =
        comm->all_to_all_v(buf.data(), three, recv, three, DType::f32)->wait().message();
    const std::vector<size_t> two(2, 3);
    short_list[static_cast<size_t>(r)] =
        comm->all_to_all_v(buf.data(), two, other.data(), three, DType::f32)->wait().message();
    if (Status st = comm->all_to_all(buf.data(), other.data(), 3, DType::f32)->wait(); !st.is_ok())
      return "afterwards: " + st.message();
    return "";
  }));
  for (int r = 0; r < n; ++r) {
    INFO(overlap[static_cast<size_t>(r)] << "\n" << short_list[static_cast<size_t>(r)]);
    CHECK(overlap[static_cast<size_t>(r)].find("rank 1 passed overlapping send and recv") !=
          std::string::npos);
    CHECK(short_list[static_cast<size_t>(r)].find("2 send counts and 3 recv counts") !=
          std::string::npos);
  }
}
