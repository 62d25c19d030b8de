// engine/snapshot_copies.hpp: the buddy ring, the start's report and plan, and the copies made and
// fetched for real (ranks as threads of the local fabric, one folder per "host").
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "comm/local/local_world.hpp"
#include "engine/snapshot_copies.hpp"
#include "storage/checkpoint.hpp"
#include "storage/durable.hpp"
#include "storage/shard_file.hpp"
#include "storage/sharded_checkpoint.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

std::vector<SnapshotPeer> peers_of(const std::vector<int>& nodes) {
  std::vector<SnapshotPeer> peers;
  std::map<int, int> count;
  for (int n : nodes) peers.push_back({n, count[n]++});
  return peers;
}

TEST_CASE("snapshot buddies: a ring of hosts, never the own host", "[snapshot_copies]") {
  CHECK(snapshot_buddies(peers_of({0, 0, 0})) == std::vector<int>{-1, -1, -1});
  CHECK(snapshot_buddies(peers_of({0, 0, 1, 1})) == std::vector<int>{2, 3, 0, 1});
  // Uneven hosts: local rank modulo the next host's count.
  CHECK(snapshot_buddies(peers_of({0, 0, 1, 2, 2, 2})) == std::vector<int>{2, 2, 3, 0, 1, 0});
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int hosts = 2 + static_cast<int>(rng() % 5);
    std::vector<int> nodes;
    for (int h = 0; h < hosts; ++h)
      for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) nodes.push_back(h * 3 + 1);  // sparse node ids
    std::shuffle(nodes.begin(), nodes.end(), rng);
    const auto peers = peers_of(nodes);
    const auto buddies = snapshot_buddies(peers);
    std::vector<int> ids;
    for (const auto& p : peers) ids.push_back(p.node);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (size_t p = 0; p < peers.size(); ++p) {
      const int b = buddies[p];
      REQUIRE(b >= 0);
      const size_t at = static_cast<size_t>(std::find(ids.begin(), ids.end(), peers[p].node) - ids.begin());
      CHECK(peers[static_cast<size_t>(b)].node == ids[(at + 1) % ids.size()]);  // the next host
    }
  }
}

SnapshotReport random_report(std::mt19937& rng) {
  SnapshotReport r;
  r.restarted = rng() % 2 == 0;
  if (rng() % 4 != 0) r.expected_run = fmt::format("{:x}", rng());
  r.disk_latest = static_cast<int64_t>(rng() % 50) - 1;
  int64_t it = rng() % 20;
  for (int k = static_cast<int>(rng() % 4); k > 0; --k) {
    HeldIteration h;
    h.iteration = it;
    it += 1 + rng() % 30;
    if (rng() % 5 != 0) h.run_id = fmt::format("{:x}", rng());
    h.shards = static_cast<int>(rng() % 9);
    for (int s = 0; s < h.shards; ++s)
      if (rng() % 2 == 0) h.present.push_back(s);
    r.held.push_back(h);
  }
  return r;
}

bool same(const SnapshotReport& a, const SnapshotReport& b) {
  if (a.restarted != b.restarted || a.expected_run != b.expected_run || a.disk_latest != b.disk_latest ||
      a.held.size() != b.held.size())
    return false;
  for (size_t i = 0; i < a.held.size(); ++i)
    if (a.held[i].iteration != b.held[i].iteration || a.held[i].run_id != b.held[i].run_id ||
        a.held[i].shards != b.held[i].shards || a.held[i].present != b.held[i].present)
      return false;
  return true;
}

