// Every op of kernels/ops.hpp on bf16 and fp16 tensors. For each op and each 16-bit type, on random
// non-zero inputs of odd sizes:
//   (a) the layer's bitwise property: op16(x16) == RNE16(op32(widen(x16))) for every result (written
//       argument), computed here by widening with Tensor::to, running the f32 op, rounding back;
//   (b) the error of the 16-bit op against the f32 op on the unrounded f32 inputs, as max |error| over
//       the result's max |value|, stays within k u (u = 2^-8 for bf16, 2^-11 for fp16; k per op, derived
//       in docs/PRECISION.md). TROUPE_PRECISION_REPORT=1 prints the measured worst cases (the table in
//       docs/PRECISION.md).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cpu/gemm_bf16.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;
using ops::AdamWParams;
using ops::AttentionLayout;
using ops::GluKind;
using ops::RotaryParams;
using troupe::test::random_tensor;
using troupe::test::random_tokens;

namespace {

struct Fixture {
  ThreadPool pool{3};
  Context ctx;
  std::mt19937_64 rng{0x3d16};
  Fixture() { ctx.pool = &pool; }
};

// One argument of an op under test: its unrounded value (f32; f64 row statistics and i32 ids pass
// through as they are), whether the 16-bit call stores it in the 16-bit type, whether the op writes it.
struct Arg {
  Tensor init;
  bool narrow = true;
  bool result = false;
};
Arg in(Tensor t, bool narrow = true) {
  return {std::move(t), narrow, false};
}
Arg res(Tensor t, bool narrow = true) {
  return {std::move(t), narrow, true};
}

using Args = std::vector<Tensor>;
using Call = std::function<void(Context&, const Args&)>;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// max |got - want| / max |want|, in double.
double scaled_error(const Tensor& got, const Tensor& want) {
  const Tensor g = got.to(DType::f64), w = want.to(DType::f64);
  double err = 0, scale = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    err = std::max(err, std::abs(g.data<double>()[i] - w.data<double>()[i]));
    scale = std::max(scale, std::abs(w.data<double>()[i]));
  }
  REQUIRE(scale > 0);
  return err / scale;
}

double unit(DType h) {
  return h == DType::bf16 ? 0x1p-8 : 0x1p-11;
}

// Runs `call` three ways: the 16-bit call, the layer's definition (widened 16-bit values through the
// f32 op, rounded back), the f32 op on the unrounded values. Checks (a); returns (b)'s worst error.
// exact_layer false (linear on bf16 with the AVX512-BF16 GEMM, which sums in its own order): (a)
// becomes "within one 16-bit rounding of the layer's result" (scaled error <= u; f32 results 1e-5).
double run_mixed(Fixture& f, DType h, const std::vector<Arg>& args, const Call& call, bool exact_layer = true) {
  std::vector<Tensor> mixed, layer, exact;
  for (const Arg& a : args) mixed.push_back(a.narrow ? a.init.to(h) : a.init.clone());
  for (size_t i = 0; i < args.size(); ++i)
    layer.push_back(args[i].narrow ? mixed[i].to(DType::f32) : args[i].init.clone());
  for (const Arg& a : args) exact.push_back(a.init.clone());
  call(f.ctx, mixed);
  call(f.ctx, layer);
  call(f.ctx, exact);
  double worst = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].result) continue;
    INFO("result argument " << i);
    if (exact_layer)
      CHECK(bitwise_equal(mixed[i], args[i].narrow ? layer[i].to(h) : layer[i]));
    else
      CHECK(scaled_error(mixed[i], args[i].narrow ? layer[i].to(h) : layer[i]) <= (args[i].narrow ? unit(h) : 1e-5));
    worst = std::max(worst, scaled_error(mixed[i], exact[i]));
  }
  return worst;
}

// (b): the worst error within k u; the table of docs/PRECISION.md under TROUPE_PRECISION_REPORT=1.
void check_bound(const char* op, DType h, double worst, double k) {
  const double in_u = worst / unit(h);
  if (std::getenv("TROUPE_PRECISION_REPORT"))
    std::printf("| %-34s | %-4s | %5.2f | %4g |\n", op, dtype_name(h), in_u, k);
  INFO(op << " in " << dtype_name(h) << ": worst error " << in_u << " u, bound " << k << " u");
  CHECK(in_u <= k);
}

