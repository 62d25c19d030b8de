// The always-on span ring (engine/span_ring.hpp), the stages arithmetic and the schedule's predicted
// bubble (engine/stages.hpp), and the iteration history (engine/iteration_history.hpp): on
// hand-made spans whose shares are worked out below, on known schedules against their formulas,
// and on live ranks of a pipeline whose rings must hold every pass of the table once per step.
#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "comm/local/local_world.hpp"
#include "comm/topology.hpp"
#include "engine/iteration_history.hpp"
#include "engine/rank_engine.hpp"
#include "engine/span_ring.hpp"
#include "engine/stages.hpp"

using namespace troupe;
using nlohmann::json;

// Allocations of the current thread while `counting` is set: the ring's steady state allocates none.
namespace {
thread_local bool counting = false;
thread_local size_t allocations = 0;
}  // namespace
void* operator new(std::size_t n) {
  if (counting) ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

sched::Schedule schedule(sched::ScheduleType t, int p, int m, int v = 1) {
  sched::ScheduleSpec s;
  s.type = t;
  s.stages = p;
  s.micro_batches = m;
  s.chunks = v;
  return sched::make_schedule(s).value();
}

StepSpan span(SpanKind k, int micro, double start_us, double dur_us) { return {k, micro, 0, start_us, dur_us}; }

// 1F1B, p = 2, m = 2, one step of 10 ms on each stage (times in us from the step's start):
//   stage 0: F0 [0, 1000) F1 [1000, 2000) wait [2000, 4000) B0 [4000, 6000) B1 [6000, 8000)
//            reduce [8000, 9000) optimizer [9000, 9500) gather [9500, 10000)
//   stage 1: wait [0, 1000) F0 [1000, 2000) B0 [2000, 4000) F1 [4000, 5000) B1 [5000, 7000)
//            reduce [7000, 9000) optimizer [9000, 9500) gather [9500, 10000)
// Each computes 6 ms: busy 0.6. The pipeline ends at 8 ms (stage 0's B1): bubble 1 - 6/8 = 0.25.
// optimizer_us lengthens the optimizer (and the step) by that much.
StepRecord stage0_step(int64_t it, double optimizer_us = 0) {
  StepRecord r{it, 1e6 * it, 10000 + optimizer_us, {}};
  r.spans = {span(SpanKind::forward, 0, 0, 1000),     span(SpanKind::forward, 1, 1000, 1000),
             span(SpanKind::wait, 0, 2000, 2000),     span(SpanKind::backward, 0, 4000, 2000),
             span(SpanKind::backward, 1, 6000, 2000), span(SpanKind::reduce, -1, 8000, 1000),
             span(SpanKind::optimizer, -1, 9000, 500 + optimizer_us),
             span(SpanKind::reduce, -1, 9500 + optimizer_us, 500)};
  return r;
}
StepRecord stage1_step(int64_t it, double optimizer_us = 0) {
  StepRecord r{it, 1e6 * it + 30, 10000 + optimizer_us, {}};
  r.spans = {span(SpanKind::wait, 0, 0, 1000),        span(SpanKind::forward, 0, 1000, 1000),
             span(SpanKind::backward, 0, 2000, 2000), span(SpanKind::forward, 1, 4000, 1000),
             span(SpanKind::backward, 1, 5000, 2000), span(SpanKind::reduce, -1, 7000, 2000),
             span(SpanKind::optimizer, -1, 9000, 500 + optimizer_us),
             span(SpanKind::reduce, -1, 9500 + optimizer_us, 500)};
  return r;
}

}  // namespace

