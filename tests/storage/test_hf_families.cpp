// LLaMA and BLOOM Hugging Face folders: config.json parsing and refusals, the row map between troupe's
// parameters and the HF tensors, export -> import round trips (bitwise), and the exported folder's
// loss in an independent float64 PyTorch implementation (bench/torch_gpt.py) against GptModel's.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "config/imported_config.hpp"
#include "kernels/ops.hpp"
#include "model/params.hpp"
#include "reference/gpt.hpp"
#include "storage/checkpoint.hpp"
#include "storage/hf_export.hpp"
#include "tests/storage/hf_checkpoint_util.hpp"
#include "storage/hf_import.hpp"
#include "storage/hf_names.hpp"
#include "storage/safetensors.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using namespace troupe::hf_test;
using Catch::Matchers::Contains;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Tiny models with odd sizes: LLaMA (GQA 4:2, head_dim 6 != hidden / heads, untied, rotate-half or
// interleaved), BLOOM (3 heads: ALiBi's rule for a count that is no power of 2).
GptConfig tiny(const std::string& family) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 12;
  c.num_attention_heads = 4;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 8;
  if (family == "llama" || family == "llama-interleaved") {
    c.set_llama_family();
    c.num_query_groups = 2;
    c.kv_channels = 6;
    c.ffn_hidden = 11;
    c.rotary_base = 300;
    c.layernorm_epsilon = 1e-6;
    c.rotary_interleaved = family == "llama-interleaved";
    if (c.rotary_interleaved) {  // and the other options: biases, a tied head, MQA
      c.add_bias_linear = true;
      c.untie_embeddings_and_output_weights = false;
      c.num_query_groups = 1;
    }
  } else {
    c.num_attention_heads = 3;
    c.set_bloom_family();
  }
  return c;
}


}  // namespace

