// Each MoE layer's load per step as the engine reports it (StepOutcome::moe, engine/moe_tally.hpp):
// carried by the step's all-reduce over the world, so every rank of every layout gets the job's
// totals. The routing of a micro-batch does not depend on the layout (model/moe_routing.hpp), so a
// tp 2 x pp 2 x dp 2 job (and one with full recompute and sequence parallelism, one interleaved)
// must report exactly the 1x1x1 run's tokens per expert, kept and dropped, and its load-balancing
// and z losses up to fp32 rounding; a recomputed forward is not counted twice; a dense model
// reports nothing. MoeTally's slots and moe_loss on their own.
//
// Ranks are threads of this process on the local backend, each with its own RankEngine, as
// tests/engine/test_parallel.cpp runs them.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "comm/local/local_world.hpp"
#include "comm/topology.hpp"
#include "engine/moe_tally.hpp"
#include "engine/rank_engine.hpp"

using namespace troupe;

namespace {

constexpr int kSteps = 3;

// Megatron-Core's top-2 with aux and z losses on every layer, or DeepSpeed's top-1 on every second
// layer with a different expert count per MoE layer; capacity factor 1, so experts drop tokens.
GptConfig moe_model(bool megatron) {
  GptConfig c;
  c.num_layers = 4;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 37;
  c.hidden_dropout = c.attention_dropout = 0.1;
  c.moe.capacity_factor = c.moe.eval_capacity_factor = 1.0;
  if (megatron) {
    c.moe.router = MoeRouter::megatron;
    c.moe.num_experts = {4};
    c.moe.topk = 2;
    c.moe.aux_loss_coeff = 0.01;
    c.moe.z_loss_coeff = 0.001;
  } else {
    c.moe.router = MoeRouter::deepspeed;
    c.moe.num_experts = {4, 3};
    c.moe.topk = 1;
    c.moe.layer_freq = 2;
    c.moe.min_capacity = 1;
    c.moe.aux_loss_coeff = 0.01;
  }
  return c;
}

ParallelConfig layout(int tp, int pp, int dp, int zero = 0, Recompute rc = Recompute::none, bool sp = false,
                      int chunks = 1) {
  ParallelConfig p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.zero_stage = zero;
  p.recompute = rc;
  p.sequence_parallel = sp;
  p.virtual_chunks = chunks;
  if (chunks > 1) p.schedule = sched::ScheduleType::interleaved;
  return p;
}

// Every rank's StepOutcome::moe of each step: [step][rank].
using Loads = std::vector<std::vector<std::vector<MoeLayerLoad>>>;

Loads run(const GptConfig& model, const ParallelConfig& par, int micro_batch, int global_batch) {
  const int world = par.world_size();
  comm::ParallelSizes sizes;
  sizes.tp = par.tp;
  sizes.pp = par.pp;
  sizes.dp = par.dp;
  sizes.cp = par.cp;
  auto topo = comm::Topology::create(sizes, world).value();
  auto fabric = comm::LocalFabric::create(world).value();
  std::mt19937_64 rng(77);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(model.vocab_size - 1));
  std::vector<Tensor> batches;
  for (int s = 0; s < kSteps; ++s) {
    Tensor t = Tensor::empty({global_batch, model.seq_length + 1}, DType::i32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = u(rng);
    batches.push_back(t);
  }
  RankSpec spec;
  spec.model = model;
  spec.par = par;
  spec.micro_batch_size = micro_batch;
  spec.micro_batches = global_batch / (micro_batch * par.dp);
  spec.seed = 4321;
  Loads loads(kSteps, std::vector<std::vector<MoeLayerLoad>>(static_cast<size_t>(world)));
  std::mutex mu;
  std::vector<std::string> errors;
  auto body = [&](int rank) {
    auto w = fabric.world(rank);
    auto g = [&](const std::vector<int>& m) { return w->group(m).value(); };
    auto tp = g(topo.tp_group(rank));
    auto dp = g(topo.dp_cp_group(rank));  // as actors/rank_actor.cpp's make_groups forms it
    auto pp = g(topo.pp_group(rank));
    auto cp = par.cp > 1 ? g(topo.cp_group(rank)) : nullptr;
    const auto emb_members = topo.embedding_group(rank);
    auto emb = emb_members.empty() ? nullptr : g(emb_members);
    auto all = w->everyone().value();
    RankComms comms{tp.get(), pp.get(), dp.get(), emb.get(), all.get()};
    comms.cp = cp.get();
    RankEngine engine(spec, topo, rank, comms);
    engine.init(1234);
    const int d = topo.coords(rank).dp;
    for (int s = 0; s < kSteps; ++s) {
      StepRequest req;
      req.step = s + 1;
      req.lr = 1e-3;
      const auto [lo, hi] = replica_windows(batches[s].dim(0), micro_batch, par.dp, d);
      auto out = engine.train_step(batches[s].rows(lo, hi), 1.0 / (double(global_batch) * model.seq_length), req);
      std::lock_guard<std::mutex> lock(mu);
      if (!out) {
        errors.push_back("rank " + std::to_string(rank) + ": " + out.status().message());
        return;
      }
      loads[static_cast<size_t>(s)][static_cast<size_t>(rank)] = out.value().moe;
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  for (const auto& e : errors) FAIL(e);
  return loads;
}

void require_same(const std::vector<MoeLayerLoad>& want, const std::vector<MoeLayerLoad>& got) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("layer " << want[i].layer);
    CHECK(got[i].layer == want[i].layer);
    CHECK(got[i].micro_batches == want[i].micro_batches);
    CHECK(got[i].routed == want[i].routed);
    CHECK(got[i].kept == want[i].kept);
    CHECK(got[i].dropped == want[i].dropped);
    CHECK(got[i].lb_loss == Approx(want[i].lb_loss).epsilon(1e-5));
    CHECK(got[i].z_loss == Approx(want[i].z_loss).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("moe stats: every layout reports the 1x1x1 run's load per layer, on every rank", "[moe][moe_stats]") {
  struct Case {
    const char* name;
    ParallelConfig par;
    int global_batch;
  };
  const std::vector<Case> cases = {
      {"tp2 pp2 dp2 zero1", layout(2, 2, 2, 1), 6},
      {"tp2 pp2 dp2 zero3 sp full recompute", layout(2, 2, 2, 3, Recompute::full, true), 6},
      {"tp2 pp2 dp2 interleaved, 2 chunks", layout(2, 2, 2, 1, Recompute::none, false, 2), 8},
  };
  for (const bool megatron : {true, false}) {
    const GptConfig model = moe_model(megatron);
    const int k = model.moe.topk;
    const int64_t tokens = model.seq_length;  // per micro-batch of one window
    std::map<int, Loads> refs;
    for (const Case& c : cases) {
      INFO((megatron ? "megatron top-2, " : "deepspeed top-1, ") << c.name);
      if (!refs.count(c.global_batch)) refs[c.global_batch] = run(model, layout(1, 1, 1), 1, c.global_batch);
      const Loads& ref = refs[c.global_batch];
      const Loads got = run(model, c.par, 1, c.global_batch);
      for (int s = 0; s < kSteps; ++s) {
        INFO("step " << s + 1);
        const auto& want = ref[static_cast<size_t>(s)][0];
        // The reference itself: every MoE layer, every micro-batch once, every assignment kept or dropped.
        REQUIRE(static_cast<int>(want.size()) == model.moe.moe_layers(model.num_layers));
        for (const MoeLayerLoad& l : want) {
          CHECK(l.micro_batches == c.global_batch);
          CHECK(static_cast<int>(l.routed.size()) == model.moe.experts_of(l.layer, model.num_layers));
          const int64_t routed = std::accumulate(l.routed.begin(), l.routed.end(), int64_t{0});
          const int64_t kept = std::accumulate(l.kept.begin(), l.kept.end(), int64_t{0});
          CHECK(routed == c.global_batch * tokens * k);
          CHECK(kept + l.dropped == routed);
          CHECK(l.lb_loss > 0);
          CHECK(l.z_loss > 0);
        }
        CHECK(std::any_of(want.begin(), want.end(), [](const MoeLayerLoad& l) { return l.dropped > 0; }));
        for (size_t r = 0; r < got[static_cast<size_t>(s)].size(); ++r) {
          INFO("rank " << r);
          require_same(want, got[static_cast<size_t>(s)][r]);
        }
      }
    }
  }
}

// Context parallelism: every cp rank routes the whole sequences (model/gpt_chunk_moe.cpp), and only
// cp rank 0's count, so a cp 2 (and a Ulysses 2 x tp 2 x pp 2) job reports the 1x1x1 run's load,
// each micro-batch once.
TEST_CASE("moe stats: context parallelism reports the whole micro-batch's load once", "[moe][moe_stats][cp]") {
  ParallelConfig cp2 = layout(1, 1, 1), ulysses = layout(2, 2, 1, 0, Recompute::selective, true);
  cp2.cp = 2;
  ulysses.cp = 2;
  ulysses.cp_comm = CpComm::a2a;
  ulysses.cp_contiguous = true;
  for (const bool megatron : {true, false}) {
    GptConfig model = moe_model(megatron);
    model.seq_length = 8;  // 2 * cp chunks
    const Loads ref = run(model, layout(1, 1, 1), 1, 4);
    for (const ParallelConfig& par : {cp2, ulysses}) {
      INFO((megatron ? "megatron top-2, " : "deepspeed top-1, ") << (par.tp > 1 ? "ulysses 2 tp 2 pp 2" : "cp 2"));
      const Loads got = run(model, par, 1, 4);
      for (int s = 0; s < kSteps; ++s) {
        INFO("step " << s + 1);
        const auto& want = ref[static_cast<size_t>(s)][0];
        REQUIRE(static_cast<int>(want.size()) == model.moe.moe_layers(model.num_layers));
        for (const MoeLayerLoad& l : want) CHECK(l.micro_batches == 4);
        for (size_t r = 0; r < got[static_cast<size_t>(s)].size(); ++r) {
          INFO("rank " << r);
          require_same(want, got[static_cast<size_t>(s)][r]);
        }
      }
    }
  }
}

TEST_CASE("moe stats: a dense model's steps carry none", "[moe_stats]") {
  GptConfig dense = moe_model(true);
  dense.moe = MoeConfig{};
  const Loads got = run(dense, layout(1, 2, 2), 1, 4);
  for (const auto& step : got)
    for (const auto& rank : step) CHECK(rank.empty());
  CHECK(MoeTally(dense).size() == 0);
}

TEST_CASE("moe stats: the tally's slots, layer by layer, and Megatron-DeepSpeed's moe loss", "[moe_stats]") {
  GptConfig m = moe_model(false);  // layers 1 and 3: 4 and 3 experts
  MoeTally tally(m);
  REQUIRE(tally.size() == (4 + 2 * 4) + (4 + 2 * 3));
  std::vector<double> slots(tally.size(), 0.0);
  MoeLayerStats l3{3, 2, 0.5, 1.5, {4, 3, 7}, {4, 3, 5}, 2};
  tally.add(slots, {l3});
  tally.add(slots, {l3});  // a second replica's
  const auto loads = tally.loads(slots);
  REQUIRE(loads.size() == 1);  // layer 1 routed nothing here
  CHECK(loads[0].layer == 3);
  CHECK(loads[0].micro_batches == 4);
  CHECK(loads[0].routed == std::vector<int64_t>{8, 6, 14});
  CHECK(loads[0].kept == std::vector<int64_t>{8, 6, 10});
  CHECK(loads[0].dropped == 4);
  CHECK(loads[0].lb_loss == 0.25);  // (0.5 + 0.5) / 4 micro-batches
  CHECK(loads[0].z_loss == 0.75);
  MoeConfig coeffs;
  coeffs.aux_loss_coeff = 0.01;
  coeffs.z_loss_coeff = 0.1;
  CHECK(moe_loss(coeffs, loads) == Approx(0.01 * 0.25 + 0.1 * 0.75));
  CHECK(moe_loss(coeffs, {}) == 0);
}
