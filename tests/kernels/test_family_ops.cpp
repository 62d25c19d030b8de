// The model families' ops (RMSNorm, SwiGLU/GeGLU, rotary, grouped-query attention with ALiBi):
// forwards against direct double formulas written here, backwards against central finite
// differences, in double on random non-zero inputs of odd sizes; f32 against f64 on the same
// (rounded) inputs.
#include <catch2/catch.hpp>
#include <cmath>
#include <complex>
#include <cstring>
#include <vector>

#include "kernels/ops.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;
using troupe::test::check_gradient;
using troupe::test::dot;
using troupe::test::max_rel_diff;
using troupe::test::random_tensor;

namespace {

struct Fixture {
  ThreadPool pool{3};
  Context ctx;
  std::mt19937_64 rng{20261202};
  Fixture() { ctx.pool = &pool; }
};

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

double* d(const Tensor& t) { return t.data<double>(); }

}  // namespace

// ---- RMSNorm -------------------------------------------------------------------------------------

TEST_CASE("rmsnorm forward matches the formula, backward matches finite differences", "[kernels][grad][family]") {
  Fixture f;
  const int64_t N = 19, C = 13;
  const double eps = 1e-5;
  Tensor x = random_tensor({N, C}, f.rng, -2, 2), wt = random_tensor({C}, f.rng), w = random_tensor({N, C}, f.rng);
  Tensor out = Tensor::empty({N, C}, DType::f64), rstd = Tensor::empty({N}, DType::f64);
  auto objective = [&] {
    ops::rmsnorm_forward(f.ctx, out, rstd, x, wt, eps);
    return dot(out, w);
  };
  objective();
  for (int64_t n = 0; n < N; ++n) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += d(x)[n * C + c] * d(x)[n * C + c] / C;
    const double r = 1 / std::sqrt(ms + eps);
    REQUIRE(d(rstd)[n] == Approx(r).epsilon(1e-14));
    for (int64_t c = 0; c < C; ++c) REQUIRE(d(out)[n * C + c] == Approx(d(x)[n * C + c] * r * d(wt)[c]).epsilon(1e-14));
  }

  Tensor dx = Tensor::zeros({N, C}, DType::f64), dwt = Tensor::zeros({C}, DType::f64);
  ops::rmsnorm_backward(f.ctx, dx, dwt, w, x, wt, rstd);
  check_gradient(objective, x, dx, "dx");
  check_gradient(objective, wt, dwt, "dweight");

  SECTION("the split halves are each bitwise the full call, and dx accumulates") {
    Tensor base = random_tensor({N, C}, f.rng), base_w = random_tensor({C}, f.rng);
    Tensor full_dx = base.clone(), full_dw = base_w.clone();
    ops::rmsnorm_backward(f.ctx, full_dx, full_dw, w, x, wt, rstd);
    Tensor half_dx = base.clone(), half_dw = base_w.clone();
    ops::rmsnorm_backward(f.ctx, half_dx, Tensor{}, w, x, wt, rstd);
    ops::rmsnorm_backward(f.ctx, Tensor{}, half_dw, w, x, Tensor{}, rstd);  // the weight pass needs no weight
    CHECK(bitwise_equal(half_dx, full_dx));
    CHECK(bitwise_equal(half_dw, full_dw));
    for (int64_t i = 0; i < N * C; ++i) REQUIRE(d(full_dx)[i] == Approx(d(base)[i] + d(dx)[i]).epsilon(1e-12));
    for (int64_t c = 0; c < C; ++c) REQUIRE(d(full_dw)[c] == Approx(d(base_w)[c] + d(dwt)[c]).epsilon(1e-12));
  }
}

// ---- SwiGLU / GeGLU ------------------------------------------------------------------------------

