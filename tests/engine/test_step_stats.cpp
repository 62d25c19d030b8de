// Megatron's --log-params-norm and --log-num-zeros-in-grad as the engine computes them
// (StepRequest::params_norm / zeros_in_grad): every layout (tensor, pipeline, data parallelism, ZeRO
// 1-3, 16-bit) reports the 1x1x1 run's values, each element of the model counted once; the
// parameter norm equals the L2 norm of the trained parameters gathered from every rank; the zero
// count is that of a model whose zero gradients are known (position rows past --seq-length, and, with
// an untied embedding, the rows of tokens no input holds).
//
// Ranks are threads of this process on the local backend, each with its own RankEngine, as
// tests/engine/test_parallel.cpp runs them.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "comm/local/local_world.hpp"
#include "comm/topology.hpp"
#include "engine/rank_engine.hpp"
#include "model/params.hpp"

using namespace troupe;

namespace {

// No biases: the key part of c_attn.bias has a gradient that is zero only up to rounding (softmax
// is invariant to a shift common to every key), so its elements would be zero in some layouts and
// not in others. No dropout. Positions 9 > --seq-length 7: rows 7 and 8 of wpe never get a gradient.
GptConfig model(bool untied = false) {
  GptConfig c;
  c.num_layers = 4;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 37;  // padded to 128 x tp: the padding's rows are left out of the count
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = untied;
  return c;
}

constexpr int kSteps = 3, kGlobalBatch = 4;

std::vector<Tensor> batches(const GptConfig& c, int vocab_used) {
  std::mt19937_64 rng(77);
  std::uniform_int_distribution<int32_t> u(0, vocab_used - 1);
  std::vector<Tensor> out;
  for (int s = 0; s < kSteps; ++s) {
    Tensor t = Tensor::empty({kGlobalBatch, c.seq_length + 1}, DType::i32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = u(rng);
    out.push_back(t);
  }
  return out;
}

struct Stats {
  std::vector<double> params_norm;
  std::vector<int64_t> zeros;
  double gathered_norm = 0;  // L2 norm of the global parameters after the last step, from every rank's values
};

ParallelConfig layout(int tp, int pp, int dp, int zero = 0) {
  ParallelConfig p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.zero_stage = zero;
  return p;
}

Stats run(const GptConfig& m, const ParallelConfig& par, int vocab_used, DType dtype = DType::f32) {
  const int world = par.world_size();
  comm::ParallelSizes sizes;
  sizes.tp = par.tp;
  sizes.pp = par.pp;
  sizes.dp = par.dp;
  auto topo = comm::Topology::create(sizes, world).value();
  auto fabric = comm::LocalFabric::create(world).value();
  const std::vector<Tensor> data = batches(m, vocab_used);
  RankSpec spec;
  spec.model = m;
  spec.par = par;
  spec.micro_batch_size = 1;
  spec.micro_batches = kGlobalBatch / par.dp;
  spec.num_threads = 1;
  spec.dtype = dtype;
  Stats stats;
  // Every rank's reports, compared after the run (they come out of all-reduces over the world).
  std::vector<std::vector<double>> norms(static_cast<size_t>(world), std::vector<double>(kSteps, -2));
  std::vector<std::vector<int64_t>> zeros(static_cast<size_t>(world), std::vector<int64_t>(kSteps, -2));
  std::map<std::string, std::vector<double>> params;  // global name -> global tensor
  std::mutex mu;
  std::vector<std::string> errors;
  auto body = [&](int rank) {
    auto world_r = fabric.world(rank);
    auto g = [&](const std::vector<int>& members) { return world_r->group(members).value(); };
    auto tp = g(topo.tp_group(rank));
    auto dp = g(topo.dp_group(rank));
    auto pp = g(topo.pp_group(rank));
    const auto emb_members = topo.embedding_group(rank);
    auto emb = emb_members.empty() ? nullptr : g(emb_members);
    auto all = world_r->everyone().value();
    RankComms comms{tp.get(), pp.get(), dp.get(), emb.get(), all.get()};
    RankEngine engine(spec, topo, rank, comms);
    engine.init(1234);
    const int d = topo.coords(rank).dp;
    for (int s = 0; s < kSteps; ++s) {
      StepRequest req;
      req.step = s + 1;
      req.lr = 1e-2;
      req.weight_decay = 0.1;
      req.clip_grad = 0.5;
      req.params_norm = true;
      req.zeros_in_grad = true;
      const Tensor& b = data[static_cast<size_t>(s)];
      auto out = engine.train_step(b.rows(kGlobalBatch * d / par.dp, kGlobalBatch * (d + 1) / par.dp),
                                   1.0 / (double(kGlobalBatch) * m.seq_length), req);
      if (!out) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("rank " + std::to_string(rank) + ": " + out.status().message());
        return;
      }
      norms[static_cast<size_t>(rank)][static_cast<size_t>(s)] = out.value().params_norm;
      zeros[static_cast<size_t>(rank)][static_cast<size_t>(s)] = out.value().zeros_in_grad;
    }
    for (size_t c = 0; c < engine.chunks().size(); ++c) {
      auto values = engine.param_values(static_cast<int>(c));
      std::lock_guard<std::mutex> lock(mu);
      if (!values) {
        errors.push_back("rank " + std::to_string(rank) + ": " + values.status().message());
        return;
      }
      if (d != 0) continue;  // dp replicas hold the same parameters
      const auto& specs = engine.chunks()[c]->specs();
      for (size_t i = 0; i < specs.size(); ++i) {
        auto& dst = params[specs[i].name];
        dst.resize(static_cast<size_t>(specs[i].global_shape.numel()), std::nan(""));
        const Tensor v = values.value()[i].to(DType::f64);
        for (int64_t k = 0; k < v.numel(); ++k) {
          const int64_t gi = slice_global_index(specs[i], k);
          if (gi >= 0) dst[static_cast<size_t>(gi)] = v.data<double>()[k];
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  for (const auto& e : errors) FAIL(e);
  for (int r = 1; r < world; ++r) {  // every rank got the same values
    CHECK(norms[static_cast<size_t>(r)] == norms[0]);
    CHECK(zeros[static_cast<size_t>(r)] == zeros[0]);
  }
  stats.params_norm = norms[0];
  stats.zeros = zeros[0];
  double sum = 0;
  for (const auto& [name, values] : params)
    for (double v : values) {
      REQUIRE(std::isfinite(v));  // every element came from some rank
      sum += v * v;
    }
  stats.gathered_norm = std::sqrt(sum);
  return stats;
}

}  // namespace

TEST_CASE("step stats: params norm and zero count of every layout equal the 1x1x1 run's", "[step_stats]") {
  const GptConfig m = model();
  const Stats ref = run(m, layout(1, 1, 1), 37);
  // Known zeros: wpe's rows 7 and 8 (16 each), nothing else (tied wte's rows all get the head's gradient).
  for (int s = 0; s < kSteps; ++s) CHECK(ref.zeros[static_cast<size_t>(s)] == 2 * 16);
  // The norm after the last step is the L2 norm of the parameters the ranks hold then.
  CHECK(ref.params_norm.back() == Approx(ref.gathered_norm).epsilon(1e-12));
  CHECK(ref.params_norm[0] != ref.params_norm[1]);  // it follows the updates
  struct Case {
    const char* name;
    ParallelConfig par;
  };
  const Case cases[] = {{"tp 2", layout(2, 1, 1)},
                        {"pp 2", layout(1, 2, 1)},
                        {"dp 2", layout(1, 1, 2)},
                        {"dp 2 ZeRO-1", layout(1, 1, 2, 1)},
                        {"dp 2 ZeRO-2", layout(1, 1, 2, 2)},
                        {"dp 2 ZeRO-3", layout(1, 1, 2, 3)},
                        {"tp 2 pp 2 dp 2 ZeRO-1", layout(2, 2, 2, 1)}};
  for (const Case& c : cases) {
    INFO(c.name);
    const Stats got = run(m, c.par, 37);
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s + 1);
      CHECK(got.zeros[static_cast<size_t>(s)] == ref.zeros[static_cast<size_t>(s)]);
      CHECK(got.params_norm[static_cast<size_t>(s)] == Approx(ref.params_norm[static_cast<size_t>(s)]).epsilon(1e-6));
    }
    CHECK(got.params_norm.back() == Approx(got.gathered_norm).epsilon(1e-12));
  }
}

// With an untied embedding the rows of the tokens no input holds get no gradient: the inputs here are
// drawn from the first 20 of the 37 tokens, so at least 17 rows of wte (16 each) are zero, beside
// wpe's 2 rows; the tokens the inputs do hold are counted here from the batches.
TEST_CASE("step stats: the zero count of an untied embedding counts the unused tokens' rows", "[step_stats]") {
  const GptConfig m = model(/*untied=*/true);
  const std::vector<Tensor> data = batches(m, 20);
  const Stats ref = run(m, layout(1, 1, 1), 20);
  for (int s = 0; s < kSteps; ++s) {
    std::set<int32_t> used;  // the step's input tokens (the last position of a window is only a target)
    const Tensor& b = data[static_cast<size_t>(s)];
    for (int64_t r = 0; r < b.dim(0); ++r)
      for (int64_t t = 0; t < m.seq_length; ++t) used.insert(b.data<int32_t>()[r * b.dim(1) + t]);
    REQUIRE(used.size() <= 20);
    CHECK(ref.zeros[static_cast<size_t>(s)] == (37 - static_cast<int64_t>(used.size())) * 16 + 2 * 16);
  }
  const Stats tp = run(m, layout(2, 2, 1), 20);
  CHECK(tp.zeros == ref.zeros);
}

// Mixed precision: the norm is that of the fp32 master weights, the count over the fp32 main
// gradients; the layouts agree within bf16's rounding of the trained weights (their 16-bit forward
// passes round differently per layout: tests/engine/test_parallel.cpp measures it).
TEST_CASE("step stats: in bf16 every layout reports the 1x1x1 values", "[step_stats]") {
  const GptConfig m = model();
  const Stats ref = run(m, layout(1, 1, 1), 37, DType::bf16);
  CHECK(ref.zeros.front() == 2 * 16);
  for (const ParallelConfig& par : {layout(1, 1, 2, 1), layout(2, 1, 2, 3)}) {
    const Stats got = run(m, par, 37, DType::bf16);
    CHECK(got.zeros == ref.zeros);
    for (int s = 0; s < kSteps; ++s)
      CHECK(got.params_norm[static_cast<size_t>(s)] == Approx(ref.params_norm[static_cast<size_t>(s)]).epsilon(1e-3));
  }
}