TEST_CASE("snapshot reports: round trip; every cut and bad field refused", "[snapshot_copies]") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const SnapshotReport r = random_report(rng);
    const std::string text = encode_snapshot_report(r);
    auto back = parse_snapshot_report(text);
    REQUIRE(back.is_ok());
    CHECK(same(back.value(), r));
    // Any strict prefix is refused (the last line's newline is required), as is a trailing byte.
    const size_t cut = rng() % text.size();
    CHECK_FALSE(parse_snapshot_report(text.substr(0, cut)).is_ok());
    CHECK_FALSE(parse_snapshot_report(text + "x").is_ok());
  }
  for (const char* bad : {"snapshots 2 1 ab 3 0\n", "snapshots 1 2 ab 3 0\n", "snapshots 1 1 AB 3 0\n",
                          "snapshots 1 1 ab -2 0\n", "snapshots 1 1 ab 3 1\n5 ab 4 0,0\n",
                          "snapshots 1 1 ab 3 1\n5 ab 4 1,0\n", "snapshots 1 1 ab 3 1\n5 ab 4 4\n",
                          "snapshots 1 1 ab 3 1\n5 ab 2 0,1,2\n", "snapshots 1 1 ab 3 2\n7 ab 4 -\n5 ab 4 -\n",
                          "snapshots 1 1 ab 3 1\n5 ab 4\n", "snapshots 1 1 ab 03 0\n",
                          "snapshots 1 1 ab 3 1\n5 ab 2097152 -\n", "snapshots 1 1 ab 3 1\n10000000 ab 4 -\n",
                          "snapshots 1 1 ab 3 2\n5 ab 4 -\n", "snapshots 1 1 ab 3 0\n5 ab 4 -\n",
                          "snapshots 1 1 ab 3\n", "snapshots 1 1 ab -0 0\n", "snapshots 1 1 ab +3 0\n"}) {
    INFO(bad);
    CHECK_FALSE(parse_snapshot_report(bad).is_ok());
  }
  CHECK(parse_snapshot_report("snapshots 1 1 ab -1 1\n5 - 0 -\n").is_ok());
}

HeldIteration held(int64_t it, const std::string& run, int shards, std::vector<int> present) {
  HeldIteration h;
  h.iteration = it;
  h.run_id = run;
  h.shards = shards;
  h.present = std::move(present);
  return h;
}

