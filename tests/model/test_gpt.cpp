// The whole GPT model: gradients against finite differences in double precision, loss independent of
// the vocabulary padding, initialisation defined in global coordinates.
#include <cstring>
#include <map>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "kernels/ops.hpp"
#include "reference/gpt.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;

namespace {
GptConfig tiny_config(int divisible_by = 128) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 12;
  c.num_attention_heads = 3;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = divisible_by;
  return c;
}

Tensor random_windows(std::mt19937_64& rng, int B, int T, int64_t V) {
  Tensor t = Tensor::empty({B, T + 1}, DType::i32);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(V - 1));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = u(rng);
  return t;
}

// Makes every parameter non-trivial (LayerNorm weights and biases start at 1 and 0).
void perturb(GptModel& m, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-0.3, 0.3);
  for (size_t k = 0; k < m.params().size(); ++k) {
    const Tensor& p = m.params()[k];
    const int64_t real = m.specs()[k].global_shape.numel();
    for (int64_t i = 0; i < real; ++i) {
      if (p.dtype() == DType::f64) p.data<double>()[i] += u(rng);
      else p.data<float>()[i] += static_cast<float>(u(rng));
    }
  }
}
}  // namespace

TEST_CASE("GPT gradients match finite differences of the loss (double)", "[model][grad]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(99);
  GptConfig cfg = tiny_config();
  const int B = 3;
  GptModel model(cfg, B, DType::f64);
  model.init(1234);
  perturb(model, rng);
  Tensor tokens = random_windows(rng, B, cfg.seq_length, cfg.vocab_size);
  const double scale = 1.0 / (B * cfg.seq_length);
  model.zero_grad();
  const double loss = model.forward_backward(ctx, tokens, scale);
  REQUIRE(std::isfinite(loss));
  std::vector<Tensor> grads;
  for (const Tensor& g : model.grads()) grads.push_back(g.clone());
  auto objective = [&] { return scale * model.forward_loss(ctx, tokens); };
  REQUIRE(objective() == Approx(scale * loss).epsilon(1e-13));
  for (size_t k = 0; k < model.params().size(); ++k) {
    const ParamSpec& s = model.specs()[k];
    // Only the real rows of the padded embedding are parameters of the loss.
    Tensor p = model.params()[k].rows(0, s.global_shape[0]);
    Tensor g = grads[k].rows(0, s.global_shape[0]);
    test::check_gradient(objective, p, g, s.name.c_str(), 1e-6, 1e-9, 60);
  }
  // Padding rows of wte get exactly zero gradient.
  const Tensor& gw = grads[0];
  for (int64_t i = cfg.vocab_size * cfg.hidden_size; i < gw.numel(); ++i) REQUIRE(gw.data<double>()[i] == 0.0);
}

TEST_CASE("loss and gradients do not depend on the vocabulary padding", "[model]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(5);
  const int B = 3;
  GptModel padded(tiny_config(128), B, DType::f64), unpadded(tiny_config(1), B, DType::f64);
  REQUIRE(padded.params()[0].dim(0) == 128);
  REQUIRE(unpadded.params()[0].dim(0) == 37);
  padded.init(77);
  unpadded.init(77);
  // Same global initial values regardless of the padding.
  for (size_t k = 0; k < padded.params().size(); ++k) {
    const int64_t real = padded.specs()[k].global_shape.numel();
    REQUIRE(std::memcmp(padded.params()[k].raw(), unpadded.params()[k].raw(), real * sizeof(double)) == 0);
  }
  Tensor tokens = random_windows(rng, B, 7, 37);
  padded.zero_grad();
  unpadded.zero_grad();
  const double a = padded.forward_backward(ctx, tokens, 0.5);
  const double b = unpadded.forward_backward(ctx, tokens, 0.5);
  REQUIRE(a == Approx(b).epsilon(1e-13));
  for (size_t k = 0; k < padded.grads().size(); ++k) {
    const int64_t real = padded.specs()[k].global_shape[0];
    CHECK(test::max_rel_diff(padded.grads()[k].rows(0, real), unpadded.grads()[k].rows(0, real)) < 1e-12);
  }
}