TEST_CASE("swiglu and geglu match their formulas, backward matches finite differences", "[kernels][grad][family]") {
  Fixture f;
  const int64_t N = 17, F = 11;
  for (ops::GluKind kind : {ops::GluKind::swiglu, ops::GluKind::geglu}) {
    const bool silu = kind == ops::GluKind::swiglu;
    INFO((silu ? "swiglu" : "geglu"));
    Tensor gu = random_tensor({N, 2 * F}, f.rng, -4, 4), w = random_tensor({N, F}, f.rng);
    Tensor out = Tensor::empty({N, F}, DType::f64);
    auto objective = [&] {
      ops::glu_forward(f.ctx, out, gu, kind);
      return dot(out, w);
    };
    objective();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < F; ++j) {
        const double g = d(gu)[n * 2 * F + j], u = d(gu)[n * 2 * F + F + j];
        const double act = silu ? g / (1 + std::exp(-g))
                                : 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
        REQUIRE(d(out)[n * F + j] == Approx(act * u).epsilon(1e-14).margin(1e-15));
      }
    Tensor dgu = Tensor::empty({N, 2 * F}, DType::f64);
    ops::glu_backward(f.ctx, dgu, w, gu, kind);
    check_gradient(objective, gu, dgu, "dgate_up");
  }
}

// ---- rotary --------------------------------------------------------------------------------------

namespace {

// Rotary from the published definitions, in double: the angle of pair i at position p is
// p / base^(2i/r); rotate-half as Hugging Face's apply_rotary_pos_emb (x * cat(cos, cos) +
// rotate_half(x) * cat(sin, sin), rotate_half(x) = cat(-x2, x1)); interleaved as Meta's complex
// product (x[2i] + i x[2i+1]) * e^(i angle).
void reference_rotary(Tensor& x, int64_t col0, int n_heads, int head_dim, const ops::RotaryParams& p) {
  const int64_t B = x.dim(0), T = x.dim(1), W = x.dim(2), r = p.rotary_dim, half = r / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < n_heads; ++h) {
        double* e = d(x) + (b * T + t) * W + col0 + h * head_dim;
        std::vector<double> theta(half);
        for (int64_t i = 0; i < half; ++i) theta[i] = static_cast<double>(p.pos0 + t) / std::pow(p.base, 2.0 * i / r);
        if (p.interleaved) {
          for (int64_t i = 0; i < half; ++i) {
            const std::complex<double> z = std::complex<double>(e[2 * i], e[2 * i + 1]) * std::polar(1.0, theta[i]);
            e[2 * i] = z.real();
            e[2 * i + 1] = z.imag();
          }
        } else {
          std::vector<double> rot(r), in(e, e + r);
          for (int64_t i = 0; i < half; ++i) {
            rot[i] = -in[half + i];
            rot[half + i] = in[i];
          }
          for (int64_t k = 0; k < r; ++k) e[k] = in[k] * std::cos(theta[k % half]) + rot[k] * std::sin(theta[k % half]);
        }
      }
}

}  // namespace