TEST_CASE("span ring: keeps the last steps, oldest first, and only completed ones", "[stages]") {
  SpanRing ring(3);
  CHECK(ring.snapshot(8).empty());
  for (int64_t it = 1; it <= 5; ++it) {
    ring.begin_step(it, 1000.0 * it);
    ring.add(SpanKind::forward, 0, 0, 1000.0 * it + 10, 5);
    ring.add(SpanKind::backward, 0, 0, 1000.0 * it + 20, 7);
    ring.end_step(1000.0 * it + 100);
  }
  ring.begin_step(6, 6000);  // open: not shown
  ring.add(SpanKind::forward, 0, 0, 6010, 5);
  const auto steps = ring.snapshot(8);
  REQUIRE(steps.size() == 3);
  CHECK(steps[0].iteration == 3);
  CHECK(steps[2].iteration == 5);
  CHECK(steps[2].start_us == 5000);
  CHECK(steps[2].dur_us == 100);
  REQUIRE(steps[2].spans.size() == 2);
  CHECK(steps[2].spans[0].start_us == 10);  // from the step's start
  CHECK(steps[2].spans[1].kind == SpanKind::backward);
  CHECK(steps[2].spans[1].dur_us == 7);
  const auto two = ring.snapshot(2);
  REQUIRE(two.size() == 2);
  CHECK(two[0].iteration == 4);
  // A step begun again replaces the open one (a failed step never ends); spans outside a step drop.
  ring.begin_step(7, 7000);
  ring.end_step(7050);
  ring.add(SpanKind::wait, 1, 0, 7060, 1);
  CHECK(ring.snapshot(1).front().iteration == 7);
  CHECK(ring.snapshot(1).front().spans.empty());
}

TEST_CASE("span ring: nothing is allocated once every slot has held a step", "[stages]") {
  SpanRing ring(4);
  auto step = [&](int64_t it) {
    ring.begin_step(it, 0);
    for (int k = 0; k < 40; ++k) ring.add(k % 2 ? SpanKind::backward : SpanKind::forward, k, 0, k, 1);
    ring.end_step(100);
  };
  for (int64_t it = 1; it <= 5; ++it) step(it);  // every slot, and the writer's own, full once
  allocations = 0;
  counting = true;
  for (int64_t it = 6; it <= 50; ++it) step(it);
  counting = false;
  CHECK(allocations == 0);
  CHECK(ring.snapshot(4).back().spans.size() == 40);
}

TEST_CASE("stages: shares and times of hand-made spans", "[stages]") {
  const auto sc = schedule(sched::ScheduleType::one_f_one_b, 2, 2);
  // Iteration 2 has a 10 ms longer optimizer step; iteration 3 only rank 0 completed.
  std::vector<RankSteps> ranks = {
      {1, 1, 0, 0, {stage1_step(1), stage1_step(2, 10000)}},
      {0, 0, 0, 0, {stage0_step(1), stage0_step(2, 10000), stage0_step(3)}},
  };
  const StagesReport all = stage_figures(ranks, sc, false, 8);
  CHECK(all.iterations == std::vector<int64_t>{1, 2});
  REQUIRE(all.ranks.size() == 2);
  const RankFigures& r0 = all.ranks[0];
  CHECK(r0.rank == 0);
  REQUIRE(r0.steps.size() == 2);
  CHECK(r0.steps[0].f == 2);
  CHECK(r0.steps[0].b == 2);
  CHECK(r0.steps[0].w == 0);
  CHECK(r0.steps[0].busy == Approx(0.6));
  CHECK(r0.steps[1].busy == Approx(0.3));    // 6 of 20 ms
  CHECK(r0.steps[0].makespan_ms == Approx(8));
  CHECK(r0.steps[0].bubble == Approx(0.25));
  CHECK(r0.busy == Approx(12.0 / 30.0));     // a ratio of sums, not a mean of ratios
  CHECK(r0.idle == Approx(1 - 12.0 / 30.0));
  CHECK(r0.bubble == Approx(0.25));
  CHECK(r0.f_ms == Approx(2));  // per iteration
  CHECK(r0.b_ms == Approx(4));
  CHECK(r0.wait_ms == Approx(2));
  CHECK(r0.reduce_ms == Approx(1.5));
  CHECK(r0.optimizer_ms == Approx((0.5 + 10.5) / 2));
  CHECK(r0.step_ms == Approx(15));
  const RankFigures& r1 = all.ranks[1];
  CHECK(r1.bubble == Approx(0.25));  // against the job's makespan (stage 0 ends last), not its own 7 ms
  CHECK(r1.wait_ms == Approx(1));
  CHECK(r1.reduce_ms == Approx(2.5));
  CHECK(all.bubble == Approx(0.25));
  CHECK(all.f_ms == Approx(1));  // one pass
  CHECK(all.b_ms == Approx(2));
  // The prediction: 1F1B's (p-1)/(m+p-1) = 1/3 on both stages, and the same at the measured costs.
  CHECK(all.predicted.bubble == Approx(1.0 / 3));
  CHECK(all.predicted.formula == Approx(1.0 / 3));
  CHECK(all.predicted.at_measured_costs == Approx(1.0 / 3));
  CHECK(r0.predicted_bubble == Approx(1.0 / 3));
  CHECK(r1.predicted_bubble == Approx(1.0 / 3));
  // --last 1: iteration 2 alone.
  const StagesReport last = stage_figures(ranks, sc, false, 1);
  CHECK(last.iterations == std::vector<int64_t>{2});
  CHECK(last.ranks[0].busy == Approx(0.3));
  // No common iteration: nothing counted, no division by zero.
  ranks[0].steps.clear();
  const StagesReport none = stage_figures(ranks, sc, false, 8);
  CHECK(none.iterations.empty());
  CHECK(none.ranks[1].busy == 0);
  CHECK(none.bubble == 0);
  CHECK(none.predicted.at_measured_costs == -1);
}

