// The local backend: every collective against a serial reference for 1..8 ranks (threads), uneven
// and tiny counts, send/recv matching, concurrent subgroups, misuse, abort and timeout. Catch2
// assertions are not thread-safe, so rank threads only record results; the main thread checks.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <type_traits>

#include "comm/local/local_kernels.hpp"
#include "comm/local/local_world.hpp"
#include "comm/topology.hpp"

using namespace troupe;
using namespace troupe::comm;
using Clock = std::chrono::steady_clock;

namespace {

LocalFabric make_fabric(int n, LocalFabricOptions options = {}) {
  auto f = LocalFabric::create(n, options);
  REQUIRE(f.is_ok());
  return f.value();
}

// Runs body(rank) on n threads; returns each rank's error text ("" = fine).
std::vector<std::string> run_ranks(int n, const std::function<std::string(int)>& body) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { errors[r] = body(r); });
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

// The everyone() communicator of rank r, or an error text.
std::unique_ptr<Communicator> everyone(const LocalFabric& fabric, int r, std::string* error) {
  auto world = fabric.world(r);
  auto comm = world->everyone();
  if (!comm.is_ok()) {
    *error = comm.status().message();
    return nullptr;
  }
  return std::move(comm.value());
}

template <class T>
std::vector<T> integer_valued(size_t count, uint64_t seed, int lo = -50, int hi = 50) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> u(lo, hi);
  std::vector<T> v(count);
  for (auto& x : v) x = static_cast<T>(u(rng));
  return v;
}

// The serial reduction in rank order: ((in[0] op in[1]) op in[2]) ...
template <class T>
std::vector<T> serial_reduce(const std::vector<std::vector<T>>& in, ReduceOp op) {
  std::vector<T> out = in[0];
  for (size_t r = 1; r < in.size(); ++r) {
    for (size_t k = 0; k < out.size(); ++k)
      out[k] = op == ReduceOp::sum ? out[k] + in[r][k] : std::max(out[k], in[r][k]);
  }
  return out;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// all_reduce of `count` elements over n ranks; checks every rank's result bitwise against the
// serial one.
template <class T>
void check_all_reduce(int n, size_t count, ReduceOp op, std::vector<std::vector<T>> in) {
  INFO("n=" << n << " count=" << count << " op=" << reduce_op_name(op)
            << " dtype=" << dtype_name(dtype_of<T>()));
  const std::vector<T> expected = serial_reduce(in, op);
  LocalFabric fabric = make_fabric(n);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    return text(comm->all_reduce(in[r].data(), count, dtype_of<T>(), op)->wait());
  }));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(bitwise_equal(in[r], expected));
  }
}

template <class T>
std::vector<std::vector<T>> inputs(int n, size_t count, uint64_t seed) {
  std::vector<std::vector<T>> in;
  for (int r = 0; r < n; ++r) in.push_back(integer_valued<T>(count, seed * 100 + r));
  return in;
}

}  // namespace

TEST_CASE("all_reduce sum f32, integer-valued, 1..8 ranks, odd counts: exact", "[comm][local]") {
  for (int n = 1; n <= 8; ++n) {
    for (size_t count :
         {size_t{0}, size_t{1}, size_t{7}, static_cast<size_t>(n > 1 ? n - 1 : 1), size_t{1000}}) {
      check_all_reduce<float>(n, count, ReduceOp::sum, inputs<float>(n, count, n * 1000 + count));
    }
  }
  for (int n : {3, 8})
    check_all_reduce<float>(n, 1000003, ReduceOp::sum, inputs<float>(n, 1000003, 77 + n));
}

TEST_CASE("all_reduce of non-integer floats equals the rank-order serial sum bitwise on every rank",
          "[comm][local]") {
  // Group sizes that take every pass shape of the kernel's fold (2, 3, 4+1, 4+3, 4+3+1 sources);
  // the larger count gives every member several 16 KiB chunks and a partial last one.
  for (int n : {2, 3, 5, 7, 8}) {
    for (size_t count : {size_t{4099}, size_t{8 * 8192 + 17}}) {
      std::vector<std::vector<float>> in(n);
      std::mt19937_64 rng(5 + n);
      std::normal_distribution<float> g(0.f, 1.f);
      for (auto& v : in) {
        v.resize(count);
        for (auto& x : v) x = g(rng) * 1e3f;
      }
      check_all_reduce<float>(n, count, ReduceOp::sum, in);
    }
  }
}

