// The flight recorder (comm/flight_recorder.hpp): the ring keeps the newest operations; over a
// local fabric of 3 and 4 ranks with odd sizes every member records a group's collectives with the
// same sequence numbers, kinds and bytes, completed; p2p is numbered per peer and direction; a
// failed operation shows failed; a wait in progress shows started to another thread. What a record
// costs is bench/flight_recorder_cost.cpp's to measure, not a test's.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "comm/flight_recorder.hpp"
#include "comm/local/local_world.hpp"

using namespace troupe;
using namespace troupe::comm;

namespace {

LocalFabric make_fabric(int n, LocalFabricOptions options = {}) {
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

// A recorded group of `members` for world rank r.
std::unique_ptr<Communicator> recorded(const LocalFabric& fabric, int r,
                                       const std::vector<int>& members,
                                       const std::shared_ptr<FlightRecorder>& recorder,
                                       const std::string& name, std::string& error) {
  auto g = fabric.world(r)->group(members);
  if (!g) {
    error = g.status().message();
    return nullptr;
  }
  return record_flight(std::move(g).value(), recorder, name, members);
}

std::string text(const Status& s) {
  return s.is_ok() ? "" : s.message();
}

}  // namespace

TEST_CASE("the ring wraps and keeps the newest operations", "[comm][flight]") {
  FlightRecorder rec(5, 4);
  const int g = rec.add_group("tp", {4, 5});
  std::vector<uint64_t> ids;
  for (int i = 0; i < 10; ++i) {
    FlightOp op;
    op.seq = static_cast<uint64_t>(i + 1);
    op.kind = FlightKind::all_reduce;
    op.group = g;
    op.bytes = static_cast<uint64_t>(i);
    ids.push_back(rec.issue(op));
  }
  CHECK(ids.front() == 0);
  CHECK(ids.back() == 9);
  // Ids the ring overwrote are not updated; live ones are.
  rec.finished(2, true);
  rec.started(8);
  rec.finished(9, false);
  const FlightRecord all = rec.snapshot();
  CHECK(all.rank == 5);
  CHECK(all.capacity == 4);
  CHECK(all.recorded == 10);
  REQUIRE(all.ops.size() == 4);
  for (size_t k = 0; k < 4; ++k) {
    CHECK(all.ops[k].id == 6 + k);
    CHECK(all.ops[k].seq == 7 + k);
    CHECK(all.ops[k].bytes == 6 + k);
  }
  CHECK(all.ops[0].state == FlightState::scheduled);
  CHECK(all.ops[2].state == FlightState::started);
  CHECK(all.ops[2].started_ns >= all.ops[2].enqueued_ns);
  CHECK(all.ops[3].state == FlightState::failed);
  CHECK(all.ops[3].finished_ns >= all.ops[3].enqueued_ns);
  const FlightRecord last2 = rec.snapshot(2);
  REQUIRE(last2.ops.size() == 2);
  CHECK(last2.ops[0].id == 8);
  CHECK(last2.ops[1].id == 9);
  REQUIRE(all.groups.size() == 1);
  CHECK(all.groups[0].name == "tp");
  CHECK(all.groups[0].members == std::vector<int>{4, 5});
  // Fewer operations than the capacity: all of them, oldest first.
  FlightRecorder small(0, 8);
  small.issue(FlightOp{});
  small.issue(FlightOp{});
  const FlightRecord two = small.snapshot();
  REQUIRE(two.ops.size() == 2);
  CHECK(two.ops[0].id == 0);
  CHECK(two.ops[1].id == 1);
  CHECK(small.snapshot(5).ops.size() == 2);
}

TEST_CASE("every member of a group records its collectives with the same seq, kind and bytes",
          "[comm][flight]") {
  for (const int n : {3, 4}) {
    INFO(n << " ranks");
    LocalFabric fabric = make_fabric(n);
    std::vector<std::shared_ptr<FlightRecorder>> recs;
    for (int r = 0; r < n; ++r) recs.push_back(std::make_shared<FlightRecorder>(r));
    std::vector<int> everyone(static_cast<size_t>(n));
    std::iota(everyone.begin(), everyone.end(), 0);
    // Odd sizes: 7 floats, _v counts {3, 0, 5, (2)}, a broadcast of 13 doubles from the last rank.
    std::vector<size_t> counts{3, 0, 5, 2};
    counts.resize(static_cast<size_t>(n));
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    const auto errors = run_ranks(n, [&](int r) -> std::string {
      std::string error;
      auto world = recorded(fabric, r, everyone, recs[static_cast<size_t>(r)], "world", error);
      if (!world) return error;
      // A pair group of ranks 0 and 1 (the others are not in it).
      std::unique_ptr<Communicator> pair;
      if (r < 2) pair = recorded(fabric, r, {0, 1}, recs[static_cast<size_t>(r)], "tp", error);
      if (r < 2 && !pair) return error;
      std::vector<float> a(7, 1.0f), one(1, 2.0f);
      std::vector<float> send(total, 1.0f), recv(counts[static_cast<size_t>(r)]);
      std::vector<float> gathered(total);
      std::vector<double> b(13, r);
      std::vector<int32_t> i(5, r);
      std::vector<int32_t> to_all(3 * static_cast<size_t>(n), r), from_all(to_all.size());
      std::vector<WorkPtr> works;
      works.push_back(world->all_reduce(a.data(), a.size(), DType::f32, ReduceOp::sum));
      works.push_back(
          world->reduce_scatter_v(send.data(), recv.data(), counts, DType::f32, ReduceOp::max));
      works.push_back(world->all_gather_v(send.data(), gathered.data(), counts, DType::f32));
      works.push_back(world->broadcast(b.data(), b.size(), DType::f64, n - 1));
      works.push_back(world->barrier());
      works.push_back(world->all_to_all(to_all.data(), from_all.data(), 3, DType::i32));
      if (pair) works.push_back(pair->all_reduce(i.data(), i.size(), DType::i32, ReduceOp::sum));
      works.push_back(world->all_reduce(one.data(), 1, DType::f32, ReduceOp::sum));
      // Some waited, some only tested until done.
      for (size_t k = 0; k < works.size(); ++k) {
        if (k % 2 == 0) {
          if (Status st = works[k]->wait(); !st) return st.message();
        } else {
          while (!works[k]->test()) std::this_thread::yield();
        }
      }
      if (a[6] != static_cast<float>(n) || one[0] != 2.0f * n || b[12] != n - 1 ||
          from_all[3 * static_cast<size_t>(n) - 1] != n - 1)
        return "wrong results";
      return "";
    });
    for (const auto& e : errors) REQUIRE(e == "");

    // (group members, seq) -> (kind, bytes) as every member saw it.
    std::map<std::pair<std::vector<int>, uint64_t>, std::map<int, std::pair<FlightKind, uint64_t>>>
        seen;
    for (int r = 0; r < n; ++r) {
      const FlightRecord rec = recs[static_cast<size_t>(r)]->snapshot();
      CHECK(rec.recorded == (r < 2 ? 8u : 7u));
      for (const FlightOp& op : rec.ops) {
        CHECK(op.state == FlightState::completed);
        CHECK(op.finished_ns >= op.enqueued_ns);
        seen[{rec.groups[static_cast<size_t>(op.group)].members, op.seq}][r] = {op.kind, op.bytes};
      }
      // The world's collectives in issue order, seq 1..7, with their bytes (all_to_all: what this
      // rank sends).
      std::vector<FlightOp> world_ops;
      for (const FlightOp& op : rec.ops)
        if (rec.groups[static_cast<size_t>(op.group)].name == "world") world_ops.push_back(op);
      REQUIRE(world_ops.size() == 7);
      const std::vector<std::pair<FlightKind, uint64_t>> expected{
          {FlightKind::all_reduce, 7 * 4},
          {FlightKind::reduce_scatter, total * 4},
          {FlightKind::all_gather, total * 4},
          {FlightKind::broadcast, 13 * 8},
          {FlightKind::barrier, 0},
          {FlightKind::all_to_all, 3 * static_cast<uint64_t>(n) * 4},
          {FlightKind::all_reduce, 4}};
      for (size_t k = 0; k < 7; ++k) {
        CHECK(world_ops[k].seq == k + 1);
        CHECK(world_ops[k].kind == expected[k].first);
        CHECK(world_ops[k].bytes == expected[k].second);
      }
      CHECK(world_ops[3].peer == n - 1);  // the broadcast's root
      CHECK(world_ops[1].op == ReduceOp::max);
      CHECK(world_ops[3].dtype == DType::f64);
      CHECK(std::string(flight_kind_name(world_ops[5].kind)) == "all_to_all");
      CHECK(is_collective(world_ops[5].kind));
    }
    for (const auto& [key, by_rank] : seen) {
      INFO("group of " << key.first.size() << ", seq " << key.second);
      CHECK(by_rank.size() == key.first.size());  // every member has it
      for (const auto& [rank, what] : by_rank) CHECK(what == by_rank.begin()->second);
    }
    CHECK(seen.count({{0, 1}, 1}) == 1);
    CHECK(seen[{{0, 1}, 1}][0] == std::make_pair(FlightKind::all_reduce, uint64_t{5 * 4}));
  }
}

TEST_CASE("send and recv are numbered per peer and direction, with tag and peer",
          "[comm][flight]") {
  const int n = 3;
  LocalFabric fabric = make_fabric(n);
  std::vector<std::shared_ptr<FlightRecorder>> recs;
  for (int r = 0; r < n; ++r) recs.push_back(std::make_shared<FlightRecorder>(r));
  // The pipeline group's members in another order: group rank g is world rank members[g].
  const std::vector<int> members{2, 0, 1};
  const auto errors = run_ranks(n, [&](int r) -> std::string {
    std::string error;
    auto pp = recorded(fabric, r, members, recs[static_cast<size_t>(r)], "pp", error);
    if (!pp) return error;
    const int me = pp->rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
    std::vector<float> out(11, 1.0f), in(11);
    std::vector<WorkPtr> works;
    for (uint64_t tag : {5u, 6u}) {
      works.push_back(pp->send(out.data(), out.size(), DType::f32, next, tag));
      works.push_back(pp->recv(in.data(), in.size(), DType::f32, prev, tag));
    }
    return text(wait_all(works));
  });
  for (const auto& e : errors) REQUIRE(e == "");
  for (int r = 0; r < n; ++r) {
    const FlightRecord rec = recs[static_cast<size_t>(r)]->snapshot();
    REQUIRE(rec.ops.size() == 4);
    const int me = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    const int next = members[static_cast<size_t>((me + 1) % n)],
              prev = members[static_cast<size_t>((me + n - 1) % n)];
    for (size_t k = 0; k < 4; ++k) {
      const FlightOp& op = rec.ops[k];
      CHECK(op.kind == (k % 2 == 0 ? FlightKind::send : FlightKind::recv));
      CHECK(op.peer == (k % 2 == 0 ? next : prev));  // world ranks
      CHECK(op.seq == k / 2 + 1);
      CHECK(op.tag == 5 + k / 2);
      CHECK(op.bytes == 44);
      CHECK(op.state == FlightState::completed);
    }
  }
}

TEST_CASE("a failed operation shows failed, one being waited for shows started", "[comm][flight]") {
  SECTION("a dtype that cannot be reduced fails on every member") {
    const int n = 3;
    LocalFabric fabric = make_fabric(n);
    std::vector<std::shared_ptr<FlightRecorder>> recs;
    for (int r = 0; r < n; ++r) recs.push_back(std::make_shared<FlightRecorder>(r));
    const auto errors = run_ranks(n, [&](int r) -> std::string {
      std::string error;
      auto world = recorded(fabric, r, {0, 1, 2}, recs[static_cast<size_t>(r)], "world", error);
      if (!world) return error;
      std::vector<uint8_t> bytes(9);
      return world->all_reduce(bytes.data(), bytes.size(), DType::u8, ReduceOp::sum)->wait()
                 ? "it did not fail"
                 : "";
    });
    for (const auto& e : errors) REQUIRE(e == "");
    for (const auto& rec : recs) {
      const FlightRecord now = rec->snapshot();
      REQUIRE(now.ops.size() == 1);
      CHECK(now.ops[0].state == FlightState::failed);
      CHECK(now.ops[0].dtype == DType::u8);
      CHECK(now.ops[0].bytes == 9);
    }
  }
  SECTION("a rank aborting fails the others' pending wait; meanwhile it was started") {
    LocalFabric fabric = make_fabric(2);
    auto rec = std::make_shared<FlightRecorder>(0);
    std::atomic<bool> waiting{false};
    std::string result = "not run";
    std::thread rank0([&] {
      std::string error;
      auto world = recorded(fabric, 0, {0, 1}, rec, "world", error);
      if (!world) {
        result = error;
        return;
      }
      std::vector<float> a(3);
      WorkPtr w = world->all_reduce(a.data(), a.size(), DType::f32, ReduceOp::sum);
      waiting = true;
      result = w->wait() ? "it did not fail" : "";
    });
    // Rank 1 joins the group (creating it is collective) but never calls the all-reduce.
    auto world1 = fabric.world(1)->group({0, 1});
    REQUIRE(world1.is_ok());
    while (!waiting) std::this_thread::yield();
    FlightState seen = FlightState::scheduled;
    for (int i = 0; i < 2000 && seen != FlightState::started; ++i) {
      const FlightRecord now = rec->snapshot();  // from this thread, while rank 0 waits
      if (!now.ops.empty()) seen = now.ops.back().state;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(seen == FlightState::started);
    fabric.abort(1, "test");
    rank0.join();
    CHECK(result == "");
    const FlightRecord after = rec->snapshot();
    REQUIRE(after.ops.size() == 1);
    CHECK(after.ops[0].state == FlightState::failed);
    CHECK(after.ops[0].started_ns >= after.ops[0].enqueued_ns);
    CHECK(after.ops[0].finished_ns >= after.ops[0].started_ns);
  }
}

TEST_CASE("the local backend's completion is recorded when it happens, before anybody waits",
          "[comm][flight]") {
  LocalFabric fabric = make_fabric(2);
  std::vector<std::shared_ptr<FlightRecorder>> recs{std::make_shared<FlightRecorder>(0),
                                                    std::make_shared<FlightRecorder>(1)};
  std::atomic<int> recorded_done{0};
  const auto errors = run_ranks(2, [&](int r) -> std::string {
    std::string error;
    auto world = recorded(fabric, r, {0, 1}, recs[static_cast<size_t>(r)], "world", error);
    if (!world) return error;
    std::vector<float> a(5, 1.0f), out(5, 2.0f), in(5);
    std::vector<WorkPtr> works{world->all_reduce(a.data(), a.size(), DType::f32, ReduceOp::sum),
                               world->send(out.data(), out.size(), DType::f32, 1 - r, 9),
                               world->recv(in.data(), in.size(), DType::f32, 1 - r, 9)};
    // Nobody waits or tests: the records turn completed all the same.
    bool all = false;
    for (int i = 0; i < 5000 && !all; ++i) {
      const FlightRecord now = recs[static_cast<size_t>(r)]->snapshot();
      all = now.ops.size() == 3 &&
            std::all_of(now.ops.begin(), now.ops.end(), [](const FlightOp& op) {
              return op.state == FlightState::completed && op.started_ns == 0;
            });
      if (!all) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (all) ++recorded_done;
    return text(wait_all(works));
  });
  for (const auto& e : errors) REQUIRE(e == "");
  CHECK(recorded_done == 2);
  // The waits after the fact changed nothing: still completed, never started.
  for (const auto& rec : recs)
    for (const FlightOp& op : rec->snapshot().ops) {
      CHECK(op.state == FlightState::completed);
      CHECK(op.started_ns == 0);
    }
}

TEST_CASE("flight_record_json writes the documented fields", "[comm][flight]") {
  FlightRecorder rec(3, 8);
  const int g = rec.add_group("pp", {1, 3});
  FlightOp send;
  send.seq = 1;
  send.kind = FlightKind::send;
  send.group = g;
  send.peer = 1;
  send.tag = 42;
  send.bytes = 64;
  rec.finished(rec.issue(send), true);
  FlightOp reduce;
  reduce.seq = 1;
  reduce.kind = FlightKind::all_reduce;
  reduce.group = g;
  reduce.dtype = DType::f64;
  rec.started(rec.issue(reduce));
  const auto j = nlohmann::json::parse(flight_record_json(rec.snapshot()));
  CHECK(j["rank"] == 3);
  CHECK(j["capacity"] == 8);
  CHECK(j["recorded"] == 2);
  REQUIRE(j["ops"].size() == 2);
  const auto& s = j["ops"][0];
  CHECK(s["kind"] == "send");
  CHECK(s["group"] == "pp");
  CHECK(s["members"] == nlohmann::json::array({1, 3}));
  CHECK(s["peer"] == 1);
  CHECK(s["tag"] == 42);
  CHECK(s["bytes"] == 64);
  CHECK(s["state"] == "completed");
  CHECK(s["op"].is_null());
  CHECK(s["wait_us"].is_null());
  CHECK(s["duration_us"].get<double>() >= 0);
  const auto& r = j["ops"][1];
  CHECK(r["kind"] == "all_reduce");
  CHECK(r["op"] == "sum");
  CHECK(r["dtype"] == "f64");
  CHECK(r["peer"].is_null());
  CHECK(r["state"] == "started");
  CHECK(r["wait_us"].get<double>() >= 0);
  CHECK(r["enqueued_unix_us"].get<int64_t>() >= s["enqueued_unix_us"].get<int64_t>());
}

TEST_CASE("an all_to_all is a collective named all_to_all, ready for a backend that issues one", "[comm][flight]") {
  CHECK(std::string(flight_kind_name(FlightKind::all_to_all)) == "all_to_all");
  CHECK(is_collective(FlightKind::all_to_all));
  FlightRecorder rec(0, 4);
  FlightOp op;
  op.seq = 1;
  op.kind = FlightKind::all_to_all;
  op.group = rec.add_group("ep", {0, 1});
  op.bytes = 96;
  rec.finished(rec.issue(op), true);
  const auto j = nlohmann::json::parse(flight_record_json(rec.snapshot()));
  REQUIRE(j["ops"].size() == 1);
  CHECK(j["ops"][0]["kind"] == "all_to_all");
  CHECK(j["ops"][0]["op"].is_null());
  CHECK(j["ops"][0]["peer"].is_null());
  CHECK(j["ops"][0]["bytes"] == 96);
}