TEST_CASE("stages: the predicted bubble of known schedules is their formula", "[stages]") {
  using T = sched::ScheduleType;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 4, 8, 16}) {
      INFO("p=" << p << " m=" << m);
      for (T t : {T::gpipe, T::one_f_one_b}) {
        const BubblePrediction b = predict_bubble(schedule(t, p, m), false);
        CHECK(b.bubble == Approx((p - 1.0) / (m + p - 1.0)).margin(1e-12));
        CHECK(b.formula == Approx(b.bubble).margin(1e-12));
        for (double s : b.per_stage) CHECK(s == Approx(b.bubble).margin(1e-12));  // every stage idles alike
      }
      if (m >= p) {  // ZB-H1's (p-1)(F+B-W) with the pipeline full; F = B = W = 1
        const BubblePrediction zb = predict_bubble(schedule(T::zb_h1, p, m), false);
        CHECK(zb.bubble == Approx((p - 1.0) / (3.0 * m + p - 1.0)).margin(1e-12));
        CHECK(zb.formula == Approx(zb.bubble).margin(1e-12));
      }
      if (p > 1 && m % p == 0) {
        for (int v : {2, 3}) {
          const BubblePrediction il = predict_bubble(schedule(T::interleaved, p, m, v), false);
          CHECK(il.bubble == Approx((p - 1.0) / (v * m + p - 1.0)).margin(1e-12));
          CHECK(il.formula == Approx(il.bubble).margin(1e-12));
        }
      }
    }
  }
  // A schedule given as data has no formula; measured costs are simulated on its table.
  const BubblePrediction given = predict_bubble(schedule(T::one_f_one_b, 4, 8), true, 1, 3, 0);
  CHECK(given.formula == -1);
  CHECK(given.at_measured_costs == Approx(3.0 / 11));  // 1F1B's formula holds for any F and B
  CHECK_THAT(given.method, Catch::Contains("F = 1, B = 2"));
}

TEST_CASE("stages: a peer's steps read back, and malformed ones are refused with the reason", "[stages]") {
  const std::vector<RankSteps> ranks = {{2, 1, 0, 1, {stage1_step(4)}}, {3, 1, 1, 1, {}}};
  auto back = rank_steps_from_json(rank_steps_json(ranks));
  REQUIRE(back.is_ok());
  REQUIRE(back->size() == 2);
  CHECK(back->at(0).rank == 2);
  CHECK(back->at(0).dp == 1);
  REQUIRE(back->at(0).steps.size() == 1);
  CHECK(back->at(0).steps[0].iteration == 4);
  REQUIRE(back->at(0).steps[0].spans.size() == 8);
  CHECK(back->at(0).steps[0].spans[3].kind == SpanKind::forward);
  CHECK(back->at(0).steps[0].spans[3].micro == 1);
  CHECK(back->at(0).steps[0].spans[3].start_us == 4000);
  auto refused = [](const std::string& text) { return rank_steps_from_json(text).status().message(); };
  CHECK_THAT(refused("[1, 2]"), Catch::Contains("not a stages document"));
  CHECK_THAT(refused(R"({"ranks": [{"rank": 0, "pp": 0, "tp": 0}]})"), Catch::Contains("malformed"));
  const std::string step = R"({"ranks": [{"rank": 0, "pp": 0, "tp": 0, "dp": 0, "steps": [{"iteration": 1,
      "start_us": 0, "dur_us": 10, "spans": [SPAN]}]}]})";
  auto with = [&](const std::string& s) { return refused(step.substr(0, step.find("SPAN")) + s + step.substr(step.find("SPAN") + 4)); };
  CHECK_THAT(with(R"(["frobnicate", 0, 0, 1, 1])"), Catch::Contains("kind \"frobnicate\" is unknown"));
  CHECK_THAT(with(R"(["forward", 0, 0, 1, -1])"), Catch::Contains("not a finite time"));
  CHECK_THAT(with(R"(["forward", -5, 0, 1, 1])"), Catch::Contains("micro-batch or chunk"));
  CHECK_THAT(with(R"(["forward", 0, 0, 1])"), Catch::Contains("not [kind, micro, chunk"));
  CHECK(rank_steps_from_json(step.substr(0, step.find("SPAN")) + R"(["weight", 0, 0, 1, 1])" +
                             step.substr(step.find("SPAN") + 4))
            .is_ok());
}

