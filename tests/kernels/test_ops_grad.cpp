// Every backward against central finite differences in double precision, on random non-zero inputs
// of odd sizes (B=3, T=7, C=12, H=3, V=37 padded to 40).
#include <catch2/catch.hpp>

#include "kernels/ops.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;
using troupe::test::check_gradient;
using troupe::test::dot;
using troupe::test::random_tensor;

using troupe::test::random_tokens;

namespace {
constexpr int64_t B = 3, T = 7, C = 12, H = 3, V = 37, Vp = 40, P = 9, N = B * T;

struct Fixture {
  ThreadPool pool{3};
  Context ctx;
  std::mt19937_64 rng{20261129};
  Fixture() { ctx.pool = &pool; }
};

}  // namespace

TEST_CASE("embedding backward matches finite differences", "[kernels][grad]") {
  Fixture f;
  Tensor tokens = random_tokens(f.rng, N, V).view({B, T});
  Tensor wte = random_tensor({Vp, C}, f.rng), wpe = random_tensor({P, C}, f.rng);
  Tensor w = random_tensor({B, T, C}, f.rng);
  Tensor out = Tensor::empty({B, T, C}, DType::f64);
  auto objective = [&] {
    ops::embedding_forward(f.ctx, out, tokens, wte, wpe);
    return dot(out, w);
  };
  Tensor dwte = Tensor::zeros({Vp, C}, DType::f64), dwpe = Tensor::zeros({P, C}, DType::f64);
  ops::embedding_backward(f.ctx, dwte, dwpe, w, tokens);
  check_gradient(objective, wte, dwte, "dwte");
  check_gradient(objective, wpe, dwpe, "dwpe");
}

TEST_CASE("layernorm backward matches finite differences", "[kernels][grad]") {
  Fixture f;
  Tensor x = random_tensor({N, C}, f.rng, -2, 2), wt = random_tensor({C}, f.rng), bs = random_tensor({C}, f.rng);
  Tensor w = random_tensor({N, C}, f.rng);
  Tensor out = Tensor::empty({N, C}, DType::f64), mean = Tensor::empty({N}, DType::f64),
         rstd = Tensor::empty({N}, DType::f64);
  auto objective = [&] {
    ops::layernorm_forward(f.ctx, out, mean, rstd, x, wt, bs, 1e-5);
    return dot(out, w);
  };
  objective();
  Tensor dx = Tensor::zeros({N, C}, DType::f64), dwt = Tensor::zeros({C}, DType::f64),
         dbs = Tensor::zeros({C}, DType::f64);
  ops::layernorm_backward(f.ctx, dx, dwt, dbs, w, x, wt, mean, rstd);
  check_gradient(objective, x, dx, "dx");
  check_gradient(objective, wt, dwt, "dweight");
  check_gradient(objective, bs, dbs, "dbias");

  SECTION("dx accumulates into what is already there") {
    Tensor base = random_tensor({N, C}, f.rng);
    Tensor acc = base.clone();
    ops::layernorm_backward(f.ctx, acc, dwt, dbs, w, x, wt, mean, rstd);
    for (int64_t i = 0; i < N * C; ++i)
      REQUIRE(acc.data<double>()[i] == Approx(base.data<double>()[i] + dx.data<double>()[i]).epsilon(1e-12));
  }
}

TEST_CASE("linear backward matches finite differences", "[kernels][grad]") {
  Fixture f;
  const int64_t I = 12, O = 37;
  Tensor x = random_tensor({N, I}, f.rng), wt = random_tensor({O, I}, f.rng), bs = random_tensor({O}, f.rng);
  Tensor w = random_tensor({N, O}, f.rng);
  Tensor out = Tensor::empty({N, O}, DType::f64);
  auto objective = [&] {
    ops::linear_forward(f.ctx, out, x, wt, bs);
    return dot(out, w);
  };
  Tensor dx = Tensor::empty({N, I}, DType::f64), dwt = Tensor::zeros({O, I}, DType::f64),
         dbs = Tensor::zeros({O}, DType::f64);
  ops::linear_backward(f.ctx, dx, dwt, dbs, w, x, wt);
  check_gradient(objective, x, dx, "dx");
  check_gradient(objective, wt, dwt, "dweight");
  check_gradient(objective, bs, dbs, "dbias");

  // Forward against a plain triple loop.
  objective();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double s = bs.data<double>()[o];
      for (int64_t i = 0; i < I; ++i) s += x.data<double>()[n * I + i] * wt.data<double>()[o * I + i];
      REQUIRE(out.data<double>()[n * O + o] == Approx(s).epsilon(1e-12));
    }
}

