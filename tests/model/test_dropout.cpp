// Dropout's generator and ops: Philox-4x32-10 against Random123's known answers, in the product
// (kernels/dropout.hpp) and in the reference's separate transcription (reference/dropout.hpp); the
// mask rule of both agreeing element by element; the keep rate within a binomial bound; the ops
// against the reference's factors and finite differences in double with a fixed mask; and results
// independent of how the rows and heads are split (what makes every parallel layout draw the same
// masks). Also the reference GptModel's own backward with dropout against finite differences.
#include <cmath>
#include <cstring>
#include <random>

#include <catch2/catch.hpp>

#include "kernels/ops.hpp"
#include "model/dropout.hpp"
#include "reference/dropout.hpp"
#include "reference/gpt.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;
using troupe::test::check_gradient;
using troupe::test::dot;
using troupe::test::random_tensor;

namespace {

struct Fixture {
  ThreadPool pool{3};
  Context ctx;
  std::mt19937_64 rng{20261202};
  Fixture() { ctx.pool = &pool; }
};

GptConfig tiny(double hidden, double attention) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 12;
  c.num_attention_heads = 3;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 37;
  c.hidden_dropout = hidden;
  c.attention_dropout = attention;
  return c;
}

}  // namespace

TEST_CASE("Philox-4x32-10: Random123's known-answer vectors, in both transcriptions", "[dropout]") {
  // Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key, result.
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    uint32_t a[4], b[4];
    std::memcpy(a, k.ctr, sizeof a);
    std::memcpy(b, k.ctr, sizeof b);
    philox4x32_10(a, k.key[0], k.key[1]);
    ref_dropout::philox(b, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) {
      CHECK(a[i] == k.out[i]);
      CHECK(b[i] == k.out[i]);
    }
  }
}

TEST_CASE("the mask rule: the product's and the reference's agree on every element", "[dropout]") {
  std::mt19937_64 rng(7);
  for (double p : {0.1, 0.5, 0.9, 1e-7}) {
    GptConfig m = tiny(p, p);
    int64_t differ = 0;
    for (int i = 0; i < 20000; ++i) {
      MicroBatchKey key{rng(), static_cast<int64_t>(rng() % 100000), static_cast<int64_t>(rng() % 4096)};
      const auto site = static_cast<DropoutSite>(rng() % 4);
      const int layer = static_cast<int>(rng() % 96);
      const int64_t sample = key.first_sample + static_cast<int64_t>(rng() % 64);
      const int64_t element = static_cast<int64_t>(rng() % (int64_t{1} << 33));
      const DropoutMask mask = dropout_mask(m, key, site, layer);
      const bool kept = mask.kept(sample, element);
      const double f = ref_dropout::dropout_factor(m, key, site, layer, sample, element);
      differ += kept != (f != 0);
      if (kept) REQUIRE(f == 1.0 / (1.0 - p));
    }
    CHECK(differ == 0);
  }
  // The seed's high half is part of the key: seeds 2^32 apart draw other masks.
  const GptConfig m = tiny(0.5, 0.5);
  int same = 0;
  for (int64_t e = 0; e < 1000; ++e)
    same += dropout_mask(m, {1, 1, 0}, DropoutSite::mlp_output, 0).kept(0, e) ==
            dropout_mask(m, {1 + (uint64_t{1} << 32), 1, 0}, DropoutSite::mlp_output, 0).kept(0, e);
  CHECK(same < 600);
}

TEST_CASE("the keep rate is 1 - p within a binomial bound on a large tensor", "[dropout]") {
  Fixture f;
  const int64_t rows = 512, C = 1024, Tn = 64;  // 8 samples of 64 positions, 524288 elements
  for (double p : {0.1, 0.5}) {
    Tensor x = Tensor::empty({rows, C}, DType::f32);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 1.0f;
    DropoutMask mask;
    mask.p = p;
    mask.seed = 1234;
    mask.stream = 6;
    mask.iteration = 17;
    mask.first_sample = 40;
    ops::dropout_rows(f.ctx, x, mask, 0, Tn);
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    int64_t kept = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = x.data<float>()[i];
      REQUIRE((v == 0.0f || v == scale));
      kept += v != 0.0f;
    }
    const double n = static_cast<double>(x.numel()), mean = n * (1 - p), sd = std::sqrt(n * p * (1 - p));
    INFO("p " << p << " kept " << kept << " expected " << mean << " +- " << sd);
    CHECK(std::abs(static_cast<double>(kept) - mean) < 5 * sd);
  }
}

