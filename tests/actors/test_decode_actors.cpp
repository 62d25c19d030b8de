// Parallel decoding (actors/decode_actors.hpp) against the one-thread decoder (model/decoder.hpp) for
// GPT-2, a LLaMA (rope, SwiGLU, grouped-query attention, untied head) and a BLOOM (ALiBi, embedding
// LayerNorm) of odd sizes (3 layers: an uneven pipeline split; a vocabulary of 37 that tp 2 splits 19 + 18 and pads),
// random weights, on tp 2, pp 2 and tp 2 x pp 2: ragged prompts fed together (cut into micro-batches
// through the pipeline) give the one-thread logits up to rounding; greedy and seeded sampled
// generation give its tokens; beam search (copied caches) its hypotheses. A Mixtral-like MoE (experts
// split like the MLP, a shared expert) too, and with its experts whole, two per tensor-parallel rank.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <tuple>

#include "actors/decode_actors.hpp"
#include "model/generation.hpp"
#include "reference/gpt.hpp"

namespace troupe {
namespace {

GptConfig family(const std::string& name) {
  GptConfig m;
  m.num_layers = 3;
  m.hidden_size = 40;
  m.num_attention_heads = 4;
  m.seq_length = 13;
  m.max_position_embeddings = 40;
  m.vocab_size = 37;
  m.make_vocab_size_divisible_by = 1;  // tp 2: 19 rows of the vocabulary each, the last one padding
  if (name == "llama" || name == "mixtral") {
    m.set_llama_family();
    m.num_query_groups = 2;
    m.ffn_hidden = 52;
    m.rotary_base = 500;
    if (name == "mixtral") {  // dropless top-2 of 4 experts pre-softmax, a shared expert, every layer
      m.moe.num_experts = {4};
      m.moe.router = MoeRouter::megatron;
      m.moe.topk = 2;
      m.moe.drop_tokens = false;
      m.moe.pre_softmax = true;
      m.moe.shared_expert_ffn = 6;
      m.init_method_std = 0.2;  // routers and logits far from uniform
    }
  } else if (name == "bloom") {
    m.set_bloom_family();
    m.hidden_size = 36;
    m.num_attention_heads = 6;  // ALiBi slopes of a count that is not a power of 2
  }
  REQUIRE(m.validate().is_ok());
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

}  // namespace

TEST_CASE("parallel decoding: every layout gives the one-thread decoder's logits and tokens", "[decode_actors]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (const std::string name : {"gpt2", "llama", "bloom", "mixtral"}) {
    const GptConfig m = family(name);
    Decoder one(m);
    if (m.moe.enabled()) {  // the reference model has no experts: the specs' own initial values
      for (size_t i = 0; i < one.params().size(); ++i) init_parameter(one.specs()[i], 19, one.params()[i]);
    } else {
      GptModel ref(m, 1);
      ref.init(19);
      for (size_t i = 0; i < one.params().size(); ++i) one.params()[i].copy_from(ref.params()[i]);
    }
    std::mt19937 rng(7);
    std::vector<std::vector<int32_t>> prompts;
    for (int len : {5, 1, 9, 3, 7}) {
      std::vector<int32_t> p;
      for (int t = 0; t < len; ++t) p.push_back(static_cast<int32_t>(rng() % m.vocab_size));
      prompts.push_back(p);
    }
    GenerationOptions greedy;
    greedy.sampling.top_k = 1;
    greedy.tokens_to_generate = 8;
    GenerationOptions sampled;
    sampled.sampling.top_p = 0.9;
    sampled.sampling.temperature = 1.3;
    sampled.sampling.seed = 29;
    sampled.tokens_to_generate = 8;
    const auto greedy1 = generate(ctx, one, prompts, greedy).value();
    const auto sampled1 = generate(ctx, one, prompts, sampled).value();
    const auto beams1 = beam_search(ctx, one, prompts[2], 3, 5, /*stop_token=*/-1).value();

    std::vector<std::tuple<int, int, bool>> layouts = {{2, 1, false}, {1, 2, false}, {2, 2, false}};
    if (m.moe.enabled()) {  // and the experts whole, two per tensor-parallel rank (EP = tp)
      layouts.emplace_back(2, 1, true);
      layouts.emplace_back(2, 2, true);
    }
    for (const auto& [tp, pp, ep] : layouts) {
      INFO(name << " tp " << tp << " pp " << pp << (ep ? " experts whole over the tp ranks" : ""));
      auto made = ParallelDecoder::create(one, {tp, pp, 2, 0, DType::f32, ep});
      REQUIRE(made.is_ok());
      ParallelDecoder& par = *made.value();
      // Ragged prompts together (every row's logits), then a step of one token each.
      std::vector<int> ids_one, ids_par;
      for (size_t i = 0; i < prompts.size(); ++i) {
        ids_one.push_back(one.open_sequence());
        ids_par.push_back(par.open_sequence());
      }
      auto a = one.feed(ctx, ids_one, prompts, true);
      auto b = par.feed(ctx, ids_par, prompts, true);
      REQUIRE(a.is_ok());
      REQUIRE(b.is_ok());
      for (size_t i = 0; i < prompts.size(); ++i) CHECK(max_diff(a.value()[i], b.value()[i]) < 2e-5);
      std::vector<std::vector<int32_t>> next;
      for (size_t i = 0; i < prompts.size(); ++i) next.push_back({static_cast<int32_t>(i + 3)});
      a = one.feed(ctx, ids_one, next);
      b = par.feed(ctx, ids_par, next);
      REQUIRE(b.is_ok());
      for (size_t i = 0; i < prompts.size(); ++i) CHECK(max_diff(a.value()[i], b.value()[i]) < 2e-5);
      for (size_t i = 0; i < prompts.size(); ++i) {
        CHECK(par.length(ids_par[i]) == one.length(ids_one[i]));
        one.close_sequence(ids_one[i]);
        par.close_sequence(ids_par[i]);
      }
      // Generation: the same tokens, log-probabilities up to rounding.
      auto greedy2 = generate(ctx, par, prompts, greedy);
      REQUIRE(greedy2.is_ok());
      const auto sampled2 = generate(ctx, par, prompts, sampled).value();
      for (size_t i = 0; i < prompts.size(); ++i) {
        CHECK(greedy2.value()[i].tokens == greedy1[i].tokens);
        CHECK(sampled2[i].tokens == sampled1[i].tokens);
        for (size_t t = 0; t < greedy1[i].log_probs.size(); ++t)
          CHECK(greedy2.value()[i].log_probs[t] == Approx(greedy1[i].log_probs[t]).margin(2e-5));
      }
      auto beams2 = beam_search(ctx, par, prompts[2], 3, 5, -1);
      REQUIRE(beams2.is_ok());
      REQUIRE(beams2.value().size() == beams1.size());
      for (size_t h = 0; h < beams1.size(); ++h) {
        CHECK(beams2.value()[h].tokens == beams1[h].tokens);
        CHECK(beams2.value()[h].score == Approx(beams1[h].score).margin(2e-5));
      }
      // Bad input is refused before it reaches the ranks, and the decoder goes on.
      const int s = par.open_sequence();
      CHECK(par.feed(ctx, {s}, {{static_cast<int32_t>(m.vocab_size)}}).status().is_bad_input());
      CHECK(par.feed(ctx, {s}, {{1, 2}}).is_ok());
      CHECK(par.length(s) == 2);
    }
  }
}

TEST_CASE("parallel decoding: bf16 and fp16 shards give the 16-bit decoder's logits to 16-bit rounding",
          "[decode_actors]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  GptConfig m = family("mixtral");
  Decoder whole(m);
  for (size_t i = 0; i < whole.params().size(); ++i) init_parameter(whole.specs()[i], 23, whole.params()[i]);
  const std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5}, {9, 2}, {6, 5, 3, 5, 8, 9, 7}};
  for (const DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    Decoder one(m, dt);
    one.load_from(whole);
    auto made = ParallelDecoder::create(whole, {2, 2, 2, 0, dt});
    REQUIRE(made.is_ok());
    ParallelDecoder& par = *made.value();
    std::vector<int> a, b;
    for (size_t i = 0; i < prompts.size(); ++i) {
      a.push_back(one.open_sequence());
      b.push_back(par.open_sequence());
    }
    const auto x = one.feed(ctx, a, prompts, true).value(), y = par.feed(ctx, b, prompts, true).value();
    const auto x32 = whole.feed(ctx, {whole.open_sequence()}, {prompts[0]}, true).value();
    const double tol = dt == DType::bf16 ? 0.1 : 0.02;
    for (size_t i = 0; i < prompts.size(); ++i) CHECK(max_diff(x[i], y[i]) < tol);
    CHECK(max_diff(x[0], x32[0]) > 0);  // 16 bits, not f32
  }
}