Tensor f32(Fixture& f, const Shape& s, double lo = -1, double hi = 1) {
  return random_tensor(s, f.rng, lo, hi, DType::f32);
}
Tensor zeros32(const Shape& s) {
  return Tensor::zeros(s, DType::f32);
}

const DType kHalves[] = {DType::bf16, DType::f16};

}  // namespace

TEST_CASE("16-bit embeddings: layer bitwise, error bounded", "[mixed]") {
  Fixture f;
  const int64_t B = 3, T = 5, C = 7, Vp = 11, P = 9, Vl = 6, vocab_begin = 4;
  const Tensor tokens = random_tokens(f.rng, B * T, Vp).view({B, T});
  for (DType h : kHalves) {
    double e = run_mixed(f, h, {res(zeros32({B, T, C})), in(f32(f, {Vp, C})), in(f32(f, {P, C})), in(tokens, false)},
                         [](Context& c, const Args& a) { ops::embedding_forward(c, a[0], a[3], a[1], a[2]); });
    check_bound("embedding_forward", h, e, 3);
    e = run_mixed(f, h, {res(f32(f, {Vp, C})), res(f32(f, {P, C})), in(f32(f, {B, T, C})), in(tokens, false)},
                  [](Context& c, const Args& a) { ops::embedding_backward(c, a[0], a[1], a[2], a[3]); });
    check_bound("embedding_backward (+=)", h, e, 4);
    e = run_mixed(
        f, h, {res(zeros32({B, T, C})), in(f32(f, {Vl, C})), in(f32(f, {P, C})), in(tokens, false)},
        [&](Context& c, const Args& a) { ops::vocab_embedding_forward(c, a[0], a[3], a[1], vocab_begin, a[2]); });
    check_bound("vocab_embedding_forward", h, e, 3);
    e = run_mixed(
        f, h, {res(f32(f, {Vl, C})), in(f32(f, {B, T, C})), in(tokens, false)},
        [&](Context& c, const Args& a) { ops::vocab_embedding_backward(c, a[0], Tensor(), a[1], a[2], vocab_begin); });
    check_bound("vocab_embedding_backward (+=)", h, e, 4);
  }
}