TEST_CASE("initialisation: GPT-2 scheme from the seed", "[model]") {
  GptConfig cfg = tiny_config();
  cfg.hidden_size = 64;
  cfg.num_attention_heads = 4;
  cfg.vocab_size = 1000;
  GptModel m(cfg, 1), same(cfg, 1), other(cfg, 1);
  m.init(1);
  same.init(1);
  other.init(2);
  REQUIRE(std::memcmp(m.flat_params().raw(), same.flat_params().raw(), m.flat_params().nbytes()) == 0);
  REQUIRE(std::memcmp(m.flat_params().raw(), other.flat_params().raw(), m.flat_params().nbytes()) != 0);
  for (size_t k = 0; k < m.specs().size(); ++k) {
    const ParamSpec& s = m.specs()[k];
    const float* d = m.params()[k].data<float>();
    const int64_t n = s.global_shape.numel();
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      sum += d[i];
      sq += static_cast<double>(d[i]) * d[i];
    }
    if (s.init == InitKind::ones) REQUIRE(sum == n);
    if (s.init == InitKind::zeros) REQUIRE(sq == 0);
    if (s.init == InitKind::normal || s.init == InitKind::normal_residual) {
      const double expected = s.init == InitKind::normal ? 0.02 : 0.02 / std::sqrt(2.0 * cfg.num_layers);
      REQUIRE(s.init_std == Approx(expected));
      const double std_measured = std::sqrt(sq / n - (sum / n) * (sum / n));
      INFO(s.name << " n=" << n);
      CHECK(std_measured == Approx(expected).epsilon(n > 10000 ? 0.03 : 0.1));
      CHECK(std::abs(sum / n) < 4 * expected / std::sqrt(static_cast<double>(n)));
    }
  }
  // Padding rows of wte start at zero.
  const float* wte = m.params()[0].data<float>();
  for (int64_t i = cfg.vocab_size * cfg.hidden_size; i < m.params()[0].numel(); ++i) REQUIRE(wte[i] == 0.0f);
}

TEST_CASE("float model agrees with the double model", "[model]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(8);
  GptConfig cfg = tiny_config();
  GptModel m32(cfg, 3, DType::f32), m64(cfg, 3, DType::f64);
  m32.init(3);
  m64.init(3);
  Tensor tokens = random_windows(rng, 3, 7, 37);
  m32.zero_grad();
  m64.zero_grad();
  const double l32 = m32.forward_backward(ctx, tokens, 1.0 / 21);
  const double l64 = m64.forward_backward(ctx, tokens, 1.0 / 21);
  REQUIRE(l32 == Approx(l64).epsilon(1e-6));
  CHECK(test::max_rel_diff(m32.flat_grads(), m64.flat_grads()) < 1e-6);
}

TEST_CASE("parameter names and shapes follow Hugging Face GPT-2", "[model]") {
  GptConfig cfg = tiny_config();
  auto specs = gpt2_param_specs(cfg);
  REQUIRE(specs.size() == 2 + 12 * 2 + 2);
  REQUIRE(specs[0].name == "transformer.wte.weight");
  REQUIRE(specs[0].global_shape == Shape({37, 12}));
  REQUIRE(specs[0].local_shape == Shape({128, 12}));
  REQUIRE(specs[1].name == "transformer.wpe.weight");
  REQUIRE(specs[4].name == "transformer.h.0.attn.c_attn.weight");
  REQUIRE(specs[4].global_shape == Shape({36, 12}));
  REQUIRE(specs[12].name == "transformer.h.0.mlp.c_proj.weight");
  REQUIRE(specs[12].global_shape == Shape({12, 48}));
  REQUIRE(specs.back().name == "transformer.ln_f.bias");
  int64_t total = 0;
  for (auto& s : specs) total += s.global_shape.numel();
  REQUIRE(total == cfg.num_parameters());
}

// ---- the other families ------------------------------------------------------------------------

namespace {
// Tiny configs with odd sizes; each switches on a different set of the family fields.
GptConfig family_config(const std::string& family) {
  GptConfig c = tiny_config();
  c.hidden_size = 12;
  c.num_attention_heads = 4;
  if (family == "llama") {  // RMSNorm, rotate-half rope on 4 of 5 head dims, SwiGLU, GQA 4:2, no biases, untied
    c.set_llama_family();
    c.num_query_groups = 2;
    c.kv_channels = 5;
    c.ffn_hidden = 9;
    c.rotary_base = 500;
  } else if (family == "llama-interleaved") {  // interleaved pairs on half the dims, MQA, biases, tied
    c.normalization = Normalization::rmsnorm;
    c.position_embedding = PositionEmbedding::rope;
    c.rotary_interleaved = true;
    c.rotary_percent = 0.5;
    c.activation = MlpActivation::swiglu;
    c.num_query_groups = 1;
    c.kv_channels = 6;
    c.ffn_hidden = 7;
  } else if (family == "bloom") {  // ALiBi over 3 heads (not a power of 2), LayerNorm on the embeddings
    c.num_attention_heads = 3;
    c.set_bloom_family();
  } else if (family == "nopos") {  // no position information at all, untied head, GELU of ffn 13
    c.position_embedding = PositionEmbedding::none;
    c.untie_embeddings_and_output_weights = true;
    c.ffn_hidden = 13;
  }
  REQUIRE(c.validate().is_ok());
  return c;
}

// forward_backward's gradient of (scale * summed loss) against central differences of forward_loss,
// every real parameter element up to 60 per tensor.
void check_model_gradient(const GptConfig& cfg, uint64_t seed) {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(seed);
  const int B = 2;
  GptModel model(cfg, B, DType::f64);
  model.init(seed + 1);
  perturb(model, rng);
  Tensor tokens = random_windows(rng, B, cfg.seq_length, cfg.vocab_size);
  const double scale = 1.0 / (B * cfg.seq_length);
  model.zero_grad();
  const double loss = model.forward_backward(ctx, tokens, scale);
  REQUIRE(std::isfinite(loss));
  std::vector<Tensor> grads;
  for (const Tensor& g : model.grads()) grads.push_back(g.clone());
  auto objective = [&] { return scale * model.forward_loss(ctx, tokens); };
  REQUIRE(objective() == Approx(scale * loss).epsilon(1e-13));
  for (size_t k = 0; k < model.params().size(); ++k) {
    const ParamSpec& s = model.specs()[k];
    Tensor p = model.params()[k].rows(0, s.global_shape[0]);
    Tensor g = grads[k].rows(0, s.global_shape[0]);
    test::check_gradient(objective, p, g, s.name.c_str(), 1e-6, 1e-9, 60);
  }
}
}  // namespace