TEST_CASE("all_reduce max and other dtypes", "[comm][local]") {
  for (int n : {1, 2, 3, 5, 8}) {
    check_all_reduce<float>(n, 1001, ReduceOp::max, inputs<float>(n, 1001, 1 + n));
    check_all_reduce<double>(n, 1003, ReduceOp::sum, inputs<double>(n, 1003, 2 + n));
    check_all_reduce<double>(n, 5, ReduceOp::max, inputs<double>(n, 5, 3 + n));
    check_all_reduce<int32_t>(n, 777, ReduceOp::sum, inputs<int32_t>(n, 777, 4 + n));
    check_all_reduce<int32_t>(n, 3, ReduceOp::max, inputs<int32_t>(n, 3, 5 + n));
    check_all_reduce<int64_t>(n, 129, ReduceOp::sum, inputs<int64_t>(n, 129, 6 + n));
    check_all_reduce<int64_t>(n, 2, ReduceOp::max, inputs<int64_t>(n, 2, 7 + n));
  }
}

TEST_CASE("reduce_scatter_v and all_gather_v with uneven counts, zero blocks and equal forms",
          "[comm][local]") {
  for (int n = 1; n <= 8; ++n) {
    std::vector<std::vector<size_t>> count_sets = {
        std::vector<size_t>(n, 0), std::vector<size_t>(n, 3), std::vector<size_t>(n, 1000)};
    std::vector<size_t> uneven(n);
    for (int r = 0; r < n; ++r) uneven[r] = (r % 3 == 1) ? 0 : static_cast<size_t>(r * 37 + 1);
    count_sets.push_back(uneven);
    for (const auto& counts : count_sets) {
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      std::vector<size_t> offsets(n + 1, 0);
      for (int r = 0; r < n; ++r) offsets[r + 1] = offsets[r] + counts[r];
      const bool equal =
          std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
      INFO("n=" << n << " total=" << total << " equal=" << equal);

      // reduce_scatter: each rank gets the serial sum of its block.
      std::vector<std::vector<float>> send = inputs<float>(n, total, n + total);
      const std::vector<float> sum = serial_reduce(send, ReduceOp::sum);
      std::vector<std::vector<float>> recv(n);
      // all_gather: each rank contributes a block; also the in-place form (send inside recv).
      std::vector<std::vector<int32_t>> gather_in(n), gathered(n, std::vector<int32_t>(total, -1));
      std::vector<std::vector<int32_t>> gathered_in_place(n, std::vector<int32_t>(total, -1));
      std::vector<int32_t> gather_expected(total);
      for (int r = 0; r < n; ++r) {
        recv[r].assign(counts[r], -1.f);
        gather_in[r] = integer_valued<int32_t>(counts[r], 900 + r, -1000, 1000);
        std::copy(gather_in[r].begin(), gather_in[r].end(), gather_expected.begin() + offsets[r]);
        std::copy(gather_in[r].begin(), gather_in[r].end(),
                  gathered_in_place[r].begin() + offsets[r]);
      }
      LocalFabric fabric = make_fabric(n);
      require_all_ok(run_ranks(n, [&](int r) -> std::string {
        std::string err;
        auto comm = everyone(fabric, r, &err);
        if (!comm) return err;
        std::vector<WorkPtr> works;
        if (equal) {
          works.push_back(comm->reduce_scatter(send[r].data(), recv[r].data(), counts[0],
                                               DType::f32, ReduceOp::sum));
          works.push_back(
              comm->all_gather(gather_in[r].data(), gathered[r].data(), counts[0], DType::i32));
        } else {
          works.push_back(comm->reduce_scatter_v(send[r].data(), recv[r].data(), counts, DType::f32,
                                                 ReduceOp::sum));
          works.push_back(
              comm->all_gather_v(gather_in[r].data(), gathered[r].data(), counts, DType::i32));
        }
        works.push_back(comm->all_gather_v(gathered_in_place[r].data() + offsets[r],
                                           gathered_in_place[r].data(), counts, DType::i32));
        return text(wait_all(works));
      }));
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        REQUIRE(bitwise_equal(
            recv[r], std::vector<float>(sum.begin() + offsets[r], sum.begin() + offsets[r + 1])));
        REQUIRE(gathered[r] == gather_expected);
        REQUIRE(gathered_in_place[r] == gather_expected);
      }
    }
  }
}