TEST_CASE("hf families: LlamaConfig and BloomConfig read, every unsupported option refused at once", "[hf][family]") {
  auto llama = parse_hf_config(R"({"model_type":"llama","architectures":["LlamaForCausalLM"],"hidden_size":48,)"
                               R"("intermediate_size":100,"num_hidden_layers":3,"num_attention_heads":6,)"
                               R"("num_key_value_heads":2,"head_dim":10,"max_position_embeddings":64,)"
                               R"("vocab_size":300,"rms_norm_eps":1e-5,"rope_theta":500000.0,)"
                               R"("tie_word_embeddings":false,"attention_bias":true,"mlp_bias":true,)"
                               R"("hidden_act":"silu","rope_scaling":null})",
                               "");
  REQUIRE(llama.is_ok());
  const HfArch& a = llama->arch;
  CHECK(a.family == HfFamily::llama);
  CHECK((a.layers == 3 && a.hidden == 48 && a.heads == 6 && a.groups == 2 && a.head_dim == 10 && a.ffn == 100));
  CHECK((a.vocab == 300 && a.positions == 64 && a.eps == 1e-5 && a.rope_theta == 500000.0 && a.bias && !a.tied));
  CHECK((llama->n_layer == 3 && llama->n_embd == 48 && llama->n_positions == 64 && llama->vocab_size == 300));
  // LlamaConfig's defaults: MHA, head_dim = hidden / heads, untied, no biases.
  auto defaults = parse_hf_config(R"({"model_type":"llama","hidden_size":64,"num_attention_heads":4})", "");
  REQUIRE(defaults.is_ok());
  CHECK((defaults->arch.groups == 4 && defaults->arch.head_dim == 16 && !defaults->arch.tied && !defaults->arch.bias));
  CHECK((defaults->arch.layers == 32 && defaults->arch.ffn == 11008 && defaults->arch.vocab == 32000));

  auto bad = parse_hf_config(R"({"model_type":"llama","architectures":["MistralForCausalLM"],"hidden_size":48,)"
                             R"("num_attention_heads":6,"num_key_value_heads":4,"head_dim":7,"attention_bias":true,)"
                             R"("hidden_act":"gelu","rope_scaling":{"type":"linear","factor":2.0},)"
                             R"("vocab_size":0,"intermediate_size":1e40,"rms_norm_eps":-1})",
                             "c.json: ");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().is_bad_input());
  for (const char* what : {"c.json: ", "architectures", "num_key_value_heads 4 does not divide", "head_dim 7 is odd",
                           "attention_bias is true but mlp_bias is false", "hidden_act", "rope_scaling", "vocab_size",
                           "intermediate_size", "rms_norm_eps"})
    CHECK_THAT(bad.status().message(), Contains(what));
  // Sizes whose products would leave int64 are refused, not multiplied.
  auto huge = parse_hf_config(R"({"model_type":"llama","hidden_size":16777216,"num_attention_heads":16777216,)"
                              R"("head_dim":16777216})",
                              "");
  REQUIRE_FALSE(huge.is_ok());
  CHECK_THAT(huge.status().message(), Contains("exceeds troupe's bound"));

  auto bloom = parse_hf_config(R"({"model_type":"bloom","architectures":["BloomForCausalLM"],"hidden_size":24,)"
                               R"("n_layer":2,"n_head":3,"vocab_size":50,"layer_norm_epsilon":1e-6,)"
                               R"("troupe":{"seq_length":16,"max_position_embeddings":20}})",
                               "");
  REQUIRE(bloom.is_ok());
  CHECK(bloom->arch.family == HfFamily::bloom);
  CHECK((bloom->arch.hidden == 24 && bloom->arch.heads == 3 && bloom->arch.head_dim == 8 && bloom->arch.ffn == 96));
  CHECK((bloom->seq_length == 16 && bloom->n_positions == 20 && bloom->arch.tied));
  auto no_record = parse_hf_config(R"({"model_type":"bloom","n_embed":32,"n_head":4})", "");
  REQUIRE(no_record.is_ok());
  CHECK((no_record->n_embd == 32 && no_record->n_positions == kBloomSeqLength));
  auto bad_bloom = parse_hf_config(R"({"model_type":"bloom","hidden_size":10,"n_head":4,)"
                                   R"("apply_residual_connection_post_layernorm":true})",
                                   "");
  REQUIRE_FALSE(bad_bloom.is_ok());
  CHECK_THAT(bad_bloom.status().message(),
             Contains("n_head 4 does not divide hidden_size 10") && Contains("apply_residual_connection_post_layernorm"));
  CHECK_THAT(parse_hf_config(R"({"model_type":"mistral"})", "").status().message(), Contains("\"llama\", \"mixtral\" or \"bloom\""));
}

TEST_CASE("hf families: the row map covers every troupe row once and inverts bitwise", "[hf][family]") {
  for (const char* family : {"llama", "llama-interleaved", "bloom"}) {
    INFO("family " << family);
    Result<HfArch> arch = hf_arch_of(tiny(family));
    REQUIRE(arch.is_ok());
    const std::vector<HfTensor> hf = hf_family_tensors(*arch);
    std::map<std::string, std::vector<int>> covered;  // troupe name -> times each row is taken
    for (const HfTensor& t : hf) {
      auto& rows = covered[t.troupe_name];
      rows.resize(static_cast<size_t>(t.troupe_shape[0]));
      for (int64_t r = 0; r < t.hf_shape[0]; ++r) {
        const int64_t tr = hf_troupe_row(t, r);
        REQUIRE((tr >= 0 && tr < t.troupe_shape[0]));
        ++rows[static_cast<size_t>(tr)];
      }
    }
    for (const auto& [name, rows] : covered)
      for (size_t r = 0; r < rows.size(); ++r) {
        INFO(name << " row " << r);
        REQUIRE(rows[r] == 1);
      }
    // Each troupe parameter's spec exists under that name with that shape.
    std::map<std::string, Shape> specs;
    for (const ParamSpec& s : gpt2_param_specs(tiny(family))) specs[s.name] = s.global_shape;
    CHECK(specs.size() == covered.size());
    for (const HfTensor& t : hf) CHECK(specs.at(t.troupe_name) == t.troupe_shape);
  }
  // BLOOM's fused rows: the HF tensor viewed (H, 3, hs, C) holds troupe's part j of head h.
  const GptConfig b = tiny("bloom");
  Result<HfArch> arch = hf_arch_of(b);
  REQUIRE(arch.is_ok());
  const int64_t C = b.hidden_size, H = b.num_attention_heads, hs = C / H;
  for (const HfTensor& t : hf_family_tensors(*arch)) {
    if (t.name != "transformer.h.0.self_attention.query_key_value.weight") continue;
    std::vector<float> troupe(static_cast<size_t>(3 * C * C)), out(troupe.size());
    for (int64_t r = 0; r < 3 * C; ++r)
      for (int64_t k = 0; k < C; ++k) troupe[static_cast<size_t>(r * C + k)] = static_cast<float>(r * 1000 + k);
    rows_to_hf(t, troupe.data(), out.data());
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t d = 0; d < hs; ++d)
          REQUIRE(out[static_cast<size_t>(((h * 3 + j) * hs + d) * C + 5)] ==
                  static_cast<float>((j * C + h * hs + d) * 1000 + 5));
  }
}