TEST_CASE("rotary matches both published conventions; backward is the inverse rotation", "[kernels][grad][family]") {
  Fixture f;
  // A fused qkv of H = 3 query heads and G = 5 key/value groups of head_dim 10; rotary on 6 of the 10
  // dims (rotary_percent 0.6), positions starting at 5; both on q (col0 0) and on k (col0 H*hs).
  const int64_t B = 2, T = 7;
  const int H = 3, G = 5, hs = 10;
  const int64_t W = (H + 2 * G) * hs;
  for (bool interleaved : {false, true})
    for (const std::pair<int64_t, int>& part : {std::pair<int64_t, int>{0, H}, {int64_t{H} * hs, G}}) {
      const int64_t col0 = part.first;
      const int heads = part.second;
      INFO("interleaved " << interleaved << " col0 " << col0);
      ops::RotaryParams p;
      p.rotary_dim = 6;
      p.base = 500;
      p.interleaved = interleaved;
      p.pos0 = 5;
      Tensor x = random_tensor({B, T, W}, f.rng);
      Tensor got = x.clone(), ref = x.clone();
      ops::rotary_forward(f.ctx, got, col0, heads, hs, p);
      reference_rotary(ref, col0, heads, hs, p);
      CHECK(max_rel_diff(got, ref) < 1e-14);
      // Outside the heads' rotary dims nothing moves.
      int64_t moved = 0;
      for (int64_t n = 0; n < B * T; ++n)
        for (int64_t c = 0; c < W; ++c) {
          const bool rotated = c >= col0 && c < col0 + heads * hs && (c - col0) % hs < p.rotary_dim;
          if (!rotated) moved += d(got)[n * W + c] != d(x)[n * W + c];
        }
      CHECK(moved == 0);

      // Backward against finite differences of <rotary(x), w>; then forward then backward = identity.
      Tensor w = random_tensor({B, T, W}, f.rng);
      Tensor y = Tensor::empty({B, T, W}, DType::f64);
      auto objective = [&] {
        std::memcpy(y.raw(), x.raw(), x.nbytes());
        ops::rotary_forward(f.ctx, y, col0, heads, hs, p);
        return dot(y, w);
      };
      Tensor dx = w.clone();
      ops::rotary_backward(f.ctx, dx, col0, heads, hs, p);
      check_gradient(objective, x, dx, "dx", 1e-7, 1e-9);
      Tensor round_trip = got.clone();
      ops::rotary_backward(f.ctx, round_trip, col0, heads, hs, p);
      CHECK(max_rel_diff(round_trip, x) < 1e-14);

      // f32 against f64 on the same rounded inputs.
      Tensor x32 = x.to(DType::f32), x64 = x32.to(DType::f64);
      ops::rotary_forward(f.ctx, x32, col0, heads, hs, p);
      ops::rotary_forward(f.ctx, x64, col0, heads, hs, p);
      CHECK(max_rel_diff(x32, x64) < 1e-6);
    }
}

TEST_CASE("rotary: the interleaved and rotate-half conventions differ by the q/k row permutation",
          "[kernels][family]") {
  // Hugging Face's LLaMA conversion permutes each head's q/k rows from Meta's interleaved order to
  // halves order: dim 2i + s (s = 0, 1) moves to s * r/2 + i. Rotating the permuted vector
  // rotate-half is then the permuted interleaved rotation, at every position.
  Fixture f;
  const int64_t B = 2, T = 9;
  const int heads = 3, hs = 12;
  const int64_t W = heads * hs;
  for (int rotary_dim : {12, 8}) {
    INFO("rotary_dim " << rotary_dim);
    const int64_t half = rotary_dim / 2;
    auto to_halves = [&](const Tensor& x) {
      Tensor y = x.clone();
      for (int64_t n = 0; n < B * T; ++n)
        for (int h = 0; h < heads; ++h)
          for (int64_t i = 0; i < half; ++i)
            for (int64_t s = 0; s < 2; ++s) d(y)[n * W + h * hs + s * half + i] = d(x)[n * W + h * hs + 2 * i + s];
      return y;
    };
    ops::RotaryParams p;
    p.rotary_dim = rotary_dim;
    p.pos0 = 3;
    Tensor x = random_tensor({B, T, W}, f.rng);
    Tensor inter = x.clone(), halves = to_halves(x);
    p.interleaved = true;
    ops::rotary_forward(f.ctx, inter, 0, heads, hs, p);
    p.interleaved = false;
    ops::rotary_forward(f.ctx, halves, 0, heads, hs, p);
    CHECK(max_rel_diff(halves, to_halves(inter)) < 1e-15);
    // The permutation is not the identity here: the two conventions do give other results.
    CHECK(max_rel_diff(halves, to_halves(x)) > 1e-3);
    Tensor unpermuted = x.clone();
    ops::rotary_forward(f.ctx, unpermuted, 0, heads, hs, p);
    CHECK(max_rel_diff(unpermuted, inter) > 1e-3);
  }
}

// ---- ALiBi slopes --------------------------------------------------------------------------------