TEST_CASE("snapshot recovery plan: rank 0 decides; the newest whole snapshot; the lacking host fetches",
          "[snapshot_copies]") {
  const auto peers = peers_of({0, 0, 1, 1});
  auto reports = [&](bool restarted, const std::string& run, int64_t disk) {
    std::vector<SnapshotReport> r(4);
    for (int p = 0; p < 4; ++p) {
      r[static_cast<size_t>(p)].restarted = restarted;
      r[static_cast<size_t>(p)].expected_run = run;
      r[static_cast<size_t>(p)].disk_latest = disk;
    }
    // Host 0 holds everything of 20 (own shards and host 1's copies) and half of 30; host 1 lost its folder.
    for (int p : {0, 1}) {
      r[static_cast<size_t>(p)].held = {held(20, "ab", 4, {0, 1, 2, 3}), held(30, "ab", 4, {0, 1})};
    }
    return r;
  };
  RecoveryPlan plan = plan_snapshot_recovery(reports(true, "ab", -1), peers);
  CHECK(plan.iteration == 20);
  CHECK(plan.metadata_from == 0);
  REQUIRE(plan.fetches.size() == 4);
  std::set<int> shards;
  for (const ShardFetch& f : plan.fetches) {
    shards.insert(f.shard);
    CHECK(peers[static_cast<size_t>(f.from)].node == 0);
    CHECK(peers[static_cast<size_t>(f.to)].node == 1);
  }
  CHECK(shards == std::set<int>{0, 1, 2, 3});
  CHECK(plan_snapshot_recovery(reports(false, "ab", -1), peers).iteration == -1);  // rank 0 not restarted
  CHECK(plan_snapshot_recovery(reports(true, "cd", -1), peers).iteration == -1);   // another run's
  CHECK(plan_snapshot_recovery(reports(true, "ab", 20), peers).iteration == -1);   // the save is as new
  CHECK(plan_snapshot_recovery(reports(true, "", -1), peers).iteration == -1);
  // Both hosts whole: nothing to fetch.
  auto whole = reports(true, "ab", -1);
  for (int p : {2, 3}) whole[static_cast<size_t>(p)].held = {held(20, "ab", 4, {0, 1, 2, 3})};
  plan = plan_snapshot_recovery(whole, peers);
  CHECK(plan.iteration == 20);
  CHECK(plan.fetches.empty());
  // Three hosts, one lost: the buddy copies of the lost host's shards are on the next host.
  const auto three = peers_of({0, 1, 2});
  std::vector<SnapshotReport> r3(3);
  for (auto& r : r3) {
    r.restarted = true;
    r.expected_run = "ab";
  }
  r3[0].held = {held(8, "ab", 3, {0, 2})};  // own 0, host 2's copy
  r3[1].held = {held(8, "ab", 3, {0, 1})};  // own 1, host 0's copy
  plan = plan_snapshot_recovery(r3, three);
  CHECK(plan.iteration == 8);
  REQUIRE(plan.fetches.size() == 5);  // host 0 lacks 1, host 1 lacks 2, host 2 lacks all three
  // A shard on no host: that snapshot cannot be resumed.
  r3[0].held = {held(8, "ab", 3, {0})};
  CHECK(plan_snapshot_recovery(r3, three).iteration == -1);
  // An elastic round of another size: a snapshot written by 2 processes (host 0 alone), resumed by
  // 4 on two hosts -- the new host fetches both shards; one of 6 processes likewise.
  auto grown = reports(true, "ab", -1);
  for (int p : {0, 1}) grown[static_cast<size_t>(p)].held = {held(140, "ab", 2, {0, 1})};
  plan = plan_snapshot_recovery(grown, peers);
  CHECK(plan.iteration == 140);
  REQUIRE(plan.fetches.size() == 2);
  CHECK(plan.fetches[0].shard == 0);
  CHECK(plan.fetches[1].shard == 1);
  for (const ShardFetch& f : plan.fetches) CHECK(peers[static_cast<size_t>(f.to)].node == 1);
  CHECK(plan.fetches[0].to != plan.fetches[1].to);  // spread over host 1's processes
  auto shrunk = reports(true, "ab", -1);
  for (int p : {0, 1}) shrunk[static_cast<size_t>(p)].held = {held(60, "ab", 6, {0, 1, 2, 3, 4, 5})};
  plan = plan_snapshot_recovery(shrunk, peers);
  CHECK(plan.iteration == 60);
  CHECK(plan.fetches.size() == 6);
  // Reports that disagree on an iteration's shard count: the disagreeing one is left out.
  grown[2].held = {held(140, "ab", 3, {0, 1, 2})};
  plan = plan_snapshot_recovery(grown, peers);
  CHECK(plan.iteration == 140);
  CHECK(plan.fetches.size() == 2);
}

// With the shards each rank reads known (metadata.json's reads), a host fetches those its ranks
// read and lacks, not every shard it lacks.
TEST_CASE("snapshot recovery plan: with each rank's reads, a host fetches only what its ranks read",
          "[snapshot_copies][coverage]") {
  const auto three = peers_of({0, 0, 1, 1, 2});
  std::vector<SnapshotReport> r(5);
  for (auto& x : r) {
    x.restarted = true;
    x.expected_run = "ab";
  }
  for (int p : {0, 1}) r[static_cast<size_t>(p)].held = {held(8, "ab", 5, {0, 1, 4})};
  r[4].held = {held(8, "ab", 5, {2, 3, 4})};  // host 1 lost
  const std::vector<std::vector<int>> reads = {{0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}};
  RecoveryPlan plan = plan_snapshot_recovery(r, three, reads);
  CHECK(plan.iteration == 8);
  CHECK(plan.by_reads);
  std::map<int, std::set<int>> into;
  for (const ShardFetch& f : plan.fetches) into[three[static_cast<size_t>(f.to)].node].insert(f.shard);
  CHECK(into == std::map<int, std::set<int>>{{1, {0, 2, 3}}, {2, {0}}});
  // Without them (or for another number of processes), everything each host lacks.
  plan = plan_snapshot_recovery(r, three);
  CHECK_FALSE(plan.by_reads);
  CHECK(plan.fetches.size() == 9);
  plan = plan_snapshot_recovery(r, three, {{0}, {1}});
  CHECK_FALSE(plan.by_reads);
  CHECK(plan.fetches.size() == 9);
}