TEST_CASE("hf families: troupe -> HF -> troupe is bitwise, config.json has the class's keys", "[hf][family]") {
  for (const char* family : {"llama", "llama-interleaved", "bloom"}) {
    INFO("family " << family);
    test::TempDir dir;
    const GptConfig cfg = tiny(family);
    Result<HfArch> arch = hf_arch_of(cfg);
    REQUIRE(arch.is_ok());
    const std::vector<NamedTensor> params = random_params(cfg, 7);
    write_checkpoint(dir.str("ckpt"), params,
                     R"({"model": {"seq_length": 7, "hidden_dropout": 0.0, "attention_dropout": 0.0}})");
    REQUIRE(export_of(dir.str("ckpt"), dir.str("hf"), *arch).message() == "");
    const nlohmann::json j = nlohmann::json::parse(read_text(dir.str("hf/config.json")));
    if (arch->family == HfFamily::llama) {
      CHECK(j["model_type"] == "llama");
      CHECK(j["architectures"][0] == "LlamaForCausalLM");
      CHECK((j["hidden_size"] == 12 && j["num_attention_heads"] == 4 && j["head_dim"] == 6));
      CHECK((j["num_key_value_heads"] == cfg.query_groups() && j["intermediate_size"] == 11));
      CHECK((j["rope_theta"] == 300.0 && j["rms_norm_eps"] == 1e-6 && j["hidden_act"] == "silu"));
      CHECK((j["attention_bias"] == cfg.add_bias_linear && j["mlp_bias"] == cfg.add_bias_linear));
      CHECK(j["tie_word_embeddings"] == !cfg.untie_embeddings_and_output_weights);
      CHECK(j["troupe"]["rotary_interleaved"] == cfg.rotary_interleaved);
    } else {
      CHECK((j["model_type"] == "bloom" && j["n_layer"] == 2 && j["n_head"] == 3 && j["hidden_size"] == 12));
      CHECK(j["troupe"]["max_position_embeddings"] == 9);
    }
    // The safetensors hold exactly the class's names (no troupe name leaks through).
    std::set<std::string> names;
    for (const HfTensor& t : hf_family_tensors(*arch)) names.insert(t.name);
    auto src = h5read::open_file_source(dir.str("hf/model.safetensors"));
    REQUIRE(src.is_ok());
    auto header = read_safetensors_header(**src, "");
    REQUIRE(header.is_ok());
    std::set<std::string> in_file;
    for (const SafetensorsTensor& t : header->tensors) in_file.insert(t.name);
    CHECK(in_file == names);

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
    // And the config the folder stands for is the run's model.
    const GptConfig m = imported_train_config(*back).model;
    CHECK((m.normalization == cfg.normalization && m.position_embedding == cfg.position_embedding));
    CHECK((m.activation == cfg.activation && m.add_bias_linear == cfg.add_bias_linear));
    CHECK(m.untie_embeddings_and_output_weights == cfg.untie_embeddings_and_output_weights);
    CHECK((m.embed_layernorm == cfg.embed_layernorm && m.query_groups() == cfg.query_groups()));
    CHECK((m.head_size() == cfg.head_size() && m.ffn_hidden_size() == cfg.ffn_hidden_size()));
    CHECK((m.rotary_interleaved == cfg.rotary_interleaved && m.rotary_base == cfg.rotary_base));
    CHECK((m.seq_length == 7 && m.max_position_embeddings == 9 && m.layernorm_epsilon == cfg.layernorm_epsilon));
    CHECK((m.num_layers == 2 && m.hidden_size == 12 && m.vocab_size == 37));
  }
}