TEST_CASE("family gradients match finite differences of the loss (double)", "[model][grad][family]") {
  for (const char* family : {"llama", "llama-interleaved", "bloom", "nopos"}) {
    INFO("family " << family);
    check_model_gradient(family_config(family), 17);
  }
}

TEST_CASE("family parameters: the specs the config implies, found by name", "[model][family]") {
  const GptConfig llama = family_config("llama");
  GptModel m(llama, 1, DType::f64);
  std::map<std::string, Shape> shapes;
  for (const ParamSpec& s : m.specs()) shapes[s.name] = s.global_shape;
  CHECK(!shapes.count("transformer.wpe.weight"));
  CHECK(!shapes.count("transformer.h.0.ln_1.bias"));
  CHECK(!shapes.count("transformer.h.1.attn.c_attn.bias"));
  CHECK(shapes.at("transformer.h.0.attn.c_attn.weight") == Shape({(4 + 2 * 2) * 5, 12}));
  CHECK(shapes.at("transformer.h.0.attn.c_proj.weight") == Shape({12, 4 * 5}));
  CHECK(shapes.at("transformer.h.0.mlp.c_fc.weight") == Shape({2 * 9, 12}));
  CHECK(shapes.at("transformer.h.0.mlp.c_proj.weight") == Shape({12, 9}));
  CHECK(shapes.at("lm_head.weight") == Shape({37, 12}));
  const GptConfig bloom = family_config("bloom");
  GptModel b(bloom, 1, DType::f64);
  shapes.clear();
  for (const ParamSpec& s : b.specs()) shapes[s.name] = s.global_shape;
  CHECK(shapes.at("transformer.ln_embd.weight") == Shape({12}));
  CHECK(shapes.at("transformer.ln_embd.bias") == Shape({12}));
  CHECK(!shapes.count("lm_head.weight"));
}

// The reference's own dropout attention, generalised to grouped-query attention, head sizes other than
// C/H and ALiBi: gradients with fixed masks (the loss of forward_backward at scale 0 with the same key)
// against finite differences.
TEST_CASE("family gradients with dropout match finite differences (double, fixed masks)", "[model][grad][family][dropout]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (const char* family : {"llama", "bloom"}) {
    INFO("family " << family);
    GptConfig cfg = family_config(family);
    cfg.hidden_dropout = 0.2;
    cfg.attention_dropout = 0.25;
    std::mt19937_64 rng(21);
    const int B = 2;
    GptModel model(cfg, B, DType::f64);
    model.init(3);
    perturb(model, rng);
    Tensor tokens = random_windows(rng, B, cfg.seq_length, cfg.vocab_size);
    const MicroBatchKey key{31, 2, 4};
    const double scale = 1.0 / (B * cfg.seq_length);
    model.zero_grad();
    model.forward_backward(ctx, tokens, scale, key);
    const Tensor analytic = model.flat_grads().clone();
    GptModel probe(cfg, B, DType::f64);
    probe.flat_params().copy_from(model.flat_params());
    auto objective = [&] {
      probe.zero_grad();
      return probe.forward_backward(ctx, tokens, 0.0, key) * scale;
    };
    // The masks matter: the dropped loss differs from the undropped one.
    CHECK(objective() != Approx(probe.forward_loss(ctx, tokens) * scale).epsilon(1e-6));
    test::check_gradient(objective, probe.flat_params(), analytic, family, 1e-5, 1e-8, 300);
  }
}
