// The CUDA backend's LayerNorm, RMSNorm and fused softmax + cross-entropy against the CPU backend
// (label gpu: skipped without a GPU), in f32, bf16 and f16, on odd sizes: rows that are not a warp
// multiple (C 37, 769), one row, and more rows than one chunk of the parameter-gradient partial sums
// (N 200 > 64), so the chunks' order is exercised. The bounds are those of
// tests/kernels/cuda_test_util.hpp. Parameter gradients and dx start random (they accumulate);
// statistics are f32 beside the 16-bit activations, those the backward reads computed by the CPU's
// f32 forward from the unrounded x.
#include <cstring>

#include "tests/kernels/cuda_test_util.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

Tensor f32(CrossFixture& f, const Shape& s, double lo = -1, double hi = 1) {
  return random_tensor(s, f.rng, lo, hi, DType::f32);
}

struct Rows {
  int64_t N, C;
};
const Rows kNormSizes[] = {{7, 37}, {33, 769}, {1, 1000}, {200, 129}};
constexpr double kEps = 1e-5;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("cuda ops: LayerNorm forward and backward (full and split) equal the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  for (DType h : kCrossTypes) {
    for (Rows d : kNormSizes) {
      const int64_t N = d.N, C = d.C;
      INFO(dtype_name(h) << " N " << N << " C " << C);
      // Forward: weight and bias in the call's type, then f32 beside 16-bit activations.
      for (bool f32_params : {false, true}) {
        INFO("f32 weight and bias " << f32_params);
        run_cross(f, h,
                  {xout(f32(f, {N, C})), xout(f32(f, {N}), false), xout(f32(f, {N}), false),
                   xin(f32(f, {N, C}, -2, 2)), xin(f32(f, {C}, 0.5, 1.5), !f32_params), xin(f32(f, {C}), !f32_params)},
                  [](Context& c, const XArgs& a) {
                    ops::layernorm_forward(c, a[0], a[1], a[2], a[3], a[4], a[5], kEps);
                  });
      }
      // The backward's statistics: the CPU's f32 forward on the unrounded x.
      const Tensor x = f32(f, {N, C}, -2, 2), w = f32(f, {C}, 0.5, 1.5), mean = Tensor::zeros({N}),
                   rstd = Tensor::zeros({N});
      ops::layernorm_forward(f.cpu, Tensor::zeros({N, C}), mean, rstd, x, w, f32(f, {C}), kEps);
      // Full: dx, dweight, dbias accumulated; the parameter gradients in the call's type and in f32.
      for (bool f32_grads : {false, true}) {
        INFO("f32 dweight and dbias " << f32_grads);
        run_cross(f, h,
                  {xout(f32(f, {N, C})), xout(f32(f, {C}), !f32_grads), xout(f32(f, {C}), !f32_grads),
                   xin(f32(f, {N, C})), xin(x), xin(w), xin(mean, false), xin(rstd, false)},
                  [](Context& c, const XArgs& a) {
                    ops::layernorm_backward(c, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
                  });
      }
      // The split halves: dx alone; dweight and dbias alone (without the weight), into f32.
      run_cross(f, h, {xout(f32(f, {N, C})), xin(f32(f, {N, C})), xin(x), xin(w), xin(mean, false), xin(rstd, false)},
                [](Context& c, const XArgs& a) {
                  ops::layernorm_backward(c, a[0], Tensor(), Tensor(), a[1], a[2], a[3], a[4], a[5]);
                });
      for (bool f32_grads : {false, true}) {
        run_cross(f, h,
                  {xout(f32(f, {C}), !f32_grads), xout(f32(f, {C}), !f32_grads), xin(f32(f, {N, C})), xin(x),
                   xin(mean, false), xin(rstd, false)},
                  [](Context& c, const XArgs& a) {
                    ops::layernorm_backward(c, Tensor(), a[0], a[1], a[2], a[3], Tensor(), a[4], a[5]);
                  });
      }
    }
  }
}