TEST_CASE("stages: the plan lists every stage's table and where its ranks are", "[stages]") {
  const auto sc = schedule(sched::ScheduleType::one_f_one_b, 2, 4);
  std::vector<Activity> ranks(4);
  for (int r = 0; r < 4; ++r) {
    ranks[r].rank = r;
    ranks[r].stage = r / 2;
    ranks[r].tp = r % 2;
    ranks[r].action = r;  // rank r at action r of its stage's table
    ranks[r].actions = 8;
  }
  const json all = json::parse(plan_json(sc, false, ranks, -1));
  CHECK(all["schedule"]["name"] == "1f1b");
  REQUIRE(all["stages"].size() == 2);
  for (int s = 0; s < 2; ++s) {
    const json& st = all["stages"][s];
    REQUIRE(st["actions"].size() == sc.stages[s].size());
    for (size_t k = 0; k < sc.stages[s].size(); ++k) {
      CHECK(st["actions"][k]["kind"] == sched::kind_name(sc.stages[s][k].kind));
      CHECK(st["actions"][k]["micro"] == sc.stages[s][k].micro);
      CHECK(st["actions"][k]["end"].get<double>() > st["actions"][k]["start"].get<double>());
    }
    REQUIRE(st["at"].size() == 2);
    CHECK(st["at"][0]["rank"] == 2 * s);
    CHECK(st["at"][1]["action"] == 2 * s + 1);
  }
  // Stage 1's first forward starts after stage 0's (unit costs), the makespan is (m+p-1)(F+B) = 15.
  CHECK(all["stages"][1]["actions"][0]["start"] == 1.0);
  CHECK(all["makespan"] == 15.0);
  const json one = json::parse(plan_json(sc, false, ranks, 3));
  REQUIRE(one["stages"].size() == 1);
  CHECK(one["stages"][0]["stage"] == 1);
  REQUIRE(one["stages"][0]["at"].size() == 1);
  CHECK(one["stages"][0]["at"][0]["rank"] == 3);
}

TEST_CASE("history: the last iterations, after an iteration, as columns", "[stages]") {
  IterationHistory h(3);
  for (int64_t it = 1; it <= 5; ++it) {
    IterationStats s;
    s.iteration = it;
    s.lm_loss = 10.0 / static_cast<double>(it);
    s.lr = 1e-3 * static_cast<double>(it);
    s.grad_norm = 0.5;
    s.ms_per_iter = 20;
    h.add(s);
  }
  const auto kept = h.points(-1, 100);
  REQUIRE(kept.size() == 3);
  CHECK(kept.front().iteration == 3);
  CHECK(kept.back().loss == 2.0);
  CHECK(h.points(3, 100).size() == 2);
  CHECK(h.points(-1, 1).front().iteration == 5);
  const json j = json::parse(history_json(kept, h.capacity()));
  CHECK(j["kept"] == 3);
  CHECK(j["iteration"] == json::array({3, 4, 5}));
  CHECK(j["loss"][0].get<double>() == 10.0 / 3.0);  // full precision
  CHECK(j["lr"][2].get<double>() == 5e-3);
}