// A restarted process's recovery of run `run` from its host's folder `dir`.
Result<SnapshotCopies::Recovered> restart_from(SnapshotCopies& copies, const std::string& dir, const std::string& run) {
  SnapshotReport mine;
  mine.restarted = true;
  mine.expected_run = run;
  mine.held = held_iterations(dir);
  return copies.recover(dir, mine);
}

// Ranks as threads, `nodes[r]` their hosts, each host a folder of its own.
void run_ranks(const std::vector<int>& nodes, const std::function<std::string(int, SnapshotCopies&)>& body) {
  const int n = static_cast<int>(nodes.size());
  auto fabric = comm::LocalFabric::create(n);
  REQUIRE(fabric.is_ok());
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  const auto peers = peers_of(nodes);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto world = fabric->world(r);
      auto boot = fabric->bootstrap(r);
      auto copies = SnapshotCopies::open(*boot, *world, peers[static_cast<size_t>(r)].node,
                                         peers[static_cast<size_t>(r)].local_rank);
      errors[static_cast<size_t>(r)] = copies ? body(r, *copies.value()) : copies.status().message();
      // A rank that failed ends the others' waits, as a process that exits ends its peers'.
      if (!errors[static_cast<size_t>(r)].empty()) fabric->abort(r, errors[static_cast<size_t>(r)]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<size_t>(r)] == "");
  }
}

TEST_CASE("snapshot copies: each shard on the next host; a lost host's folder refilled from the others",
          "[snapshot_copies]") {
  test::TempDir tmp;
  const std::vector<int> nodes = {0, 0, 1, 1, 2};  // three hosts, uneven
  const int n = static_cast<int>(nodes.size());
  const int64_t it = 15;
  auto dir_of = [&](int node) { return (tmp.path() / ("host" + std::to_string(node))).string(); };
  // Rank r owns elements [7r, 7r + 7) of a (n * 7) tensor.
  std::mt19937 rng(3);
  std::vector<float> global(static_cast<size_t>(n * 7));
  for (float& v : global) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  CheckpointMeta meta;
  meta.iteration = it;
  meta.config_json = "{}";
  meta.rng_json = "{}";
  meta.run_json = R"({"id": "ab12"})";
  run_ranks(nodes, [&](int r, SnapshotCopies& copies) -> std::string {
    const std::string dir = dir_of(nodes[static_cast<size_t>(r)]);
    ShardContents c;
    TensorPiece p;
    p.name = "w";
    p.global_shape = Shape{n * 7};
    p.runs = {{7 * r, 7}};
    p.values = Tensor::empty(Shape{7}, DType::f32);
    std::copy_n(global.data() + 7 * r, 7, p.values.data<float>());
    c.sections[ShardSection::model].push_back(std::move(p));
    if (Status st = write_shard_file(shard_file_path(dir, it, r), r, c); !st) return st.message();
    auto exchanged = copies.exchange(dir, it, nullptr);  // no coverage: every host fetches all it lacks
    if (!exchanged) return exchanged.status().message();
    if (!exchanged->reads.empty()) return "reads listed without a coverage";
    if (copies.first_of_host())
      if (Status st = commit_sharded_checkpoint(dir, meta, "{}", shard_file_names(n), exchanged->digests); !st)
        return st.message();
    return "";
  });
  // Each host: its own shards and its predecessor's (host 0 <- host 2, 1 <- 0, 2 <- 1).
  const std::map<int, std::vector<int>> expect = {{0, {0, 1, 4}}, {1, {0, 1, 2, 3}}, {2, {2, 3, 4}}};
  for (const auto& [node, shards] : expect) {
    auto h = held_iterations(dir_of(node));
    REQUIRE(h.size() == 1);
    CHECK(h[0].iteration == it);
    CHECK(h[0].run_id == "ab12");
    CHECK(h[0].shards == n);
    CHECK(h[0].present == shards);
  }
  // A copy damaged in transit is refused by its checksum.
  {
    auto bytes = read_small_file(shard_file_path(dir_of(0), it, 0), size_t{1} << 30);
    REQUIRE(bytes.is_ok());
    CHECK(verify_shard_bytes(bytes.value(), "x").is_ok());
    std::string bad = bytes.value();
    bad[bad.size() - 3] ^= 0x10;
    CHECK_FALSE(verify_shard_bytes(bad, "x").is_ok());
    CHECK_FALSE(verify_shard_bytes(bytes.value().substr(0, 600), "x").is_ok());
  }
  // Host 1 is lost (its tmpfs gone with it): the restart refills its folder from hosts 0 and 2.
  std::filesystem::remove_all(dir_of(1));
  std::vector<int64_t> resumed(static_cast<size_t>(n), -2);
  run_ranks(nodes, [&](int r, SnapshotCopies& copies) -> std::string {
    const std::string dir = dir_of(nodes[static_cast<size_t>(r)]);
    auto got = restart_from(copies, dir, "ab12");
    if (!got) return got.status().message();
    resumed[static_cast<size_t>(r)] = got->iteration;
    return "";
  });
  CHECK(resumed == std::vector<int64_t>(static_cast<size_t>(n), it));
  for (int node : {0, 1, 2}) {
    INFO("host " << node);
    const std::string dir = dir_of(node);
    auto latest = latest_iteration(dir);
    REQUIRE(latest.is_ok());
    CHECK(latest.value() == it);
    auto files = sharded_checkpoint_files(dir, it);
    REQUIRE(files.is_ok());
    auto reader = ShardSetReader::open(files.value());
    REQUIRE(reader.is_ok());
    Tensor back = Tensor::empty(Shape{n * 7}, DType::f32);
    REQUIRE(reader.value()->read(ShardSection::model, "w", Shape{n * 7}, {{0, n * 7}}, back).is_ok());
    CHECK(std::equal(global.begin(), global.end(), back.data<float>()));
  }
}