TEST_CASE("reduce_scatter in place: recv is the rank's own block of send", "[comm][local]") {
  const int n = 5;
  const size_t block = 11;
  std::vector<std::vector<double>> buf = inputs<double>(n, n * block, 31);
  const std::vector<double> sum = serial_reduce(buf, ReduceOp::sum);
  LocalFabric fabric = make_fabric(n);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    return text(comm->reduce_scatter(buf[r].data(), buf[r].data() + r * block, block, DType::f64,
                                     ReduceOp::sum)
                    ->wait());
  }));
  for (int r = 0; r < n; ++r) {
    for (size_t k = 0; k < block; ++k) REQUIRE(buf[r][r * block + k] == sum[r * block + k]);
  }
}

TEST_CASE("skewed _v counts: one rank's block spans every member's share, in place and not",
          "[comm][local]") {
  const int n = 4;
  const std::vector<size_t> counts = {0, 3, 20011, 0};
  const std::vector<size_t> offsets = {0, 0, 3, 20014, 20014};
  const size_t total = offsets[n];
  std::vector<std::vector<int64_t>> send = inputs<int64_t>(n, total, 41), in_place = send;
  const std::vector<int64_t> sum = serial_reduce(send, ReduceOp::sum);
  std::vector<std::vector<int64_t>> recv(n), gathered(n, std::vector<int64_t>(total, -1));
  std::vector<std::vector<int64_t>> gathered_in_place(n, std::vector<int64_t>(total, -1));
  std::vector<int64_t> gather_expected(total);
  for (int r = 0; r < n; ++r) {
    recv[r].assign(counts[r], -1);
    for (size_t k = offsets[r]; k < offsets[r + 1]; ++k) {
      gather_expected[k] = send[r][k];
      gathered_in_place[r][k] = send[r][k];
    }
  }
  LocalFabric fabric = make_fabric(n);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    return text(wait_all(
        {comm->reduce_scatter_v(send[r].data(), recv[r].data(), counts, DType::i64, ReduceOp::sum),
         comm->reduce_scatter_v(in_place[r].data(), in_place[r].data() + offsets[r], counts,
                                DType::i64, ReduceOp::sum),
         comm->all_gather_v(send[r].data() + offsets[r], gathered[r].data(), counts, DType::i64),
         comm->all_gather_v(gathered_in_place[r].data() + offsets[r], gathered_in_place[r].data(),
                            counts, DType::i64)}));
  }));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const std::vector<int64_t> mine(sum.begin() + offsets[r], sum.begin() + offsets[r + 1]);
    REQUIRE(recv[r] == mine);
    REQUIRE(std::vector<int64_t>(in_place[r].begin() + offsets[r],
                                 in_place[r].begin() + offsets[r + 1]) == mine);
    REQUIRE(gathered[r] == gather_expected);
    REQUIRE(gathered_in_place[r] == gather_expected);
  }
}

TEST_CASE("collectives larger than the last-level cache (streaming stores) are exact",
          "[comm][local]") {
  // 32 MiB per buffer, so reduce_scatter, all_gather and broadcast span more than the last-level
  // cache of common machines and take the streaming path (all_reduce never streams); the counts
  // are odd so blocks start at every alignment.
  const int n = 3;
  const size_t count = (size_t{32} << 20) / sizeof(float) + 5;
  const size_t block = count / n;  // reduce_scatter / all_gather block
  std::vector<std::vector<float>> buf = inputs<float>(n, count, 51),
                                  send = inputs<float>(n, count, 52);
  const std::vector<float> ar_expected = serial_reduce(buf, ReduceOp::sum);
  const std::vector<float> rs_expected = serial_reduce(send, ReduceOp::sum);
  std::vector<std::vector<float>> rs(n, std::vector<float>(block)),
      ag(n, std::vector<float>(n * block));
  std::vector<std::vector<float>> bc = inputs<float>(n, count, 53);
  const std::vector<float> bc_expected = bc[1];
  LocalFabric fabric = make_fabric(n);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    return text(wait_all(
        {comm->all_reduce(buf[r].data(), count, DType::f32, ReduceOp::sum),
         comm->reduce_scatter(send[r].data(), rs[r].data(), block, DType::f32, ReduceOp::sum),
         comm->all_gather(send[r].data() + 1, ag[r].data(), block, DType::f32),
         comm->broadcast(bc[r].data(), count, DType::f32, 1)}));
  }));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(bitwise_equal(buf[r], ar_expected));
    REQUIRE(bitwise_equal(rs[r], std::vector<float>(rs_expected.begin() + r * block,
                                                    rs_expected.begin() + (r + 1) * block)));
    for (int q = 0; q < n; ++q) {
      REQUIRE(std::memcmp(ag[r].data() + q * block, send[q].data() + 1, block * sizeof(float)) ==
              0);
    }
    REQUIRE(bc[r] == bc_expected);
  }
}

