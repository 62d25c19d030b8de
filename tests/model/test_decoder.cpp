// The decoder (model/decoder.hpp) against the training model (reference/gpt.hpp) for GPT-2, a LLaMA
// (RMSNorm, rope, SwiGLU, grouped-query attention, untied head) and a BLOOM (ALiBi, embedding
// LayerNorm) of odd sizes with random weights: feeding a sequence token by token through the key/value
// cache gives log-probabilities whose sum is the training model's loss on it; feeding it whole gives
// the last token's logits of the token-by-token run; sequences of different lengths fed together
// give what each gives alone; all of it with the linears on OpenBLAS and on the packed kernel
// (kernels/cpu/gemm_packed.hpp). Mixture-of-experts models (both anchors' routers, PR-MoE, a shared
// expert, expert counts per layer; dropless) against the training chunk's evaluation forward.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "model/decoder.hpp"
#include "model/generation.hpp"
#include "model/gpt_chunk.hpp"
#include "reference/gpt.hpp"

namespace troupe {
namespace {

GptConfig family(const std::string& name) {
  GptConfig m;
  m.num_layers = 2;
  m.hidden_size = 40;
  m.num_attention_heads = 4;
  m.seq_length = 13;
  m.max_position_embeddings = 24;
  m.vocab_size = 37;
  if (name == "llama") {
    m.set_llama_family();
    m.num_query_groups = 2;
    m.ffn_hidden = 52;
    m.rotary_base = 500;
  } else if (name == "bloom") {
    m.set_bloom_family();
    m.num_attention_heads = 5;  // ALiBi slopes of a count that is not a power of 2
  }
  REQUIRE(m.validate().is_ok());
  return m;
}

double log_prob(const std::vector<float>& logits, int32_t token) {
  double mx = -INFINITY, sum = 0;
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  return static_cast<double>(logits[static_cast<size_t>(token)]) - mx - std::log(sum);
}

}  // namespace

TEST_CASE("decoder: the cache's log-probabilities are the training model's loss", "[decoder]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (const std::string name : {"gpt2", "llama", "bloom"}) {
    INFO(name);
    const GptConfig m = family(name);
    GptModel ref(m, 1);
    ref.init(11);
    for (const bool packed : {false, true}) {
      INFO((packed ? "packed weights" : "OpenBLAS"));
      Decoder dec(m);
      REQUIRE(dec.params().size() == ref.params().size());
      for (size_t i = 0; i < dec.params().size(); ++i) dec.params()[i].copy_from(ref.params()[i]);
      if (packed) dec.pack_weights();  // the forward's linears on the packed kernel (none: OpenBLAS again)
      std::mt19937 rng(5);
      const int T = m.seq_length;
      Tensor tokens = Tensor::empty({1, T + 1}, DType::i32);
      for (int t = 0; t <= T; ++t) tokens.data<int32_t>()[t] = static_cast<int32_t>(rng() % m.vocab_size);
      const int32_t* tok = tokens.data<int32_t>();
      const double loss = ref.forward_loss(ctx, tokens);

      const int one = dec.open_sequence();
      double sum = 0;
      std::vector<float> last;
      for (int t = 0; t < T; ++t) {
        auto logits = dec.feed(ctx, {one}, {{tok[t]}});
        REQUIRE(logits.is_ok());
        last = logits.value()[0];
        REQUIRE(last.size() == static_cast<size_t>(m.vocab_size));
        sum -= log_prob(last, tok[t + 1]);
      }
      CHECK(dec.length(one) == T);
      CHECK(sum == Approx(loss).epsilon(1e-5));

      // Whole at once, and two sequences of different lengths in one call.
      const int whole = dec.open_sequence();
      auto at_once = dec.feed(ctx, {whole}, {std::vector<int32_t>(tok, tok + T)});
      REQUIRE(at_once.is_ok());
      for (size_t v = 0; v < last.size(); ++v) CHECK(at_once.value()[0][v] == Approx(last[v]).margin(1e-5));
      dec.close_sequence(whole);
      const int a = dec.open_sequence(), b = dec.open_sequence();
      auto first = dec.feed(ctx, {a, b}, {std::vector<int32_t>(tok, tok + 4), std::vector<int32_t>(tok, tok + T - 1)});
      REQUIRE(first.is_ok());
      auto second = dec.feed(ctx, {b, a}, {{tok[T - 1]}, {tok[4]}});
      REQUIRE(second.is_ok());
      for (size_t v = 0; v < last.size(); ++v) CHECK(second.value()[0][v] == Approx(last[v]).margin(1e-5));
      // a holds tok[0..4]: its next-token log-probability of tok[5] is the token-by-token run's term.
      const int c = dec.open_sequence();
      std::vector<float> alone;
      for (int t = 0; t < 5; ++t) alone = dec.feed(ctx, {c}, {{tok[t]}}).value()[0];
      for (size_t v = 0; v < alone.size(); ++v) CHECK(second.value()[1][v] == Approx(alone[v]).margin(1e-5));

      // Past the model's positions: refused, nothing fed.
      auto over = dec.feed(ctx, {one}, {std::vector<int32_t>(static_cast<size_t>(m.max_position_embeddings), 1)});
      REQUIRE_FALSE(over.is_ok());
      CHECK(over.status().is_bad_input());
      CHECK(dec.length(one) == T);
      auto outside = dec.feed(ctx, {one}, {{static_cast<int32_t>(m.vocab_size)}});
      REQUIRE_FALSE(outside.is_ok());
    }
  }
}