TEST_CASE("16-bit LayerNorm and RMSNorm: layer bitwise, error bounded", "[mixed]") {
  Fixture f;
  const int64_t N = 9, C = 13;
  const double eps = 1e-5;
  for (DType h : kHalves) {
    // Statistics f32 beside 16-bit activations, and (layernorm) 16-bit too.
    for (bool stats16 : {false, true}) {
      const double e = run_mixed(
          f, h,
          {res(zeros32({N, C})), res(zeros32({N}), stats16), res(zeros32({N}), stats16), in(f32(f, {N, C}, -2, 2)),
           in(f32(f, {C}, 0.5, 1.5)), in(f32(f, {C}))},
          [&](Context& c, const Args& a) { ops::layernorm_forward(c, a[0], a[1], a[2], a[3], a[4], a[5], eps); });
      check_bound(stats16 ? "layernorm_forward (16-bit stats)" : "layernorm_forward", h, e, 4);
    }
    // The backward's statistics come from the unrounded x (f32 beside the 16-bit activations), for all
    // three runs: (a) does not depend on where they came from; (b) includes x's rounding against them.
    const Tensor x = f32(f, {N, C}, -2, 2), w = f32(f, {C}, 0.5, 1.5), mean = zeros32({N}), rstd = zeros32({N});
    ops::layernorm_forward(f.ctx, zeros32({N, C}), mean, rstd, x, w, f32(f, {C}), eps);
    double e = run_mixed(
        f, h,
        {res(f32(f, {N, C})), res(f32(f, {C})), res(f32(f, {C})), in(f32(f, {N, C})), in(x), in(w), in(mean, false),
         in(rstd, false)},
        [](Context& c, const Args& a) { ops::layernorm_backward(c, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]); });
    check_bound("layernorm_backward (+=)", h, e, 8);
    // The split halves apart, the parameter half into f32 gradients.
    e = run_mixed(f, h, {res(f32(f, {N, C})), in(f32(f, {N, C})), in(x), in(w), in(mean, false), in(rstd, false)},
                  [](Context& c, const Args& a) {
                    ops::layernorm_backward(c, a[0], Tensor(), Tensor(), a[1], a[2], a[3], a[4], a[5]);
                  });
    check_bound("layernorm_backward (dx half)", h, e, 8);
    e = run_mixed(f, h,
                  {res(f32(f, {C}), false), res(f32(f, {C}), false), in(f32(f, {N, C})), in(x), in(mean, false),
                   in(rstd, false)},
                  [](Context& c, const Args& a) {
                    ops::layernorm_backward(c, Tensor(), a[0], a[1], a[2], a[3], Tensor(), a[4], a[5]);
                  });
    check_bound("layernorm_backward (f32 dw, db half)", h, e, 8);

    e = run_mixed(f, h, {res(zeros32({N, C})), res(zeros32({N}), false), in(x), in(w)},
                  [&](Context& c, const Args& a) { ops::rmsnorm_forward(c, a[0], a[1], a[2], a[3], eps); });
    check_bound("rmsnorm_forward", h, e, 4);
    const Tensor rrstd = zeros32({N});
    ops::rmsnorm_forward(f.ctx, zeros32({N, C}), rrstd, x, w, eps);
    e = run_mixed(f, h, {res(f32(f, {N, C})), res(f32(f, {C})), in(f32(f, {N, C})), in(x), in(w), in(rrstd, false)},
                  [](Context& c, const Args& a) { ops::rmsnorm_backward(c, a[0], a[1], a[2], a[3], a[4], a[5]); });
    check_bound("rmsnorm_backward (+=)", h, e, 8);
  }
}

TEST_CASE("16-bit linear: layer bitwise (the bf16 GEMM: within a rounding), error bounded", "[mixed]") {
  Fixture f;
  const int64_t B = 3, T = 7, N = B * T, I = 13, O = 11;
  for (DType h : kHalves) {
    // bf16 on a CPU with AVX512-BF16: the GEMMs read the bf16 operands directly (cpu::gemm_bf16).
    const bool exact = !(h == DType::bf16 && cpu::bf16_gemm_kernel() == cpu::Bf16Kernel::avx512_bf16);
    double e = run_mixed(f, h, {res(zeros32({B, T, O})), in(f32(f, {B, T, I})), in(f32(f, {O, I})), in(f32(f, {O}))},
                         [](Context& c, const Args& a) { ops::linear_forward(c, a[0], a[1], a[2], a[3]); }, exact);
    check_bound("linear_forward", h, e, 8);
    // An f32 output from 16-bit operands.
    e = run_mixed(f, h, {res(zeros32({N, O}), false), in(f32(f, {N, I})), in(f32(f, {O, I}))},
                  [](Context& c, const Args& a) { ops::linear_forward(c, a[0], a[1], a[2], Tensor()); }, exact);
    check_bound("linear_forward (f32 out, no bias)", h, e, 8);
    e = run_mixed(f, h,
                  {res(zeros32({N, I})), res(f32(f, {O, I})), res(f32(f, {O})), in(f32(f, {N, O})), in(f32(f, {N, I})),
                   in(f32(f, {O, I}))},
                  [](Context& c, const Args& a) { ops::linear_backward(c, a[0], a[1], a[2], a[3], a[4], a[5]); }, exact);
    check_bound("linear_backward", h, e, 8);
    // 16-bit activations with f32 parameter gradients (the engine's master gradients).
    e = run_mixed(f, h,
                  {res(zeros32({N, I})), res(f32(f, {O, I}), false), res(f32(f, {O}), false), in(f32(f, {N, O})),
                   in(f32(f, {N, I})), in(f32(f, {O, I}))},
                  [](Context& c, const Args& a) { ops::linear_backward(c, a[0], a[1], a[2], a[3], a[4], a[5]); }, exact);
    check_bound("linear_backward (f32 dW, db)", h, e, 8);
    // The split weight half, without the weight.
    e = run_mixed(
        f, h, {res(f32(f, {O, I})), res(f32(f, {O})), in(f32(f, {N, O})), in(f32(f, {N, I}))},
        [](Context& c, const Args& a) { ops::linear_backward(c, Tensor(), a[0], a[1], a[2], a[3], Tensor()); }, exact);
    check_bound("linear_backward (weight half)", h, e, 8);
  }
}

