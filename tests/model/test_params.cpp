// Parameter slices of a tensor-parallel shard: local shapes, and initialisation defined in global
// coordinates (every rank's slice of the initial values, put together, is the single-shard tensor).
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "model/params.hpp"

using namespace troupe;

namespace {
GptConfig slice_config() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 12;
  c.num_attention_heads = 6;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 4;  // Vp = 40 (t = 1, 2), 48 (t = 3): padding on the last ranks
  return c;
}

// LLaMA-like: RMSNorm, rotary, SwiGLU, GQA (H = 8, G = 4), head size != C/H, no biases, untied head.
GptConfig llama_config() {
  GptConfig c = slice_config();
  c.set_llama_family();
  c.num_attention_heads = 8;
  c.num_query_groups = 4;
  c.kv_channels = 5;
  c.ffn_hidden = 20;
  return c;
}

// BLOOM-like: ALiBi (no wpe), LayerNorm on the embeddings, biases, tied.
GptConfig bloom_config() {
  GptConfig c = slice_config();
  c.set_bloom_family();
  c.num_attention_heads = 4;
  return c;
}

std::vector<std::string> names(const std::vector<ParamSpec>& s) {
  std::vector<std::string> out;
  for (const ParamSpec& p : s) out.push_back(p.name);
  return out;
}
}  // namespace

TEST_CASE("shard specs: Megatron's split of every GPT-2 parameter", "[model][params]") {
  const GptConfig c = slice_config();
  const int64_t C = 12, F = 48;
  const auto one = gpt2_param_specs(c);
  const auto same = gpt2_shard_specs(c, 1, 0);
  REQUIRE(one.size() == same.size());
  for (size_t i = 0; i < one.size(); ++i) {
    REQUIRE(one[i].name == same[i].name);
    REQUIRE(one[i].local_shape == same[i].local_shape);
  }
  REQUIRE(one[0].local_shape == Shape({40, C}));
  REQUIRE(one[0].slice.dim == 0);
  REQUIRE(one.size() == 2 + 12 * 2 + 2);
  REQUIRE(one[4].slice.offsets == std::vector<int64_t>{0, C, 2 * C});  // c_attn: q, k, v blocks
  REQUIRE(one[4].slice.extents == std::vector<int64_t>{C, C, C});
  REQUIRE(one[1].slice.dim == -1);                                      // wpe replicated

  const auto s = gpt2_shard_specs(c, 3, 1);
  REQUIRE(s[0].local_shape == Shape({16, C}));  // wte rows [16, 32)
  REQUIRE(s[0].slice.offsets == std::vector<int64_t>{16});
  REQUIRE(s[4].name == "transformer.h.0.attn.c_attn.weight");
  REQUIRE(s[4].local_shape == Shape({12, C}));  // 3 blocks of C/3 rows
  REQUIRE(s[4].slice.offsets == std::vector<int64_t>{4, 16, 28});
  REQUIRE(s[4].slice.extents == std::vector<int64_t>{4, 4, 4});
  REQUIRE(s[5].local_shape == Shape({12}));     // c_attn.bias splits like its weight
  REQUIRE(s[6].name == "transformer.h.0.attn.c_proj.weight");
  REQUIRE(s[6].local_shape == Shape({C, 4}));   // row-parallel: input columns
  REQUIRE(s[6].slice.dim == 1);
  REQUIRE(s[7].slice.dim == -1);                // its bias replicated
  REQUIRE(s[10].local_shape == Shape({F / 3, C}));
  REQUIRE(s[11].local_shape == Shape({F / 3}));
  REQUIRE(s[12].local_shape == Shape({C, F / 3}));
  for (const ParamSpec& p : s) REQUIRE(p.global_shape == one[&p - s.data()].global_shape);
}

TEST_CASE("shard specs: the LLaMA family (RMSNorm, rope, SwiGLU, GQA, no biases, untied)", "[model][params][family]") {
  const GptConfig c = llama_config();
  const int64_t C = 12, hs = 5, H = 8, G = 4, F = 20;
  const auto one = gpt2_param_specs(c);
  const std::vector<std::string> layer0 = {"transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.weight",
                                           "transformer.h.0.attn.c_proj.weight", "transformer.h.0.ln_2.weight",
                                           "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight"};
  std::vector<std::string> want = {"transformer.wte.weight"};  // no wpe with rope
  for (int l = 0; l < 2; ++l)
    for (std::string n : layer0) want.push_back(n.replace(14, 1, std::to_string(l)));
  want.push_back("transformer.ln_f.weight");
  want.push_back("lm_head.weight");
  REQUIRE(names(one) == want);
  REQUIRE(one[1].global_shape == Shape({C}));
  REQUIRE(one[1].init == InitKind::ones);
  REQUIRE(one[2].global_shape == Shape({(H + 2 * G) * hs, C}));
  REQUIRE(one[2].slice.offsets == std::vector<int64_t>{0, H * hs, (H + G) * hs});
  REQUIRE(one[2].slice.extents == std::vector<int64_t>{H * hs, G * hs, G * hs});
  REQUIRE(one[3].global_shape == Shape({C, H * hs}));
  REQUIRE(one[5].global_shape == Shape({2 * F, C}));
  REQUIRE(one[5].slice.extents == std::vector<int64_t>{F, F});
  REQUIRE(one[6].global_shape == Shape({C, F}));
  REQUIRE(one.back().global_shape == Shape({37, C}));
  REQUIRE(one.back().local_shape == Shape({40, C}));  // padded like wte
  REQUIRE(one.back().init == InitKind::normal);

  // tp = 2, rank 1: heads 4..7, groups 2..3; gate and up rows 10..19 of each half.
  const auto s = gpt2_shard_specs(c, 2, 1);
  REQUIRE(s[2].local_shape == Shape({(H + 2 * G) * hs / 2, C}));
  REQUIRE(s[2].slice.offsets == std::vector<int64_t>{4 * hs, H * hs + 2 * hs, (H + G) * hs + 2 * hs});
  REQUIRE(s[2].slice.extents == std::vector<int64_t>{4 * hs, 2 * hs, 2 * hs});
  REQUIRE(s[3].local_shape == Shape({C, 4 * hs}));
  REQUIRE(s[3].slice.offsets == std::vector<int64_t>{4 * hs});
  REQUIRE(s[5].slice.offsets == std::vector<int64_t>{10, F + 10});
  REQUIRE(s[5].local_shape == Shape({F, C}));
  REQUIRE(s[6].local_shape == Shape({C, F / 2}));
  REQUIRE(s.back().local_shape == Shape({20, C}));
  REQUIRE(s.back().slice.offsets == std::vector<int64_t>{20});
  REQUIRE(s[1].slice.dim == -1);
}

