// AdamW and gradient clipping against straight-line reference formulas.
#include <catch2/catch.hpp>

#include "kernels/ops.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;

TEST_CASE("AdamW matches the algorithm of Loshchilov & Hutter over several steps", "[kernels][optimizer]") {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(7);
  const int64_t n = 1001;
  Tensor p = test::random_tensor({n}, rng), m = Tensor::zeros({n}, DType::f64), v = Tensor::zeros({n}, DType::f64);
  std::vector<double> rp(p.data<double>(), p.data<double>() + n), rm(n, 0.0), rv(n, 0.0);
  ops::AdamWParams hp;
  hp.lr = 3e-3;
  hp.beta1 = 0.8;
  hp.beta2 = 0.95;
  hp.eps = 1e-6;
  hp.weight_decay = 0.1;
  for (int64_t step = 1; step <= 4; ++step) {
    Tensor g = test::random_tensor({n}, rng);
    hp.step = step;
    ops::adamw_update(ctx, p, g, m, v, hp);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g.data<double>()[i];
      rm[i] = hp.beta1 * rm[i] + (1 - hp.beta1) * gi;
      rv[i] = hp.beta2 * rv[i] + (1 - hp.beta2) * gi * gi;
      const double mhat = rm[i] / (1 - std::pow(hp.beta1, step));
      const double vhat = rv[i] / (1 - std::pow(hp.beta2, step));
      rp[i] = rp[i] - hp.lr * (mhat / (std::sqrt(vhat) + hp.eps) + hp.weight_decay * rp[i]);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(p.data<double>()[i] == Approx(rp[i]).epsilon(1e-12));
    REQUIRE(m.data<double>()[i] == Approx(rm[i]).epsilon(1e-12));
    REQUIRE(v.data<double>()[i] == Approx(rv[i]).epsilon(1e-12));
  }
}

TEST_CASE("global gradient norm and clipping", "[kernels][optimizer]") {
  ThreadPool pool(3);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(11);
  std::vector<Tensor> grads = {test::random_tensor({37}, rng), test::random_tensor({20001}, rng),
                               test::random_tensor({5, 7}, rng)};
  std::vector<Tensor> copies;
  double ref = 0;
  for (auto& g : grads) {
    copies.push_back(g.clone());
    for (int64_t i = 0; i < g.numel(); ++i) ref += g.data<double>()[i] * g.data<double>()[i];
  }
  ref = std::sqrt(ref);
  SECTION("below the threshold nothing changes") {
    double norm = ops::clip_grad_norm(ctx, grads, ref * 2);
    REQUIRE(norm == Approx(ref).epsilon(1e-13));
    for (size_t k = 0; k < grads.size(); ++k)
      for (int64_t i = 0; i < grads[k].numel(); ++i) REQUIRE(grads[k].data<double>()[i] == copies[k].data<double>()[i]);
  }
  SECTION("above the threshold the norm becomes max_norm") {
    const double max_norm = ref / 3;
    double norm = ops::clip_grad_norm(ctx, grads, max_norm);
    REQUIRE(norm == Approx(ref).epsilon(1e-13));
    double after = 0;
    for (auto& g : grads) after += ops::sum_squares(ctx, g);
    REQUIRE(std::sqrt(after) == Approx(max_norm).epsilon(1e-5));
    const double coef = max_norm / (ref + 1e-6);
    REQUIRE(grads[1].data<double>()[17] == Approx(copies[1].data<double>()[17] * coef).epsilon(1e-13));
  }
}