TEST_CASE("16-bit GELU, GLUs, residual, dropout: layer bitwise (aliases kept), error bounded", "[mixed]") {
  Fixture f;
  const int64_t n = 1001, N = 7, F = 9;
  DropoutMask mask;
  mask.p = 0.2;
  mask.seed = 42;
  mask.stream = 3;
  mask.iteration = 5;
  mask.first_sample = 2;
  for (DType h : kHalves) {
    double e = run_mixed(f, h, {res(zeros32({n})), in(f32(f, {n}, -3, 3))},
                         [](Context& c, const Args& a) { ops::gelu_forward(c, a[0], a[1]); });
    check_bound("gelu_forward", h, e, 3);
    // dx aliases dout: one temporary.
    e = run_mixed(f, h, {res(f32(f, {n})), in(f32(f, {n}, -3, 3))},
                  [](Context& c, const Args& a) { ops::gelu_backward(c, a[0], a[0], a[1]); });
    check_bound("gelu_backward (dx = dout)", h, e, 4);
    for (GluKind kind : {GluKind::swiglu, GluKind::geglu}) {
      const char* fw = kind == GluKind::swiglu ? "glu_forward swiglu" : "glu_forward geglu";
      const char* bw = kind == GluKind::swiglu ? "glu_backward swiglu" : "glu_backward geglu";
      e = run_mixed(f, h, {res(zeros32({N, F})), in(f32(f, {N, 2 * F}, -3, 3))},
                    [&](Context& c, const Args& a) { ops::glu_forward(c, a[0], a[1], kind); });
      check_bound(fw, h, e, 4);
      e = run_mixed(f, h, {res(zeros32({N, 2 * F})), in(f32(f, {N, F})), in(f32(f, {N, 2 * F}, -3, 3))},
                    [&](Context& c, const Args& a) { ops::glu_backward(c, a[0], a[1], a[2], kind); });
      check_bound(bw, h, e, 4);
    }
    e = run_mixed(f, h, {res(zeros32({n})), in(f32(f, {n})), in(f32(f, {n}))},
                  [](Context& c, const Args& a) { ops::residual_forward(c, a[0], a[1], a[2]); });
    check_bound("residual_forward", h, e, 3);
    // out aliases a, and an f32 b beside a 16-bit a.
    e = run_mixed(f, h, {res(f32(f, {n})), in(f32(f, {n}), false)},
                  [](Context& c, const Args& a) { ops::residual_forward(c, a[0], a[0], a[1]); });
    check_bound("residual_forward (out = a)", h, e, 3);
    e = run_mixed(f, h, {res(f32(f, {n})), in(f32(f, {n}))},
                  [](Context& c, const Args& a) { ops::add_inplace(c, a[0], a[1]); });
    check_bound("add_inplace", h, e, 3);
    e = run_mixed(f, h, {res(f32(f, {6, 11}))},
                  [&](Context& c, const Args& a) { ops::dropout_rows(c, a[0], mask, 2, 4); });
    check_bound("dropout_rows", h, e, 2);
  }
}

