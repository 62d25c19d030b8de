// Mixtral through Hugging Face folders (docs/MODELS.md, "Mixtral"): MixtralConfig read and refused,
// the row map of the sparse MoE block, troupe -> MixtralForCausalLM -> troupe bitwise from a
// checkpoint written here (no training flags needed), the MoE models HF Mixtral cannot hold refused
// naming why (in code and through `troupe ckpt export`, exit 2), and the exported folder's loss in
// bench/torch_gpt.py's own float64 Mixtral (written from HF's published semantics) against GptChunk's.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include <sys/wait.h>

#include <catch2/catch.hpp>

#include "config/imported_config.hpp"
#include "kernels/ops.hpp"
#include "model/gpt_chunk.hpp"
#include "model/params.hpp"
#include "storage/checkpoint.hpp"
#include "storage/hf_export.hpp"
#include "tests/storage/hf_checkpoint_util.hpp"
#include "storage/hf_import.hpp"
#include "storage/hf_names.hpp"
#include "storage/safetensors.hpp"
#include "tests/test_util.hpp"
#include "troupe/train_config.hpp"

using namespace troupe;
using namespace troupe::hf_test;
using Catch::Matchers::Contains;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A tiny Mixtral of odd sizes: GQA 4:2, head_dim 6 != hidden / heads, 4 SwiGLU experts of width 11,
// top-2, untied; `variant` 1: interleaved rotary pairs, a tied head, 3 experts top-1, and the router's
// training-only settings (sequence aux loss, z-loss, jitter) that only the "troupe" block carries.
GptConfig tiny_mixtral(int variant = 0) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 12;
  c.num_attention_heads = 4;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 8;
  c.set_llama_family();
  c.num_query_groups = 2;
  c.kv_channels = 6;
  c.ffn_hidden = 11;
  c.rotary_base = 300;
  c.layernorm_epsilon = 1e-6;
  MoeConfig& moe = c.moe;
  moe.num_experts = {4};
  moe.router = MoeRouter::megatron;
  moe.topk = 2;
  moe.drop_tokens = false;
  moe.aux_loss_coeff = 0.01;
  if (variant == 1) {
    c.rotary_interleaved = true;
    c.untie_embeddings_and_output_weights = false;
    moe.num_experts = {3};
    moe.topk = 2;  // (top-1 without pre-softmax is refused, as Megatron-Core refuses it)
    moe.load_balancing = MoeLoadBalancing::seq_aux_loss;
    moe.z_loss_coeff = 1e-3;
    moe.input_jitter_eps = 0.02;
    moe.aux_loss_coeff = 0.25;
  }
  return c;
}

std::string config_json(const GptConfig& model) {
  TrainConfig t;
  t.model = model;
  t.tokenizer_type = "NullTokenizer";
  return t.to_json();
}


// The safetensors of a folder, by name.
std::map<std::string, Tensor> folder_tensors(const std::string& file) {
  auto src = h5read::open_file_source(file);
  REQUIRE(src.is_ok());
  auto header = read_safetensors_header(**src, "");
  REQUIRE(header.is_ok());
  std::map<std::string, Tensor> out;
  for (const SafetensorsTensor& t : header->tensors) {
    Tensor x = Tensor::empty(t.shape);
    REQUIRE(read_safetensors_tensor(**src, *header, t, x, "").is_ok());
    out.emplace(t.name, x);
  }
  return out;
}

const char* kPublished = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
  "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
  "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0",
  "use_cache": true, "vocab_size": 32000})";

}  // namespace

