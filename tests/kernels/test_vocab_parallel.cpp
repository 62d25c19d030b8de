// The vocabulary-parallel kernels (cross-entropy pieces, masked embedding) and the split halves of
// linear_backward / layernorm_backward. Shards are simulated in one thread: the test does the
// reductions a TP group would do. References: the fused single-shard ops (bitwise with one shard),
// a plain double formula and central finite differences.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <catch2/catch.hpp>

#include "kernels/ops.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;
using troupe::test::check_gradient;
using troupe::test::random_tensor;

using troupe::test::random_tokens;

namespace {
constexpr int64_t B = 3, T = 7, C = 12, V = 37, N = B * T, P = 9;

struct Fixture {
  ThreadPool pool{3};
  Context ctx;
  std::mt19937_64 rng{777};
  Fixture() { ctx.pool = &pool; }
};


bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Columns [c0, c1) of a (rows, cols) tensor, copied.
Tensor columns(const Tensor& x, int64_t c0, int64_t c1) {
  const int64_t rows = x.dim(0), cols = x.dim(1), es = static_cast<int64_t>(dtype_size(x.dtype()));
  Tensor out = Tensor::empty({rows, c1 - c0}, x.dtype());
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(out.raw()) + i * (c1 - c0) * es, static_cast<char*>(x.raw()) + (i * cols + c0) * es,
                (c1 - c0) * es);
  return out;
}

void put_columns(const Tensor& dst, const Tensor& src, int64_t c0) {
  const int64_t rows = dst.dim(0), cols = dst.dim(1), w = src.dim(1);
  const int64_t es = static_cast<int64_t>(dtype_size(dst.dtype()));
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(dst.raw()) + (i * cols + c0) * es, static_cast<char*>(src.raw()) + i * w * es,
                w * es);
}

// The vocabulary-parallel cross-entropy over `shards` column blocks of `logits` (N, Vp), with the
// reductions done here in shard order as the TP all-reduces would. Returns the losses; `grad`
// (N, Vp), when defined, receives every shard's gradient block (from the raw logits, as the chunk's
// backward does).
Tensor parallel_xent(Context& ctx, const Tensor& logits, const Tensor& targets, int shards, double grad_scale,
                     const Tensor& grad) {
  const int64_t Vp = logits.dim(1), Vl = Vp / shards, n = logits.dim(0);
  REQUIRE(Vp % shards == 0);
  std::vector<Tensor> part, maxes, sums, tgts;
  Tensor max_all = Tensor::empty({n}, DType::f64), sum_all = Tensor::zeros({n}, DType::f64),
         tgt_all = Tensor::zeros({n}, DType::f64);
  for (int64_t i = 0; i < n; ++i) max_all.data<double>()[i] = -std::numeric_limits<double>::infinity();
  for (int s = 0; s < shards; ++s) {
    const int64_t v0 = s * Vl, valid = std::clamp<int64_t>(V - v0, 0, Vl);
    part.push_back(columns(logits, v0, v0 + Vl));
    maxes.push_back(Tensor::empty({n}, DType::f64));
    tgts.push_back(Tensor::empty({n}, DType::f64));
    ops::xent_local_stats(ctx, maxes[s], tgts[s], part[s], targets, v0, valid);
    for (int64_t i = 0; i < n; ++i)
      max_all.data<double>()[i] = std::max(max_all.data<double>()[i], maxes[s].data<double>()[i]);
  }
  for (int s = 0; s < shards; ++s) {
    const int64_t v0 = s * Vl, valid = std::clamp<int64_t>(V - v0, 0, Vl);
    sums.push_back(Tensor::empty({n}, DType::f64));
    ops::xent_exp_sum(ctx, sums[s], part[s], max_all, valid);
    for (int64_t i = 0; i < n; ++i) {
      sum_all.data<double>()[i] += sums[s].data<double>()[i];
      tgt_all.data<double>()[i] += tgts[s].data<double>()[i];
    }
  }
  Tensor losses = Tensor::empty({n}, logits.dtype());
  ops::xent_loss(ctx, losses, max_all, sum_all, tgt_all);
  if (grad.defined()) {
    for (int s = 0; s < shards; ++s) {
      const int64_t v0 = s * Vl, valid = std::clamp<int64_t>(V - v0, 0, Vl);
      Tensor g = columns(logits, v0, v0 + Vl);
      ops::xent_backward(ctx, g, max_all, sum_all, targets, v0, valid, grad_scale);
      put_columns(grad, g, v0);
    }
  }
  return losses;
}
}  // namespace