TEST_CASE("16-bit rotary: layer bitwise, error bounded", "[mixed]") {
  Fixture f;
  const int64_t B = 2, T = 5, W = 30;
  for (DType h : kHalves) {
    for (bool interleaved : {false, true}) {
      RotaryParams p;
      p.rotary_dim = 4;
      p.base = 10000;
      p.interleaved = interleaved;
      p.pos0 = 3;
      double e = run_mixed(f, h, {res(f32(f, {B, T, W}))},
                           [&](Context& c, const Args& a) { ops::rotary_forward(c, a[0], 12, 2, 6, p); });
      check_bound(interleaved ? "rotary_forward interleaved" : "rotary_forward", h, e, 3);
      e = run_mixed(f, h, {res(f32(f, {B, T, W}))},
                    [&](Context& c, const Args& a) { ops::rotary_backward(c, a[0], 12, 2, 6, p); });
      check_bound(interleaved ? "rotary_backward interleaved" : "rotary_backward", h, e, 3);
    }
  }
}

TEST_CASE("16-bit attention (MHA, GQA with ALiBi, dropout): layer bitwise, error bounded", "[mixed]") {
  Fixture f;
  const int64_t B = 2, T = 7;
  AttentionLayout gqa;
  gqa.n_head = 4;
  gqa.n_group = 2;
  gqa.head_dim = 5;
  const std::vector<double> slopes = ops::alibi_slopes(8);
  gqa.alibi_slopes.assign(slopes.begin() + 4, slopes.end());  // heads [4, 8) of the model's 8
  DropoutMask mask;
  mask.p = 0.1;
  mask.seed = 7;
  for (DType h : kHalves) {
    // Multi-head, the int overload: H = 3, C = 9.
    const Tensor qkv = f32(f, {B, T, 27}, -2, 2), probs = zeros32({B, 3, T, T});
    ops::attention_forward(f.ctx, zeros32({B, T, 9}), probs, qkv, 3);
    double e = run_mixed(f, h, {res(zeros32({B, T, 9})), res(zeros32({B, 3, T, T})), in(qkv)},
                         [](Context& c, const Args& a) { ops::attention_forward(c, a[0], a[1], a[2], 3); });
    check_bound("attention_forward", h, e, 8);
    e = run_mixed(f, h, {res(zeros32({B, T, 27})), in(f32(f, {B, T, 9})), in(qkv), in(probs)},
                  [](Context& c, const Args& a) { ops::attention_backward(c, a[0], a[1], a[2], a[3], 3); });
    check_bound("attention_backward", h, e, 8);
    // GQA (H 4, G 2, hs 5) with ALiBi and attention dropout, heads from head0 = 4 of the model's 8.
    const Tensor gqkv = f32(f, {B, T, 40}, -2, 2), gprobs = zeros32({B, 4, T, T});
    ops::attention_forward(f.ctx, zeros32({B, T, 20}), gprobs, gqkv, gqa, mask, 4);
    e = run_mixed(f, h, {res(zeros32({B, T, 20})), res(zeros32({B, 4, T, T})), in(gqkv)},
                  [&](Context& c, const Args& a) { ops::attention_forward(c, a[0], a[1], a[2], gqa, mask, 4); });
    check_bound("attention_forward GQA+ALiBi+dropout", h, e, 8);
    e = run_mixed(f, h, {res(zeros32({B, T, 40})), in(f32(f, {B, T, 20})), in(gqkv), in(gprobs)},
                  [&](Context& c, const Args& a) { ops::attention_backward(c, a[0], a[1], a[2], a[3], gqa, mask, 4); });
    check_bound("attention_backward GQA+dropout", h, e, 8);
  }
}

