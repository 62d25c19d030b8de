// What a rank is doing, and who a stalled job waits on (engine/activity.hpp): the wait-for graph on
// hand-made activities (a chain, a collective, a cycle), and on live ranks of a pipeline where one
// rank never starts its step.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "comm/local/local_world.hpp"
#include "comm/topology.hpp"
#include "engine/activity.hpp"
#include "engine/rank_engine.hpp"

using namespace troupe;

namespace {

Activity busy(int rank, Doing d = Doing::forward) {
  Activity a;
  a.rank = rank;
  a.doing = d;
  return a;
}

Activity waits(int rank, std::vector<int> on, bool collective = false, std::string what = "something") {
  Activity a;
  a.rank = rank;
  a.doing = Doing::waiting;
  a.waiting = {std::move(what), std::move(on), collective};
  return a;
}

}  // namespace

TEST_CASE("activity: the culprit of a chain of waits is the rank at its end", "[activity]") {
  const WaitGraph g = wait_graph({waits(0, {1}), waits(1, {2}), busy(2, Doing::backward), busy(3)});
  CHECK(g.culprits == std::vector<int>{2});
  CHECK_FALSE(g.deadlock);
  CHECK(g.edges.size() == 2);
  CHECK_THAT(g.summary, Catch::Contains("rank 2 (pp 0, tp 0, dp 0) step 0: backward") &&
                            Catch::Contains("rank 1 waits on it, 2 ranks in all through them"));
}

TEST_CASE("activity: members that arrived at a collective are not waited on", "[activity]") {
  // Ranks 0 and 1 are in the dp collective {0, 1, 2}; rank 2 is still computing.
  const WaitGraph g = wait_graph({waits(0, {1, 2}, true), waits(1, {0, 2}, true), busy(2)});
  CHECK(g.culprits == std::vector<int>{2});
  REQUIRE(g.edges.size() == 2);
  for (const WaitEdge& e : g.edges) CHECK(e.to == 2);
  CHECK_THAT(g.summary, Catch::Contains("ranks 0, 1 wait on it"));
  // Everyone arrived: no edge, nothing to blame.
  const WaitGraph all = wait_graph({waits(0, {1}, true), waits(1, {0}, true)});
  CHECK(all.edges.empty());
  CHECK(all.culprits.empty());
}

TEST_CASE("activity: waits in a cycle are a deadlock of the cycle's ranks", "[activity]") {
  const WaitGraph g = wait_graph({waits(0, {1}), waits(1, {0}), waits(2, {0}), busy(3)});
  CHECK(g.deadlock);
  CHECK(g.culprits == std::vector<int>{0, 1, 2});
  CHECK_THAT(g.summary, Catch::StartsWith("deadlock: ranks 0, 1, 2"));
  CHECK(wait_graph({busy(0), busy(1)}).summary == "nothing is stuck: no rank is waiting on another");
}

TEST_CASE("activity: a healthy job's passing waits are told from a stall by how long they last", "[activity]") {
  // Steps of 0.4 s: a stall is a wait over 1.2 s (three steps), at least 1 s.
  auto timed = [](Activity a, double seconds, double step) {
    a.seconds_in_state = seconds;
    a.last_step_seconds = step;
    return a;
  };
  std::vector<Activity> healthy = {timed(waits(0, {1}), 0.08, 0.4), timed(busy(1), 0.05, 0.4),
                                   timed(waits(2, {1}), 0.01, 0.3), timed(busy(3), 0.0, 0.4)};
  CHECK(stall_threshold(healthy) == Approx(1.2));
  const WaitGraph ok = wait_graph(healthy, stall_threshold(healthy));
  CHECK_FALSE(ok.stuck);
  CHECK(ok.edges.empty());
  CHECK(ok.momentary.size() == 2);
  CHECK(ok.culprits.empty());
  CHECK_THAT(ok.summary, Catch::StartsWith("nothing is stuck: ranks 0, 2 wait momentarily") &&
                             Catch::Contains("at most 0.08 s") && Catch::Contains("over 1.2 s"));
  // The same picture with rank 0's wait at 5 s: rank 1 is the culprit, rank 2's short wait is not counted.
  std::vector<Activity> stalled = healthy;
  stalled[0].seconds_in_state = 5;
  const WaitGraph bad = wait_graph(stalled, stall_threshold(stalled));
  CHECK(bad.stuck);
  CHECK(bad.culprits == std::vector<int>{1});
  CHECK(bad.edges.size() == 1);
  CHECK(bad.momentary.size() == 1);
  CHECK_THAT(bad.summary, Catch::Contains("rank 0 waits on it"));
  // No step yet: at least 1 s.
  CHECK(stall_threshold({busy(0)}) == 1.0);
  // After a failure every wait counts (threshold 0), as before.
  CHECK(wait_graph(healthy).stuck);
}