TEST_CASE("dropout_rows: the reference's factors, whatever the row blocks", "[dropout]") {
  Fixture f;
  const int64_t Tn = 5, C = 13, rows = 4 * Tn;  // C not a multiple of 4: groups straddle rows
  const GptConfig m = tiny(0.3, 0.0);
  const MicroBatchKey key{99, 12, 8};
  const DropoutMask mask = dropout_mask(m, key, DropoutSite::attention_output, 1);
  Tensor x = random_tensor({rows, C}, f.rng);
  Tensor whole = x.clone();
  ops::dropout_rows(f.ctx, whole, mask, 0, Tn);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const double want = x.data<double>()[n * C + c] *
                          ref_dropout::dropout_factor(m, key, DropoutSite::attention_output, 1, 8 + n / Tn, (n % Tn) * C + c);
      REQUIRE(whole.data<double>()[n * C + c] == want);
    }
  // Sequence parallelism's uneven row blocks: each block with its first row gives the same values.
  for (int64_t cut : {int64_t{3}, int64_t{7}, int64_t{11}}) {
    Tensor a = x.rows(0, cut).clone(), b = x.rows(cut, rows).clone();
    ops::dropout_rows(f.ctx, a, mask, 0, Tn);
    ops::dropout_rows(f.ctx, b, mask, cut, Tn);
    for (int64_t i = 0; i < a.numel(); ++i) REQUIRE(a.data<double>()[i] == whole.data<double>()[i]);
    for (int64_t i = 0; i < b.numel(); ++i) REQUIRE(b.data<double>()[i] == whole.data<double>()[cut * C + i]);
  }
  // Its backward is the same call on the gradient: d<x_dropped, w>/dx = w's dropped values.
  Tensor w = random_tensor({rows, C}, f.rng);
  Tensor dx = w.clone();
  ops::dropout_rows(f.ctx, dx, mask, 0, Tn);
  Tensor probe = x.clone(), y = x.clone();
  auto objective = [&] {
    y.copy_from(probe);
    ops::dropout_rows(f.ctx, y, mask, 0, Tn);
    return dot(y, w);
  };
  check_gradient(objective, probe, dx, "dropout_rows dx");
}