TEST_CASE("16-bit cross-entropy, fused and vocabulary-parallel pieces: layer bitwise, error bounded", "[mixed]") {
  Fixture f;
  const int64_t N = 6, Vp = 17, valid = 15, Vl = 13, vocab_begin = 10, shard_valid = 11;
  const Tensor targets = random_tokens(f.rng, N, valid);
  const Tensor wide_targets = random_tokens(f.rng, N, 30);  // some inside the shard [10, 21), some not
  auto f64z = [](int64_t n) { return Tensor::zeros({n}, DType::f64); };
  for (DType h : kHalves) {
    double e =
        run_mixed(f, h, {res(zeros32({N}), false), res(f32(f, {N, Vp}, -3, 3)), in(targets, false)},
                  [&](Context& c, const Args& a) { ops::softmax_cross_entropy(c, a[0], a[1], a[2], valid, 1.0 / N); });
    check_bound("softmax_cross_entropy (+ grad)", h, e, 8);
    const Tensor logits = f32(f, {N, Vl}, -3, 3);
    e = run_mixed(
        f, h, {res(f64z(N), false), res(f64z(N), false), in(logits), in(wide_targets, false)},
        [&](Context& c, const Args& a) { ops::xent_local_stats(c, a[0], a[1], a[2], a[3], vocab_begin, shard_valid); });
    check_bound("xent_local_stats", h, e, 1);
    const Tensor row_max = f64z(N), target_logit = f64z(N), sum_exp = f64z(N);
    ops::xent_local_stats(f.ctx, row_max, target_logit, logits, wide_targets, vocab_begin, shard_valid);
    ops::xent_exp_sum(f.ctx, sum_exp, logits.clone(), row_max, shard_valid);
    e = run_mixed(f, h, {res(f64z(N), false), res(logits), in(row_max, false)},
                  [&](Context& c, const Args& a) { ops::xent_exp_sum(c, a[0], a[1], a[2], shard_valid); });
    check_bound("xent_exp_sum", h, e, 8);
    e = run_mixed(f, h, {res(zeros32({N})), in(row_max, false), in(sum_exp, false), in(target_logit, false)},
                  [](Context& c, const Args& a) { ops::xent_loss(c, a[0], a[1], a[2], a[3]); });
    check_bound("xent_loss (16-bit losses)", h, e, 1);
    e = run_mixed(f, h, {res(logits), in(row_max, false), in(sum_exp, false), in(wide_targets, false)},
                  [&](Context& c, const Args& a) {
                    ops::xent_backward(c, a[0], a[1], a[2], a[3], vocab_begin, shard_valid, 0.25);
                  });
    check_bound("xent_backward", h, e, 8);
  }
}

TEST_CASE("16-bit optimizer ops: adamw, sum_squares, scale, clip_grad_norm", "[mixed]") {
  Fixture f;
  const int64_t n = 1003;
  AdamWParams p;
  p.lr = 1e-2;
  p.weight_decay = 0.1;
  p.step = 3;
  for (DType h : kHalves) {
    // The engine's case: f32 master weights and moments, a 16-bit gradient; then all 16-bit.
    for (bool all16 : {false, true}) {
      const double e = run_mixed(f, h,
                                 {res(f32(f, {n}), all16), in(f32(f, {n})), res(f32(f, {n}, -0.1, 0.1), all16),
                                  res(f32(f, {n}, 1e-3, 1e-2), all16)},
                                 [&](Context& c, const Args& a) { ops::adamw_update(c, a[0], a[1], a[2], a[3], p); });
      check_bound(all16 ? "adamw_update (all 16-bit)" : "adamw_update (16-bit grad)", h, e, 4);
    }
    double e =
        run_mixed(f, h, {res(f32(f, {n}))}, [](Context& c, const Args& a) { ops::scale_inplace(c, a[0], 0.37); });
    check_bound("scale_inplace", h, e, 2);

    const Tensor x = f32(f, {n});
    const Tensor x16 = x.to(h);
    const double s16 = ops::sum_squares(f.ctx, x16);
    CHECK(s16 == ops::sum_squares(f.ctx, x16.to(DType::f32)));  // (a): the widened values' sum
    const double s32 = ops::sum_squares(f.ctx, x);
    check_bound("sum_squares", h, std::abs(s16 - s32) / s32, 2);

    // clip_grad_norm over a 16-bit and an f32 gradient, clipping.
    std::vector<double> norms;
    e = run_mixed(f, h, {res(f32(f, {n})), res(f32(f, {7}), false)}, [&](Context& c, const Args& a) {
      norms.push_back(ops::clip_grad_norm(c, {a[0], a[1]}, 1.0));
    });
    REQUIRE(norms.size() == 3);
    CHECK(norms[0] == norms[1]);
    CHECK(norms[0] > 1.0);
    check_bound("clip_grad_norm (clipped grads)", h, e, 3);
    check_bound("clip_grad_norm (norm)", h, std::abs(norms[0] - norms[2]) / norms[2], 1);
  }
}