TEST_CASE("vocabulary-parallel cross-entropy with one shard is bitwise the fused op", "[kernels]") {
  Fixture f;
  const int64_t Vp = 40;
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    Tensor logits = random_tensor({N, Vp}, f.rng, -4, 4, dt);
    Tensor targets = random_tokens(f.rng, N, V);
    const double scale = 0.37;
    Tensor fused = logits.clone(), fused_losses = Tensor::empty({N}, dt);
    ops::softmax_cross_entropy(f.ctx, fused_losses, fused, targets, V, scale);
    Tensor grad = Tensor::empty({N, Vp}, dt);
    Tensor losses = parallel_xent(f.ctx, logits, targets, 1, scale, grad);
    REQUIRE(bitwise_equal(losses, fused_losses));
    REQUIRE(bitwise_equal(grad, fused));
  }
}

TEST_CASE("vocabulary-parallel cross-entropy over 2..4 shards matches the fused op and finite differences",
          "[kernels][grad]") {
  Fixture f;
  const int64_t Vp = 48;  // 37 real columns; shards of 24, 16, 12: the last ones partly or wholly padding
  Tensor logits = random_tensor({N, Vp}, f.rng, -4, 4);
  Tensor targets = random_tokens(f.rng, N, V);
  const double scale = 0.21;
  Tensor fused = logits.clone(), fused_losses = Tensor::empty({N}, DType::f64);
  ops::softmax_cross_entropy(f.ctx, fused_losses, fused, targets, V, scale);
  // A plain reference of one row's loss.
  for (int64_t i = 0; i < N; ++i) {
    const double* row = logits.data<double>() + i * Vp;
    double mx = row[0], s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(row[j] - mx);
    REQUIRE(fused_losses.data<double>()[i] ==
            Approx(mx + std::log(s) - row[targets.data<int32_t>()[i]]).epsilon(1e-13));
  }
  for (int shards : {2, 3, 4}) {
    INFO("shards " << shards);
    Tensor grad = Tensor::empty({N, Vp}, DType::f64);
    Tensor losses = parallel_xent(f.ctx, logits, targets, shards, scale, grad);
    CHECK(test::max_rel_diff(losses, fused_losses) < 1e-14);
    CHECK(test::max_rel_diff(grad, fused) < 1e-15);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = V; j < Vp; ++j) REQUIRE(grad.data<double>()[i * Vp + j] == 0.0);  // padding masked
    // Padding logits do not change the loss.
    Tensor shifted = logits.clone();
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = V; j < Vp; ++j) shifted.data<double>()[i * Vp + j] = 1e3;
    REQUIRE(bitwise_equal(parallel_xent(f.ctx, shifted, targets, shards, scale, Tensor()), losses));
    auto objective = [&] {
      Tensor l = parallel_xent(f.ctx, logits, targets, shards, scale, Tensor());
      double s = 0;
      for (int64_t i = 0; i < N; ++i) s += l.data<double>()[i];
      return scale * s;
    };
    check_gradient(objective, logits, grad, "dlogits", 1e-6, 1e-8, 300);
  }
}