namespace {
// Press et al.'s get_slopes (the recursion BLOOM's build_alibi_tensor unrolls): for n a power of 2,
// start = 2^(-2^-(log2 n - 3)) and slopes start * start^i; otherwise the slopes of the closest power of
// 2 below, then get_slopes(2 * that)[0::2] for the remaining heads.
std::vector<double> press_slopes(int n) {
  const double l = std::log2(static_cast<double>(n));
  if (l == std::floor(l)) {
    const double start = std::pow(2.0, -std::pow(2.0, -(l - 3)));
    std::vector<double> s;
    for (int i = 0; i < n; ++i) s.push_back(start * std::pow(start, i));
    return s;
  }
  const int cp2 = 1 << static_cast<int>(std::floor(l));
  std::vector<double> s = press_slopes(cp2), extra = press_slopes(2 * cp2);
  for (int i = 0; static_cast<int>(s.size()) < n; i += 2) s.push_back(extra[i]);
  return s;
}
}  // namespace

TEST_CASE("ALiBi slopes follow BLOOM's rule", "[kernels][family]") {
  for (int n : {8, 12, 16, 30, 1, 6}) {
    INFO("heads " << n);
    const std::vector<double> got = ops::alibi_slopes(n), ref = press_slopes(n);
    REQUIRE(got.size() == static_cast<size_t>(n));
    for (int h = 0; h < n; ++h) CHECK(got[h] == Approx(ref[h]).epsilon(1e-14));
  }
  // Closed forms: powers of 2 give 2^(-8(h+1)/n) (8 heads: 1/2 ... 1/256); 12 heads continue after the
  // 8 with 2^(-4 k / 8) for odd k; 30 heads with 2^(-4 k / 16) for odd k < 28.
  for (int n : {8, 16})
    for (int h = 0; h < n; ++h) CHECK(ops::alibi_slopes(n)[h] == Approx(std::exp2(-8.0 * (h + 1) / n)).epsilon(1e-15));
  CHECK(ops::alibi_slopes(8)[7] == 1.0 / 256);
  for (int k = 0; k < 4; ++k) CHECK(ops::alibi_slopes(12)[8 + k] == Approx(std::exp2(-0.5 * (2 * k + 1))).epsilon(1e-15));
  for (int k = 0; k < 14; ++k) CHECK(ops::alibi_slopes(30)[16 + k] == Approx(std::exp2(-0.25 * (2 * k + 1))).epsilon(1e-15));
}

// ---- grouped-query attention ---------------------------------------------------------------------

namespace {

struct GqaCase {
  int H, G, hs;
  bool alibi, dropout;
  int64_t head0;
};

// Attention straight from the definition, in double: query head h reads group h / (H/G); scores
// q_i.k_j / sqrt(hs) + slope_h (j - i) over j <= i; out_i = sum_j softmax_j * factor_ij * v_j with the
// dropout factor of probability (b, h, i, j), element ((head0 + h) T + i) T + j of its sample.
void reference_attention(const Tensor& qkv, Tensor& out, Tensor& probs, const GqaCase& c,
                         const std::vector<double>& slopes, const DropoutMask& mask) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), ld = qkv.dim(2), C = int64_t{c.H} * c.hs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t g = h / (c.H / c.G);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dq = 0;
          for (int64_t e = 0; e < c.hs; ++e)
            dq += d(qkv)[(b * T + i) * ld + h * c.hs + e] * d(qkv)[(b * T + j) * ld + C + g * c.hs + e];
          s[j] = dq / std::sqrt(static_cast<double>(c.hs)) + (slopes.empty() ? 0.0 : slopes[h] * (j - i));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int64_t j = 0; j < T; ++j) d(probs)[((b * c.H + h) * T + i) * T + j] = j <= i ? s[j] / z : 0.0;
        for (int64_t e = 0; e < c.hs; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double factor = 1;
            if (mask.active())
              factor = mask.kept(mask.first_sample + b, ((c.head0 + h) * T + i) * T + j) ? 1 / (1 - mask.p) : 0.0;
            o += s[j] / z * factor * d(qkv)[(b * T + j) * ld + C + int64_t{c.G} * c.hs + g * c.hs + e];
          }
          d(out)[(b * T + i) * C + h * c.hs + e] = o;
        }
      }
    }
}

DropoutMask test_mask() {
  DropoutMask m;
  m.p = 0.3;
  m.seed = 0x1234567890ull;
  m.stream = 5;
  m.iteration = 11;
  m.first_sample = 7;
  return m;
}

}  // namespace