TEST_CASE("hf mixtral: MixtralConfig read with its defaults, every unsupported option refused at once",
          "[hf][mixtral]") {
  auto published = parse_hf_config(kPublished, "");
  REQUIRE(published.is_ok());
  const HfArch& a = published->arch;
  CHECK(a.family == HfFamily::mixtral);
  CHECK((a.layers == 32 && a.hidden == 4096 && a.heads == 32 && a.groups == 8 && a.head_dim == 128));
  CHECK((a.ffn == 14336 && a.experts == 8 && a.topk == 2 && a.aux_loss_coef == 0.02));
  CHECK((a.vocab == 32000 && a.positions == 32768 && a.eps == 1e-5 && a.rope_theta == 1e6 && !a.bias && !a.tied));
  CHECK((published->bos_token_id == 1 && published->eos_token_id == 2));
  // The model it stands for: Megatron-Core's router without pre-softmax, dropless, every layer MoE.
  HfModel m;
  m.config = *published;
  const GptConfig g = imported_train_config(m).model;
  CHECK((g.moe.num_experts == std::vector<int>{8} && g.moe.router == MoeRouter::megatron && g.moe.topk == 2));
  CHECK((!g.moe.drop_tokens && !g.moe.pre_softmax && g.moe.aux_loss_coeff == 0.02));
  CHECK((g.moe.load_balancing == MoeLoadBalancing::aux_loss && g.moe.layer_freq == 1 && g.moe.layer_pattern.empty()));
  CHECK((g.moe.moe_layers(g.num_layers) == 32 && g.expert_ffn_hidden_size() == 14336));
  CHECK((g.normalization == Normalization::rmsnorm && g.position_embedding == PositionEmbedding::rope));
  CHECK((g.activation == MlpActivation::swiglu && !g.add_bias_linear && g.untie_embeddings_and_output_weights));
  CHECK((g.query_groups() == 8 && g.rotary_base == 1e6 && g.num_parameters() == 46'702'792'704));

  // MixtralConfig's defaults (Mixtral-8x7B's), not LlamaConfig's.
  auto defaults = parse_hf_config(R"({"model_type":"mixtral"})", "");
  REQUIRE(defaults.is_ok());
  const HfArch& d = defaults->arch;
  CHECK((d.groups == 8 && d.ffn == 14336 && d.experts == 8 && d.topk == 2 && d.aux_loss_coef == 0.001));
  CHECK((d.rope_theta == 1e6 && d.eps == 1e-5 && d.positions == 131072 && !d.tied));

  auto bad = parse_hf_config(R"({"model_type":"mixtral","architectures":["MistralForCausalLM"],"hidden_size":48,)"
                             R"("num_attention_heads":6,"num_key_value_heads":4,"num_local_experts":2,)"
                             R"("num_experts_per_tok":3,"router_jitter_noise":0.1,"sliding_window":16,)"
                             R"("max_position_embeddings":64,"router_aux_loss_coef":-1,"hidden_act":"gelu",)"
                             R"("rope_scaling":{"type":"linear","factor":2.0}})",
                             "c.json: ");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().is_bad_input());
  for (const char* what : {"c.json: ", "architectures", "num_key_value_heads 4 does not divide",
                           "num_experts_per_tok 3 exceeds num_local_experts 2", "router_jitter_noise",
                           "sliding_window is 16", "router_aux_loss_coef", "hidden_act", "rope_scaling"})
    CHECK_THAT(bad.status().message(), Contains(what));
  // A window no shorter than the positions masks nothing: accepted.
  CHECK(parse_hf_config(R"({"model_type":"mixtral","max_position_embeddings":64,"sliding_window":64})", "").is_ok());
}

TEST_CASE("hf mixtral: the row map covers every troupe row once, experts by global index", "[hf][mixtral]") {
  for (int variant : {0, 1}) {
    INFO("variant " << variant);
    const GptConfig cfg = tiny_mixtral(variant);
    Result<HfArch> arch = hf_arch_of(cfg);
    REQUIRE(arch.is_ok());
    CHECK(arch->family == HfFamily::mixtral);
    CHECK((arch->experts == cfg.moe.num_experts[0] && arch->topk == cfg.moe.topk && arch->ffn == 11));
    const std::vector<HfTensor> hf = hf_family_tensors(*arch);
    std::map<std::string, std::vector<int>> covered;
    for (const HfTensor& t : hf) {
      auto& rows = covered[t.troupe_name];
      rows.resize(static_cast<size_t>(t.troupe_shape[0]));
      for (int64_t r = 0; r < t.hf_shape[0]; ++r) ++rows[static_cast<size_t>(hf_troupe_row(t, r))];
    }
    for (const auto& [name, rows] : covered)
      for (size_t r = 0; r < rows.size(); ++r) {
        INFO(name << " row " << r);
        REQUIRE(rows[r] == 1);
      }
    std::map<std::string, Shape> specs;
    for (const ParamSpec& s : gpt2_param_specs(cfg)) specs[s.name] = s.global_shape;
    CHECK(specs.size() == covered.size());
    for (const HfTensor& t : hf) CHECK(specs.at(t.troupe_name) == t.troupe_shape);
  }
  // The names and shapes of layer 1's block.
  Result<HfArch> arch = hf_arch_of(tiny_mixtral());
  REQUIRE(arch.is_ok());
  std::map<std::string, const HfTensor*> by_name;
  const std::vector<HfTensor> hf = hf_family_tensors(*arch);
  for (const HfTensor& t : hf) by_name[t.name] = &t;
  const std::string b = "model.layers.1.block_sparse_moe.";
  REQUIRE(by_name.count(b + "gate.weight"));
  CHECK((by_name[b + "gate.weight"]->hf_shape == Shape{4, 12} &&
         by_name[b + "gate.weight"]->troupe_name == "transformer.h.1.mlp.router.weight"));
  for (const char* w : {"w1", "w2", "w3"}) REQUIRE(by_name.count(b + "experts.3." + w + ".weight"));
  const HfTensor& w1 = *by_name[b + "experts.3.w1.weight"];
  const HfTensor& w2 = *by_name[b + "experts.3.w2.weight"];
  const HfTensor& w3 = *by_name[b + "experts.3.w3.weight"];
  CHECK((w1.troupe_name == "transformer.h.1.mlp.experts.3.c_fc.weight" && w1.row0 == 0 && w1.hf_shape == Shape{11, 12}));
  CHECK((w3.troupe_name == w1.troupe_name && w3.row0 == 11 && w3.hf_shape == Shape{11, 12}));
  CHECK((w2.troupe_name == "transformer.h.1.mlp.experts.3.c_proj.weight" && w2.hf_shape == Shape{12, 11}));
  CHECK(by_name.count("model.layers.0.mlp.gate_proj.weight") == 0);
  CHECK(by_name.count("model.layers.0.block_sparse_moe.experts.4.w1.weight") == 0);
}

TEST_CASE("hf mixtral: troupe -> MixtralForCausalLM -> troupe is bitwise, config.json has Mixtral's keys",
          "[hf][mixtral]") {
  for (int variant : {0, 1}) {
    INFO("variant " << variant);
    test::TempDir dir;
    const GptConfig cfg = tiny_mixtral(variant);
    Result<HfArch> arch = hf_arch_of(cfg);
    REQUIRE(arch.is_ok());
    const std::vector<NamedTensor> params = random_params(cfg, 7 + variant);
    write_checkpoint(dir.str("ckpt"), params, config_json(cfg));
    REQUIRE(export_of(dir.str("ckpt"), dir.str("hf"), *arch).message() == "");
    const nlohmann::json j = nlohmann::json::parse(read_text(dir.str("hf/config.json")));
    CHECK(j["architectures"] == nlohmann::json::array({"MixtralForCausalLM"}));
    CHECK(j["model_type"] == "mixtral");
    CHECK((j["num_local_experts"] == cfg.moe.num_experts[0] && j["num_experts_per_tok"] == cfg.moe.topk));
    CHECK((j["router_aux_loss_coef"] == cfg.moe.aux_loss_coeff && j["intermediate_size"] == 11));
    CHECK((j["hidden_size"] == 12 && j["num_attention_heads"] == 4 && j["num_key_value_heads"] == 2));
    CHECK((j["head_dim"] == 6 && j["num_hidden_layers"] == 2 && j["vocab_size"] == 37));
    CHECK((j["rope_theta"] == 300.0 && j["rms_norm_eps"] == 1e-6 && j["hidden_act"] == "silu"));
    CHECK((j["max_position_embeddings"] == 9 && j["sliding_window"].is_null() && j["router_jitter_noise"] == 0.0));
    CHECK(j["tie_word_embeddings"] == !cfg.untie_embeddings_and_output_weights);
    CHECK_FALSE(j.contains("attention_bias"));
    CHECK(j["troupe"]["rotary_interleaved"] == cfg.rotary_interleaved);
    CHECK(j["troupe"]["moe"]["load_balancing"] == to_string(cfg.moe.load_balancing));

    // Exactly Mixtral's names; the experts' halves where Mixtral keeps them.
    std::set<std::string> names;
    for (const HfTensor& t : hf_family_tensors(*arch)) names.insert(t.name);
    const std::map<std::string, Tensor> file = folder_tensors(dir.str("hf/model.safetensors"));
    std::set<std::string> in_file;
    for (const auto& [name, t] : file) in_file.insert(name);
    CHECK(in_file == names);
    CHECK(in_file.count("lm_head.weight") == (cfg.untie_embeddings_and_output_weights ? 1u : 0u));
    std::map<std::string, const NamedTensor*> troupe;
    for (const NamedTensor& p : params) troupe[p.name] = &p;
    const int64_t F = 11, C = 12;
    const float* c_fc = troupe.at("transformer.h.0.mlp.experts.1.c_fc.weight")->tensor.data<float>();
    CHECK(std::memcmp(file.at("model.layers.0.block_sparse_moe.experts.1.w1.weight").data<float>(), c_fc,
                      F * C * sizeof(float)) == 0);
    CHECK(std::memcmp(file.at("model.layers.0.block_sparse_moe.experts.1.w3.weight").data<float>(), c_fc + F * C,
                      F * C * sizeof(float)) == 0);

    Result<HfModel> back = read_hf_folder(dir.str("hf"));
    REQUIRE(back.is_ok());
    std::map<std::string, const NamedTensor*> got;
    for (const NamedTensor& t : back->params) got[t.name] = &t;
    REQUIRE(got.size() == params.size());
    for (const NamedTensor& p : params) {
      INFO(p.name);
      REQUIRE(got.count(p.name));
      REQUIRE(got[p.name]->global_shape == p.global_shape);
      CHECK(std::memcmp(got[p.name]->tensor.raw(), p.tensor.raw(), p.tensor.nbytes()) == 0);
    }
    // The model the folder stands for is the run's: every MoE setting, the training-only ones from the
    // "troupe" block.
    const GptConfig m = imported_train_config(*back).model;
    CHECK(m.moe.num_experts == cfg.moe.num_experts);
    CHECK((m.moe.topk == cfg.moe.topk && m.moe.router == MoeRouter::megatron && !m.moe.drop_tokens));
    CHECK((m.moe.aux_loss_coeff == cfg.moe.aux_loss_coeff && m.moe.load_balancing == cfg.moe.load_balancing));
    CHECK((m.moe.z_loss_coeff == cfg.moe.z_loss_coeff && m.moe.input_jitter_eps == cfg.moe.input_jitter_eps));
    CHECK((m.expert_ffn_hidden_size() == 11 && m.rotary_interleaved == cfg.rotary_interleaved));
    CHECK((m.query_groups() == 2 && m.head_size() == 6 && m.rotary_base == 300 && m.layernorm_epsilon == 1e-6));
    CHECK(m.untie_embeddings_and_output_weights == cfg.untie_embeddings_and_output_weights);
    CHECK((m.seq_length == 7 && m.max_position_embeddings == 9 && m.vocab_size == 37));
    CHECK(m.num_parameters() == cfg.num_parameters());
    // And the imported checkpoint's stored config keeps them (train config version 8's "moe").
    auto stored = TrainConfig::from_json(imported_train_config(*back).to_json());
    REQUIRE(stored.is_ok());
    CHECK(stored->model.moe == m.moe);
  }
}

TEST_CASE("hf mixtral: MoE models Mixtral cannot hold are refused, each reason named", "[hf][mixtral]") {
  struct Case {
    const char* what;
    std::function<void(GptConfig&)> change;
  };
  const std::vector<Case> cases = {
      {"DeepSpeed's gating", [](GptConfig& c) { c.moe.router = MoeRouter::deepspeed; }},
      {"dropless", [](GptConfig& c) { c.moe.drop_tokens = true; }},
      {"pre-softmax", [](GptConfig& c) { c.moe.pre_softmax = true; }},
      {"PR-MoE", [](GptConfig& c) { c.moe.residual = true; }},
      {"shared expert", [](GptConfig& c) { c.moe.shared_expert_ffn = 8; }},
      {"no linear biases", [](GptConfig& c) { c.add_bias_linear = true; }},
      {"an MoE block in every layer", [](GptConfig& c) { c.moe.layer_freq = 2; }},
      {"the same number of experts in every layer", [](GptConfig& c) { c.moe.num_experts = {4, 2}; }},
      {"a SwiGLU MLP", [](GptConfig& c) { c.activation = MlpActivation::gelu; }},
  };
  for (const Case& k : cases) {
    INFO(k.what);
    GptConfig c = tiny_mixtral();
    k.change(c);
    Result<HfArch> arch = hf_arch_of(c);
    REQUIRE_FALSE(arch.is_ok());
    CHECK(arch.status().is_bad_input());
    CHECK_THAT(arch.status().message(), Contains("MixtralForCausalLM") && Contains(k.what) && Contains("docs/MODELS.md"));
  }
  // Every problem at once.
  GptConfig all = tiny_mixtral();
  all.moe.pre_softmax = true;
  all.moe.drop_tokens = true;
  all.moe.shared_expert_ffn = 4;
  const std::string m = hf_arch_of(all).status().message();
  CHECK_THAT(m, Contains("pre-softmax") && Contains("dropless") && Contains("shared expert"));
}

TEST_CASE("hf mixtral: a folder with missing, misshapen or extra expert tensors is refused", "[hf][mixtral]") {
  test::TempDir dir;
  const GptConfig cfg = tiny_mixtral();
  Result<HfArch> arch = hf_arch_of(cfg);
  REQUIRE(arch.is_ok());
  write_checkpoint(dir.str("ckpt"), random_params(cfg, 5), config_json(cfg));
  REQUIRE(export_of(dir.str("ckpt"), dir.str("hf"), *arch).message() == "");
  std::map<std::string, Tensor> file = folder_tensors(dir.str("hf/model.safetensors"));
  std::vector<SafetensorsInput> inputs;
  std::vector<float> extra(11 * 12, 0.5f);
  for (const auto& [name, t] : file) {
    if (name == "model.layers.1.block_sparse_moe.experts.2.w3.weight") continue;
    Shape shape = t.shape();
    if (name == "model.layers.0.block_sparse_moe.gate.weight") shape = Shape{6, 8};  // same bytes, wrong shape
    inputs.push_back({name, shape, t.data<float>()});
  }
  inputs.push_back({"model.layers.0.block_sparse_moe.experts.4.w1.weight", {11, 12}, extra.data()});
  REQUIRE(write_safetensors(dir.str("hf/model.safetensors"), inputs, {}).is_ok());
  auto refused = read_hf_folder(dir.str("hf"));
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.status().is_bad_input());
  CHECK_THAT(refused.status().message(),
             Contains("'model.layers.1.block_sparse_moe.experts.2.w3.weight' is missing") &&
                 Contains("'model.layers.0.block_sparse_moe.gate.weight' has shape (6, 8)") &&
                 Contains("num_local_experts 4") &&
                 Contains("'model.layers.0.block_sparse_moe.experts.4.w1.weight' (in model.safetensors) has no "
                          "counterpart in troupe's Mixtral"));
}

