// Mixture of experts in the model's and the run's config (include/troupe/model_config.hpp
// MoeConfig, TrainConfig's expert sizes): the parameter count against every tensor listed from the
// shapes, the FLOPs GEMM by GEMM, the dense model's figures untouched, the JSON form (version 8)
// and older files, and validation's MoE problems of configs built in code (the flags' are
// tests/apps/test_moe_flags.cpp).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/run_identity.hpp"
#include "config/validate.hpp"
#include "troupe/model_config.hpp"
#include "troupe/train_config.hpp"

namespace troupe {
namespace {

using Catch::Contains;
using nlohmann::json;

// Every tensor of the model, listed from the shapes (docs/MODELS.md's names; an MoE layer's as
// Megatron-DeepSpeed's DeepSpeed-MoE and Megatron-Core build them): the reference for
// num_parameters(). Written apart from the product's closed form.
int64_t count_tensors(const GptConfig& m) {
  const int64_t C = m.hidden_size, V = m.vocab_size, F = m.ffn_hidden_size(),
                hs = C / m.num_attention_heads;
  const int64_t H = m.num_attention_heads;
  const bool ln = m.normalization == Normalization::layernorm, bias = m.add_bias_linear;
  const bool swiglu = m.activation == MlpActivation::swiglu;
  int64_t total = 0;
  auto tensor = [&total](int64_t rows, int64_t cols) { total += rows * cols; };
  auto norm = [&] {
    tensor(C, 1);
    if (ln) tensor(C, 1);
  };
  // One MLP of width `width`: c_fc (both halves with SwiGLU) and c_proj, with their biases when
  // `fc_bias` / `proj_bias`.
  auto mlp = [&](int64_t width, bool fc_bias, bool proj_bias) {
    for (int half = 0; half < (swiglu ? 2 : 1); ++half) {
      tensor(width, C);               // c_fc.weight (F, C)
      if (fc_bias) tensor(width, 1);  // c_fc.bias
    }
    tensor(C, width);             // c_proj.weight (C, F)
    if (proj_bias) tensor(C, 1);  // c_proj.bias
  };
  tensor(V, C);                          // wte
  tensor(m.max_position_embeddings, C);  // wpe (learned positions in these models)
  for (int l = 0; l < m.num_layers; ++l) {
    norm();                           // ln_1
    tensor(3 * H * hs, C);            // c_attn.weight
    if (bias) tensor(3 * H * hs, 1);  // c_attn.bias
    tensor(C, H * hs);                // attn.c_proj.weight
    if (bias) tensor(C, 1);           // attn.c_proj.bias
    norm();                           // ln_2
    const MoeConfig& moe = m.moe;
    if (!moe.is_moe_layer(l, m.num_layers)) {
      mlp(F, bias, bias);
      continue;
    }
    const int64_t E = moe.experts_of(l, m.num_layers);
    const int64_t Fe = moe.ffn_hidden > 0 ? moe.ffn_hidden : F;
    const bool megatron = moe.router == MoeRouter::megatron;
    tensor(E, C);                       // router: gate.wg (E, C)
    if (bias && megatron) tensor(E, 1);  // Megatron-Core's router bias
    for (int64_t e = 0; e < E; ++e)
      mlp(Fe, bias, bias);  // both anchors add the experts' c_proj bias (docs/MOE_SEMANTICS.md)
    if (moe.residual) {
      mlp(Fe, bias, bias);  // PR-MoE's MLP, the expert's copy
      tensor(2, C);          // coefficient: Linear(C, 2)
      tensor(2, 1);
    }
    if (moe.shared_expert_ffn > 0) mlp(moe.shared_expert_ffn, bias, bias);
  }
  norm();  // ln_f
  return total;
}

GptConfig small() {
  GptConfig m;
  m.num_layers = 4;
  m.hidden_size = 8;
  m.num_attention_heads = 2;
  m.seq_length = 16;
  m.max_position_embeddings = 16;
  m.vocab_size = 50;
  return m;
}

TEST_CASE(
    "moe config: num_parameters counts the router, the experts, the residual MLP and the shared "
    "expert",
    "[moe]") {
  const GptConfig dense = small();
  // Megatron-DeepSpeed: 4 experts in layers 2 and 4, PR-MoE's residual MLP, GPT-2's biases.
  GptConfig ds = dense;
  ds.moe.num_experts = {4};
  ds.moe.layer_freq = 2;
  ds.moe.router = MoeRouter::deepspeed;
  ds.moe.topk = 1;
  ds.moe.residual = true;
  CHECK(ds.num_parameters() == count_tensors(ds));
  // By hand: each MoE layer replaces the dense MLP (8x32 + 32 + 32x8 + 8 = 552) by the router 4 x
  // 8, four experts of 552, the residual MLP 552 and its coefficient 2 x 8 + 2.
  CHECK(ds.num_parameters() - dense.num_parameters() == 2 * (32 + 4 * 552 + 552 + 18 - 552));
  // Megatron-Core: per-layer counts by a pattern, experts of their own width, a shared expert,
  // c_proj's bias kept.
  GptConfig lm = dense;
  lm.moe.num_experts = {3, 5};
  lm.moe.layer_pattern = {1, 0, 0, 1};
  lm.moe.ffn_hidden = 12;
  lm.moe.shared_expert_ffn = 16;
  CHECK(lm.num_parameters() == count_tensors(lm));
  // SwiGLU without biases (LLaMA's MLP).
  GptConfig llama = lm;
  llama.activation = MlpActivation::swiglu;
  llama.add_bias_linear = false;
  llama.ffn_hidden = 24;
  CHECK(llama.num_parameters() == count_tensors(llama));
  // The dense model is what it was.
  CHECK(dense.num_parameters() == count_tensors(dense));
}

// The GEMMs one token runs forward, each 2 m n k, per layer; backward is twice forward.
double count_gemm_flops(const GptConfig& m, double tokens) {
  const double C = m.hidden_size, s = m.seq_length, F = m.ffn_hidden_size(),
               Vp = static_cast<double>(m.padded_vocab_size(1));
  const double e = m.activation == MlpActivation::swiglu ? 3 : 2;  // fc1 halves + fc2
  double forward = 2 * tokens * C * Vp;                            // logits
  for (int l = 0; l < m.num_layers; ++l) {
    forward += 2 * tokens * C * 3 * C + 2 * tokens * C * C;  // qkv, projection
    forward += 2 * (2 * tokens * s * C / 2);                 // QK^T and PV, causal halves
    if (!m.moe.is_moe_layer(l, m.num_layers)) {
      forward += tokens * 2 * C * F * e;
      continue;
    }
    const double E = m.moe.experts_of(l, m.num_layers), Fe = m.expert_ffn_hidden_size();
    forward += 2 * tokens * C * E;                    // router
    forward += m.moe.topk * tokens * 2 * C * Fe * e;  // k experts per token
    if (m.moe.residual) forward += tokens * 2 * C * Fe * e + 2 * tokens * C * 2;
    if (m.moe.shared_expert_ffn > 0) forward += tokens * 2 * C * m.moe.shared_expert_ffn * e;
  }
  return 3 * forward;
}

TEST_CASE(
    "moe config: FLOPs count k experts per token, the router, the residual MLP and the shared "
    "expert",
    "[moe]") {
  GptConfig ds = small();
  ds.moe.num_experts = {4};
  ds.moe.layer_freq = 2;
  ds.moe.router = MoeRouter::deepspeed;
  ds.moe.topk = 2;
  ds.moe.residual = true;
  CHECK(ds.flops_per_iteration(64) == Approx(count_gemm_flops(ds, 64)).epsilon(1e-12));
  GptConfig lm = small();
  lm.set_llama_family();
  lm.ffn_hidden = 24;
  lm.moe.num_experts = {3, 5};
  lm.moe.layer_pattern = {1, 0, 0, 1};
  lm.moe.topk = 3;
  lm.moe.ffn_hidden = 12;
  lm.moe.shared_expert_ffn = 16;
  CHECK(lm.flops_per_iteration(32) == Approx(count_gemm_flops(lm, 32)).epsilon(1e-12));
  // Without experts the closed form is Megatron's, bit for bit as before.
  const GptConfig dense = small();
  const double s = dense.seq_length, L = dense.num_layers, h = dense.hidden_size, q = h, kv = h;
  const double Vp = static_cast<double>(dense.padded_vocab_size(1));
  const double per_token =
      6.0 * (L * (h * dense.ffn_hidden_size() * 2.0 + h * (q + 2 * kv) + q * h) + h * Vp);
  CHECK(dense.flops_per_iteration(64) == 64.0 * (per_token + 6.0 * s * L * q));
}

TEST_CASE(
    "moe config: the JSON keeps MoE under model.moe and the expert sizes in parallel; older files "
    "are dense",
    "[moe]") {
  TrainConfig c;
  c.model.moe.num_experts = {8};
  c.model.moe.router = MoeRouter::deepspeed;
  c.model.moe.layer_freq = 2;
  c.model.moe.load_balancing = MoeLoadBalancing::none;
  c.model.moe.drop_policy = MoeDropPolicy::position;
  c.expert_model_parallel_size = 4;
  c.expert_tensor_parallel_size = 1;
  const json j = json::parse(c.to_json());
  CHECK(j.at("version") == 9);
  const json& m = j.at("model").at("moe");
  CHECK(m.at("num_experts") == json::array({8}));
  CHECK(m.at("router") == "deepspeed");
  CHECK(m.at("layer_freq") == 2);
  CHECK(m.at("load_balancing") == "none");
  CHECK(m.at("drop_policy") == "position");
  CHECK(m.size() == 21);
  CHECK(j.at("parallel").at("expert_model_parallel_size") == 4);
  CHECK(j.at("parallel").at("expert_tensor_parallel_size") == 1);
  auto back = TrainConfig::from_json(j.dump());
  REQUIRE(back.is_ok());
  CHECK(back.value().model.moe == c.model.moe);
  CHECK(back.value().expert_model_parallel_size == 4);
  CHECK(back.value().expert_tensor_parallel_size == 1);

  // A version 7 file has none of it: a dense model, expert sizes 1 and 0 (TrainConfig's defaults).
  json old = j;
  old["version"] = 7;
  old["model"].erase("moe");
  for (const char* key : {"context_parallel_size", "cp_comm_type", "ds_sequence_parallel_size"}) old["parallel"].erase(key);
  old["parallel"].erase("expert_model_parallel_size");
  old["parallel"].erase("expert_tensor_parallel_size");
  auto dense = TrainConfig::from_json(old.dump());
  REQUIRE(dense.is_ok());
  CHECK_FALSE(dense.value().model.moe.enabled());
  CHECK(dense.value().model.moe == MoeConfig{});
  CHECK(dense.value().expert_model_parallel_size == 1);
  CHECK(dense.value().expert_tensor_parallel_size == 0);
  // ... and a version 7 file with it is from elsewhere.
  json old_with = j;
  old_with["version"] = 7;
  CHECK_THAT(TrainConfig::from_json(old_with.dump()).status().message(),
             Contains("unknown key \"model.moe\""));

  auto error_after = [&j](auto edit) {
    json e = j;
    edit(e);
    auto r = TrainConfig::from_json(e.dump());
    REQUIRE_FALSE(r.is_ok());
    return r.status().message();
  };
  CHECK_THAT(error_after([](json& e) { e["model"].erase("moe"); }),
             Contains("missing key \"model.moe\""));
  CHECK_THAT(error_after([](json& e) { e["model"]["moe"].erase("topk"); }),
             Contains("missing key \"model.moe.topk\""));
  CHECK_THAT(error_after([](json& e) { e["model"]["moe"]["router"] = "switch"; }),
             Contains("\"model.moe.router\" must be \"deepspeed\" or \"megatron\""));
  CHECK_THAT(
      error_after([](json& e) { e["model"]["moe"]["load_balancing"] = "sinkhorn"; }),
      Contains("\"model.moe.load_balancing\" must be \"aux_loss\", \"seq_aux_loss\" or \"none\""));
  CHECK_THAT(error_after([](json& e) { e["model"]["moe"]["drop_policy"] = 1; }),
             Contains("\"model.moe.drop_policy\" must be \"probs\" or \"position\""));
  CHECK_THAT(error_after([](json& e) {
               e["model"]["moe"]["num_experts"] = json::array({8, "8"});
             }),
             Contains("\"model.moe.num_experts\""));
  CHECK_THAT(error_after([](json& e) { e["model"]["moe"]["num_experts"] = 8; }),
             Contains("\"model.moe.num_experts\" must be an array of integers"));
  CHECK_THAT(error_after([](json& e) { e["model"]["moe"]["experts"] = 8; }),
             Contains("unknown key \"model.moe.experts\""));
  CHECK_THAT(error_after([](json& e) { e["parallel"]["expert_model_parallel_size"] = 0; }),
             Contains("\"parallel.expert_model_parallel_size\""));
}

TrainConfig valid_moe() {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden_size = 48;
  c.model.num_attention_heads = 4;
  c.model.seq_length = 16;
  c.model.max_position_embeddings = 16;
  c.model.moe.num_experts = {4};
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  c.train_iters = 5;
  c.mock_data = true;
  c.tokenizer_type = "ByteLevelTokenizer";
  return c;
}

// Validation's problem lines ("N problems:" and one line each, or one message; none when ok).
std::vector<std::string> moe_problems(const Status& st) {
  std::vector<std::string> out;
  if (st.is_ok()) return out;
  const std::string m = st.message();
  for (size_t at = 0; at < m.size();) {
    size_t end = m.find("\n  - ", at);
    const std::string line = m.substr(at, end == std::string::npos ? end : end - at);
    if (line.find(" problems:") == std::string::npos) out.push_back(line);
    at = end == std::string::npos ? m.size() : end + 5;
  }
  return out;
}

TEST_CASE(
    "moe config: validation of configs built in code: each router's own settings, the layout by "
    "world size",
    "[moe]") {
  const Status ok = validate_train_config(valid_moe());
  INFO(ok.message());
  CHECK(ok.is_ok());

  TrainConfig lm = valid_moe();
  lm.model.moe.residual = true;
  lm.model.moe.drop_tokens = false;
  lm.model.moe.pad_to_capacity = true;  // without a capacity
  TrainConfig ds = valid_moe();
  ds.model.moe.router = MoeRouter::deepspeed;
  ds.model.moe.layer_freq = 1;
  ds.model.moe.shared_expert_ffn = 64;
  ds.model.moe.z_loss_coeff = 1e-3;
  ds.model.moe.pre_softmax = true;
  ds.model.moe.load_balancing = MoeLoadBalancing::seq_aux_loss;
  ds.model.moe.input_jitter_eps = 0.01;
  ds.model.moe.drop_policy = MoeDropPolicy::position;
  const std::vector<std::string> l = moe_problems(validate_train_config(lm));
  const std::vector<std::string> d = moe_problems(validate_train_config(ds));
  INFO(validate_train_config(lm).message() << "\n" << validate_train_config(ds).message());
  REQUIRE(l.size() == 2);
  CHECK_THAT(
      l[0],
      Contains("--mlp-type residual (PR-MoE, Megatron-DeepSpeed's) with the megatron router"));
  CHECK_THAT(l[1], Contains("--moe-pad-expert-input-to-capacity needs a capacity"));
  REQUIRE(d.size() == 6);
  CHECK_THAT(d[0],
             Contains("--moe-shared-expert-intermediate-size is Megatron-Core's router setting"));
  for (const char* flag :
       {"--moe-router-pre-softmax", "--moe-z-loss-coeff", "--moe-input-jitter-eps",
        "--moe-router-load-balancing-type seq_aux_loss", "--moe-token-drop-policy position"})
    CHECK(std::any_of(d.begin(), d.end(),
                      [&](const std::string& p) { return p.find(flag) != std::string::npos; }));

  // The expert-parallel size divides the data-parallel size: 1 in one process, the ranks' under
  // troupe launch (validate_train_config's world_size).
  TrainConfig ep = valid_moe();
  ep.expert_model_parallel_size = 2;
  const std::vector<std::string> one = moe_problems(validate_train_config(ep));
  REQUIRE(one.size() == 1);
  CHECK_THAT(one[0],
             Contains("--expert-model-parallel-size 2 does not divide the data-parallel size 1"));
  CHECK(moe_problems(validate_train_config(ep, nullptr, {}, 4)).empty());
  ep.data_parallel_size = 2;
  CHECK(moe_problems(validate_train_config(ep)).empty());
  // Expert parallelism without experts, and a stored config's MoE problems, come as any other.
  TrainConfig none = valid_moe();
  none.model.moe = MoeConfig{};
  none.expert_model_parallel_size = 2;
  CHECK_THAT(validate_train_config(none).message(),
             Contains("splits experts over ranks, but the model has none"));
  GptConfig bad = valid_moe().model;
  bad.vocab_size = 100;
  bad.moe.num_experts = {4, 4, 4};
  CHECK_THAT(bad.validate().message(),
             Contains("--num-experts lists 3 values but the model has 2 MoE layers"));
  // The width each split expert holds.
  TrainConfig etp = valid_moe();
  etp.tensor_model_parallel_size = 4;
  etp.model.moe.ffn_hidden = 30;
  const std::vector<std::string> width = moe_problems(validate_train_config(etp));
  REQUIRE(width.size() == 1);
  CHECK_THAT(
      width[0],
      Contains("--moe-ffn-hidden-size 30 (each expert's width) is not divisible by the expert "
               "tensor-parallel size 4"));
  etp.expert_tensor_parallel_size = 1;
  CHECK(moe_problems(validate_train_config(etp)).empty());
}


TEST_CASE("moe config: a resume keeps what shapes the experts; the routing settings may change", "[moe]") {
  TrainConfig saved = valid_moe();
  saved.model.vocab_size = 257;
  TrainConfig now = saved;
  now.model.moe.topk = 1;
  now.model.moe.pre_softmax = true;
  now.model.moe.capacity_factor = 2;
  now.expert_model_parallel_size = 2;
  const ResumeCheck ok = check_resume(now, saved);
  INFO(ok.status("ckpt").message());
  CHECK(ok.refused.empty());
  auto changed = [&](const ResumeCheck& r, const std::string& what) {
    return std::any_of(r.changed.begin(), r.changed.end(), [&](const std::string& c) { return c == what; });
  };
  CHECK(changed(ok, "MoE top-k 2 -> 1"));
  CHECK(changed(ok, "MoE capacity factor 1 -> 2"));
  CHECK(changed(ok, "expert-parallel size 1 -> 2"));

  now.model.moe.num_experts = {8};
  now.model.moe.router = MoeRouter::deepspeed;
  now.model.moe.ffn_hidden = 96;
  now.model.moe.residual = true;
  const ResumeCheck bad = check_resume(now, saved);
  const std::string m = bad.status("ckpt").message();
  INFO(m);
  CHECK_THAT(m, Contains("the experts of each layer (--num-experts and its layer rule) is 8 8 but the checkpoint's run "
                         "used 4 4 -- "));
  CHECK_THAT(m, Contains("the MoE router (Megatron-DeepSpeed's or Megatron-LM's flags) is deepspeed but the "
                         "checkpoint's run used megatron"));
  CHECK_THAT(m, Contains("each expert's width (--moe-ffn-hidden-size) is 96 but the checkpoint's run used 192"));
  CHECK_THAT(m, Contains("--mlp-type residual is on but the checkpoint's run used off"));
  // A dense checkpoint does not resume as an MoE model, nor fine-tunes into one (its MLPs are no experts).
  TrainConfig dense = saved;
  dense.model.moe = MoeConfig{};
  CHECK_THAT(check_resume(saved, dense).status("ckpt").message(),
             Contains("the experts of each layer (--num-experts and its layer rule) is 4 4 but the checkpoint's run "
                      "used none"));
  CHECK_FALSE(check_finetune(saved, dense).refused.empty());
}

}  // namespace
}  // namespace troupe