TEST_CASE("cuda ops: RMSNorm forward and backward (full and split) equal the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  for (DType h : kCrossTypes) {
    for (Rows d : kNormSizes) {
      const int64_t N = d.N, C = d.C;
      INFO(dtype_name(h) << " N " << N << " C " << C);
      for (bool f32_weight : {false, true}) {
        INFO("f32 weight " << f32_weight);
        run_cross(f, h,
                  {xout(f32(f, {N, C})), xout(f32(f, {N}), false), xin(f32(f, {N, C}, -2, 2)),
                   xin(f32(f, {C}, 0.5, 1.5), !f32_weight)},
                  [](Context& c, const XArgs& a) { ops::rmsnorm_forward(c, a[0], a[1], a[2], a[3], kEps); });
      }
      const Tensor x = f32(f, {N, C}, -2, 2), w = f32(f, {C}, 0.5, 1.5), rstd = Tensor::zeros({N});
      ops::rmsnorm_forward(f.cpu, Tensor::zeros({N, C}), rstd, x, w, kEps);
      for (bool f32_grads : {false, true}) {
        INFO("f32 dweight " << f32_grads);
        run_cross(f, h,
                  {xout(f32(f, {N, C})), xout(f32(f, {C}), !f32_grads), xin(f32(f, {N, C})), xin(x), xin(w),
                   xin(rstd, false)},
                  [](Context& c, const XArgs& a) { ops::rmsnorm_backward(c, a[0], a[1], a[2], a[3], a[4], a[5]); });
      }
      run_cross(f, h, {xout(f32(f, {N, C})), xin(f32(f, {N, C})), xin(x), xin(w), xin(rstd, false)},
                [](Context& c, const XArgs& a) { ops::rmsnorm_backward(c, a[0], Tensor(), a[1], a[2], a[3], a[4]); });
      for (bool f32_grads : {false, true}) {
        run_cross(f, h, {xout(f32(f, {C}), !f32_grads), xin(f32(f, {N, C})), xin(x), xin(rstd, false)},
                  [](Context& c, const XArgs& a) {
                    ops::rmsnorm_backward(c, Tensor(), a[0], a[1], a[2], Tensor(), a[3]);
                  });
      }
    }
  }
}

TEST_CASE("cuda ops: the norms' parameter gradients are the same bits run after run, split or full", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  const int64_t N = 517, C = 769;  // 9 chunks of rows, the last one partial
  const Tensor x = f32(f, {N, C}, -2, 2), w = f32(f, {C}, 0.5, 1.5), dout = f32(f, {N, C}), mean = Tensor::zeros({N}),
               rstd = Tensor::zeros({N}), rms = Tensor::zeros({N});
  ops::layernorm_forward(f.cpu, Tensor::zeros({N, C}), mean, rstd, x, w, f32(f, {C}), kEps);
  ops::rmsnorm_forward(f.cpu, Tensor::zeros({N, C}), rms, x, w, kEps);
  const Tensor dw0 = f32(f, {C}), db0 = f32(f, {C}), dx0 = f32(f, {N, C});
  Context& g = f.gpu->ctx();
  const Tensor xd = to_device(x), wd = to_device(w), doutd = to_device(dout), meand = to_device(mean),
               rstdd = to_device(rstd), rmsd = to_device(rms);
  // Layernorm: two full calls and the two halves apart give the same bits.
  std::vector<Tensor> dws, dbs, dxs;
  for (int run = 0; run < 3; ++run) {
    const Tensor dw = to_device(dw0), db = to_device(db0), dx = to_device(dx0);
    if (run < 2) {
      ops::layernorm_backward(g, dx, dw, db, doutd, xd, wd, meand, rstdd);
    } else {
      ops::layernorm_backward(g, Tensor(), dw, db, doutd, xd, Tensor(), meand, rstdd);
      ops::layernorm_backward(g, dx, Tensor(), Tensor(), doutd, xd, wd, meand, rstdd);
    }
    REQUIRE(f.gpu->synchronize().is_ok());
    dws.push_back(to_host(dw));
    dbs.push_back(to_host(db));
    dxs.push_back(to_host(dx));
  }
  for (int run = 1; run < 3; ++run) {
    INFO("layernorm run " << run);
    CHECK(same_bits(dws[run], dws[0]));
    CHECK(same_bits(dbs[run], dbs[0]));
    CHECK(same_bits(dxs[run], dxs[0]));
  }
  dws.clear();
  dxs.clear();
  for (int run = 0; run < 3; ++run) {
    const Tensor dw = to_device(dw0), dx = to_device(dx0);
    if (run < 2) {
      ops::rmsnorm_backward(g, dx, dw, doutd, xd, wd, rmsd);
    } else {
      ops::rmsnorm_backward(g, Tensor(), dw, doutd, xd, Tensor(), rmsd);
      ops::rmsnorm_backward(g, dx, Tensor(), doutd, xd, wd, rmsd);
    }
    REQUIRE(f.gpu->synchronize().is_ok());
    dws.push_back(to_host(dw));
    dxs.push_back(to_host(dx));
  }
  for (int run = 1; run < 3; ++run) {
    INFO("rmsnorm run " << run);
    CHECK(same_bits(dws[run], dws[0]));
    CHECK(same_bits(dxs[run], dxs[0]));
  }
}

