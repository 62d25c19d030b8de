// Results do not depend on the thread count: every CPU kernel on 1, 2, 3, 4 and 7 threads gives
// bitwise the 1-thread result. Cases tagged [determinism] are run once per OpenBLAS core type by
// tests/cli/openblas_coretypes.sh (OpenBLAS's Haswell and Zen kernels give other bits when a GEMM
// is cut elsewhere, so a cut that followed the thread count fails there).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;

namespace {

constexpr int kThreadCounts[] = {1, 2, 3, 4, 7};

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// (M, N, K) covering every tiling: one call below the small-problem threshold, row and column tiles
// on wide and narrow outputs, chunks of K (gemm_tiling's cases).
struct GemmCase {
  int64_t M, N, K;
};
const GemmCase kGemmCases[] = {{301, 53, 97},   {37, 411, 129},  {517, 515, 63}, {1000, 777, 301},
                               {97, 1201, 301}, {100, 300, 200}, {2100, 70, 40}, {45, 67, 5000}};

// Row-major operands with leading dimensions a little wider than the matrices, so tile offsets are
// checked against the leading dimension rather than the width.
struct GemmOperands {
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  Tensor A, B, C;
};
GemmOperands make_operands(std::mt19937_64& rng, bool ta, bool tb, const GemmCase& s) {
  GemmOperands o{ta,      tb, s.M, s.N, s.K, (ta ? s.M : s.K) + 3, (tb ? s.K : s.N) + 5,
                 s.N + 2, {}, {},  {}};
  o.A = test::random_tensor({(ta ? s.K : s.M) * o.lda}, rng, -1, 1, DType::f32);
  o.B = test::random_tensor({(tb ? s.N : s.K) * o.ldb}, rng, -1, 1, DType::f32);
  o.C = test::random_tensor({s.M * o.ldc}, rng, -1, 1, DType::f32);
  return o;
}
Tensor run_gemm(ThreadPool& pool, const GemmOperands& o, float alpha, float beta) {
  Tensor C = o.C.clone();
  cpu::gemm<float>(pool, o.ta, o.tb, o.M, o.N, o.K, alpha, o.A.data<float>(), o.lda,
                   o.B.data<float>(), o.ldb, beta, C.data<float>(), o.ldc);
  return C;
}

}  // namespace

TEST_CASE("the GEMM test shapes cover every tiling", "[kernels][gemm]") {
  using Axis = cpu::GemmTiling::Axis;
  bool one = false, rows = false, cols = false, depth = false;
  for (const GemmCase& s : kGemmCases) {
    const cpu::GemmTiling t = cpu::gemm_tiling(s.M, s.N, s.K);
    one |= t.tiles == 1;
    rows |= t.tiles > 1 && t.axis == Axis::rows;
    cols |= t.tiles > 1 && t.axis == Axis::cols;
    depth |= t.tiles > 1 && t.axis == Axis::depth;
  }
  CHECK(one);
  CHECK(rows);
  CHECK(cols);
  CHECK(depth);
  // The tiling is a function of the shape alone: its signature has no pool. Small products stay one
  // call, and a tile count is 1 or even.
  CHECK(cpu::gemm_tiling(301, 53, 97).tiles == 1);
  for (int64_t m : {1, 17, 255, 256, 1023, 2048, 50304})
    for (int64_t n : {1, 64, 384, 1536})
      for (int64_t k : {1, 384, 5000, 50304}) {
        const int64_t tiles = cpu::gemm_tiling(m, n, k).tiles;
        CHECK((tiles == 1 || tiles % 2 == 0));
      }
}