TEST_CASE("parallel decoding: a layout the model cannot take is refused with the reason", "[decode_actors]") {
  const GptConfig m = family("llama");  // 4 heads, 2 query groups, 3 layers
  Decoder one(m);
  auto three = ParallelDecoder::create(one, {3, 1, 1, 0});
  REQUIRE_FALSE(three.is_ok());
  CHECK(three.status().is_bad_input());
  CHECK_THAT(three.status().message(), Catch::Contains("attention heads") && Catch::Contains("query groups"));
  auto deep = ParallelDecoder::create(one, {1, 4, 1, 0});
  REQUIRE_FALSE(deep.is_ok());
  CHECK_THAT(deep.status().message(), Catch::Contains("3 layers"));
  // Experts whole over the tensor-parallel ranks: a count the group does not divide; a dense model.
  auto ep_dense = ParallelDecoder::create(one, {2, 1, 1, 0, DType::f32, true});
  REQUIRE_FALSE(ep_dense.is_ok());
  CHECK_THAT(ep_dense.status().message(), Catch::Contains("the model has no experts"));
  GptConfig odd = family("mixtral");
  odd.moe.num_experts = {3};
  Decoder three_experts(odd);
  auto ep_odd = ParallelDecoder::create(three_experts, {2, 1, 1, 0, DType::f32, true});
  REQUIRE_FALSE(ep_odd.is_ok());
  CHECK_THAT(ep_odd.status().message(), Catch::Contains("does not divide layer 0's 3 experts"));
  CHECK(ParallelDecoder::create(three_experts, {2, 1, 1, 0}).is_ok());  // split like the MLP, 3 experts work
}

}  // namespace troupe
