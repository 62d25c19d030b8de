// Parameter slices of a tensor-parallel shard: local shapes, and initialisation defined in global
// coordinates (every rank's slice of the initial values, put together, is the single-shard tensor).
#include <cstring>

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
  REQUIRE(one[4].slice.offsets == std::vector<int64_t>{0, C, 2 * C});  // c_attn: q, k, v blocks
  REQUIRE(one[1].slice.dim == -1);                                      // wpe replicated

  const auto s = gpt2_shard_specs(c, 3, 1);
  REQUIRE(s[0].local_shape == Shape({16, C}));  // wte rows [16, 32)
  REQUIRE(s[0].slice.offsets == std::vector<int64_t>{16});
  REQUIRE(s[4].name == "transformer.h.0.attn.c_attn.weight");
  REQUIRE(s[4].local_shape == Shape({12, C}));  // 3 blocks of C/3 rows
  REQUIRE(s[4].slice.offsets == std::vector<int64_t>{4, 16, 28});
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

TEST_CASE("init: every rank's slices put together are the single-shard tensor, bitwise", "[model][params]") {
  const GptConfig c = slice_config();
  const auto whole = gpt2_param_specs(c);
  for (DType dt : {DType::f32, DType::f64}) {
    for (int t : {2, 3}) {
      INFO("t=" << t << " " << dtype_name(dt));
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