TEST_CASE("GEMM is bitwise the same on 1, 2, 3, 4 and 7 threads, all transposes",
          "[kernels][gemm][determinism]") {
  configure_blas_threads();  // as every shard does: each tile is a single-threaded OpenBLAS call
  std::mt19937_64 rng(3);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const GemmCase& s : kGemmCases) {
        INFO("trans_a " << ta << " trans_b " << tb << " M " << s.M << " N " << s.N << " K " << s.K);
        const GemmOperands o = make_operands(rng, ta, tb, s);
        ThreadPool one(1);
        const Tensor reference = run_gemm(one, o, 1.5f, -0.75f);
        for (int threads : kThreadCounts) {
          INFO("threads " << threads);
          ThreadPool pool(threads);
          CHECK(bitwise_equal(run_gemm(pool, o, 1.5f, -0.75f), reference));
        }
      }
}

TEST_CASE("GEMM tiles compute alpha op(A) op(B) + beta C (double reference)", "[kernels][gemm]") {
  std::mt19937_64 rng(4);
  ThreadPool pool(3);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const GemmCase& s : kGemmCases) {
        for (float beta : {-0.75f, 0.0f}) {
          INFO("trans_a " << ta << " trans_b " << tb << " M " << s.M << " N " << s.N << " K " << s.K
                          << " beta " << beta);
          GemmOperands o = make_operands(rng, ta, tb, s);
          // beta == 0: C is not read, so what it held (here NaN) must not show through.
          if (beta == 0.0f)
            for (int64_t i = 0; i < o.C.numel(); ++i)
              o.C.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
          const float alpha = 1.5f;
          const Tensor C = run_gemm(pool, o, alpha, beta);
          const float *a = o.A.data<float>(), *b = o.B.data<float>(), *c0 = o.C.data<float>(),
                      *c = C.data<float>();
          int64_t bad = 0;
          for (int64_t m = 0; m < s.M; ++m)
            for (int64_t n = 0; n < s.N; ++n) {
              double exact = 0, magnitude = 0;
              for (int64_t k = 0; k < s.K; ++k) {
                const double x = ta ? a[k * o.lda + m] : a[m * o.lda + k];
                const double y = tb ? b[n * o.ldb + k] : b[k * o.ldb + n];
                exact += x * y;
                magnitude += std::abs(x * y);
              }
              const double old = beta == 0.0f ? 0.0 : c0[m * o.ldc + n];
              exact = alpha * exact + beta * old;
              magnitude = std::abs(alpha) * magnitude + std::abs(beta * old);
              // Any order of K float additions stays within (K + 2) eps of the magnitude.
              const double bound = (s.K + 2) * std::numeric_limits<float>::epsilon() * magnitude;
              if (!(std::abs(c[m * o.ldc + n] - exact) <= bound)) ++bad;
            }
          CHECK(bad == 0);
          // Columns past N (the padding of ldc) are left alone.
          int64_t touched = 0;
          for (int64_t m = 0; m < s.M; ++m)
            touched += std::memcmp(c0 + m * o.ldc + s.N, c + m * o.ldc + s.N,
                                   (o.ldc - s.N) * sizeof(float)) != 0;
          CHECK(touched == 0);
        }
      }
}