TEST_CASE("decoder: a request's tokens do not depend on what runs beside it", "[decoder]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  const GptConfig m = family("llama");
  GptModel ref(m, 1);
  ref.init(3);
  Decoder dec(m);
  for (size_t i = 0; i < dec.params().size(); ++i) dec.params()[i].copy_from(ref.params()[i]);
  dec.pack_weights();  // as troupe generate decodes
  GenerationOptions o;
  o.sampling.top_p = 0.9;
  o.sampling.temperature = 1.5;
  o.sampling.seed = 17;
  o.tokens_to_generate = 9;
  const std::vector<int32_t> a{3, 1, 4, 1, 5}, b{9, 2, 6};
  auto alone = [&](const std::vector<int32_t>& prompt, int64_t index) {
    BatchGenerator batch(dec);
    Generation out;
    BatchGenerator::Request r{prompt, o, index, {}, [&](Generation g) { out = std::move(g); }};
    REQUIRE(batch.add(std::move(r)).is_ok());
    while (batch.step(ctx).value()) {
    }
    return out;
  };
  const Generation a1 = alone(a, 0), b1 = alone(b, 1);
  REQUIRE(a1.tokens.size() == 9);
  // b joins after a's third step; a also as index 1 to see the key matter.
  BatchGenerator batch(dec);
  Generation a2, b2;
  std::vector<int32_t> streamed;
  REQUIRE(batch.add({a, o, 0, [&](int32_t t, double) { streamed.push_back(t); }, [&](Generation g) { a2 = std::move(g); }})
              .is_ok());
  for (int s = 0; s < 3; ++s) REQUIRE(batch.step(ctx).value());
  CHECK(batch.running() == 1);
  REQUIRE(batch.add({b, o, 1, {}, [&](Generation g) { b2 = std::move(g); }}).is_ok());
  while (batch.step(ctx).value()) {
  }
  CHECK(a2.tokens == a1.tokens);
  CHECK(streamed == a1.tokens);
  CHECK(b2.tokens == b1.tokens);
  CHECK(b2.prompt_log_probs.size() == b.size() - 1);
  for (size_t i = 0; i < a1.log_probs.size(); ++i) CHECK(a2.log_probs[i] == Approx(a1.log_probs[i]).margin(1e-6));
  const Generation other_key = alone(a, 1);
  CHECK(other_key.tokens != a1.tokens);
  // Bad requests are refused before they join.
  CHECK(batch.add({{}, o, 0, {}, {}}).is_bad_input());
  GenerationOptions wide = o;
  wide.tokens_to_generate = m.max_position_embeddings;
  CHECK(batch.add({a, wide, 0, {}, {}}).is_bad_input());
}