TEST_CASE("hf families: a checkpoint that is not the config's model, and models no class fits, are refused",
          "[hf][family]") {
  test::TempDir dir;
  const GptConfig cfg = tiny("llama");
  Result<HfArch> arch = hf_arch_of(cfg);
  REQUIRE(arch.is_ok());
  std::vector<NamedTensor> params = random_params(cfg, 3);
  params.erase(params.begin() + 1);  // a layer norm weight gone
  params[1].global_shape = Shape{3, 3};  // and a misshapen one
  params[1].tensor = Tensor::zeros({3, 3});
  params.push_back({"transformer.wpe.weight", {9, 12}, Tensor::zeros({9, 12})});
  write_checkpoint(dir.str("ckpt"), params, "{}");
  Status st = export_of(dir.str("ckpt"), dir.str("hf"), *arch);
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.is_bad_input());
  CHECK_THAT(st.message(), Contains("is missing") && Contains("has shape (3, 3)") &&
                               Contains("'model/transformer.wpe.weight' has no LlamaForCausalLM counterpart"));
  CHECK_FALSE(std::filesystem::exists(dir.str("hf")));  // nothing written

  GptConfig odd = tiny("llama");
  odd.rotary_percent = 0.5;  // HF's Llama rotates whole heads
  odd.embed_layernorm = true;
  Result<HfArch> none = hf_arch_of(odd);
  REQUIRE_FALSE(none.is_ok());
  CHECK_THAT(none.status().message(), Contains("LlamaForCausalLM needs rope over the whole") &&
                                          Contains("no embedding LayerNorm") && Contains("BloomForCausalLM needs"));
  CHECK(hf_arch_of(GptConfig{}).is_ok());
  CHECK(hf_arch_of(GptConfig{})->family == HfFamily::gpt2);
}