TEST_CASE("grouped-query attention matches the definition, backward matches finite differences",
          "[kernels][grad][family]") {
  Fixture f;
  const int64_t B = 2, T = 7;
  const int H = 6, hs = 5;
  for (int G : {1, 2, 6})
    for (bool alibi : {false, true})
      for (bool dropout : {false, true}) {
        const GqaCase c{H, G, hs, alibi, dropout, dropout ? 3 : 0};
        INFO("G " << G << " alibi " << alibi << " dropout " << dropout);
        ops::AttentionLayout layout;
        layout.n_head = H;
        layout.n_group = G;
        layout.head_dim = hs;
        // Steep slopes (those of 2 heads, repeated) so the bias changes the softmax visibly.
        if (alibi) layout.alibi_slopes = {0.5, 0.25, 0.7, 0.125, 0.9, 0.3};
        const DropoutMask mask = dropout ? test_mask() : DropoutMask{};
        const int64_t W = (H + 2 * G) * hs, C = int64_t{H} * hs;
        Tensor qkv = random_tensor({B, T, W}, f.rng, -1.5, 1.5), w = random_tensor({B, T, C}, f.rng);
        Tensor out = Tensor::empty({B, T, C}, DType::f64), probs = Tensor::empty({B, H, T, T}, DType::f64);
        auto objective = [&] {
          ops::attention_forward(f.ctx, out, probs, qkv, layout, mask, c.head0);
          return dot(out, w);
        };
        objective();
        Tensor ref = Tensor::empty({B, T, C}, DType::f64), ref_probs = Tensor::empty({B, H, T, T}, DType::f64);
        reference_attention(qkv, ref, ref_probs, c, layout.alibi_slopes, mask);
        CHECK(max_rel_diff(out, ref) < 1e-13);
        CHECK(max_rel_diff(probs, ref_probs) < 1e-13);

        Tensor dqkv = Tensor::empty({B, T, W}, DType::f64);
        ops::attention_backward(f.ctx, dqkv, w, qkv, probs, layout, mask, c.head0);
        check_gradient(objective, qkv, dqkv, "dqkv", 1e-6, 1e-8, 2000);

        // f32 against f64 on the same rounded inputs.
        Tensor q32 = qkv.to(DType::f32), q64 = q32.to(DType::f64);
        Tensor o32 = Tensor::empty({B, T, C}, DType::f32), p32 = Tensor::empty({B, H, T, T}, DType::f32);
        ops::attention_forward(f.ctx, out, probs, q64, layout, mask, c.head0);
        ops::attention_forward(f.ctx, o32, p32, q32, layout, mask, c.head0);
        CHECK(max_rel_diff(o32, out) < 2e-6);
        Tensor w32 = w.to(DType::f32);
        Tensor dq64 = Tensor::empty({B, T, W}, DType::f64), dq32 = Tensor::empty({B, T, W}, DType::f32);
        ops::attention_backward(f.ctx, dq64, w32.to(DType::f64), q64, probs, layout, mask, c.head0);
        ops::attention_backward(f.ctx, dq32, w32, q32, p32, layout, mask, c.head0);
        CHECK(max_rel_diff(dq32, dq64) < 1e-5);
      }
}

