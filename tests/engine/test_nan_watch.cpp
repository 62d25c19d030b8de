// The NaN locator (engine/nan_watch.hpp): a NaN injected into one tensor of one layer at one
// iteration (TROUPE_FAULT_NAN's NanFault, given here through RankSpec) is named exactly -- layer,
// tensor, direction, iteration, micro-batch and rank -- by the replay every rank runs when the
// watched step's check fails; without a NaN the watch never fires and changes no bit of the losses.
// Ranks are threads of this process on the local backend, as in test_parallel.cpp.
#include <cmath>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "comm/local/local_world.hpp"
#include "comm/topology.hpp"
#include "engine/fault_injection.hpp"
#include "engine/nan_watch.hpp"
#include "engine/rank_engine.hpp"
#include "examples/zloss_head.hpp"
#include "model/pipeline_model.hpp"

using namespace troupe;

namespace {

GptConfig small_model() {
  GptConfig c;
  c.num_layers = 4;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 200;  // tp 2: 128 vocabulary rows per rank, real on both
  return c;
}

ParallelConfig layout(int tp, int pp, int dp, int zero = 0, Recompute rc = Recompute::none,
                      sched::ScheduleType schedule = sched::ScheduleType::one_f_one_b) {
  ParallelConfig p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.zero_stage = zero;
  p.recompute = rc;
  p.schedule = schedule;
  return p;
}

struct Outcome {
  std::vector<double> losses, norms;  // of the steps that completed
  int failed_step = 0;                // 1-based; 0: none failed
  std::vector<std::string> errors;    // every rank's error of that step
  std::optional<NanReport> report;
  bool watched = false;               // the last step ran watched
};

constexpr int kMicroBatch = 2, kGlobalBatch = 4;

Outcome run(const ParallelConfig& par, bool watch, std::optional<NanFault> fault, int steps,
            std::shared_ptr<const Model> custom = nullptr) {
  const GptConfig model = small_model();
  const int world = par.world_size();
  comm::ParallelSizes sizes{par.tp, par.pp, par.dp};
  auto topo = comm::Topology::create(sizes, world).value();
  auto fabric = comm::LocalFabric::create(world).value();
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(model.vocab_size - 1));
  std::vector<Tensor> batches;
  for (int s = 0; s < steps; ++s) {
    Tensor t = Tensor::empty({kGlobalBatch, model.seq_length + 1}, DType::i32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = u(rng);
    batches.push_back(t);
  }
  auto control = std::make_shared<NanControl>(watch);
  RankSpec spec;
  spec.model = model;
  spec.par = par;
  spec.micro_batch_size = kMicroBatch;
  spec.micro_batches = kGlobalBatch / (kMicroBatch * par.dp);
  spec.num_threads = 1;
  spec.nan = control;
  spec.nan_fault = std::move(fault);
  spec.custom_model = std::move(custom);
  Outcome out;
  std::mutex mu;
  auto body = [&](int rank) {
    auto w = fabric.world(rank);
    auto g = [&](const std::vector<int>& m) { return w->group(m).value(); };
    auto tp = g(topo.tp_group(rank));
    auto dp = g(topo.dp_group(rank));
    auto pp = g(topo.pp_group(rank));
    const auto emb_members = topo.embedding_group(rank);
    auto emb = emb_members.empty() ? nullptr : g(emb_members);
    auto all = w->everyone().value();
    RankEngine engine(spec, topo, rank, RankComms{tp.get(), pp.get(), dp.get(), emb.get(), all.get()});
    engine.init(1234);
    const int d = topo.coords(rank).dp;
    for (int s = 0; s < steps; ++s) {
      StepRequest req;
      req.step = s + 1;
      req.lr = 1e-3;
      req.weight_decay = 0.1;
      req.clip_grad = 1.0;
      const Tensor& b = batches[static_cast<size_t>(s)];
      auto r = engine.train_step(b.rows(kGlobalBatch * d / par.dp, kGlobalBatch * (d + 1) / par.dp),
                                 1.0 / (double(kGlobalBatch) * model.seq_length), req);
      std::lock_guard<std::mutex> lock(mu);
      if (!r) {
        out.failed_step = s + 1;
        out.errors.push_back(r.status().message());
        return;
      }
      if (rank == 0) {
        out.losses.push_back(r.value().loss_sum);
        out.norms.push_back(r.value().grad_norm);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  out.report = control->report();
  out.watched = control->watching();
  return out;
}

NanFault fault(const std::string& spec) {
  auto f = parse_nan_fault(spec);
  REQUIRE(f);
  return f.value();
}

// The job stopped at the fault's iteration on every rank, with the report naming exactly it.
void require_located(const Outcome& o, const ParallelConfig& par, const std::string& spec, int want_rank,
                     const std::string& want_id, const std::string& want_what) {
  const NanFault f = fault(spec);
  INFO(spec);
  REQUIRE(o.failed_step == f.iteration);
  REQUIRE(o.errors.size() == static_cast<size_t>(par.world_size()));
  REQUIRE(o.report);
  const NanReport& r = *o.report;
  for (const std::string& e : o.errors) CHECK(e == r.message());
  CHECK(r.iteration == f.iteration);
  REQUIRE(r.located);
  CHECK(r.origin.spec == want_id);
  CHECK(r.origin.what == want_what);
  CHECK(r.origin.micro_batch == f.micro_batch);
  CHECK(r.origin.rank == want_rank);
  comm::ParallelSizes sizes{par.tp, par.pp, par.dp};
  const comm::Coords at = comm::Topology::create(sizes, par.world_size()).value().coords(want_rank);
  CHECK((r.origin.pp == at.pp && r.origin.tp == at.tp && r.origin.dp == at.dp));
  CHECK(r.origin.first_index == 0);
  CHECK(std::isnan(r.origin.first_value));
  CHECK(r.ranks.size() == static_cast<size_t>(par.world_size()));
  CHECK(r.message().find(want_what) != std::string::npos);
  CHECK(r.message().find("micro-batch " + std::to_string(f.micro_batch)) != std::string::npos);
}

}  // namespace

TEST_CASE("nan watch: parsing TROUPE_FAULT_NAN", "[nan]") {
  const NanFault a = fault("layer2:mlp_fc1@4");
  CHECK((a.rank == -1 && a.layer == 2 && a.tensor == "mlp_fc1" && a.dir == ProbeDir::forward && a.iteration == 4 &&
         a.micro_batch == 0 && !a.optimizer));
  const NanFault b = fault("rank3/layer1:attention_scores:backward@3/1");
  CHECK((b.rank == 3 && b.layer == 1 && b.tensor == "attention_scores" && b.dir == ProbeDir::backward &&
         b.iteration == 3 && b.micro_batch == 1));
  CHECK(fault("head:logits:weight@2").layer == kHeadProbe);
  CHECK(fault("custom.zloss_head:loss@2").block == "zloss_head");
  CHECK(fault("rank1/optimizer@5").optimizer);
  for (const char* wrong : {"layer2:mlp_fc9@4", "layer2:mlp_fc1", "layer2:mlp_fc1@0", "layerx:ln1@2",
                            "layer1:attention_output:backward@2", "embedding:lookup:backward@1", "tail:ln1@1",
                            "layer1:ln1:sideways@1", "rankx/layer1:ln1@1", "layer1:ln1@2/x"}) {
    INFO(wrong);
    auto f = parse_nan_fault(wrong);
    REQUIRE(!f);
    CHECK(f.status().is_bad_input());
    CHECK(f.status().message().find("attention_scores (forward backward)") != std::string::npos);
    CHECK(f.status().message().find("mlp_fc1 (forward backward weight)") != std::string::npos);
  }
  CHECK(!check_nan_fault(fault("layer4:ln1@1"), 4, 4));
  CHECK(!check_nan_fault(fault("rank4/layer1:ln1@1"), 4, 4));
  CHECK(check_nan_fault(fault("rank3/layer3:ln1@1"), 4, 4));
}

TEST_CASE("nan watch: a finding travels between ranks unchanged", "[nan]") {
  NanFinding f;
  f.found = true;
  f.rank = 5;
  f.pp = 1;
  f.tp = 1;
  f.dp = 0;
  f.micro_batch = 2;
  f.pass = 1;
  f.position = 3;
  f.op = 17;
  f.virtual_stage = 2;
  f.chunk = 1;
  f.layer = 3;
  f.dir = ProbeDir::weight;
  f.what = "layer 3 mlp fc1 weight grad";
  f.spec = "layer3:mlp_fc1:weight";
  f.where = "layer 3";
  f.tensor = "mlp_fc1";
  f.non_finite = 9;
  f.elements = 1024;
  f.first_index = 4;
  f.first_value = -INFINITY;
  f.bad_parameter = "transformer.h.3.mlp.c_fc.weight";
  const NanFinding g = decode_finding(encode_finding(f).data());
  CHECK((g.found && g.rank == 5 && g.pp == 1 && g.tp == 1 && g.dp == 0 && g.micro_batch == 2 && g.pass == 1 &&
         g.position == 3 && g.op == 17 && g.virtual_stage == 2 && g.chunk == 1 && g.layer == 3 &&
         g.dir == ProbeDir::weight && g.non_finite == 9 && g.elements == 1024 && g.first_index == 4));
  CHECK((g.what == f.what && g.spec == f.spec && g.where == f.where && g.tensor == f.tensor &&
         g.bad_parameter == f.bad_parameter && g.first_value == -INFINITY));
  // The pipeline's order: an earlier micro-batch, then forward before backward, then the stage.
  NanFinding later = g;
  later.micro_batch = 3;
  CHECK(g.before(later));
  NanFinding fwd = g;
  fwd.pass = 0;
  fwd.position = 9;
  CHECK(fwd.before(g));
  NanFinding none;
  CHECK(g.before(none));
  CHECK(!none.before(g));
}

TEST_CASE("nan watch: without a NaN it never fires and changes no bit of the losses", "[nan][parallel]") {
  for (const ParallelConfig& par : {layout(2, 2, 1), layout(1, 2, 2, 3)}) {
    const Outcome plain = run(par, false, std::nullopt, 4);
    const Outcome watched = run(par, true, std::nullopt, 4);
    REQUIRE(plain.failed_step == 0);
    REQUIRE(watched.failed_step == 0);
    CHECK(!watched.report);
    CHECK(watched.watched);
    CHECK(!plain.watched);
    REQUIRE(watched.losses.size() == 4);
    for (size_t s = 0; s < 4; ++s) {
      INFO("step " << s + 1);
      CHECK(watched.losses[s] == plain.losses[s]);  // bitwise
      CHECK(watched.norms[s] == plain.norms[s]);
    }
  }
}

TEST_CASE("nan watch: without the watch an injected NaN fails the job as before", "[nan][parallel]") {
  const Outcome o = run(layout(2, 2, 1), false, fault("layer2:mlp_fc1@2"), 3);
  CHECK(o.failed_step == 0);  // train_step does not step on a non-finite norm, and reports it
  REQUIRE(o.norms.size() == 3);
  CHECK(!std::isfinite(o.norms[1]));
  CHECK(!o.report);
}

TEST_CASE("nan watch: tp 2 x pp 2, the locator names the injected layer, tensor and direction", "[nan][parallel]") {
  const ParallelConfig par = layout(2, 2, 1);
  // Ranks: 0 (pp 0, tp 0), 1 (pp 0, tp 1), 2 (pp 1, tp 0), 3 (pp 1, tp 1); layers 0, 1 on stage 0.
  struct Want {
    const char* spec;
    int rank;
    const char* id;
    const char* what;
  };
  for (const Want& w : {
           Want{"layer2:mlp_fc1@2", 2, "layer2:mlp_fc1:forward", "layer 2 mlp fc1 output"},
           Want{"rank1/layer1:attention_scores:backward@3/1", 1, "layer1:attention_scores:backward",
                "layer 1 attention scores grad input"},
           Want{"rank3/layer3:attention_qkv@2", 3, "layer3:attention_qkv:forward", "layer 3 attention qkv output"},
           Want{"rank1/layer0:ln2:backward@2/1", 1, "layer0:ln2:backward", "layer 0 ln2 grad input"},
           Want{"layer1:residual2@2", 0, "layer1:residual2:forward", "layer 1 residual2 output"},
           Want{"rank0/layer1:mlp_fc2:weight@3", 0, "layer1:mlp_fc2:weight", "layer 1 mlp fc2 weight grad"},
           Want{"rank3/head:ln_f@2", 3, "head:ln_f:forward", "the head ln_f output"},
           Want{"rank3/head:logits:weight@2", 3, "head:logits:weight", "the head logits weight grad"},
           Want{"rank2/head:loss:backward@2/1", 2, "head:loss:backward", "the head loss grad input"},
           Want{"rank1/embedding:lookup:weight@2", 1, "embedding:lookup:weight", "the embedding lookup weight grad"},
       }) {
    const Outcome o = run(par, true, fault(w.spec), 3);
    require_located(o, par, w.spec, w.rank, w.id, w.what);
  }
}

TEST_CASE("nan watch: the locator under recompute, zero-bubble, sequence parallelism, interleaving and ZeRO-3",
          "[nan][parallel]") {
  {
    ParallelConfig par = layout(2, 2, 1, 0, Recompute::selective);
    require_located(run(par, true, fault("rank0/layer1:attention_scores@2"), 2), par, "rank0/layer1:attention_scores@2",
                    0, "layer1:attention_scores:forward", "layer 1 attention scores output");
  }
  {
    ParallelConfig par = layout(2, 2, 1, 0, Recompute::full, sched::ScheduleType::zb_h1);
    par.sequence_parallel = true;
    require_located(run(par, true, fault("rank3/layer2:mlp_gelu:backward@2/1"), 2), par,
                    "rank3/layer2:mlp_gelu:backward@2/1", 3, "layer2:mlp_gelu:backward", "layer 2 mlp gelu grad input");
  }
  {
    // Interleaved, 2 chunks per stage: layer 2 is virtual stage 2, chunk 1 of stage 0.
    ParallelConfig par = layout(2, 2, 1, 0, Recompute::none, sched::ScheduleType::interleaved);
    par.virtual_chunks = 2;
    require_located(run(par, true, fault("layer2:ln2:backward@2/1"), 2), par, "layer2:ln2:backward@2/1", 0,
                    "layer2:ln2:backward", "layer 2 ln2 grad input");
  }
  {
    // pp 2 x dp 2 under ZeRO-3: the replay gathers the parameters once, then runs without dp
    // collectives; the NaN is in the second replica only.
    const ParallelConfig par = layout(1, 2, 2, 3);
    comm::Coords second;
    second.pp = 1;
    second.dp = 1;
    const int rank = comm::Topology::create(comm::ParallelSizes{1, 2, 2}, 4).value().rank(second);
    const std::string spec = "rank" + std::to_string(rank) + "/layer3:ln1@2";
    require_located(run(par, true, fault(spec), 2), par, spec, rank, "layer3:ln1:forward", "layer 3 ln1 output");
  }
}

TEST_CASE("nan watch: a NaN from the optimizer step is named as such", "[nan][parallel]") {
  const ParallelConfig par = layout(2, 2, 1, 1);
  const Outcome o = run(par, true, fault("rank2/optimizer@2"), 3);
  REQUIRE(o.failed_step == 2);
  REQUIRE(o.report);
  CHECK(!o.report->located);
  CHECK(o.report->trigger == "a parameter after the optimizer step");
  CHECK(o.report->bad_parameter_rank == 2);
  CHECK(!o.report->bad_parameter.empty());
  CHECK(o.report->message().find("found every op finite") != std::string::npos);
  CHECK(o.report->message().find(o.report->bad_parameter + " on rank 2") != std::string::npos);
}

TEST_CASE("nan watch: a custom block's outputs, loss and input gradients are checked", "[nan][parallel][custom]") {
  // GPT's layers, then example::ZLossHead (examples/zloss_head.hpp) behind them on the last stage.
  Model m = gpt_model(small_model(), 2, /*with_head=*/false);
  m.stages.back().push_back(Block::custom(
      "zloss_head", [](const StagePlace& at) { return std::make_unique<example::ZLossHead>(at); }));
  const auto model = std::make_shared<const Model>(std::move(m));
  const ParallelConfig par = layout(2, 2, 1);
  require_located(run(par, true, fault("rank3/custom.zloss_head:hidden:backward@2/1"), 3, model), par,
                  "rank3/custom.zloss_head:hidden:backward@2/1", 3, "custom.zloss_head:hidden:backward",
                  "custom block zloss_head tensor \"hidden\" (its gradient)");
  require_located(run(par, true, fault("custom.zloss_head:loss@2"), 3, model), par, "custom.zloss_head:loss@2", 2,
                  "custom.zloss_head:loss:forward", "custom block zloss_head loss");
  // The GPT layers before it are still GptChunk's points.
  require_located(run(par, true, fault("rank2/layer3:mlp_fc1:backward@2"), 3, model), par,
                  "rank2/layer3:mlp_fc1:backward@2", 2, "layer3:mlp_fc1:backward", "layer 3 mlp fc1 grad input");
}