TEST_CASE("decoder: beam search finds the exhaustive search's best when it is wide enough", "[decoder]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  GptConfig m = family("gpt2");
  m.vocab_size = 6;
  GptModel ref(m, 1);
  ref.init(23);
  Decoder dec(m);
  for (size_t i = 0; i < dec.params().size(); ++i) dec.params()[i].copy_from(ref.params()[i]);
  const std::vector<int32_t> prompt{1, 4, 2};
  // Every continuation of 3 tokens, scored by its summed log-probability.
  double best = -INFINITY;
  std::vector<int32_t> best_tokens;
  for (int32_t a = 0; a < 6; ++a)
    for (int32_t b = 0; b < 6; ++b)
      for (int32_t c = 0; c < 6; ++c) {
        const int id = dec.open_sequence();
        double sum = 0;
        std::vector<int32_t> seq = prompt;
        for (int32_t t : {a, b, c}) {
          const std::vector<float> lg = dec.feed(ctx, {id}, {seq}).value()[0];
          sum += token_log_prob(lg, t);
          seq = {t};
        }
        dec.close_sequence(id);
        if (sum > best) {
          best = sum;
          best_tokens = {a, b, c};
        }
      }
  // Width 36 keeps every 2-token prefix: the best of all 216 is found, its score sum / 3.
  auto wide = beam_search(ctx, dec, prompt, 36, 3, /*stop_token=*/-1, 1.0);
  REQUIRE(wide.is_ok());
  REQUIRE(wide.value().size() == 36);
  CHECK(wide.value()[0].tokens == best_tokens);
  CHECK(wide.value()[0].score == Approx(best / 3).epsilon(1e-6));  // logits of batched rows: float32 rounding
  for (size_t i = 1; i < wide.value().size(); ++i) CHECK(wide.value()[i].score <= wide.value()[i - 1].score);
  // Width 1 is greedy.
  GenerationOptions greedy;
  greedy.sampling.top_k = 1;
  greedy.tokens_to_generate = 3;
  auto g = generate(ctx, dec, {prompt}, greedy);
  auto one = beam_search(ctx, dec, prompt, 1, 3, -1, 1.0);
  REQUIRE(one.is_ok());
  CHECK(one.value()[0].tokens == g.value()[0].tokens);
  // A stop token ends hypotheses without itself; the result is still best first.
  auto stopped = beam_search(ctx, dec, prompt, 4, 5, best_tokens[1], 1.0);
  REQUIRE(stopped.is_ok());
  for (const BeamHypothesis& h : stopped.value())
    CHECK(std::find(h.tokens.begin(), h.tokens.end(), best_tokens[1]) == h.tokens.end());
  CHECK_FALSE(beam_search(ctx, dec, {}, 2, 3, -1).is_ok());
  CHECK(beam_search(ctx, dec, prompt, 0, 3, -1).status().is_bad_input());
}

namespace {

// Dropless MoE models of both anchors' routers (a capacity belongs to a batch; generation routes
// every token to its top-k experts, docs/SERVE.md).
std::vector<std::pair<std::string, GptConfig>> moe_models() {
  std::vector<std::pair<std::string, GptConfig>> out;
  GptConfig megatron = family("gpt2");  // biases: the router's too
  megatron.moe.num_experts = {4};
  megatron.moe.router = MoeRouter::megatron;
  megatron.moe.topk = 2;
  megatron.moe.drop_tokens = false;
  megatron.moe.ffn_hidden = 18;
  out.emplace_back("megatron top-2", megatron);
  GptConfig mixtral = family("llama");
  mixtral.moe.num_experts = {4};
  mixtral.moe.router = MoeRouter::megatron;
  mixtral.moe.topk = 2;
  mixtral.moe.drop_tokens = false;
  mixtral.moe.pre_softmax = true;
  mixtral.moe.shared_expert_ffn = 6;
  out.emplace_back("mixtral pre-softmax, shared expert", mixtral);
  GptConfig pr = family("gpt2");
  pr.moe.num_experts = {3};
  pr.moe.layer_freq = 2;
  pr.moe.router = MoeRouter::deepspeed;
  pr.moe.topk = 1;
  pr.moe.drop_tokens = false;
  pr.moe.residual = true;
  out.emplace_back("deepspeed top-1 PR-MoE", pr);
  GptConfig ds2 = family("bloom");
  ds2.moe.num_experts = {4, 2};
  ds2.moe.router = MoeRouter::deepspeed;
  ds2.moe.topk = 2;
  ds2.moe.drop_tokens = false;
  out.emplace_back("deepspeed top-2, 4 and 2 experts", ds2);
  for (auto& [name, c] : out) REQUIRE(c.validate().is_ok());
  return out;
}

}  // namespace