TEST_CASE("ALiBi with steep slopes: no subnormal probabilities, f32 still agrees with f64", "[kernels][family]") {
  // Slopes of 1 and 0.5 over 131 positions push distant keys 130 below the row's maximum score: f32
  // flushes those probabilities to 0 (below exp(-80)) instead of computing subnormal numbers.
  Fixture f;
  const int64_t B = 2, T = 131;
  const int H = 2, G = 1, hs = 8;
  const int64_t W = (H + 2 * G) * hs, C = int64_t{H} * hs;
  ops::AttentionLayout layout;
  layout.n_head = H;
  layout.n_group = G;
  layout.head_dim = hs;
  layout.alibi_slopes = {1.0, 0.5};
  Tensor q64 = random_tensor({B, T, W}, f.rng).to(DType::f32).to(DType::f64), q32 = q64.to(DType::f32);
  Tensor o64 = Tensor::empty({B, T, C}, DType::f64), p64 = Tensor::empty({B, H, T, T}, DType::f64);
  Tensor o32 = Tensor::empty({B, T, C}, DType::f32), p32 = Tensor::empty({B, H, T, T}, DType::f32);
  ops::attention_forward(f.ctx, o64, p64, q64, layout);
  ops::attention_forward(f.ctx, o32, p32, q32, layout);
  int64_t subnormal = 0, zero = 0;
  for (int64_t i = 0; i < p32.numel(); ++i) {
    const float v = p32.data<float>()[i];
    subnormal += v != 0 && std::fpclassify(v) == FP_SUBNORMAL;
    zero += v == 0;
  }
  CHECK(subnormal == 0);
  CHECK(zero > B * H * T * (T - 1) / 2);  // more than the masked upper triangle: some were flushed
  CHECK(max_rel_diff(o32, o64) < 2e-6);
  CHECK(max_rel_diff(p32, p64) < 2e-6);
  Tensor dout = random_tensor({B, T, C}, f.rng).to(DType::f32);
  Tensor d64 = Tensor::empty({B, T, W}, DType::f64), d32 = Tensor::empty({B, T, W}, DType::f32);
  ops::attention_backward(f.ctx, d64, dout.to(DType::f64), q64, p64, layout);
  ops::attention_backward(f.ctx, d32, dout, q32, p32, layout);
  CHECK(max_rel_diff(d32, d64) < 1e-5);
}

TEST_CASE("attention with G = H and no ALiBi is bitwise the multi-head overload", "[kernels][family]") {
  Fixture f;
  const int64_t B = 3, T = 11;
  const int H = 4, hs = 7;
  const int64_t C = int64_t{H} * hs;
  for (bool dropout : {false, true})
    for (DType dt : {DType::f32, DType::f64}) {
      INFO("dropout " << dropout << " f32 " << (dt == DType::f32));
      const DropoutMask mask = dropout ? test_mask() : DropoutMask{};
      const int64_t head0 = dropout ? 4 : 0;
      Tensor qkv = random_tensor({B, T, 3 * C}, f.rng, -2, 2, dt), dout = random_tensor({B, T, C}, f.rng, -1, 1, dt);
      Tensor o1 = Tensor::empty({B, T, C}, dt), p1 = Tensor::empty({B, H, T, T}, dt);
      Tensor o2 = Tensor::empty({B, T, C}, dt), p2 = Tensor::empty({B, H, T, T}, dt);
      ops::attention_forward(f.ctx, o1, p1, qkv, H, mask, head0);
      ops::AttentionLayout layout;
      layout.n_head = H;  // n_group 0 and head_dim 0: the defaults G = H, hs = C / H
      ops::attention_forward(f.ctx, o2, p2, qkv, layout, mask, head0);
      CHECK(bitwise_equal(o1, o2));
      CHECK(bitwise_equal(p1, p2));
      Tensor d1 = Tensor::empty({B, T, 3 * C}, dt), d2 = Tensor::empty({B, T, 3 * C}, dt);
      ops::attention_backward(f.ctx, d1, dout, qkv, p1, H, mask, head0);
      layout.n_group = H;
      layout.head_dim = hs;
      ops::attention_backward(f.ctx, d2, dout, qkv, p1, layout, mask, head0);
      CHECK(bitwise_equal(d1, d2));
    }
}