TEST_CASE("broadcast from every root, movement dtypes", "[comm][local]") {
  for (int n : {1, 2, 3, 4, 5, 7, 8}) {
    LocalFabric fabric = make_fabric(n);
    const size_t count = 1001;
    std::vector<std::vector<std::vector<uint8_t>>> bufs(n);  // [rank][root]
    for (int r = 0; r < n; ++r) {
      for (int root = 0; root < n; ++root)
        bufs[r].push_back(integer_valued<uint8_t>(count * 2, r * 10 + root, 0, 255));
    }
    auto expected = bufs;
    require_all_ok(run_ranks(n, [&](int r) -> std::string {
      std::string err;
      auto comm = everyone(fabric, r, &err);
      if (!comm) return err;
      std::vector<WorkPtr> works;
      for (int root = 0; root < n; ++root) {  // bf16 is moved as 2-byte elements
        works.push_back(comm->broadcast(bufs[r][root].data(), count, DType::bf16, root));
      }
      works.push_back(comm->broadcast(nullptr, 0, DType::f32, 0));  // count 0: a no-op
      return text(wait_all(works));
    }));
    for (int r = 0; r < n; ++r) {
      for (int root = 0; root < n; ++root) REQUIRE(bufs[r][root] == expected[root][root]);
    }
  }
}

TEST_CASE("send/recv: interleaved tags, both directions at once, FIFO per tag", "[comm][local]") {
  const int n = 4;
  LocalFabric fabric = make_fabric(n);
  const int kTags = 3, kPerTag = 4;
  const size_t count = 513;
  auto payload = [&](int from, int to, int tag, int i) {
    return integer_valued<float>(count, ((from * 8 + to) * 8 + tag) * 8 + i);
  };
  // received[r][peer][tag][i]
  std::vector<std::vector<std::vector<std::vector<std::vector<float>>>>> received(
      n, std::vector<std::vector<std::vector<std::vector<float>>>>(
             n, std::vector<std::vector<std::vector<float>>>(
                    kTags, std::vector<std::vector<float>>(kPerTag))));
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    std::vector<std::vector<float>> outgoing;
    outgoing.reserve(n * kTags * kPerTag);
    std::vector<WorkPtr> works;
    // Every rank sends to every other rank first (tags interleaved), then receives in reverse tag
    // order.
    for (int i = 0; i < kPerTag; ++i) {
      for (int tag = 0; tag < kTags; ++tag) {
        for (int peer = 0; peer < n; ++peer) {
          if (peer == r) continue;
          outgoing.push_back(payload(r, peer, tag, i));
          works.push_back(comm->send(outgoing.back().data(), count, DType::f32, peer, 100 + tag));
        }
      }
    }
    for (int tag = kTags - 1; tag >= 0; --tag) {
      for (int i = 0; i < kPerTag; ++i) {
        for (int peer = 0; peer < n; ++peer) {
          if (peer == r) continue;
          auto& buf = received[r][peer][tag][i];
          buf.resize(count);
          works.push_back(comm->recv(buf.data(), count, DType::f32, peer, 100 + tag));
        }
      }
    }
    return text(wait_all(works));
  }));
  for (int r = 0; r < n; ++r) {
    for (int peer = 0; peer < n; ++peer) {
      if (peer == r) continue;
      for (int tag = 0; tag < kTags; ++tag) {
        for (int i = 0; i < kPerTag; ++i)
          REQUIRE(received[r][peer][tag][i] == payload(peer, r, tag, i));
      }
    }
  }
}

