// The sizes of mixture-of-experts models: GptConfig::num_parameters against the tensors
// model/params.hpp lays out (Mixtral-8x7B's published 46,702,792,704 among them), and the memory plan
// (config/memory_estimate.hpp) of Mixtral-8x7B with expert parallelism against a hand computation.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "config/memory_estimate.hpp"
#include "config/model_presets.hpp"
#include "model/params.hpp"
#include "troupe/model_config.hpp"
#include "troupe/train_config.hpp"

namespace troupe {
namespace {

using Catch::Contains;

// The model's parameters as model/params.hpp lays them out: the sum of the global shapes.
int64_t sum_of_specs(const GptConfig& m) {
  int64_t n = 0;
  for (const ParamSpec& s : gpt2_param_specs(m)) n += s.global_shape.numel();
  return n;
}

TEST_CASE("moe sizes: Mixtral-8x7B has its published 46.7e9 parameters, from the shapes", "[family][moe]") {
  const GptConfig& m = find_model_preset("mixtral-8x7b")->model;
  REQUIRE(m.validate().is_ok());
  // By hand, from Mixtral's tensors: embed_tokens and lm_head (32000, 4096); per layer q (4096, 4096),
  // k and v (1024, 4096), o (4096, 4096), two RMSNorm weights (4096), the gate (8, 4096) and 8 experts
  // of w1, w3 (14336, 4096) and w2 (4096, 14336); the final norm.
  const int64_t attention = 4096LL * 4096 + 2 * 1024LL * 4096 + 4096LL * 4096;
  const int64_t experts = 8 * 3 * 14336LL * 4096;
  const int64_t layer = attention + 2 * 4096 + 8 * 4096 + experts;
  const int64_t by_hand = 2 * 32000LL * 4096 + 32 * layer + 4096;
  CHECK(by_hand == 46'702'792'704);
  CHECK(sum_of_specs(m) == by_hand);
  CHECK(m.num_parameters() == by_hand);
}

// Random small MoE models, every MoE option drawn: num_parameters equals the specs' sum.
TEST_CASE("moe sizes: num_parameters counts the router, experts, PR-MoE and shared expert as laid out",
          "[family][moe]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()) + 28);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 200; ++trial) {
    GptConfig m;
    m.num_layers = pick(1, 6);
    m.num_attention_heads = 2;
    m.hidden_size = 2 * pick(1, 6);
    m.vocab_size = pick(5, 70);
    if (pick(0, 1)) m.set_llama_family();
    m.ffn_hidden = pick(1, 20);
    m.add_bias_linear = pick(0, 1);
    MoeConfig& moe = m.moe;
    moe.router = pick(0, 1) ? MoeRouter::megatron : MoeRouter::deepspeed;
    moe.num_experts = {pick(1, 5)};
    if (pick(0, 1)) moe.num_experts.push_back(pick(1, 5));  // a list, one value per MoE layer
    moe.layer_freq = pick(1, 2);
    if (moe.num_experts.size() > 1) moe.layer_freq = m.num_layers > 1 ? (m.num_layers + 1) / 2 : 1;
    moe.ffn_hidden = pick(0, 1) ? pick(1, 9) : 0;
    moe.residual = pick(0, 1);
    moe.shared_expert_ffn = pick(0, 1) ? pick(1, 7) : 0;
    INFO("trial " << trial << " layers " << m.num_layers << " experts " << moe.num_experts[0] << " router "
                  << to_string(moe.router) << " residual " << moe.residual << " shared " << moe.shared_expert_ffn);
    CHECK(m.num_parameters() == sum_of_specs(m));
  }
}

TEST_CASE("memory plan: Mixtral-8x7B on tp 2 x pp 2 x dp 4 with ep 2, by hand", "[family][memory][moe]") {
  TrainConfig c;
  c.model = find_model_preset("mixtral-8x7b")->model;  // vocabulary 32000: no padding at tp 2
  c.tensor_model_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  c.data_parallel_size = 4;
  c.expert_model_parallel_size = 2;
  c.zero_stage = 1;
  c.micro_batch_size = 1;
  c.global_batch_size = 16;
  // One layer on one rank: the attention split in two (qkv 6144 rows, o 4096 columns), two RMSNorm
  // weights and the router (8, 4096) whole; 4 of the 8 experts, each split in two.
  const double dense = 2 * 4096 + (4096.0 * 6144 + 4096.0 * 4096) / 2 + 8 * 4096;
  const double expert = (4096.0 * 2 * 14336 + 14336.0 * 4096) / 2;
  REQUIRE(dense == 21'012'480);
  const double experts = 4 * expert;
  const double first_dense = 16 * dense + 16000.0 * 4096;  // wte's half of the vocabulary
  const double last_dense = 16 * dense + 4096 + 16000.0 * 4096;  // ln_f and lm_head's half
  const MemoryEstimate e = estimate_memory(c, 1);
  REQUIRE(e.stages.size() == 2);
  CHECK(e.stages[0].parameters == first_dense + 16 * experts);
  CHECK(e.stages[1].parameters == last_dense + 16 * experts);
  // ZeRO-1: weights and gradients 8 bytes; the moments' 8 bytes and the reduce-scatter's gradient
  // partition's 4 over the 4 replicas of the dense parameters, over the 2 (= 4 / ep) replicas of each
  // expert.
  CHECK(e.stages[0].model_state_bytes == Approx(11 * first_dense + 14 * 16 * experts));
  // The ranks hold the model once: tp x ep shards of the experts, tp of the rest, whose norms and router
  // are replicated over tp.
  const double replicated = 32 * (2 * 4096 + 8 * 4096) + 4096;
  CHECK(2 * (first_dense + last_dense) - replicated + 2 * 2 * 32 * experts ==
        static_cast<double>(c.model.num_parameters()));
  // Activations of a layer per token, in floats: 4 x 4096 whole; (qkv 6144 + attention output 4096 +
  // 2 experts x 3 x 14336) / 2 + the router's logits and probabilities (2 x 8) + the 2 rows gathered
  // to their experts, their outputs and (ep 2) the outputs of this rank's own assignments, 4096 each;
  // probabilities 32 x 4096 / 2.
  const double per_layer = 4 * 4096 + (6144 + 4096 + 2 * 3 * 14336) / 2.0 + 16 + 2 * 3 * 4096 + 32 * 4096 / 2.0;
  CHECK(e.micro_batch_activation_none == Approx(4.0 * 4096 * 16 * per_layer));

  // Whole experts on every TP rank (expert-TP 1): each rank holds 4 unsplit experts.
  c.expert_tensor_parallel_size = 1;
  CHECK(estimate_memory(c, 1).stages[0].parameters == Approx(first_dense + 16 * 4 * 2 * expert));
  // Without expert parallelism each rank holds all 8, the moments over all 4 replicas.
  c.expert_tensor_parallel_size = 0;
  c.expert_model_parallel_size = 1;
  const MemoryEstimate all = estimate_memory(c, 1);
  CHECK(all.stages[0].parameters == first_dense + 16 * 8 * expert);
  CHECK(all.stages[0].model_state_bytes == Approx(11 * all.stages[0].parameters));
  const std::vector<std::string> plan = memory_plan_lines(c, 1);
  REQUIRE(!plan.empty());
  CHECK_THAT(plan[0], Contains("46702792704 parameters"));
}

}  // namespace
}  // namespace troupe