// `troupe ckpt export` itself: a Mixtral-shaped checkpoint exports (exit 0, naming the class); one with
// the pre-softmax router is refused with exit 2, naming it, and writes nothing.
TEST_CASE("hf mixtral: troupe ckpt export of MoE checkpoints, exit 0 and 2", "[hf][mixtral][cli]") {
  const char* bin = std::getenv("TROUPE_BIN");
  if (bin == nullptr || !std::filesystem::exists(bin)) TROUPE_SKIP("no troupe binary (TROUPE_BIN)");
  test::TempDir dir;
  GptConfig cfg = tiny_mixtral();
  write_checkpoint(dir.str("good"), random_params(cfg, 3), config_json(cfg));
  const std::string good = std::string(bin) + " ckpt export --load " + dir.str("good") + " --format hf --output " +
                           dir.str("hf") + " > " + dir.str("good.log") + " 2>&1";
  const int rc = std::system(good.c_str());
  INFO(read_text(dir.str("good.log")));
  REQUIRE(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 0);
  CHECK_THAT(read_text(dir.str("good.log")), Contains("MixtralForCausalLM"));
  CHECK(std::filesystem::exists(dir.str("hf/model.safetensors")));

  cfg.moe.pre_softmax = true;
  write_checkpoint(dir.str("bad"), random_params(cfg, 3), config_json(cfg));
  const std::string bad = std::string(bin) + " ckpt export --load " + dir.str("bad") + " --format hf --output " +
                          dir.str("hf_bad") + " > " + dir.str("bad.log") + " 2>&1";
  const int rc_bad = std::system(bad.c_str());
  const std::string log = read_text(dir.str("bad.log"));
  INFO(log);
  REQUIRE(WIFEXITED(rc_bad));
  CHECK(WEXITSTATUS(rc_bad) == 2);
  CHECK_THAT(log, Contains("MixtralForCausalLM") && Contains("pre-softmax"));
  CHECK_FALSE(std::filesystem::exists(dir.str("hf_bad")));
}