TEST_CASE("send/recv: ring shift, self-send, size mismatch and reserved tags", "[comm][local]") {
  const int n = 5;
  LocalFabric fabric = make_fabric(n);
  std::vector<int64_t> got(n, -1), self(n, -1);
  std::vector<std::string> mismatch(n), reserved(n);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    int64_t mine = 1000 + r, me_again = 2000 + r;
    auto s = comm->send(&mine, 1, DType::i64, (r + 1) % n, 7);
    auto rv = comm->recv(&got[r], 1, DType::i64, (r + n - 1) % n, 7);
    auto ss = comm->send(&me_again, 1, DType::i64, r, 8);
    auto sr = comm->recv(&self[r], 1, DType::i64, r, 8);
    if (Status st = wait_all({s, rv, ss, sr}); !st.is_ok()) return st.message();
    // A recv for 2 elements meets a send of 1: both sides fail.
    int64_t two[2];
    WorkPtr bad = (r % 2 == 0 && r + 1 < n) ? comm->send(&mine, 1, DType::i64, r + 1, 9)
                  : (r % 2 == 1)            ? comm->recv(two, 2, DType::i64, r - 1, 9)
                                            : completed_work(Status::error("no partner"));
    mismatch[r] = text(bad->wait());
    reserved[r] = text(comm->send(&mine, 1, DType::i64, 0, uint64_t{1} << 56)->wait());
    return "";
  }));
  for (int r = 0; r < n; ++r) {
    REQUIRE(got[r] == 1000 + (r + n - 1) % n);
    REQUIRE(self[r] == 2000 + r);
    if (r + 1 < n || r % 2 == 1) {
      INFO(mismatch[r]);
      REQUIRE(mismatch[r].find("8 bytes") != std::string::npos);
      REQUIRE(mismatch[r].find("16 bytes") != std::string::npos);
    }
    REQUIRE(reserved[r].find("reserved") != std::string::npos);
  }
}

TEST_CASE("tp and dp groups of a topology run concurrently on the same threads", "[comm][local]") {
  auto topo = Topology::create({.tp = 2, .pp = 2, .dp = 2}, 8);
  REQUIRE(topo.is_ok());
  const Topology& t = topo.value();
  const int n = t.world_size();
  const size_t count = 10007;
  std::vector<std::vector<float>> tp_buf = inputs<float>(n, count, 11),
                                  dp_buf = inputs<float>(n, count, 12);
  std::vector<std::vector<int32_t>> pp_buf = inputs<int32_t>(n, 3, 13);
  auto tp_in = tp_buf, dp_in = dp_buf;
  auto pp_in = pp_buf;
  LocalFabric fabric = make_fabric(n);
  std::vector<int> barrier_passed(n, 0);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    auto world = fabric.world(r);
    auto tp = world->group(t.tp_group(r));
    auto dp = world->group(t.dp_group(r));
    auto pp = world->group(t.pp_group(r));
    auto emb =
        world->group(t.embedding_group(r));  // same members as pp here: a separate communicator
    for (auto* g : {&tp, &dp, &pp, &emb}) {
      if (!g->is_ok()) return g->status().message();
    }
    // Issue on every group before waiting on any.
    WorkPtr a = (*tp)->all_reduce(tp_buf[r].data(), count, DType::f32, ReduceOp::sum);
    WorkPtr b = (*dp)->all_reduce(dp_buf[r].data(), count, DType::f32, ReduceOp::max);
    WorkPtr c = (*pp)->all_reduce(pp_buf[r].data(), 3, DType::i32, ReduceOp::sum);
    WorkPtr d = (*emb)->barrier();
    Status st = wait_all({a, b, c, d});
    barrier_passed[r] = 1;
    return text(st);
  }));
  for (int r = 0; r < n; ++r) {
    auto expect = [&](const auto& in, const std::vector<int>& members, ReduceOp op) {
      std::remove_cvref_t<decltype(in)> sub;
      for (int m : members) sub.push_back(in[m]);
      return serial_reduce(sub, op);
    };
    REQUIRE(bitwise_equal(tp_buf[r], expect(tp_in, t.tp_group(r), ReduceOp::sum)));
    REQUIRE(bitwise_equal(dp_buf[r], expect(dp_in, t.dp_group(r), ReduceOp::max)));
    REQUIRE(pp_buf[r] == expect(pp_in, t.pp_group(r), ReduceOp::sum));
  }
}