TEST_CASE("cuda ops: fused softmax + cross-entropy, with and without the gradient, equals the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  struct Vocab {
    int64_t N, Vp, valid;
  };
  for (DType h : kCrossTypes) {
    for (Vocab v : {Vocab{9, 53, 50}, Vocab{3, 50311, 50300}, Vocab{4, 37, 37}}) {
      INFO(dtype_name(h) << " N " << v.N << " Vp " << v.Vp << " valid " << v.valid);
      const Tensor targets = random_tokens(f.rng, v.N, v.valid);
      const double scale = 1.0 / static_cast<double>(v.N);
      // The gradient in place (compared, padding columns included), f32 losses and losses in the call's type.
      for (bool narrow_losses : {false, true}) {
        INFO("losses in the call's type " << narrow_losses);
        run_cross(f, h, {xout(f32(f, {v.N}), narrow_losses), xout(f32(f, {v.N, v.Vp}, -3, 3)), xin(targets, false)},
                  [&](Context& c, const XArgs& a) {
                    ops::softmax_cross_entropy(c, a[0], a[1], a[2], v.valid, scale);
                  });
      }
      // No gradient: only the losses are results (the logits are left as scratch).
      run_cross(f, h, {xout(f32(f, {v.N}), false), xin(f32(f, {v.N, v.Vp}, -3, 3)), xin(targets, false)},
                [&](Context& c, const XArgs& a) { ops::softmax_cross_entropy(c, a[0], a[1], a[2], v.valid, 0.0); });
    }
  }
}

TEST_CASE("cuda ops: the vocabulary-parallel pieces with one shard give the fused cross-entropy's bits",
          "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  Context& g = f.gpu->ctx();
  const int64_t N = 5, Vp = 50311, valid = 50300;
  const double scale = 0.2;
  for (DType h : kCrossTypes) {
    INFO(dtype_name(h));
    const Tensor logits = f32(f, {N, Vp}, -3, 3).to(h), targets = to_device(random_tokens(f.rng, N, valid));
    const Tensor fused = to_device(logits), raw = to_device(logits), scratch = to_device(logits);
    const Tensor loss_fused = to_device(Tensor::zeros({N})), loss_pieces = to_device(Tensor::zeros({N}));
    const Tensor row_max = to_device(Tensor::zeros({N}, DType::f64)),
                 target_logit = to_device(Tensor::zeros({N}, DType::f64)),
                 sum_exp = to_device(Tensor::zeros({N}, DType::f64));
    ops::softmax_cross_entropy(g, loss_fused, fused, targets, valid, scale);
    ops::xent_local_stats(g, row_max, target_logit, raw, targets, 0, valid);
    ops::xent_exp_sum(g, sum_exp, scratch, row_max, valid);
    ops::xent_loss(g, loss_pieces, row_max, sum_exp, target_logit);
    ops::xent_backward(g, raw, row_max, sum_exp, targets, 0, valid, scale);
    REQUIRE(f.gpu->synchronize().is_ok());
    CHECK(same_bits(to_host(loss_pieces), to_host(loss_fused)));
    CHECK(same_bits(to_host(raw), to_host(fused)));
  }
}