TEST_CASE("attention with dropout: the reference's attention, head splits, finite differences", "[dropout][grad]") {
  Fixture f;
  const GptConfig m = tiny(0.0, 0.3);
  const int64_t B = 2, Tn = m.seq_length, C = m.hidden_size, H = m.num_attention_heads, hs = C / H;
  const MicroBatchKey key{4321, 9, 6};
  const DropoutMask mask = dropout_mask(m, key, DropoutSite::attention_probs, 1);
  Tensor qkv = random_tensor({B, Tn, 3 * C}, f.rng, -1.5, 1.5), w = random_tensor({B, Tn, C}, f.rng);
  Tensor out = Tensor::empty({B, Tn, C}, DType::f64), probs = Tensor::empty({B, H, Tn, Tn}, DType::f64);
  ops::attention_forward(f.ctx, out, probs, qkv, static_cast<int>(H), mask);
  Tensor ref_out = Tensor::empty({B, Tn, C}, DType::f64), ref_probs = Tensor::empty({B, H, Tn, Tn}, DType::f64);
  ref_dropout::attention_forward(m, key, 1, ref_out.data<double>(), ref_probs.data<double>(), qkv.data<double>(), B);
  CHECK(test::max_rel_diff(out, ref_out) < 1e-12);
  CHECK(test::max_rel_diff(probs, ref_probs) < 1e-12);  // probs stay the softmax before dropout
  Tensor plain = Tensor::empty({B, Tn, C}, DType::f64), plain_probs = Tensor::empty({B, H, Tn, Tn}, DType::f64);
  ops::attention_forward(f.ctx, plain, plain_probs, qkv, static_cast<int>(H));
  CHECK(test::max_rel_diff(out, plain) > 1e-3);  // the mask changes the output

  // Backward: against finite differences of the forward with the same mask, and the reference's.
  Tensor dqkv = Tensor::empty({B, Tn, 3 * C}, DType::f64);
  ops::attention_backward(f.ctx, dqkv, w, qkv, probs, static_cast<int>(H), mask);
  Tensor ref_dqkv = Tensor::empty({B, Tn, 3 * C}, DType::f64);
  ref_dropout::attention_backward(m, key, 1, ref_dqkv.data<double>(), w.data<double>(), qkv.data<double>(),
                                  ref_probs.data<double>(), B);
  CHECK(test::max_rel_diff(dqkv, ref_dqkv) < 1e-11);
  Tensor scratch_out = Tensor::empty({B, Tn, C}, DType::f64), scratch_probs = Tensor::empty({B, H, Tn, Tn}, DType::f64);
  auto objective = [&] {
    ops::attention_forward(f.ctx, scratch_out, scratch_probs, qkv, static_cast<int>(H), mask);
    return dot(scratch_out, w);
  };
  check_gradient(objective, qkv, dqkv, "dqkv with attention dropout");

  // Tensor parallelism: rank 1 holds heads [1, 3) (columns of its own q, k, v) and passes head0 = 1.
  const int64_t H1 = 2, C1 = H1 * hs;
  Tensor part = Tensor::empty({B, Tn, 3 * C1}, DType::f64);
  for (int64_t n = 0; n < B * Tn; ++n)
    for (int64_t s = 0; s < 3; ++s)
      for (int64_t k = 0; k < C1; ++k)
        part.data<double>()[n * 3 * C1 + s * C1 + k] = qkv.data<double>()[n * 3 * C + s * C + hs + k];
  Tensor part_out = Tensor::empty({B, Tn, C1}, DType::f64), part_probs = Tensor::empty({B, H1, Tn, Tn}, DType::f64);
  ops::attention_forward(f.ctx, part_out, part_probs, part, static_cast<int>(H1), mask, 1);
  for (int64_t n = 0; n < B * Tn; ++n)
    for (int64_t k = 0; k < C1; ++k) REQUIRE(part_out.data<double>()[n * C1 + k] == out.data<double>()[n * C + hs + k]);
}

TEST_CASE("GptModel with dropout: gradients match finite differences (double, fixed masks)", "[model][grad][dropout]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(5);
  const GptConfig cfg = tiny(0.2, 0.25);
  const int B = 2;
  GptModel model(cfg, B, DType::f64);
  model.init(77);
  std::uniform_real_distribution<double> u(-0.3, 0.3);
  for (size_t k = 0; k < model.params().size(); ++k)
    for (int64_t i = 0; i < model.specs()[k].global_shape.numel(); ++i) model.params()[k].data<double>()[i] += u(rng);
  Tensor tokens = Tensor::empty({B, cfg.seq_length + 1}, DType::i32);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
  const MicroBatchKey key{31, 2, 4};
  const double scale = 1.0 / (B * cfg.seq_length);
  model.zero_grad();
  model.forward_backward(ctx, tokens, scale, key);
  const Tensor analytic = model.flat_grads().clone();
  GptModel probe(cfg, B, DType::f64);
  auto objective = [&] {
    probe.zero_grad();
    return probe.forward_backward(ctx, tokens, 0.0, key) * scale;  // the loss with the same masks
  };
  probe.flat_params().copy_from(model.flat_params());
  check_gradient(objective, probe.flat_params(), analytic, "GptModel with dropout", 1e-5, 1e-8, 300);
}