TEST_CASE("MQA equals MHA with the key/value head repeated", "[kernels][family]") {
  // An independent check of the group sums at a size where blocks of 64 rows matter (T = 131): a
  // grouped call on [q | k | v] gives the multi-head call's output on [q | k..k | v..v], and its dK,
  // dV are the sums of the multi-head dK, dV over each group's heads.
  Fixture f;
  const int64_t B = 1, T = 131;
  const int H = 4, G = 2, hs = 6, R = H / G;
  const int64_t C = int64_t{H} * hs, Wg = (H + 2 * G) * hs, Wm = 3 * C;
  Tensor qkv = random_tensor({B, T, Wg}, f.rng), dout = random_tensor({B, T, C}, f.rng);
  Tensor wide = Tensor::empty({B, T, Wm}, DType::f64);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < Wm; ++c) {
      int64_t src = c;  // q
      if (c >= C) {
        const int64_t part = (c - C) / C, h = (c - C) % C / hs, e = c % hs;  // k (0) or v (1) of head h
        src = C + part * G * hs + (h / R) * hs + e;
      }
      d(wide)[t * Wm + c] = d(qkv)[t * Wg + src];
    }
  ops::AttentionLayout layout;
  layout.n_head = H;
  layout.n_group = G;
  layout.head_dim = hs;
  Tensor og = Tensor::empty({B, T, C}, DType::f64), pg = Tensor::empty({B, H, T, T}, DType::f64);
  Tensor om = Tensor::empty({B, T, C}, DType::f64), pm = Tensor::empty({B, H, T, T}, DType::f64);
  ops::attention_forward(f.ctx, og, pg, qkv, layout);
  ops::attention_forward(f.ctx, om, pm, wide, H);
  CHECK(max_rel_diff(og, om) < 1e-14);
  Tensor dg = Tensor::empty({B, T, Wg}, DType::f64), dm = Tensor::empty({B, T, Wm}, DType::f64);
  ops::attention_backward(f.ctx, dg, dout, qkv, pg, layout);
  ops::attention_backward(f.ctx, dm, dout, wide, pm, H);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < Wg; ++c) {
      double want = 0;
      if (c < C) {
        want = d(dm)[t * Wm + c];
      } else {
        const int64_t part = (c - C) / (G * hs), g = (c - C) % (G * hs) / hs, e = c % hs;
        for (int64_t r = 0; r < R; ++r) want += d(dm)[t * Wm + C + part * C + (g * R + r) * hs + e];
      }
      worst = std::max(worst, std::abs(d(dg)[t * Wg + c] - want) / (1 + std::abs(want)));
    }
  CHECK(worst < 1e-13);
}

// ---- f32 against f64 for the elementwise families ------------------------------------------------

TEST_CASE("rmsnorm and glu in f32 agree with f64 on the same inputs", "[kernels][family]") {
  Fixture f;
  const int64_t N = 37, C = 301, F = 203;
  Tensor x32 = random_tensor({N, C}, f.rng, -3, 3, DType::f32), w32 = random_tensor({C}, f.rng, -1, 1, DType::f32);
  Tensor dy32 = random_tensor({N, C}, f.rng, -1, 1, DType::f32);
  Tensor x64 = x32.to(DType::f64), w64 = w32.to(DType::f64), dy64 = dy32.to(DType::f64);
  Tensor y32 = Tensor::empty({N, C}, DType::f32), r32 = Tensor::empty({N}, DType::f32);
  Tensor y64 = Tensor::empty({N, C}, DType::f64), r64 = Tensor::empty({N}, DType::f64);
  ops::rmsnorm_forward(f.ctx, y32, r32, x32, w32, 1e-6);
  ops::rmsnorm_forward(f.ctx, y64, r64, x64, w64, 1e-6);
  CHECK(max_rel_diff(y32, y64) < 2e-6);
  Tensor dx32 = Tensor::zeros({N, C}, DType::f32), dw32 = Tensor::zeros({C}, DType::f32);
  Tensor dx64 = Tensor::zeros({N, C}, DType::f64), dw64 = Tensor::zeros({C}, DType::f64);
  ops::rmsnorm_backward(f.ctx, dx32, dw32, dy32, x32, w32, r32);
  ops::rmsnorm_backward(f.ctx, dx64, dw64, dy64, x64, w64, r64);
  CHECK(max_rel_diff(dx32, dx64) < 1e-5);
  CHECK(max_rel_diff(dw32, dw64) < 1e-5);

  for (ops::GluKind kind : {ops::GluKind::swiglu, ops::GluKind::geglu}) {
    Tensor gu32 = random_tensor({N, 2 * F}, f.rng, -9, 9, DType::f32), d32 = random_tensor({N, F}, f.rng, -1, 1, DType::f32);
    Tensor gu64 = gu32.to(DType::f64), d64 = d32.to(DType::f64);
    Tensor o32 = Tensor::empty({N, F}, DType::f32), o64 = Tensor::empty({N, F}, DType::f64);
    ops::glu_forward(f.ctx, o32, gu32, kind);
    ops::glu_forward(f.ctx, o64, gu64, kind);
    INFO((kind == ops::GluKind::swiglu ? "swiglu" : "geglu"));
    CHECK(max_rel_diff(o32, o64) < 5e-6);
    Tensor g32 = Tensor::empty({N, 2 * F}, DType::f32), g64 = Tensor::empty({N, 2 * F}, DType::f64);
    ops::glu_backward(f.ctx, g32, d32, gu32, kind);
    ops::glu_backward(f.ctx, g64, d64, gu64, kind);
    // GeGLU: fp32 tanh's absolute error (~1e-7) grows with x * du * up (gate and up up to 9).
    CHECK(max_rel_diff(g32, g64) < (kind == ops::GluKind::swiglu ? 2e-6 : 5e-5));
  }
}