// The whole path with coverages: at the first exchange every process learns what each shard holds
// and records which shards its rank reads; after a host is lost, each host fetches what its ranks
// read, and each rank loads from its host's folder through only those files.
TEST_CASE("snapshot copies: a lost host fetches the shards its ranks read, and they load from them",
          "[snapshot_copies][coverage]") {
  test::TempDir tmp;
  const std::vector<int> nodes = {0, 0, 1, 1, 2};
  const int n = static_cast<int>(nodes.size());
  auto dir_of = [&](int node) { return (tmp.path() / ("host" + std::to_string(node))).string(); };
  // Rank r owns elements [7r, 7r + 7) of w (n * 7) and reads them; every rank holds the replicated
  // b (5), which rank 0 alone writes.
  std::mt19937 rng(4);
  std::vector<float> w(static_cast<size_t>(n * 7)), b(5);
  for (float& v : w) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (float& v : b) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  auto coverage_of = [&](int r) {
    auto c = std::make_shared<RankCoverage>();
    c->reads = {{ShardSection::model, "w", {{7 * r, 7, 0, 1}}}, {ShardSection::model, "b", {{0, 5, 0, 1}}}};
    c->writes = {{ShardSection::model, "w", {{7 * r, 7, 0, 1}}}};
    if (r == 0) c->writes.push_back({ShardSection::model, "b", {{0, 5, 0, 1}}});
    return c;
  };
  CheckpointMeta meta;
  meta.config_json = meta.rng_json = "{}";
  meta.run_json = R"({"id": "cd34"})";
  for (int64_t it : {10, 20}) {  // the second exchange reuses the first's lists
    meta.iteration = it;
    run_ranks(nodes, [&](int r, SnapshotCopies& copies) -> std::string {
      const std::string dir = dir_of(nodes[static_cast<size_t>(r)]);
      ShardContents c;
      auto piece = [](const std::string& name, int64_t numel, GlobalRun run, const float* from) {
        TensorPiece p;
        p.name = name;
        p.global_shape = Shape{numel};
        p.runs = {run};
        p.values = Tensor::empty(Shape{run.length}, DType::f32);
        std::copy_n(from + run.start, run.length, p.values.data<float>());
        return p;
      };
      c.sections[ShardSection::model].push_back(piece("w", n * 7, {7 * r, 7}, w.data()));
      if (r == 0) c.sections[ShardSection::model].push_back(piece("b", 5, {0, 5}, b.data()));
      if (Status st = write_shard_file(shard_file_path(dir, it, r), r, c); !st) return st.message();
      auto exchanged = copies.exchange(dir, it, coverage_of(r));
      if (!exchanged) return exchanged.status().message();
      if (exchanged->reads != std::vector<std::vector<int>>{{0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}})
        return "wrong reads";
      if (copies.first_of_host())
        if (Status st = commit_sharded_checkpoint(dir, meta, "{}", shard_file_names(n), exchanged->digests,
                                                  exchanged->reads);
            !st)
          return st.message();
      return "";
    });
  }
  std::filesystem::remove_all(dir_of(1));
  std::vector<std::string> notes(static_cast<size_t>(n));
  run_ranks(nodes, [&](int r, SnapshotCopies& copies) -> std::string {
    const std::string dir = dir_of(nodes[static_cast<size_t>(r)]);
    auto got = restart_from(copies, dir, "cd34");
    if (!got) return got.status().message();
    if (got->iteration != 20) return "resumed " + std::to_string(got->iteration);
    notes[static_cast<size_t>(r)] = got->note;
    // The rank loads from its host's folder through the files it reads.
    auto checkpoint = Checkpoint::open(dir, 20);
    if (!checkpoint) return checkpoint.status().message();
    ShardReadOptions deferred;
    deferred.verify_at_open = false;
    auto reader = checkpoint->reader_for(r, n, "{}", deferred);
    if (!reader) return reader.status().message();
    // The lists are the writing layout's: another layout of as many ranks opens every file, which
    // host 1's folder does not hold.
    auto other = checkpoint->reader_for(r, n, R"({"tensor_model_parallel_size": 5})", deferred);
    if (nodes[static_cast<size_t>(r)] == 1 &&
        (other || other.status().message().find("is missing its shard") == std::string::npos))
      return "another layout read the lists of this one";
    Tensor mine_w = Tensor::empty(Shape{7}, DType::f32), all_b = Tensor::empty(Shape{5}, DType::f32);
    if (Status st = (*reader)->read(ShardSection::model, "w", Shape{n * 7}, {{7 * r, 7}}, mine_w); !st) return st.message();
    if (Status st = (*reader)->read(ShardSection::model, "b", Shape{5}, {{0, 5}}, all_b); !st) return st.message();
    if (!std::equal(w.begin() + 7 * r, w.begin() + 7 * r + 7, mine_w.data<float>()) ||
        !std::equal(b.begin(), b.end(), all_b.data<float>()))
      return "the values read differ from those written";
    return "";
  });
  // Host 1 fetched shards 0, 2, 3 (not 1 and 4); host 2 shard 0; host 0 nothing.
  CHECK_THAT(notes[0], Catch::Contains("3 of 5 shards into node 1's folder, 1 of 5 shards into node 2's folder "
                                       "(the shards its ranks read)"));
  CHECK(held_iterations(dir_of(1)).back().present == std::vector<int>{0, 2, 3});
  CHECK(held_iterations(dir_of(2)).back().present == std::vector<int>{0, 2, 3, 4});
  CHECK(held_iterations(dir_of(0)).back().present == std::vector<int>{0, 1, 4});
}