TEST_CASE("activity: a rank that never starts its step is named by the others' waits", "[activity]") {
  // pp 4 x dp 2 on threads; rank 6 (the last stage of replica 0... rank numbering from the topology)
  // holds back: every other rank ends up waiting, directly or through others, on it.
  GptConfig model;
  model.num_layers = 4;
  model.hidden_size = 16;
  model.num_attention_heads = 2;
  model.seq_length = 5;
  model.max_position_embeddings = 5;
  model.vocab_size = 23;
  ParallelConfig par;
  par.pp = 4;
  par.dp = 2;
  comm::ParallelSizes sizes;
  sizes.pp = par.pp;
  sizes.dp = par.dp;
  const int world = par.world_size();
  auto topo = comm::Topology::create(sizes, world).value();
  auto fabric = comm::LocalFabric::create(world).value();
  RankSpec spec;
  spec.model = model;
  spec.par = par;
  spec.micro_batch_size = 1;
  spec.micro_batches = 4;
  const int stuck = topo.pp_group(0).back();  // the last stage of rank 0's pipeline
  Tensor tokens = Tensor::empty({4, model.seq_length + 1}, DType::i32);
  std::mt19937 rng(1);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 23);
  std::vector<std::unique_ptr<RankEngine>> engines(world);
  std::vector<std::unique_ptr<comm::Communicator>> keep;
  std::mutex mu;
  std::atomic<int> built{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> threads;
  std::vector<std::string> errors;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto w = fabric.world(r);
      auto g = [&](const std::vector<int>& m) { return w->group(m).value(); };
      auto tp = g(topo.tp_group(r)), pp = g(topo.pp_group(r)), dp = g(topo.dp_group(r));
      const auto emb_members = topo.embedding_group(r);
      auto emb = emb_members.empty() ? nullptr : g(emb_members);
      auto all = w->everyone().value();
      engines[r] = std::make_unique<RankEngine>(spec, topo, r, RankComms{tp.get(), pp.get(), dp.get(), emb.get(), all.get()});
      engines[r]->init(7);
      ++built;
      if (r == stuck)
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      StepRequest req;
      req.step = 1;
      req.lr = 1e-3;
      auto out = engines[r]->train_step(tokens, 1.0 / (8.0 * model.seq_length), req);
      if (!out) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(out.status().message());
      }
    });
  }
  while (built < world) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Wait until every rank but the stuck one waits (or a generous bound passes).
  std::vector<Activity> now;
  for (int tries = 0; tries < 400; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now.clear();
    int waiting = 0;
    for (int r = 0; r < world; ++r) {
      now.push_back(engines[r]->activity().snapshot());
      waiting += now.back().doing == Doing::waiting;
    }
    if (waiting == world - 1) break;
  }
  const WaitGraph g = wait_graph(now);
  if (std::getenv("TROUPE_TEST_VERBOSE")) {
    for (const Activity& a : now) std::printf("  %s\n", a.describe().c_str());
    std::printf("culprit: %s\n", g.summary.c_str());
  }
  INFO(g.summary);
  for (const Activity& a : now) INFO(a.describe());
  CHECK(g.culprits == std::vector<int>{stuck});
  CHECK_FALSE(g.deadlock);
  CHECK(now[static_cast<size_t>(stuck)].doing == Doing::idle);
  CHECK(now[static_cast<size_t>(stuck)].step == 0);
  CHECK_THAT(g.summary, Catch::StartsWith("rank " + std::to_string(stuck) + " (") &&
                            Catch::Contains(std::to_string(world - 1) + " ranks in all"));
  // The stuck rank's previous stage waits on it for a gradient.
  const int before = topo.pp_group(0)[2];
  CHECK(now[static_cast<size_t>(before)].doing == Doing::waiting);
  CHECK(now[static_cast<size_t>(before)].waiting.ranks == std::vector<int>{stuck});
  CHECK_THAT(now[static_cast<size_t>(before)].waiting.what, Catch::Contains("from stage 3"));
  release = true;
  for (auto& t : threads) t.join();
  for (const auto& e : errors) FAIL(e);
  for (int r = 0; r < world; ++r) {
    const Activity a = engines[r]->activity().snapshot();
    CHECK(a.doing == Doing::idle);  // the step finished everywhere
    CHECK(a.step == 1);
  }
  CHECK(wait_graph([&] {
          std::vector<Activity> v;
          for (int r = 0; r < world; ++r) v.push_back(engines[r]->activity().snapshot());
          return v;
        }())
            .culprits.empty());
}