TEST_CASE("async: calls return at once and the caller overlaps two groups", "[comm][local]") {
  // Rank 1 delays its part; rank 0's calls must return before rank 1 joins.
  const int n = 2;
  LocalFabric fabric = make_fabric(n);
  std::atomic<bool> rank1_joined{false};
  std::vector<int> returned_early(n, 0), test_false_early(n, 0);
  std::vector<float> x(1000, 1.f), y(1000, 2.f), x1(1000, 3.f), y1(1000, 4.f);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    auto world = fabric.world(r);
    auto g1 = world->everyone();
    auto g2 = world->group({0, 1});
    if (!g1.is_ok() || !g2.is_ok()) return "group failed";
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    WorkPtr a = (*g1)->all_reduce(r == 0 ? x.data() : x1.data(), 1000, DType::f32, ReduceOp::sum);
    WorkPtr b = (*g2)->all_reduce(r == 0 ? y.data() : y1.data(), 1000, DType::f32, ReduceOp::sum);
    if (r == 0) {
      returned_early[0] = !rank1_joined.load();
      test_false_early[0] = !a->test() && !b->test();
    } else {
      rank1_joined = true;
    }
    Status st = wait_all({a, b});
    if (st.is_ok() && !(a->test() && b->test())) return "test() false after wait";
    return text(st);
  }));
  REQUIRE(returned_early[0] == 1);
  REQUIRE(test_false_early[0] == 1);
  REQUIRE(x == std::vector<float>(1000, 4.f));
  REQUIRE(y1 == std::vector<float>(1000, 6.f));
}

TEST_CASE("barrier, group validation and misuse seen alike by every rank", "[comm][local]") {
  const int n = 3;
  LocalFabric fabric = make_fabric(n);
  std::vector<std::string> bad_dtype(n), disagree(n), bad_root(n), bad_counts(n), after(n);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    auto world = fabric.world(r);
    auto not_member = world->group({(r + 1) % n});
    if (not_member.is_ok() ||
        not_member.status().message().find("not a member") == std::string::npos) {
      return "group() without this rank was not refused";
    }
    if (world->group({r, r}).is_ok()) return "duplicate member accepted";
    if (world->group({r, n}).is_ok()) return "out-of-range member accepted";
    if (world->group({}).is_ok()) return "empty group accepted";
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    for (int i = 0; i < 3; ++i) {
      if (Status st = comm->barrier()->wait(); !st.is_ok()) return st.message();
    }
    uint16_t h[4] = {};
    bad_dtype[r] = text(comm->all_reduce(h, 4, DType::u16, ReduceOp::sum)->wait());
    float f[8] = {};
    disagree[r] = text(comm->all_reduce(f, r == 2 ? 8 : 4, DType::f32, ReduceOp::sum)->wait());
    bad_root[r] = text(comm->broadcast(f, 4, DType::f32, n)->wait());
    const size_t two[2] = {1, 1};
    bad_counts[r] = text(comm->all_gather_v(f, f, two, DType::f32)->wait());
    after[r] = text(comm->all_reduce(f, 8, DType::f32, ReduceOp::sum)->wait());  // still usable
    return "";
  }));
  for (int r = 0; r < n; ++r) {
    INFO(bad_dtype[r] << "\n" << disagree[r] << "\n" << bad_root[r] << "\n" << bad_counts[r]);
    REQUIRE(bad_dtype[r].find("cannot reduce u16") != std::string::npos);
    REQUIRE(disagree[r].find("disagree (count 4 vs 8)") != std::string::npos);
    REQUIRE(bad_root[r].find("root 3") != std::string::npos);
    REQUIRE(bad_counts[r].find("2 counts for a group of 3") != std::string::npos);
    REQUIRE(after[r] == "");
  }
}