TEST_CASE("shard specs: the BLOOM family (ALiBi, embedding LayerNorm, biases, tied)", "[model][params][family]") {
  const GptConfig c = bloom_config();
  const int64_t C = 12;
  const auto one = gpt2_param_specs(c);
  REQUIRE(one.size() == 3 + 12 * 2 + 2);  // no wpe, ln_embd's two, no lm_head
  REQUIRE(one[0].name == "transformer.wte.weight");
  REQUIRE(one[1].name == "transformer.ln_embd.weight");
  REQUIRE(one[1].init == InitKind::ones);
  REQUIRE(one[2].name == "transformer.ln_embd.bias");
  REQUIRE(one[2].init == InitKind::zeros);
  REQUIRE(one[3].name == "transformer.h.0.ln_1.weight");
  REQUIRE(one[6].name == "transformer.h.0.attn.c_attn.bias");
  REQUIRE(one.back().name == "transformer.ln_f.bias");
  for (const ParamSpec& p : one) REQUIRE(p.name.find("wpe") == std::string::npos);
  const auto s = gpt2_shard_specs(c, 2, 0);
  REQUIRE(s[5].local_shape == Shape({3 * C / 2, C}));
  REQUIRE(s[1].slice.dim == -1);
}

TEST_CASE("init: every rank's slices put together are the single-shard tensor, bitwise", "[model][params]") {
  const int model = GENERATE(0, 1, 2);  // GPT-2, LLaMA, BLOOM
  const GptConfig c = model == 0 ? slice_config() : model == 1 ? llama_config() : bloom_config();
  const auto whole = gpt2_param_specs(c);
  const std::vector<int> sizes = model == 0 ? std::vector<int>{2, 3} : std::vector<int>{2, 4};
  for (DType dt : {DType::f32, DType::f64}) {
    for (int t : sizes) {
      if (c.num_attention_heads % t != 0 || c.query_groups() % t != 0 || c.ffn_hidden_size() % t != 0) continue;
      INFO("t=" << t << " " << dtype_name(dt) << " heads " << c.num_attention_heads);
      std::vector<std::vector<ParamSpec>> ranks;
      for (int r = 0; r < t; ++r) ranks.push_back(gpt2_shard_specs(c, t, r));
      for (size_t k = 0; k < whole.size(); ++k) {
        INFO(whole[k].name);
        Tensor ref = Tensor::empty(whole[k].local_shape, dt);
        init_parameter(whole[k], 42, ref);
        const int64_t n = whole[k].global_shape.numel();  // real part (wte: first V rows)
        const size_t es = dtype_size(dt);
        Tensor put = Tensor::zeros({n}, dt);
        std::vector<int> hits(static_cast<size_t>(n), 0);
        for (int r = 0; r < t; ++r) {
          const ParamSpec& sp = ranks[r][k];
          Tensor local = Tensor::empty(sp.local_shape, dt);
          init_parameter(sp, 42, local);
          for (int64_t i = 0; i < local.numel(); ++i) {
            const int64_t g = slice_global_index(sp, i);
            const char* src = static_cast<const char*>(local.raw()) + i * es;
            if (g < 0) {  // padding starts at zero
              const double v = dt == DType::f32 ? *reinterpret_cast<const float*>(src) : *reinterpret_cast<const double*>(src);
              REQUIRE(v == 0.0);
              continue;
            }
            std::memcpy(static_cast<char*>(put.raw()) + g * es, src, es);
            ++hits[static_cast<size_t>(g)];
          }
        }
        const bool replicated = whole[k].slice.dim < 0;
        for (int h : hits) REQUIRE(h == (replicated ? t : 1));
        REQUIRE(std::memcmp(put.raw(), ref.raw(), static_cast<size_t>(n) * es) == 0);
      }
    }
  }
}
