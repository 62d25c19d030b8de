// The architecture families in GptConfig (include/troupe/model_config.hpp) and what config/ derives
// from them: the parameter count against an explicit list of every tensor and against the published
// figures of the presets, the FLOPs against a GEMM-by-GEMM count, validation reporting every problem
// at once, the checkpoint's stored config (version 6) and its resume rules, and the memory plan
// against a hand computation.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "config/memory_estimate.hpp"
#include "config/model_presets.hpp"
#include "config/run_identity.hpp"
#include "troupe/model_config.hpp"
#include "troupe/train_config.hpp"

namespace troupe {
namespace {

using Catch::Contains;

// Every tensor of the model as docs/MODELS.md and model/params.hpp name them, with its element
// count: the reference the closed form of num_parameters() is compared to.
int64_t count_tensors(const GptConfig& m) {
  const int64_t C = m.hidden_size, V = m.vocab_size, F = m.ffn_hidden_size();
  const int64_t hs = m.kv_channels > 0 ? m.kv_channels : C / m.num_attention_heads;
  const int64_t H = m.num_attention_heads, G = m.num_query_groups > 0 ? m.num_query_groups : H;
  const bool ln = m.normalization == Normalization::layernorm, bias = m.add_bias_linear;
  struct Tensor {
    std::string name;
    int64_t elements;
  };
  std::vector<Tensor> t;
  auto norm = [&](const std::string& name) {
    t.push_back({name + ".weight", C});
    if (ln) t.push_back({name + ".bias", C});
  };
  t.push_back({"transformer.wte.weight", V * C});
  if (m.position_embedding == PositionEmbedding::learned_absolute)
    t.push_back({"transformer.wpe.weight", int64_t{m.max_position_embeddings} * C});
  if (m.embed_layernorm) norm("transformer.ln_embd");
  for (int l = 0; l < m.num_layers; ++l) {
    const std::string h = "transformer.h." + std::to_string(l);
    norm(h + ".ln_1");
    t.push_back({h + ".attn.c_attn.weight (q)", H * hs * C});
    t.push_back({h + ".attn.c_attn.weight (k)", G * hs * C});
    t.push_back({h + ".attn.c_attn.weight (v)", G * hs * C});
    if (bias) t.push_back({h + ".attn.c_attn.bias", (H + 2 * G) * hs});
    t.push_back({h + ".attn.c_proj.weight", C * H * hs});
    if (bias) t.push_back({h + ".attn.c_proj.bias", C});
    norm(h + ".ln_2");
    const int64_t halves = m.activation == MlpActivation::swiglu ? 2 : 1;
    auto mlp = [&](const std::string& prefix, int64_t width) {
      for (int64_t k = 0; k < halves; ++k) {
        t.push_back({prefix + "c_fc.weight (part)", width * C});
        if (bias) t.push_back({prefix + "c_fc.bias (part)", width});
      }
      t.push_back({prefix + "c_proj.weight", C * width});
      if (bias) t.push_back({prefix + "c_proj.bias", C});
    };
    const int64_t E = m.moe.experts_of(l, m.num_layers);  // an MoE layer: the router and E experts
    if (E == 0 || m.moe.residual) mlp(h + ".mlp.", F);
    if (E == 0) continue;
    t.push_back({h + ".mlp.router.weight", E * C});
    if (bias && m.moe.router == MoeRouter::megatron) t.push_back({h + ".mlp.router.bias", E});
    if (m.moe.residual) t.push_back({h + ".mlp.coefficient", 2 * C + 2});
    if (m.moe.shared_expert_ffn > 0) mlp(h + ".mlp.shared_expert.", m.moe.shared_expert_ffn);
    for (int64_t e = 0; e < E; ++e) mlp(h + ".mlp.experts." + std::to_string(e) + ".", m.expert_ffn_hidden_size());
  }
  norm("transformer.ln_f");
  if (m.untie_embeddings_and_output_weights) t.push_back({"lm_head.weight", V * C});
  int64_t total = 0;
  for (const Tensor& x : t) total += x.elements;
  return total;
}

// A random valid architecture of small odd sizes, every family switch drawn.
GptConfig random_model(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  GptConfig m;
  m.num_layers = pick(1, 5);
  const int groups = pick(1, 3), per_group = pick(1, 3);
  m.num_attention_heads = groups * per_group;
  m.num_query_groups = pick(0, 1) ? groups : 0;
  m.kv_channels = pick(0, 1) ? 2 * pick(1, 5) : 0;
  m.hidden_size = m.kv_channels > 0 ? pick(5, 41) : m.num_attention_heads * 2 * pick(1, 5);
  m.seq_length = pick(3, 17);
  m.max_position_embeddings = m.seq_length + pick(0, 7);
  m.vocab_size = pick(11, 301);
  m.normalization = pick(0, 1) ? Normalization::rmsnorm : Normalization::layernorm;
  m.position_embedding = static_cast<PositionEmbedding>(pick(0, 3));
  m.activation = pick(0, 1) ? MlpActivation::swiglu : MlpActivation::gelu;
  m.ffn_hidden = pick(0, 1) ? pick(1, 97) : 0;
  if (m.activation == MlpActivation::swiglu && m.ffn_hidden == 0) m.ffn_hidden = pick(1, 97);  // small h: rule gives 0
  m.add_bias_linear = pick(0, 1);
  m.untie_embeddings_and_output_weights = pick(0, 1);
  m.embed_layernorm = pick(0, 1);
  return m;
}

TEST_CASE("model family: num_parameters counts every tensor of every family", "[family]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()) + 14);
  for (int trial = 0; trial < 300; ++trial) {
    const GptConfig m = random_model(rng);
    INFO("trial " << trial << ": layers " << m.num_layers << " hidden " << m.hidden_size << " heads "
                  << m.num_attention_heads << " groups " << m.num_query_groups << " kv " << m.kv_channels << " "
                  << to_string(m.normalization) << " " << to_string(m.position_embedding) << " "
                  << to_string(m.activation));
    REQUIRE(m.validate().is_ok());
    CHECK(m.num_parameters() == count_tensors(m));
  }
}

TEST_CASE("model family: the presets have the published parameter counts and vocabularies", "[family]") {
  const std::map<std::string, std::pair<int64_t, int64_t>> published = {
      {"gpt2-124m", {124'439'808, 50257}},        {"gpt2-350m", {354'823'168, 50257}},
      {"gpt2-774m", {774'030'080, 50257}},        {"gpt2-1.5b", {1'557'611'200, 50257}},
      {"llama2-7b", {6'738'415'616, 32000}},      {"llama2-13b", {13'015'864'320, 32000}},
      {"llama2-70b", {68'976'648'192, 32000}},    {"llama3-8b", {8'030'261'248, 128256}},
      {"mixtral-8x7b", {46'702'792'704, 32000}},
      {"bloom-560m", {559'214'592, 250880}},      {"bloom-176b", {176'247'271'424, 250880}}};
  REQUIRE(model_presets().size() == published.size());
  for (const ModelPreset& p : model_presets()) {
    INFO(p.name);
    REQUIRE(published.count(p.name) == 1);
    CHECK(p.model.validate().is_ok());
    CHECK(p.model.vocab_size == published.at(p.name).second);
    CHECK(p.model.num_parameters() == published.at(p.name).first);
    CHECK(p.published_parameters == published.at(p.name).first);
    CHECK(count_tensors(p.model) == published.at(p.name).first);
    CHECK(find_model_preset(p.name) == &p);
  }
  CHECK(std::string(find_model_preset("llama2-70b")->model.family_name()) == "LLaMA");
  CHECK(find_model_preset("llama2-70b")->model.query_groups() == 8);
  CHECK(std::string(find_model_preset("bloom-560m")->model.family_name()) == "BLOOM");
  CHECK(find_model_preset("gpt2-124m")->model.is_gpt2_family());
  CHECK(find_model_preset("llama3-8b")->model.rotary_base == 500000);
  const GptConfig& mixtral = find_model_preset("mixtral-8x7b")->model;
  CHECK((mixtral.moe.num_experts == std::vector<int>{8} && mixtral.moe.topk == 2 && !mixtral.moe.drop_tokens));
  CHECK((mixtral.expert_ffn_hidden_size() == 14336 && mixtral.query_groups() == 8 && mixtral.rotary_base == 1e6));
  CHECK((mixtral.seq_length == 4096 && mixtral.max_position_embeddings == 32768));
  CHECK(find_model_preset("gpt-5") == nullptr);
}

// The GEMMs of one forward pass, each 2 m n k, counted from the shapes; backward is twice forward.
double count_gemm_flops(const GptConfig& m, double tokens) {
  const double C = m.hidden_size, s = m.seq_length, L = m.num_layers, F = m.ffn_hidden_size();
  const double q = static_cast<double>(m.attention_size()), qkv = static_cast<double>(m.qkv_size());
  const double Vp = static_cast<double>(m.padded_vocab_size(1));
  const double fc1 = m.activation == MlpActivation::swiglu ? 2 * F : F;
  double forward = 0;
  forward += L * 2 * tokens * C * qkv;         // x W_qkv
  forward += L * 2 * tokens * s * q / 2;       // Q K^T, causal half
  forward += L * 2 * tokens * s * q / 2;       // P V, causal half
  forward += L * 2 * tokens * q * C;           // attention projection
  forward += L * 2 * tokens * C * fc1;         // fc1 (both halves with SwiGLU)
  forward += L * 2 * tokens * F * C;           // fc2
  forward += 2 * tokens * C * Vp;              // logits
  return 3 * forward;
}

TEST_CASE("model family: FLOPs are Megatron's count, GEMM by GEMM", "[family]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()) + 15);
  for (int trial = 0; trial < 100; ++trial) {
    const GptConfig m = random_model(rng);
    const int64_t tokens = int64_t{m.seq_length} * (1 + trial % 5);
    CHECK(m.flops_per_iteration(tokens) == Approx(count_gemm_flops(m, static_cast<double>(tokens))).epsilon(1e-12));
  }
  // GPT-2: Megatron's formula in closed form, 72 T L h^2 (1 + s / 12h + Vp / 12 L h).
  const GptConfig g = find_model_preset("gpt2-124m")->model;
  const double T = 8.0 * g.seq_length, h = g.hidden_size, L = g.num_layers, s = g.seq_length;
  const double Vp = static_cast<double>(g.padded_vocab_size(1));
  CHECK(g.flops_per_iteration(8 * g.seq_length) ==
        Approx(72 * T * L * h * h * (1 + s / (12 * h) + Vp / (12 * L * h))).epsilon(1e-12));
}

TEST_CASE("model family: validation names every problem at once, with the flag and the fix", "[family]") {
  GptConfig m;
  m.vocab_size = 100;
  m.num_attention_heads = 6;
  m.hidden_size = 96;
  m.num_query_groups = 4;               // does not divide 6 heads
  m.ffn_hidden = -3;                    // negative width
  m.position_embedding = PositionEmbedding::alibi;
  m.rotary_base = 500000;               // rotary without rope
  m.rotary_interleaved = true;
  m.layernorm_epsilon = 0;
  const Status st = m.validate();
  REQUIRE_FALSE(st.is_ok());
  const std::string text = st.message();
  INFO(text);
  CHECK_THAT(text, Contains("5 problems:"));
  CHECK_THAT(text, Contains("--num-query-groups 4 does not divide --num-attention-heads 6 --"));
  CHECK_THAT(text, Contains("--ffn-hidden-size must be"));
  CHECK_THAT(text, Contains("--rotary-base has no effect with --position-embedding-type alibi -- add"));
  CHECK_THAT(text, Contains("--rotary-interleaved has no effect"));
  CHECK_THAT(text, Contains("--norm-epsilon must be a positive number"));

  GptConfig r;
  r.vocab_size = 100;
  r.position_embedding = PositionEmbedding::rope;
  r.hidden_size = 8;
  r.num_attention_heads = 4;  // head dimension 2
  r.rotary_percent = 0.5;     // rotates 1 dimension: odd, below 2
  CHECK_THAT(r.validate().message(), Contains("--rotary-percent 0.5 of the head dimension 2 rotates 0"));
  r.rotary_percent = 0;
  CHECK_THAT(r.validate().message(), Contains("--rotary-percent must be in (0, 1]"));
  r.rotary_percent = 1;
  r.rotary_base = -1;
  CHECK_THAT(r.validate().message(), Contains("--rotary-base must be a positive number"));
  // Megatron's SwiGLU rule gives no MLP at all for a narrow model: the fix is an explicit width.
  GptConfig narrow;
  narrow.vocab_size = 100;
  narrow.hidden_size = 16;
  narrow.activation = MlpActivation::swiglu;
  CHECK_THAT(narrow.validate().message(), Contains("--swiglu with --hidden-size 16") && Contains("--ffn-hidden-size"));
  // --kv-channels frees the head count from dividing the hidden size (Megatron's rule).
  GptConfig kv;
  kv.vocab_size = 100;
  kv.hidden_size = 100;
  kv.num_attention_heads = 3;
  CHECK_FALSE(kv.validate().is_ok());
  kv.kv_channels = 32;
  CHECK(kv.validate().is_ok());
  CHECK(kv.attention_size() == 96);
  // Absurd sizes are refused before any product could overflow.
  GptConfig huge;
  huge.vocab_size = 100;
  huge.kv_channels = 1 << 23;
  huge.num_attention_heads = 1 << 10;
  huge.hidden_size = 1 << 10;
  CHECK_THAT(huge.validate().message(), Contains("--kv-channels"));
}

TEST_CASE("model family: the stored config keeps the family; version 5 files read as GPT-2", "[family]") {
  TrainConfig c;
  c.model = find_model_preset("llama2-70b")->model;
  c.model.rotary_percent = 0.75;
  c.model.rotary_interleaved = true;
  c.model.kv_channels = 128;
  c.model.embed_layernorm = true;
  auto back = TrainConfig::from_json(c.to_json());
  REQUIRE(back.is_ok());
  const GptConfig& b = back.value().model;
  CHECK(b.normalization == Normalization::rmsnorm);
  CHECK(b.position_embedding == PositionEmbedding::rope);
  CHECK(b.activation == MlpActivation::swiglu);
  CHECK_FALSE(b.add_bias_linear);
  CHECK(b.untie_embeddings_and_output_weights);
  CHECK(b.embed_layernorm);
  CHECK(b.num_query_groups == 8);
  CHECK(b.kv_channels == 128);
  CHECK(b.ffn_hidden == 28672);
  CHECK(b.rotary_percent == 0.75);
  CHECK(b.rotary_base == 10000);
  CHECK(b.rotary_interleaved);
  CHECK(b.num_parameters() == c.model.num_parameters());
  auto j = nlohmann::json::parse(c.to_json());
  CHECK(j["version"] == 9);
  CHECK(j["model"]["normalization"] == "RMSNorm");
  CHECK(j["model"]["position_embedding_type"] == "rope");

  // A version 5 file (no family keys) is a GPT-2.
  TrainConfig gpt2;
  auto old = nlohmann::json::parse(gpt2.to_json());
  old["version"] = 5;
  old.erase("precision");  // version 7's
  old["model"].erase("moe");  // version 8's
  old["parallel"].erase("expert_model_parallel_size");
  old["parallel"].erase("expert_tensor_parallel_size");
  for (const char* key : {"context_parallel_size", "cp_comm_type", "ds_sequence_parallel_size"}) old["parallel"].erase(key);
  for (const char* key : {"normalization", "position_embedding_type", "activation", "add_bias_linear",
                          "untie_embeddings_and_output_weights", "embed_layernorm", "num_query_groups", "kv_channels",
                          "ffn_hidden_size", "rotary_percent", "rotary_base", "rotary_interleaved"})
    REQUIRE(old["model"].erase(key) == 1);
  auto read_old = TrainConfig::from_json(old.dump());
  REQUIRE(read_old.is_ok());
  CHECK(read_old.value().model.is_gpt2_family());
  // A family key in a version 5 file is unknown there; a bad spelling names the key and the values.
  old["model"]["normalization"] = "RMSNorm";
  CHECK_THAT(TrainConfig::from_json(old.dump()).status().message(), Contains("unknown key \"model.normalization\""));
  j["model"]["normalization"] = "BatchNorm";
  const Status bad = TrainConfig::from_json(j.dump()).status();
  CHECK(bad.is_bad_input());
  CHECK_THAT(bad.message(), Contains("model.normalization") && Contains("\"LayerNorm\" or \"RMSNorm\""));
}

TEST_CASE("model family: resuming with other family flags is refused, each difference named", "[family]") {
  TrainConfig saved;
  saved.model = find_model_preset("llama3-8b")->model;
  saved.model.vocab_size = 300;
  TrainConfig now = saved;
  CHECK(check_resume(now, saved).refused.empty());
  now.model.normalization = Normalization::layernorm;
  now.model.num_query_groups = 4;
  now.model.rotary_base = 10000;
  now.model.untie_embeddings_and_output_weights = false;
  const ResumeCheck r = check_resume(now, saved);
  REQUIRE(r.refused.size() == 4);
  const std::string all = r.status("ck").message();
  CHECK_THAT(all, Contains("--normalization is LayerNorm but the checkpoint's run used RMSNorm"));
  CHECK_THAT(all, Contains("the key/value groups (--num-query-groups / --num-key-value-heads) is 4 but the "
                           "checkpoint's run used 8"));
  CHECK_THAT(all, Contains("--rotary-base is 10000 but the checkpoint's run used 500000"));
  CHECK_THAT(all, Contains("--untie-embeddings-and-output-weights is off but the checkpoint's run used on"));
  // A fine-tune may move the rotary base (context extension), not the shapes.
  TrainConfig tune = saved;
  tune.model.rotary_base = 1e6;
  const ResumeCheck f = check_finetune(tune, saved);
  CHECK(f.refused.empty());
  REQUIRE(f.changed.size() == 1);
  CHECK_THAT(f.changed[0], Contains("--rotary-base 500000 -> 1e+06"));
  tune.model.activation = MlpActivation::gelu;
  CHECK(check_finetune(tune, saved).refused.size() == 1);
}

TEST_CASE("memory plan: LLaMA-2 7B on tp 2 x pp 2 x dp 2, by hand", "[family][memory]") {
  TrainConfig c;
  c.model = find_model_preset("llama2-7b")->model;  // vocabulary 32000: a multiple of 128 x 2, no padding
  c.tensor_model_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  c.data_parallel_size = 2;
  c.zero_stage = 1;
  c.micro_batch_size = 1;
  c.global_batch_size = 8;  // 4 micro-batches per replica
  c.num_threads = 8;        // one per rank of the 8 in the process
  // One layer on one tensor-parallel rank: two RMSNorm weights whole; qkv (3 x 4096 rows), the
  // projection, fc1 (2 x 11008 rows) and fc2 split in two.
  const double layer = 2 * 4096 + (4096.0 * 12288 + 4096.0 * 4096 + 4096.0 * 22016 + 11008.0 * 4096) / 2;
  REQUIRE(layer == 101'195'776);
  const double first = 16 * layer + 16000.0 * 4096;         // wte's half of the vocabulary
  const double last = 16 * layer + 4096 + 16000.0 * 4096;   // ln_f and lm_head's half
  const MemoryEstimate e = estimate_memory(c, 1);
  REQUIRE(e.stages.size() == 2);
  CHECK(e.stages[0].parameters == first);
  CHECK(e.stages[1].parameters == last);
  // The two stages' shards, each tp rank's, make the whole model once the replicated norms count once.
  CHECK(2 * (first + last) - (32 * 2 * 4096 + 4096) == c.model.num_parameters());
  // ZeRO-1 over 2 replicas: weights and gradients 8 bytes, the moments' 8 bytes halved, and the
  // half of the gradients its reduce-scatter writes (kept: the optimizer reads it), 2 bytes.
  CHECK(e.stages[0].model_state_bytes == Approx(14 * first));
  // Activations per token of one layer, in floats: 4 x 4096 whole; (qkv 12288 + attention output
  // 4096 + SwiGLU 3 x 11008) / 2; probabilities 32 heads x 4096 / 2.
  const double per_layer = 4 * 4096 + (12288 + 4096 + 3 * 11008) / 2.0 + 32 * 4096 / 2.0;
  REQUIRE(per_layer == 106'624);
  const double micro = 4.0 * 4096 * 16 * per_layer;  // bytes of one micro-batch of 4096 tokens
  CHECK(e.micro_batch_activation_none == Approx(micro));
  // The chunk's scratch, once per rank, floats per token: one layer's gradients, d fc1 (2 x 11008 / 2),
  // d SwiGLU (11008 / 2), d qkv (12288 / 2), d attention (4096 / 2) and five of 4096 (the two branches'
  // output gradients, the two norms' and d(layer input)); stage 0 adds d(embedding), the last stage
  // d(ln_f), the TP partial sums and the f32 losses.
  const double layer_scratch = 11008 + 5504 + 6144 + 2048 + 5 * 4096;
  REQUIRE(layer_scratch == 45184);
  // The attention kernel's backward: one thread per rank, its (T, T) f32 dP.
  const double attention = 4.0 * 4096 * 4096;
  CHECK(e.attention_scratch_bytes == attention);
  // The rank engine's boundary buffers: each stage's 2 slots keep the activation and the gradient it
  // exchanges with the other stage, (4096, 4096) f32 each.
  const double boundary = 2 * 2 * 4.0 * 4096 * 4096;
  const double scratch0 = 4.0 * 4096 * (layer_scratch + 4096) + attention + boundary;
  const double scratch1 = 4.0 * 4096 * (layer_scratch + 2 * 4096) + 4.0 * 4096 + attention + boundary;
  // 1F1B: stage 0 of 2 holds 2 micro-batches in flight; stage 1 holds 1, and takes the next one's
  // slot when it posts its receive, one action ahead of the backward that frees one: 2 slots.
  CHECK(e.stages[0].micro_batches_in_flight == 2);
  CHECK(e.stages[1].micro_batches_in_flight == 2);
  CHECK(e.stages[0].activation_bytes == Approx(2 * micro + scratch0));
  CHECK(e.stages[1].activation_bytes == Approx(2 * micro + 4.0 * 4096 * 16000 + scratch1));  // + the logits' half
  CHECK(e.micro_batch_activation_full == Approx(4.0 * 4096 * (16 * 4096 + per_layer)));
  CHECK(e.micro_batch_activation_selective == Approx(4.0 * 4096 * (16 * (per_layer - 65536) + 65536)));
  // One process runs all 8 ranks: tp x dp = 4 ranks of each stage.
  CHECK(e.ranks_in_process == 8);
  CHECK(e.model_state_bytes == Approx(4 * 14 * (first + last)));
  CHECK(e.activation_bytes == Approx(4 * (2 * micro + 2 * micro + 4.0 * 4096 * 16000 + scratch0 + scratch1)));
  // Under troupe launch each process holds one rank: the larger stage, the last.
  const MemoryEstimate one = estimate_memory(c, 8);
  CHECK(one.ranks_in_process == 1);
  // (its 8 threads all busy in the attention's backward: 16 heads of a micro-batch)
  CHECK(one.total() == Approx(14 * last + 2 * micro + 4.0 * 4096 * 16000 + scratch1 + 7 * attention));
  // Full recompute keeps the layer inputs in each micro-batch's slot, and one layer's activations
  // once (the buffer it recomputes into); selective keeps all but the probabilities in the slots and
  // one layer's probabilities once. Sequence parallelism splits the whole part too.
  c.recompute_granularity = "full";
  CHECK(estimate_memory(c, 1).stages[0].activation_bytes ==
        Approx(2 * 4.0 * 4096 * 16 * 4096 + 4.0 * 4096 * per_layer + scratch0));
  c.recompute_granularity = "selective";
  CHECK(estimate_memory(c, 1).stages[0].activation_bytes ==
        Approx(2 * 4.0 * 4096 * 16 * (per_layer - 65536) + 4.0 * 4096 * 65536 + scratch0));
  // ZeRO-2 over the 2 replicas: three of the stage's largest unit's gradients in flight (a layer's
  // shard, larger than wte's half of 16000 x 4096) and two received halves; ZeRO-3 also gathers two
  // units' weights.
  c.recompute_granularity = "none";
  c.zero_stage = 2;
  REQUIRE(layer > 16000.0 * 4096);
  CHECK(estimate_memory(c, 1).stages[0].zero_buffer_bytes == Approx(3 * layer * 4 + 2 * layer / 2 * 4));
  CHECK(estimate_memory(c, 1).stages[0].activation_bytes ==
        Approx(2 * micro + scratch0 + 3 * layer * 4 + 2 * layer / 2 * 4));
  c.zero_stage = 3;
  CHECK(estimate_memory(c, 1).stages[0].zero_buffer_bytes ==
        Approx(3 * layer * 4 + 2 * layer / 2 * 4 + 2 * layer * 4));
  c.zero_stage = 1;
  CHECK(estimate_memory(c, 1).stages[0].zero_buffer_bytes == 0);
  c.recompute_granularity = "none";
  c.sequence_parallel = true;
  CHECK(estimate_memory(c, 1).micro_batch_activation_none == Approx(micro - 4.0 * 4096 * 16 * 2 * 4096));
  const std::vector<std::string> plan = memory_plan_lines(c, 1);
  REQUIRE(plan.size() >= 4);
  CHECK_THAT(plan[0], Contains("LLaMA family, 6738415616 parameters"));
  CHECK_THAT(plan[1], Contains("tp 2, pp 2, dp 2, ZeRO stage 1"));

  // Context parallelism 4 (16 ranks): each rank holds 1024 tokens of a sequence and, instead of the
  // probabilities, each row's log-sum-exp (32 heads / 2 floats per token); ZeRO-1 partitions the
  // moments over dp x cp = 8 ranks.
  c.sequence_parallel = false;
  c.context_parallel_size = 4;
  c.num_threads = 64;  // 2 per rank of the 32 in the process
  const MemoryEstimate q = estimate_memory(c, 1);
  // The ring's score tiles: 2 threads x 2 (backward, no attention dropout) x 128 x 1024 f32 elements.
  REQUIRE(c.model.attention_dropout == 0);
  CHECK(q.attention_scratch_bytes == 2.0 * 2 * 128 * 1024 * 4);
  const double per_layer_cp = 4 * 4096 + (12288 + 4096 + 3 * 11008) / 2.0 + 32 / 2.0;
  const double micro_cp = 4.0 * 1024 * 16 * per_layer_cp;
  CHECK(q.micro_batch_activation_none == Approx(micro_cp));
  CHECK(q.stages[0].model_state_bytes == Approx(8 * first + 12 * first / 8));
  // The scratch per token as above, of 1024 tokens (rotary: no position table to gather).
  // The ring's workspace, f32 per token: accumulator and dQ (2048 each), m, l, delta (16 heads each),
  // five K/V blocks of 2 x 16 heads x 128.
  CHECK(q.ring_workspace_bytes == 4.0 * 1024 * (2 * 2048 + 3 * 16 + 5 * 4096));
  CHECK(q.stages[1].activation_bytes == Approx(2 * micro_cp + 4.0 * 1024 * 16000 + q.attention_scratch_bytes +
                                               q.ring_workspace_bytes + (scratch1 - attention) / 4));
  CHECK(q.ranks_in_process == 32);
  CHECK_THAT(memory_plan_lines(c, 1)[1], Contains("tp 2, pp 2, dp 2, cp 4, ZeRO stage 1"));
}

TEST_CASE("memory plan: a stage's shards add up to the model on any layout", "[family][memory]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()) + 16);
  for (int trial = 0; trial < 200; ++trial) {
    TrainConfig c;
    c.model = random_model(rng);
    const int tp = 1 + static_cast<int>(rng() % 3);
    c.model.num_attention_heads *= tp;
    if (c.model.num_query_groups > 0) c.model.num_query_groups *= tp;
    if (c.model.kv_channels == 0) c.model.hidden_size = c.model.num_attention_heads * 2;
    c.model.ffn_hidden = tp * (1 + static_cast<int>(rng() % 20));
    c.model.vocab_size = 128 * tp * (1 + static_cast<int>(rng() % 3));  // no padding rows
    c.tensor_model_parallel_size = tp;
    c.pipeline_model_parallel_size = 1 + static_cast<int>(rng() % c.model.num_layers);
    REQUIRE(c.model.validate().is_ok());
    const MemoryEstimate e = estimate_memory(c, 1);
    double shards = 0;
    for (const StageMemory& s : e.stages) shards += s.parameters * tp;
    const GptConfig& m = c.model;
    const double norm = m.normalization == Normalization::rmsnorm ? m.hidden_size : 2.0 * m.hidden_size;
    // Replicated over tp: the norms, the row-parallel biases, wpe, the embedding LayerNorm.
    double replicated = (2 * norm + (m.add_bias_linear ? 2.0 * m.hidden_size : 0)) * m.num_layers + norm;
    if (m.position_embedding == PositionEmbedding::learned_absolute)
      replicated += double(m.max_position_embeddings) * m.hidden_size;
    if (m.embed_layernorm) replicated += norm;
    double expected = static_cast<double>(m.num_parameters()) + (tp - 1) * replicated;
    // The tied copy of wte on the last stage of a pipeline.
    if (!m.untie_embeddings_and_output_weights && c.pipeline_model_parallel_size > 1)
      expected += static_cast<double>(m.vocab_size) * m.hidden_size;
    INFO("trial " << trial << " tp " << tp << " pp " << c.pipeline_model_parallel_size);
    CHECK(shards == Approx(expected).epsilon(1e-12));
  }
}

}  // namespace
}  // namespace troupe