TEST_CASE("abort: every rank's pending and later operations fail naming the rank, fast",
          "[comm][local]") {
  const int n = 4;
  LocalFabric fabric = make_fabric(n);
  std::vector<std::string> pending(n), p2p(n), later(n), created(n), boot(n);
  std::vector<double> seconds(n, 0);
  std::atomic<int> ready{0};
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    auto world = fabric.world(r);
    auto bootstrap = fabric.bootstrap(r);
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    auto second = world->group({0, 1, 2, 3});
    if (!second.is_ok()) return second.status().message();
    if (r == 3) {  // the rank whose actor "dies": never takes part; the supervisor aborts it
      ready.fetch_add(1);
      while (ready.load() < n) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      fabric.abort(3, "actor crashed (test)");
      return "";
    }
    std::vector<float> buf(100000, 1.f);
    float one = 0;
    const auto start = Clock::now();
    WorkPtr a = comm->all_reduce(buf.data(), buf.size(), DType::f32, ReduceOp::sum);
    WorkPtr b = (*second)->recv(&one, 1, DType::f32, (r + 1) % n, 5);
    ready.fetch_add(1);
    pending[r] = text(a->wait());
    p2p[r] = text(b->wait());
    seconds[r] = std::chrono::duration<double>(Clock::now() - start).count();
    later[r] = text(comm->barrier()->wait());
    auto g = world->group({r});
    created[r] = g.is_ok() ? "" : g.status().message();
    auto gathered = bootstrap->all_gather("k", "x");
    boot[r] = gathered.is_ok() ? "" : gathered.status().message();
    return "";
  }));
  REQUIRE(!fabric.status().is_ok());
  for (int r = 0; r < n - 1; ++r) {
    INFO("rank " << r << ": " << pending[r] << "\n" << p2p[r] << "\n" << later[r]);
    for (const std::string* m : {&pending[r], &p2p[r], &later[r], &created[r], &boot[r]}) {
      REQUIRE(m->find("rank 3 aborted: actor crashed (test)") != std::string::npos);
    }
    REQUIRE(pending[r].find("all_reduce on rank " + std::to_string(r)) != std::string::npos);
    REQUIRE(seconds[r] < 1.0);
  }
}

TEST_CASE("timeout: a rank that never arrives fails the fabric, naming it", "[comm][local]") {
  const int n = 3;
  LocalFabric fabric = make_fabric(n, {.timeout = std::chrono::milliseconds(150)});
  std::vector<std::string> result(n);
  std::vector<double> seconds(n, 0);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    std::string err;
    auto comm = everyone(fabric, r, &err);
    if (!comm) return err;
    if (r == 1) return "";  // never calls the collective
    const auto start = Clock::now();
    float x = 1;
    result[r] = text(comm->all_reduce(&x, 1, DType::f32, ReduceOp::sum)->wait());
    seconds[r] = std::chrono::duration<double>(Clock::now() - start).count();
    return "";
  }));
  for (int r : {0, 2}) {
    INFO(result[r]);
    REQUIRE(result[r].find("timeout") != std::string::npos);
    REQUIRE(result[r].find("for rank(s) [1]") != std::string::npos);
    REQUIRE(seconds[r] < 1.0);
  }
  // An unmatched recv times out in Work::wait.
  LocalFabric f2 = make_fabric(2, {.timeout = std::chrono::milliseconds(100)});
  auto world = f2.world(0);
  auto comm = world->group({0, 1});
  REQUIRE(comm.is_ok());
  float y = 0;
  Status st = (*comm)->recv(&y, 1, DType::f32, 1, 3)->wait();
  REQUIRE(st.message().find("recv from rank 1 (tag 3)") != std::string::npos);
  REQUIRE(st.message().find("timeout") != std::string::npos);
}

TEST_CASE("in-process bootstrap: all_gather in rank order, barrier, keys used once",
          "[comm][local]") {
  const int n = 5;
  LocalFabric fabric = make_fabric(n);
  std::vector<std::vector<std::string>> got(n);
  std::vector<std::string> reuse(n);
  require_all_ok(run_ranks(n, [&](int r) -> std::string {
    auto b = fabric.bootstrap(r);
    if (b->rank() != r || b->world_size() != n) return "wrong rank or size";
    auto g = b->all_gather("addresses", "blob-" + std::to_string(r));
    if (!g.is_ok()) return g.status().message();
    got[r] = g.value();
    if (Status st = b->barrier("after"); !st.is_ok()) return st.message();
    auto again = b->all_gather("addresses", "x");
    reuse[r] = again.is_ok() ? "" : again.status().message();
    return "";
  }));
  for (int r = 0; r < n; ++r) {
    REQUIRE(got[r] == std::vector<std::string>{"blob-0", "blob-1", "blob-2", "blob-3", "blob-4"});
    REQUIRE(reuse[r].find("use each bootstrap key once") != std::string::npos);
  }
}