TEST_CASE("gelu backward matches finite differences and the tanh formula", "[kernels][grad]") {
  Fixture f;
  Tensor x = random_tensor({83}, f.rng, -4, 4), w = random_tensor({83}, f.rng);
  Tensor out = Tensor::empty({83}, DType::f64);
  auto objective = [&] {
    ops::gelu_forward(f.ctx, out, x);
    return dot(out, w);
  };
  objective();
  for (int64_t i = 0; i < 83; ++i) {
    double v = x.data<double>()[i];
    double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    REQUIRE(out.data<double>()[i] == Approx(ref).epsilon(1e-14));
  }
  Tensor dx = Tensor::empty({83}, DType::f64);
  ops::gelu_backward(f.ctx, dx, w, x);
  check_gradient(objective, x, dx, "dx");
}

TEST_CASE("residual add and its identity backward", "[kernels]") {
  Fixture f;
  Tensor a = random_tensor({N, C}, f.rng), b = random_tensor({N, C}, f.rng), out = Tensor::empty({N, C}, DType::f64);
  ops::residual_forward(f.ctx, out, a, b);
  for (int64_t i = 0; i < N * C; ++i) REQUIRE(out.data<double>()[i] == a.data<double>()[i] + b.data<double>()[i]);
  Tensor acc = a.clone();
  ops::add_inplace(f.ctx, acc, b);
  for (int64_t i = 0; i < N * C; ++i) REQUIRE(acc.data<double>()[i] == out.data<double>()[i]);
}

namespace {
// Plain causal attention, one (b, h) at a time, straight from the definition.
void naive_attention(const Tensor& qkv, Tensor& out) {
  const int64_t hs = C / H;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hs; ++e)
            d += qkv.data<double>()[(b * T + i) * 3 * C + h * hs + e] * qkv.data<double>()[(b * T + j) * 3 * C + C + h * hs + e];
          s[j] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int64_t e = 0; e < hs; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += s[j] / z * qkv.data<double>()[(b * T + j) * 3 * C + 2 * C + h * hs + e];
          out.data<double>()[(b * T + i) * C + h * hs + e] = o;
        }
      }
}
}  // namespace

TEST_CASE("attention forward matches the definition, backward matches finite differences", "[kernels][grad]") {
  Fixture f;
  Tensor qkv = random_tensor({B, T, 3 * C}, f.rng, -1.5, 1.5), w = random_tensor({B, T, C}, f.rng);
  Tensor out = Tensor::empty({B, T, C}, DType::f64), probs = Tensor::empty({B, H, T, T}, DType::f64);
  auto objective = [&] {
    ops::attention_forward(f.ctx, out, probs, qkv, H);
    return dot(out, w);
  };
  objective();
  Tensor ref = Tensor::empty({B, T, C}, DType::f64);
  naive_attention(qkv, ref);
  CHECK(test::max_rel_diff(out, ref) < 1e-13);
  Tensor dqkv = Tensor::empty({B, T, 3 * C}, DType::f64);
  ops::attention_backward(f.ctx, dqkv, w, qkv, probs, H);
  check_gradient(objective, qkv, dqkv, "dqkv");
}

TEST_CASE("attention is causal", "[kernels]") {
  Fixture f;
  Tensor qkv = random_tensor({B, T, 3 * C}, f.rng);
  Tensor out1 = Tensor::empty({B, T, C}, DType::f64), out2 = Tensor::empty({B, T, C}, DType::f64);
  Tensor probs = Tensor::empty({B, H, T, T}, DType::f64);
  ops::attention_forward(f.ctx, out1, probs, qkv, H);
  const int64_t t_changed = 4;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < 3 * C; ++c) qkv.data<double>()[(b * T + t_changed) * 3 * C + c] += 0.7;
  ops::attention_forward(f.ctx, out2, probs, qkv, H);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      bool same = true;
      for (int64_t c = 0; c < C; ++c)
        same = same && out1.data<double>()[(b * T + t) * C + c] == out2.data<double>()[(b * T + t) * C + c];
      CHECK(same == (t < t_changed));
    }
}