TEST_CASE("decoder: mixture-of-experts models give the training chunk's loss", "[decoder][moe]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (const auto& [name, m] : moe_models()) {
    INFO(name);
    ChunkSpec spec = chunk_layers(m, 1, 1, 0, 0);
    GptChunk chunk(spec, nullptr);
    chunk.init(31);
    Decoder dec(m);
    REQUIRE(dec.params().size() == chunk.params().size());
    for (size_t i = 0; i < dec.specs().size(); ++i) {
      REQUIRE(dec.specs()[i].name == chunk.specs()[i].name);
      dec.params()[i].copy_from(chunk.params()[i]);
    }
    std::mt19937 rng(9);
    const int T = m.seq_length;
    Tensor tokens = Tensor::empty({1, T + 1}, DType::i32);
    for (int t = 0; t <= T; ++t) tokens.data<int32_t>()[t] = static_cast<int32_t>(rng() % m.vocab_size);
    const int32_t* tok = tokens.data<int32_t>();
    const double loss = chunk.forward_eval(ctx, tokens, Tensor(), Tensor());
    // Token by token through the cache: each token's experts chosen alone.
    const int one = dec.open_sequence();
    double sum = 0;
    std::vector<float> last;
    for (int t = 0; t < T; ++t) {
      last = dec.feed(ctx, {one}, {{tok[t]}}).value()[0];
      sum -= log_prob(last, tok[t + 1]);
    }
    CHECK(sum == Approx(loss).epsilon(1e-5));
    // Whole at once: the same logits.
    const int whole = dec.open_sequence();
    auto at_once = dec.feed(ctx, {whole}, {std::vector<int32_t>(tok, tok + T)}).value()[0];
    for (size_t v = 0; v < last.size(); ++v) CHECK(at_once[v] == Approx(last[v]).margin(1e-5));
  }
}

TEST_CASE("decoder: bf16 and fp16 give the training chunk's 16-bit loss to 16-bit rounding", "[decoder][half]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  auto models = moe_models();
  for (const std::string name : {"gpt2", "llama", "bloom"}) models.emplace_back(name, family(name));
  for (const auto& [name, base] : models) {
    GptConfig m = base;
    m.init_method_std = 0.1;  // logits far from uniform: 16-bit rounding shows in the loss
    std::mt19937 rng(4);
    const int T = m.seq_length;
    Tensor tokens = Tensor::empty({1, T + 1}, DType::i32);
    for (int t = 0; t <= T; ++t) tokens.data<int32_t>()[t] = static_cast<int32_t>(rng() % m.vocab_size);
    const int32_t* tok = tokens.data<int32_t>();
    // The f32 model's loss, and each 16-bit model's: the chunk's forward over the whole sequence
    // against the decoder's token by token through a 16-bit cache.
    ChunkSpec spec32 = chunk_layers(m, 1, 1, 0, 0);
    GptChunk chunk32(spec32, nullptr);
    chunk32.init(5);
    const double loss32 = chunk32.forward_eval(ctx, tokens, Tensor(), Tensor());
    for (const DType dt : {DType::bf16, DType::f16}) {
      INFO(name << " " << dtype_name(dt));
      ChunkSpec spec = spec32;
      spec.dtype = dt;
      GptChunk chunk(spec, nullptr);
      chunk.init(5);
      const double loss = chunk.forward_eval(ctx, tokens, Tensor(), Tensor());
      Decoder whole(m);
      for (size_t i = 0; i < whole.specs().size(); ++i) whole.params()[i].copy_from(chunk32.params()[i]);
      Decoder dec(m, dt);
      dec.load_from(whole);  // rounded: the 16-bit chunk's values
      for (size_t i = 0; i < dec.specs().size(); ++i) {
        REQUIRE(dec.params()[i].dtype() == dt);
        const Tensor a = dec.params()[i].to(DType::f32), b = chunk.params()[i].to(DType::f32);
        REQUIRE(std::equal(a.data<float>(), a.data<float>() + a.numel(), b.data<float>()));
      }
      const int one = dec.open_sequence(), ref = whole.open_sequence();
      double sum = 0, moved = 0;
      for (int t = 0; t < T; ++t) {
        const std::vector<float> lg = dec.feed(ctx, {one}, {{tok[t]}}).value()[0];
        const std::vector<float> lg32 = whole.feed(ctx, {ref}, {{tok[t]}}).value()[0];
        sum -= log_prob(lg, tok[t + 1]);
        for (size_t v = 0; v < lg.size(); ++v) moved = std::max(moved, std::fabs(static_cast<double>(lg[v]) - lg32[v]));
      }
      // Not bitwise: where a 16-bit value rounds differs between the sequence at once and one token at
      // a time (GEMM blockings, the attention's blocks), so the two agree to 16-bit rounding.
      INFO("16-bit chunk " << loss << ", decoder " << sum << ", f32 " << loss32 << "; logits moved " << moved);
      CHECK(std::fabs(sum - loss) < 1e-3 * std::fabs(loss));
      CHECK(moved > 0);      // it computes in 16 bits
      CHECK(moved < 0.05);   // and only rounds
    }
  }
}

}  // namespace troupe