// ---- the outside oracle --------------------------------------------------------------------------

namespace {
std::string python_with_torch() {
  for (const char* py : {"/usr/bin/python3", "python3"})
    if (std::system((std::string(py) + " -c 'import torch, numpy' >/dev/null 2>&1").c_str()) == 0) return py;
  return "";
}
}  // namespace

// GptChunk (the production model, one rank) in float64 on weights float32 holds exactly, exported, and
// evaluated by bench/torch_gpt.py's Mixtral (float64): the mean losses agree within 1e-9 relative.
TEST_CASE("hf mixtral: the exported folder's loss in PyTorch (float64) is GptChunk's", "[hf][mixtral][oracle]") {
  const std::string py = python_with_torch();
  if (py.empty()) TROUPE_SKIP("no python3 with torch and numpy");
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (int variant : {0, 1}) {
    INFO("variant " << variant);
    test::TempDir dir;
    const GptConfig cfg = tiny_mixtral(variant);
    Result<HfArch> arch = hf_arch_of(cfg);
    REQUIRE(arch.is_ok());
    const int K = 5, T = cfg.seq_length;  // windows k: tokens [k T, k T + T + 1) of one stream
    ChunkSpec spec = chunk_layers(cfg, 1, 1, 0, 0);
    spec.micro_batch = K;
    spec.dtype = DType::f64;
    GptChunk chunk(spec, nullptr);
    chunk.init(11);
    std::mt19937_64 rng(13 + variant);
    std::uniform_real_distribution<double> u(-0.3, 0.3);
    std::vector<NamedTensor> params;
    const std::vector<Tensor> local = chunk.params();
    for (size_t k = 0; k < chunk.specs().size(); ++k) {
      const ParamSpec& s = chunk.specs()[k];
      Tensor f = Tensor::zeros(s.global_shape);
      for (int64_t i = 0; i < s.local_shape.numel(); ++i) {
        const int64_t g = slice_global_index(s, i);
        if (g < 0) continue;  // vocabulary padding
        const float v = static_cast<float>(local[k].data<double>()[i] + u(rng));  // float-exact values
        local[k].data<double>()[i] = v;
        f.data<float>()[g] = v;
      }
      params.push_back({s.name, s.global_shape, f});
    }
    std::vector<int32_t> stream(static_cast<size_t>(K * T + 1));
    for (int32_t& t : stream) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab_size));
    Tensor windows = Tensor::empty({K, T + 1}, DType::i32);
    for (int k = 0; k < K; ++k)
      std::memcpy(windows.data<int32_t>() + k * (T + 1), stream.data() + k * T, (T + 1) * sizeof(int32_t));
    const double troupe_loss = chunk.forward_eval(ctx, windows, Tensor(), Tensor()) / (K * T);

    write_checkpoint(dir.str("ckpt"), params, config_json(cfg));
    REQUIRE(export_of(dir.str("ckpt"), dir.str("hf"), *arch).message() == "");
    {
      std::ofstream f(dir.str("tokens.i32"), std::ios::binary);
      f.write(reinterpret_cast<const char*>(stream.data()), static_cast<std::streamsize>(stream.size() * 4));
    }
    const std::string cmd = py + " " + test::source_dir() + "/bench/torch_gpt.py eval --hf-dir " + dir.str("hf") +
                            " --token-file " + dir.str("tokens.i32") + " --seq-length " + std::to_string(T) +
                            " --samples " + std::to_string(K) + " --double --threads 1 > " + dir.str("out.json");
    REQUIRE(std::system(cmd.c_str()) == 0);
    const nlohmann::json out = nlohmann::json::parse(read_text(dir.str("out.json")));
    const double torch_loss = out["loss"].get<double>();
    INFO("troupe " << troupe_loss << " torch " << torch_loss << " relative "
                   << std::abs(troupe_loss - torch_loss) / torch_loss);
    CHECK(std::isfinite(troupe_loss));
    CHECK(out["tokens"] == K * T);
    CHECK(std::abs(troupe_loss - torch_loss) <= 1e-9 * torch_loss);
  }
}