TEST_CASE("LocalFabric::create refuses bad sizes", "[comm][local]") {
  auto f = LocalFabric::create(0);
  REQUIRE_FALSE(f.is_ok());
  REQUIRE(f.status().message().find("size 0") != std::string::npos);
  REQUIRE_FALSE(LocalFabric::create(2, {.timeout = std::chrono::milliseconds(-1)}).is_ok());
}

// The data-movement kernels against plain loops: every source count (fold shapes), destinations
// at every alignment (streaming stores cover only whole 64-byte lines), a destination that is a
// source, lengths around the chunk and line sizes.
TEST_CASE("reduce_to equals the serial reduction for every destination", "[comm][local]") {
  for (bool streaming : {false, true}) {
    for (int n = 1; n <= 9; ++n) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{17}, size_t{4096 * 3 + 5}}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
          INFO("streaming=" << streaming << " n=" << n << " count=" << count
                            << " op=" << reduce_op_name(op));
          std::vector<std::vector<float>> in;
          for (int j = 0; j < n; ++j) {
            std::vector<float> v(count);
            std::mt19937_64 rng(count * 10 + j);
            std::normal_distribution<float> g(0.f, 100.f);
            for (auto& x : v) x = g(rng);
            in.push_back(v);
          }
          const std::vector<float> expected = count ? serial_reduce(in, op) : std::vector<float>{};
          std::vector<const void*> srcs;
          for (auto& v : in) srcs.push_back(v.data());
          // Three fresh destinations at element offsets 0, 1 and 3, plus source 0 itself.
          std::vector<std::vector<float>> out(3, std::vector<float>(count + 8, -7.f));
          const size_t shift[3] = {0, 1, 3};
          std::vector<void*> dsts = {out[0].data() + shift[0], out[1].data() + shift[1],
                                     out[2].data() + shift[2], in[0].data()};
          detail::reduce_to(dsts, srcs, count, DType::f32, op, streaming);
          for (int d = 0; d < 3; ++d) {
            REQUIRE(bitwise_equal(
                std::vector<float>(out[d].begin() + shift[d], out[d].begin() + shift[d] + count),
                expected));
            for (size_t k = 0; k < out[d].size(); ++k) {
              if (k < shift[d] || k >= shift[d] + count) REQUIRE(out[d][k] == -7.f);
            }
          }
          REQUIRE(bitwise_equal(in[0], expected));
        }
      }
    }
  }
  // The other dtypes, through one shape.
  auto check = [](auto zero, DType dtype) {
    using T = decltype(zero);
    const size_t count = 5000;
    std::vector<std::vector<T>> in = inputs<T>(5, count, 9);
    std::vector<const void*> srcs;
    for (auto& v : in) srcs.push_back(v.data());
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      std::vector<T> out(count + 1);
      void* dst = out.data() + 1;
      detail::reduce_to({&dst, 1}, srcs, count, dtype, op, true);
      REQUIRE(std::vector<T>(out.begin() + 1, out.end()) == serial_reduce(in, op));
    }
  };
  check(double{}, DType::f64);
  check(int32_t{}, DType::i32);
  check(int64_t{}, DType::i64);
}

TEST_CASE("copy_to copies to every destination and skips the source", "[comm][local]") {
  for (bool streaming : {false, true}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{200},
                         size_t{16384}, size_t{16384 * 2 + 100}}) {
      for (size_t src_shift : {size_t{0}, size_t{5}}) {
        INFO("streaming=" << streaming << " bytes=" << bytes << " src_shift=" << src_shift);
        std::vector<uint8_t> src = integer_valued<uint8_t>(bytes + 8, bytes, 0, 255);
        const std::vector<uint8_t> src_before = src;
        std::vector<std::vector<uint8_t>> out(4, std::vector<uint8_t>(bytes + 80, 0xAB));
        const size_t shift[4] = {0, 1, 31, 63};
        std::vector<void*> dsts;
        for (int d = 0; d < 4; ++d) dsts.push_back(out[d].data() + shift[d]);
        dsts.push_back(src.data() + src_shift);  // the source itself: left alone
        detail::copy_to(dsts, src.data() + src_shift, bytes, streaming);
        REQUIRE(src == src_before);
        for (int d = 0; d < 4; ++d) {
          for (size_t k = 0; k < out[d].size(); ++k) {
            const bool inside = k >= shift[d] && k < shift[d] + bytes;
            REQUIRE(out[d][k] == (inside ? src[src_shift + k - shift[d]] : 0xAB));
          }
        }
      }
    }
  }
}