// A job's snapshots one after another (the newest kept, the older dropped, as actors/job.cpp does):
// from the third on, each copy is received into the file of its sender's copy two snapshots before
// (same inode), and what the buddy holds is that snapshot's bytes, never the old ones.
TEST_CASE("snapshot copies: received into the files of copies whose snapshot was dropped", "[snapshot_copies]") {
  test::TempDir tmp;
  const std::vector<int> nodes = {0, 0, 1, 2};  // rank 2 receives ranks 0's and 1's copies
  const int n = static_cast<int>(nodes.size());
  const int64_t numel = 20011;  // per rank: several pages, an odd length
  auto dir_of = [&](int node) { return (tmp.path() / ("host" + std::to_string(node))).string(); };
  const std::vector<int64_t> iterations = {10, 20, 30, 40, 50};
  auto value = [](int64_t it, int r, int64_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * r + 0.011 * static_cast<double>(it)));
  };
  const std::vector<std::vector<int>> expect_in_place = {{0, 0, 1, 1, 1}, {0, 0, 0, 0, 0}, {0, 0, 2, 2, 2}, {0, 0, 1, 1, 1}};
  std::vector<std::vector<int>> in_place(static_cast<size_t>(n));
  std::vector<std::map<int64_t, std::map<int, ino_t>>> inodes(static_cast<size_t>(n));  // by rank: it -> sender -> inode
  CheckpointMeta meta;
  meta.config_json = meta.rng_json = "{}";
  meta.run_json = R"({"id": "ef56"})";
  run_ranks(nodes, [&](int r, SnapshotCopies& copies) -> std::string {
    const std::string dir = dir_of(nodes[static_cast<size_t>(r)]);
    for (int64_t it : iterations) {
      ShardContents c;
      TensorPiece p;
      p.name = "w";
      p.global_shape = Shape{n * numel};
      p.runs = {{r * numel, numel}};
      p.values = Tensor::empty(Shape{numel}, DType::f32);
      for (int64_t i = 0; i < numel; ++i) p.values.data<float>()[i] = value(it, r, r * numel + i);
      c.sections[ShardSection::model].push_back(std::move(p));
      if (Status st = write_shard_file(shard_file_path(dir, it, r), r, c); !st) return st.message();
      auto exchanged = copies.exchange(dir, it, nullptr);
      if (!exchanged) return exchanged.status().message();
      in_place[static_cast<size_t>(r)].push_back(exchanged->copies_in_place);
      // Each copy this rank received: whole, and this snapshot's values.
      for (int from = 0; from < n; ++from) {
        if (from == r || nodes[static_cast<size_t>(from)] == nodes[static_cast<size_t>(r)]) continue;
        const std::string path = shard_file_path(dir, it, from);
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) continue;  // another host's buddy
        if (copies.buddy() < 0) return "no buddy";
        inodes[static_cast<size_t>(r)][it][from] = st.st_ino;
        auto reader = ShardSetReader::open(std::vector<std::string>{path}, [] {
          ShardReadOptions o;
          o.allow_gaps = true;
          return o;
        }());
        if (!reader) return reader.status().message();
        Tensor back = Tensor::empty(Shape{numel}, DType::f32);
        if (Status s = (*reader)->read(ShardSection::model, "w", Shape{n * numel}, {{from * numel, numel}}, back); !s)
          return s.message();
        for (int64_t i = 0; i < numel; ++i)
          if (back.data<float>()[i] != value(it, from, from * numel + i))
            return fmt::format("the copy of rank {}'s shard of iteration {} holds another snapshot's value at {}", from,
                               it, i);
      }
      if (copies.first_of_host()) {
        meta.iteration = it;
        if (Status st = commit_sharded_checkpoint(dir, meta, "{}", shard_file_names(n), exchanged->digests); !st)
          return st.message();
        drop_older_iterations(dir, it);
      }
    }
    return "";
  });
  CHECK(in_place == expect_in_place);
  // Rank 2 (host 1) holds ranks 0's and 1's copies; the files alternate: 30 in 10's, 40 in 20's, 50 in 30's.
  for (int r : {0, 2, 3}) {
    INFO("rank " << r);
    const auto& got = inodes[static_cast<size_t>(r)];
    REQUIRE(got.size() == iterations.size());
    for (const auto& [from, ino] : got.at(30)) {
      CHECK(ino == got.at(10).at(from));
      CHECK(got.at(40).at(from) == got.at(20).at(from));
      CHECK(got.at(50).at(from) == ino);
      CHECK(got.at(20).at(from) != ino);
    }
  }
  // The kept files (in the folders' .recycle) go with the SnapshotCopies that kept them.
  size_t kept = 0;
  for (int node : {0, 1, 2})
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(dir_of(node)) / ".recycle"))
      kept += e.path().filename().string().rfind("copy.", 0) == 0 ? 1 : 0;
  CHECK(kept == 0);  // let go with the SnapshotCopies
}

}  // namespace
}  // namespace troupe