namespace {

// Every op of the model at odd sizes large enough that each one is cut into several tasks; returns
// every output and gradient. The inputs come from a fixed seed, so calls differ only in the pool.
std::vector<Tensor> run_all_ops(ThreadPool& pool) {
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(11);
  auto rnd = [&](const Shape& s) { return test::random_tensor(s, rng, -1, 1, DType::f32); };
  std::vector<Tensor> out;
  const int64_t B = 3, T = 343, C = 197, N = B * T, V = 101, O = 301, H = 3;

  Tensor tokens = test::random_tokens(rng, N, V).view({B, T});
  Tensor wte = rnd({V, C}), wpe = rnd({T + 2, C});
  Tensor emb = Tensor::empty({B, T, C});
  ops::embedding_forward(ctx, emb, tokens, wte, wpe);
  Tensor dwte = rnd({V, C}), dwpe = rnd({T + 2, C}), demb = rnd({B, T, C});
  ops::embedding_backward(ctx, dwte, dwpe, demb, tokens);
  out.insert(out.end(), {emb, dwte, dwpe});

  Tensor x = rnd({N, C}), w = rnd({C}), b = rnd({C}), dout = rnd({N, C});
  Tensor ln = Tensor::empty({N, C}), mean = Tensor::empty({N}), rstd = Tensor::empty({N});
  ops::layernorm_forward(ctx, ln, mean, rstd, x, w, b, 1e-5);
  Tensor dx = rnd({N, C}), dw = rnd({C}), db = rnd({C});
  ops::layernorm_backward(ctx, dx, dw, db, dout, x, w, mean, rstd);
  out.insert(out.end(), {ln, mean, rstd, dx, dw, db});

  // Linear layers whose GEMMs are cut into row, column and K tiles.
  for (auto [rows, in, outf] :
       {std::tuple<int64_t, int64_t, int64_t>{N, C, O}, {4099, 37, 29}, {77, 301, 1501}}) {
    Tensor xi = rnd({rows, in}), wi = rnd({outf, in}), bi = rnd({outf}), douti = rnd({rows, outf});
    Tensor y = Tensor::empty({rows, outf});
    ops::linear_forward(ctx, y, xi, wi, bi);
    Tensor dxi = Tensor::empty({rows, in}), dwi = rnd({outf, in}), dbi = rnd({outf});
    ops::linear_backward(ctx, dxi, dwi, dbi, douti, xi, wi);
    out.insert(out.end(), {y, dxi, dwi, dbi});
  }

  Tensor g = Tensor::empty({N, 4 * C}), pre = rnd({N, 4 * C}), dg = rnd({N, 4 * C});
  ops::gelu_forward(ctx, g, pre);
  Tensor dpre = Tensor::empty({N, 4 * C});
  ops::gelu_backward(ctx, dpre, dg, pre);
  Tensor sum = Tensor::empty({N, 4 * C});
  ops::residual_forward(ctx, sum, pre, dg);
  out.insert(out.end(), {g, dpre, sum});

  const int64_t Ta = 131, Ca = 48;
  Tensor qkv = rnd({B, Ta, 3 * Ca}), att = Tensor::empty({B, Ta, Ca}),
         probs = Tensor::empty({B, H, Ta, Ta});
  ops::attention_forward(ctx, att, probs, qkv, H);
  Tensor datt = rnd({B, Ta, Ca}), dqkv = Tensor::empty({B, Ta, 3 * Ca});
  ops::attention_backward(ctx, dqkv, datt, qkv, probs, H);
  out.insert(out.end(), {att, probs, dqkv});

  // The model families' ops: RMSNorm, SwiGLU / GeGLU, rotary on q and k of a fused GQA qkv, and
  // grouped-query attention (MQA and 2 groups) with ALiBi and attention dropout.
  Tensor rms = Tensor::empty({N, C}), rrstd = Tensor::empty({N});
  ops::rmsnorm_forward(ctx, rms, rrstd, x, w, 1e-6);
  Tensor rdx = rnd({N, C}), rdw = rnd({C});
  ops::rmsnorm_backward(ctx, rdx, rdw, dout, x, w, rrstd);
  out.insert(out.end(), {rms, rrstd, rdx, rdw});
  for (ops::GluKind kind : {ops::GluKind::swiglu, ops::GluKind::geglu}) {
    Tensor gate_up = rnd({N, 2 * C}), glu = Tensor::empty({N, C}), dgate_up = Tensor::empty({N, 2 * C});
    ops::glu_forward(ctx, glu, gate_up, kind);
    ops::glu_backward(ctx, dgate_up, dout, gate_up, kind);
    out.insert(out.end(), {glu, dgate_up});
  }
  const int Hq = 6, hs = 9;
  for (int G : {1, 2}) {
    const int64_t W = (Hq + 2 * G) * hs, Cq = int64_t{Hq} * hs;
    Tensor gqkv = rnd({B, Ta, W});
    ops::RotaryParams rp;
    rp.rotary_dim = 6;
    rp.pos0 = 17;
    rp.interleaved = G == 1;
    ops::rotary_forward(ctx, gqkv, 0, Hq, hs, rp);
    ops::rotary_forward(ctx, gqkv, Cq, G, hs, rp);
    ops::AttentionLayout layout;
    layout.n_head = Hq;
    layout.n_group = G;
    layout.head_dim = hs;
    layout.alibi_slopes = ops::alibi_slopes(Hq);
    DropoutMask mask;
    mask.p = 0.1;
    mask.seed = 99;
    mask.first_sample = 3;
    Tensor gatt = Tensor::empty({B, Ta, Cq}), gprobs = Tensor::empty({B, Hq, Ta, Ta});
    ops::attention_forward(ctx, gatt, gprobs, gqkv, layout, mask, 2);
    Tensor gdatt = rnd({B, Ta, Cq}), gdqkv = Tensor::empty({B, Ta, W});
    ops::attention_backward(ctx, gdqkv, gdatt, gqkv, gprobs, layout, mask, 2);
    ops::rotary_backward(ctx, gdqkv, Cq, G, hs, rp);
    ops::rotary_backward(ctx, gdqkv, 0, Hq, hs, rp);
    out.insert(out.end(), {gqkv, gatt, gprobs, gdqkv});
  }

  const int64_t Vp = 211, valid = 199;
  Tensor logits = rnd({N, Vp}), targets = test::random_tokens(rng, N, valid),
         losses = Tensor::empty({N});
  Tensor raw = logits.clone();
  ops::softmax_cross_entropy(ctx, losses, logits, targets, valid, 0.37);
  Tensor row_max = Tensor::empty({N}, DType::f64), target_logit = Tensor::empty({N}, DType::f64);
  Tensor sum_exp = Tensor::empty({N}, DType::f64), xlosses = Tensor::empty({N});
  Tensor piece = raw.clone();
  ops::xent_local_stats(ctx, row_max, target_logit, piece, targets, 0, valid);
  ops::xent_exp_sum(ctx, sum_exp, piece, row_max, valid);
  ops::xent_loss(ctx, xlosses, row_max, sum_exp, target_logit);
  Tensor grad = raw.clone();
  ops::xent_backward(ctx, grad, row_max, sum_exp, targets, 0, valid, 0.37);
  out.insert(out.end(), {losses, logits, row_max, target_logit, sum_exp, xlosses, grad});

  const int64_t P = 100003;
  Tensor p = rnd({P}), pg = rnd({P}), m = rnd({P}), v = rnd({P});
  for (int64_t i = 0; i < P; ++i) v.data<float>()[i] = std::abs(v.data<float>()[i]);
  ops::AdamWParams hp;
  hp.lr = 1e-3;
  hp.weight_decay = 0.1;
  hp.step = 3;
  ops::adamw_update(ctx, p, pg, m, v, hp);
  Tensor norms = Tensor::empty({2}, DType::f64);
  norms.data<double>()[0] = ops::sum_squares(ctx, pg);
  norms.data<double>()[1] = ops::clip_grad_norm(ctx, {pg, dwte}, 0.5);
  out.insert(out.end(), {p, m, v, norms, pg});
  return out;
}

}  // namespace

TEST_CASE("every CPU op is bitwise the same on 1, 2, 3, 4 and 7 threads",
          "[kernels][determinism]") {
  configure_blas_threads();
  ThreadPool one(1);
  const std::vector<Tensor> reference = run_all_ops(one);
  for (int threads : kThreadCounts) {
    ThreadPool pool(threads);
    const std::vector<Tensor> got = run_all_ops(pool);
    REQUIRE(got.size() == reference.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("threads " << threads << ", output " << i);
      CHECK(bitwise_equal(got[i], reference[i]));
    }
  }
}