TEST_CASE("softmax cross-entropy: loss over the real vocabulary, fused gradient", "[kernels][grad]") {
  Fixture f;
  Tensor logits = random_tensor({N, Vp}, f.rng, -3, 3);
  Tensor targets = random_tokens(f.rng, N, V);
  Tensor losses = Tensor::empty({N}, DType::f64);
  const double scale = 0.37;
  auto objective = [&] {
    Tensor scratch = logits.clone();
    ops::softmax_cross_entropy(f.ctx, losses, scratch, targets, V, 0.0);
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += losses.data<double>()[i];
    return scale * s;
  };
  objective();
  for (int64_t n = 0; n < N; ++n) {  // logsumexp over the first V columns only
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(logits.data<double>()[n * Vp + v]);
    double ref = std::log(z) - logits.data<double>()[n * Vp + targets.data<int32_t>()[n]];
    REQUIRE(losses.data<double>()[n] == Approx(ref).epsilon(1e-12));
  }
  Tensor grad = logits.clone();
  ops::softmax_cross_entropy(f.ctx, losses, grad, targets, V, scale);
  check_gradient(objective, logits, grad, "dlogits");
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = V; v < Vp; ++v) REQUIRE(grad.data<double>()[n * Vp + v] == 0.0);

  SECTION("padding columns never change the loss") {
    Tensor a = logits.clone(), b = logits.clone();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t v = V; v < Vp; ++v) b.data<double>()[n * Vp + v] = 50.0 + v;
    Tensor la = Tensor::empty({N}, DType::f64), lb = Tensor::empty({N}, DType::f64);
    ops::softmax_cross_entropy(f.ctx, la, a, targets, V, 0.0);
    ops::softmax_cross_entropy(f.ctx, lb, b, targets, V, 0.0);
    for (int64_t n = 0; n < N; ++n) REQUIRE(la.data<double>()[n] == lb.data<double>()[n]);
  }
}

TEST_CASE("float kernels agree with double kernels", "[kernels]") {
  Fixture f;
  Tensor logits = random_tensor({N, Vp}, f.rng, -8, 8);
  Tensor targets = random_tokens(f.rng, N, V);
  Tensor l64 = Tensor::empty({N}, DType::f64), l32 = Tensor::empty({N}, DType::f32);
  Tensor g64 = logits.clone(), g32 = logits.to(DType::f32);
  ops::softmax_cross_entropy(f.ctx, l64, g64, targets, V, 1.0);
  ops::softmax_cross_entropy(f.ctx, l32, g32, targets, V, 1.0);
  CHECK(test::max_rel_diff(l32, l64) < 2e-6);
  CHECK(test::max_rel_diff(g32, g64) < 2e-6);

  Tensor x = random_tensor({1001}, f.rng, -9, 9);
  Tensor y64 = Tensor::empty({1001}, DType::f64), y32 = Tensor::empty({1001}, DType::f32);
  ops::gelu_forward(f.ctx, y64, x);
  ops::gelu_forward(f.ctx, y32, x.to(DType::f32));
  CHECK(test::max_rel_diff(y32, y64) < 1e-6);
  Tensor d64 = Tensor::empty({1001}, DType::f64), d32 = Tensor::empty({1001}, DType::f32);
  Tensor ones = Tensor::empty({1001}, DType::f64);
  for (int64_t i = 0; i < 1001; ++i) ones.data<double>()[i] = 1.0;
  ops::gelu_backward(f.ctx, d64, ones, x);
  ops::gelu_backward(f.ctx, d32, ones.to(DType::f32), x.to(DType::f32));
  CHECK(test::max_rel_diff(d32, d64) < 5e-6);  // fp32 tanh, absolute error ~1e-7 times x

  Tensor qkv = random_tensor({B, T, 3 * C}, f.rng, -2, 2);
  Tensor o64 = Tensor::empty({B, T, C}, DType::f64), p64 = Tensor::empty({B, H, T, T}, DType::f64);
  Tensor o32 = Tensor::empty({B, T, C}, DType::f32), p32 = Tensor::empty({B, H, T, T}, DType::f32);
  ops::attention_forward(f.ctx, o64, p64, qkv, H);
  ops::attention_forward(f.ctx, o32, p32, qkv.to(DType::f32), H);
  CHECK(test::max_rel_diff(o32, o64) < 1e-6);
}