TEST_CASE("hf families: a folder with missing, misshapen, extra or untied-head tensors is refused", "[hf][family]") {
  test::TempDir dir;
  const GptConfig cfg = tiny("bloom");
  Result<HfArch> arch = hf_arch_of(cfg);
  REQUIRE(arch.is_ok());
  write_checkpoint(dir.str("ckpt"), random_params(cfg, 5), "{}");
  REQUIRE(export_of(dir.str("ckpt"), dir.str("hf"), *arch).message() == "");
  // Rewrite the weights: one missing, one misshapen, one foreign, and an lm_head unlike the embedding.
  auto src = h5read::open_file_source(dir.str("hf/model.safetensors"));
  REQUIRE(src.is_ok());
  auto header = read_safetensors_header(**src, "");
  REQUIRE(header.is_ok());
  std::vector<Tensor> keep;
  std::vector<SafetensorsInput> inputs;
  for (const SafetensorsTensor& t : header->tensors) {
    Tensor x = Tensor::empty(t.shape);
    REQUIRE(read_safetensors_tensor(**src, *header, t, x, "").is_ok());
    keep.push_back(x);
    if (t.name == "transformer.h.1.mlp.dense_4h_to_h.bias") continue;
    Shape shape = t.shape;
    if (t.name == "transformer.ln_f.weight") shape = Shape{3, 4};
    inputs.push_back({t.name, shape, keep.back().data<float>()});
  }
  std::vector<float> other(37 * 12, 0.5f), extra(4, 1.f);
  inputs.push_back({"lm_head.weight", {37, 12}, other.data()});
  inputs.push_back({"transformer.h.0.self_attention.rotary.weight", {4}, extra.data()});
  REQUIRE(write_safetensors(dir.str("hf/model.safetensors"), inputs, {}).is_ok());
  auto refused = read_hf_folder(dir.str("hf"));
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.status().is_bad_input());
  CHECK_THAT(refused.status().message(), Contains("'transformer.h.1.mlp.dense_4h_to_h.bias' is missing") &&
                                             Contains("'transformer.ln_f.weight' has shape (3, 4)") &&
                                             Contains("'transformer.h.0.self_attention.rotary.weight'"));
  // With the tensors right, the differing tied head alone.
  inputs.pop_back();
  inputs.erase(std::remove_if(inputs.begin(), inputs.end(),
                              [](const SafetensorsInput& i) { return i.name == "transformer.ln_f.weight"; }),
               inputs.end());
  std::vector<float> ln(12, 1.f), bias(12, 0.f);
  inputs.push_back({"transformer.ln_f.weight", {12}, ln.data()});
  inputs.push_back({"transformer.h.1.mlp.dense_4h_to_h.bias", {12}, bias.data()});
  REQUIRE(write_safetensors(dir.str("hf/model.safetensors"), inputs, {}).is_ok());
  CHECK_THAT(read_hf_folder(dir.str("hf")).status().message(), Contains("lm_head.weight differs"));
}

// ---- the outside oracle --------------------------------------------------------------------------

namespace {
std::string python_with_torch() {
  for (const char* py : {"/usr/bin/python3", "python3"})
    if (std::system((std::string(py) + " -c 'import torch, numpy' >/dev/null 2>&1").c_str()) == 0) return py;
  return "";
}
}  // namespace

// GptModel in float64 on weights that float32 holds exactly, exported, and evaluated by
// bench/torch_gpt.py's own LLaMA / BLOOM (float64): the two mean losses agree within 1e-9 relative.
TEST_CASE("hf families: the exported folder's loss in PyTorch (float64) is GptModel's", "[hf][family][oracle]") {
  const std::string py = python_with_torch();
  if (py.empty()) TROUPE_SKIP("no python3 with torch and numpy");
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (const char* family : {"llama", "llama-interleaved", "bloom"}) {
    INFO("family " << family);
    test::TempDir dir;
    const GptConfig cfg = tiny(family);
    Result<HfArch> arch = hf_arch_of(cfg);
    REQUIRE(arch.is_ok());
    const int K = 5, T = cfg.seq_length;  // windows k: tokens [k T, k T + T + 1) of one stream
    GptModel model(cfg, K, DType::f64);
    model.init(11);
    std::mt19937_64 rng(13);
    std::uniform_real_distribution<double> u(-0.3, 0.3);
    std::vector<NamedTensor> params;
    for (size_t k = 0; k < model.specs().size(); ++k) {
      const ParamSpec& s = model.specs()[k];
      const Tensor& p = model.params()[k];
      Tensor f = Tensor::empty(s.global_shape);
      for (int64_t i = 0; i < s.global_shape.numel(); ++i) {  // real rows only; float-exact values
        const float v = static_cast<float>(p.data<double>()[i] + u(rng));
        p.data<double>()[i] = v;
        f.data<float>()[i] = v;
      }
      params.push_back({s.name, s.global_shape, f});
    }
    std::vector<int32_t> stream(static_cast<size_t>(K * T + 1));
    for (int32_t& t : stream) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab_size));
    Tensor windows = Tensor::empty({K, T + 1}, DType::i32);
    for (int k = 0; k < K; ++k)
      std::memcpy(windows.data<int32_t>() + k * (T + 1), stream.data() + k * T, (T + 1) * sizeof(int32_t));
    const double troupe_loss = model.forward_loss(ctx, windows) / (K * T);

    write_checkpoint(dir.str("ckpt"), params, "{}");
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