TEST_CASE("vocabulary-parallel embedding: the shards' sum is the embedding, gradients split by rows",
          "[kernels][grad]") {
  Fixture f;
  const int64_t Vp = 48;
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    Tensor wte = random_tensor({Vp, C}, f.rng, -1, 1, dt), wpe = random_tensor({P, C}, f.rng, -1, 1, dt);
    Tensor tokens = random_tokens(f.rng, N, V).view({B, T});
    Tensor ref = Tensor::empty({B, T, C}, dt);
    ops::embedding_forward(f.ctx, ref, tokens, wte, wpe);
    Tensor dout = random_tensor({B, T, C}, f.rng, -1, 1, dt);
    Tensor ref_dwte = Tensor::zeros({Vp, C}, dt), ref_dwpe = Tensor::zeros({P, C}, dt);
    ops::embedding_backward(f.ctx, ref_dwte, ref_dwpe, dout, tokens);
    for (int shards : {1, 2, 3}) {
      INFO("shards " << shards);
      const int64_t Vl = Vp / shards;
      Tensor sum = Tensor::zeros({B, T, C}, dt), out = Tensor::empty({B, T, C}, dt);
      Tensor dwte = Tensor::zeros({Vp, C}, dt), dwpe = Tensor::zeros({P, C}, dt);
      for (int s = 0; s < shards; ++s) {
        ops::vocab_embedding_forward(f.ctx, out, tokens, wte.rows(s * Vl, (s + 1) * Vl), s * Vl,
                                     s == 0 ? wpe : Tensor());
        ops::add_inplace(f.ctx, sum, out);
        ops::vocab_embedding_backward(f.ctx, dwte.rows(s * Vl, (s + 1) * Vl), s == 0 ? dwpe : Tensor(), dout, tokens,
                                      s * Vl);
      }
      // One nonzero term per element: the sum is exact, bitwise the single-shard embedding.
      REQUIRE(bitwise_equal(sum, ref));
      REQUIRE(bitwise_equal(dwte, ref_dwte));
      REQUIRE(bitwise_equal(dwpe, ref_dwpe));
    }
  }
  // Finite differences for one shard that holds rows [16, 32) and no positions.
  Tensor wte = random_tensor({16, C}, f.rng), tokens = random_tokens(f.rng, N, V).view({B, T});
  Tensor w = random_tensor({B, T, C}, f.rng), out = Tensor::empty({B, T, C}, DType::f64);
  auto objective = [&] {
    ops::vocab_embedding_forward(f.ctx, out, tokens, wte, 16, Tensor());
    return test::dot(out, w);
  };
  Tensor dwte = Tensor::zeros({16, C}, DType::f64);
  ops::vocab_embedding_backward(f.ctx, dwte, Tensor(), w, tokens, 16);
  check_gradient(objective, wte, dwte, "dwte shard");
}

TEST_CASE("split backward halves are bitwise the full linear and layernorm backward", "[kernels]") {
  Fixture f;
  const int64_t I = 12, O = 37;
  Tensor x = random_tensor({N, I}, f.rng, -1, 1, DType::f32), w = random_tensor({O, I}, f.rng, -1, 1, DType::f32);
  Tensor dout = random_tensor({N, O}, f.rng, -1, 1, DType::f32);
  Tensor dx = Tensor::empty({N, I}), dw = random_tensor({O, I}, f.rng, -1, 1, DType::f32),
         db = random_tensor({O}, f.rng, -1, 1, DType::f32);
  Tensor dx2 = Tensor::empty({N, I}), dw2 = dw.clone(), db2 = db.clone();
  ops::linear_backward(f.ctx, dx, dw, db, dout, x, w);
  ops::linear_backward(f.ctx, dx2, Tensor(), Tensor(), dout, Tensor(), w);
  ops::linear_backward(f.ctx, Tensor(), dw2, db2, dout, x, Tensor());
  REQUIRE(bitwise_equal(dx, dx2));
  REQUIRE(bitwise_equal(dw, dw2));
  REQUIRE(bitwise_equal(db, db2));

  Tensor lx = random_tensor({N, C}, f.rng, -2, 2, DType::f32), lw = random_tensor({C}, f.rng, -1, 1, DType::f32),
         lb = random_tensor({C}, f.rng, -1, 1, DType::f32);
  Tensor y = Tensor::empty({N, C}), mean = Tensor::empty({N}), rstd = Tensor::empty({N});
  ops::layernorm_forward(f.ctx, y, mean, rstd, lx, lw, lb, 1e-5);
  Tensor ldout = random_tensor({N, C}, f.rng, -1, 1, DType::f32);
  Tensor ldx = random_tensor({N, C}, f.rng, -1, 1, DType::f32), ldw = Tensor::zeros({C}), ldb = Tensor::zeros({C});
  Tensor ldx2 = ldx.clone(), ldw2 = Tensor::zeros({C}), ldb2 = Tensor::zeros({C});
  ops::layernorm_backward(f.ctx, ldx, ldw, ldb, ldout, lx, lw, mean, rstd);
  ops::layernorm_backward(f.ctx, ldx2, Tensor(), Tensor(), ldout, lx, lw, mean, rstd);
  ops::layernorm_backward(f.ctx, Tensor(), ldw2, ldb2, ldout, lx, Tensor(), mean, rstd);
  REQUIRE(bitwise_equal(ldx, ldx2));
  REQUIRE(bitwise_equal(ldw, ldw2));
  REQUIRE(bitwise_equal(ldb, ldb2));
}