TEST_CASE("the elementwise family ops' bits do not depend on where a row lies in memory", "[kernels][family]") {
  // A vectorised loop and its scalar tail must compute the same bits (kernels/CMakeLists.txt: no FMA
  // contraction in these files), or an element's result would depend on its row's alignment.
  Fixture f;
  const int64_t N = 9, C = 203;
  auto shifted = [](const Tensor& t) {  // a copy of t one element further into a buffer
    Tensor buf = Tensor::empty({t.numel() + 1}, t.dtype());
    Tensor s = buf.rows(1, t.numel() + 1).view(t.shape());
    s.copy_from(t);
    return s;
  };
  Tensor x = random_tensor({N, 2 * C}, f.rng, -3, 3, DType::f32), dy = random_tensor({N, C}, f.rng, -1, 1, DType::f32);
  Tensor wt = random_tensor({2 * C}, f.rng, -1, 1, DType::f32);
  Tensor xs = shifted(x), dys = shifted(dy);
  for (ops::GluKind kind : {ops::GluKind::swiglu, ops::GluKind::geglu}) {
    Tensor o = Tensor::empty({N, C}), os = shifted(o), g = Tensor::empty({N, 2 * C}), gs = shifted(g);
    ops::glu_forward(f.ctx, o, x, kind);
    ops::glu_forward(f.ctx, os, xs, kind);
    ops::glu_backward(f.ctx, g, dy, x, kind);
    ops::glu_backward(f.ctx, gs, dys, xs, kind);
    CHECK(bitwise_equal(o, os));
    CHECK(bitwise_equal(g, gs));
  }
  Tensor y = Tensor::empty({N, 2 * C}), ys = shifted(y), r = Tensor::empty({N}), rs = Tensor::empty({N});
  ops::rmsnorm_forward(f.ctx, y, r, x, wt, 1e-5);
  ops::rmsnorm_forward(f.ctx, ys, rs, xs, wt, 1e-5);
  CHECK(bitwise_equal(y, ys));
  Tensor dx = Tensor::zeros({N, 2 * C}), dxs = shifted(dx), dw = Tensor::zeros({2 * C}), dws = Tensor::zeros({2 * C});
  ops::rmsnorm_backward(f.ctx, dx, dw, y, x, wt, r);
  ops::rmsnorm_backward(f.ctx, dxs, dws, ys, xs, wt, rs);
  CHECK(bitwise_equal(dx, dxs));
  CHECK(bitwise_equal(dw, dws));
  for (bool interleaved : {false, true}) {
    ops::RotaryParams p;
    p.rotary_dim = 202;  // of each head's 203 dims: 101 pairs, a loop with a tail
    p.interleaved = interleaved;
    Tensor a = x.clone().view({1, N, 2 * C}), as = shifted(a);
    ops::rotary_forward(f.ctx, a, 0, 2, C, p);
    ops::rotary_forward(f.ctx, as, 0, 2, C, p);
    CHECK(bitwise_equal(a, as));
  }
}