TEST_CASE("stages: live pipeline ranks record every pass of their table once per step", "[stages]") {
  GptConfig model;
  model.num_layers = 2;
  model.hidden_size = 16;
  model.num_attention_heads = 2;
  model.seq_length = 5;
  model.max_position_embeddings = 5;
  model.vocab_size = 23;
  ParallelConfig par;
  par.pp = 2;
  par.tp = 2;
  comm::ParallelSizes sizes;
  sizes.pp = par.pp;
  sizes.tp = par.tp;
  const int world = par.world_size();
  auto topo = comm::Topology::create(sizes, world).value();
  auto fabric = comm::LocalFabric::create(world).value();
  RankSpec spec;
  spec.model = model;
  spec.par = par;
  spec.micro_batch_size = 1;
  spec.micro_batches = 3;
  const sched::Schedule sc = job_schedule(spec);
  constexpr int kSteps = 3;
  Tensor tokens = Tensor::empty({3, model.seq_length + 1}, DType::i32);
  std::mt19937 rng(1);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 23);
  std::vector<std::shared_ptr<ActivityBoard>> boards;
  for (int r = 0; r < world; ++r) {
    const comm::Coords at = topo.coords(r);
    boards.push_back(std::make_shared<ActivityBoard>(r, at.pp, at.tp, at.dp));
  }
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto w = fabric.world(r);
      auto g = [&](const std::vector<int>& m) { return w->group(m).value(); };
      auto tp = g(topo.tp_group(r)), pp = g(topo.pp_group(r)), dp = g(topo.dp_group(r));
      const auto emb_members = topo.embedding_group(r);
      auto emb = emb_members.empty() ? nullptr : g(emb_members);
      auto all = w->everyone().value();
      RankEngine engine(spec, topo, r, RankComms{tp.get(), pp.get(), dp.get(), emb.get(), all.get()}, boards[r]);
      engine.init(7);
      for (int step = 1; step <= kSteps; ++step) {
        StepRequest req;
        req.step = step;
        req.lr = 1e-3;
        auto out = engine.train_step(tokens, 1.0 / (3.0 * model.seq_length), req);
        if (!out) errors[r] = out.status().message();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) REQUIRE(e.empty());
  std::vector<RankSteps> ranks;
  for (int r = 0; r < world; ++r) {
    const Activity a = boards[r]->snapshot();
    ranks.push_back({r, a.stage, a.tp, a.dp, boards[r]->recent().snapshot(8)});
  }
  for (const RankSteps& r : ranks) {
    INFO("rank " << r.rank);
    REQUIRE(r.steps.size() == kSteps);
    for (const StepRecord& s : r.steps) {
      std::multiset<std::pair<int, int>> f, b;  // (micro, chunk)
      bool optimizer = false;
      for (const StepSpan& sp : s.spans) {
        CHECK(sp.start_us >= 0);
        CHECK(sp.start_us + sp.dur_us <= s.dur_us + 1e-3);
        if (sp.kind == SpanKind::forward) f.insert({sp.micro, sp.chunk});
        if (sp.kind == SpanKind::backward) b.insert({sp.micro, sp.chunk});
        optimizer = optimizer || sp.kind == SpanKind::optimizer;
      }
      const std::multiset<std::pair<int, int>> each = {{0, 0}, {1, 0}, {2, 0}};
      CHECK(f == each);
      CHECK(b == each);
      CHECK(optimizer);
    }
  }
  const StagesReport report = stage_figures(ranks, sc, false, 8);
  CHECK(report.iterations == std::vector<int64_t>{1, 2, 3});
  for (const RankFigures& r : report.ranks) {
    CHECK(r.busy > 0);
    CHECK(r.busy + r.idle == Approx(1));
    CHECK(r.bubble >= 0);
    CHECK(r.bubble < 1);
    CHECK(r.steps.back().f == 3);
  }
  // Through JSON as rank 0's inspector reads a peer's, to the same figures.
  auto back = rank_steps_from_json(rank_steps_json(ranks));
  REQUIRE(back.is_ok());
  CHECK(stage_figures(back.value(), sc, false, 8).bubble == Approx(report.bubble));
}
