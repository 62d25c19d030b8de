// The CUDA backend's flash-style attention against the CPU's, forward and backward, with grouped
// queries, ALiBi and dropout (label gpu: skipped without a GPU). The CPU keeps the (B,H,T,T) softmax
// for its backward, the GPU the rows' log-sum-exp (ops::attention_saved_tensor); under 16 bits the
// CPU's stored probabilities are rounded to 16 bits and the GPU recomputes them in f32, so the
// backward's bound is 8 rounding units there (the forward's: 2, like every op).
#include "tests/kernels/cuda_test_util.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {
struct Case {
  int64_t B, T, H, G, hs;
  bool alibi;
  double p;
  int64_t head0;
};
}  // namespace

TEST_CASE("cuda ops: attention forward and backward equal the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  const Case cases[] = {{2, 13, 4, 2, 16, false, 0, 0}, {1, 67, 3, 3, 24, true, 0, 0}, {2, 5, 4, 1, 8, false, 0.1, 1},
                        {1, 129, 2, 1, 64, true, 0.2, 3}, {1, 9, 2, 2, 128, false, 0, 0}};
  for (DType h : kCrossTypes) {
    for (const Case& c : cases) {
      INFO(dtype_name(h) << " B " << c.B << " T " << c.T << " H " << c.H << " G " << c.G << " hs " << c.hs
                         << (c.alibi ? " alibi" : "") << " p " << c.p);
      ops::AttentionLayout layout;
      layout.n_head = static_cast<int>(c.H);
      layout.n_group = static_cast<int>(c.G);
      layout.head_dim = static_cast<int>(c.hs);
      if (c.alibi) {
        const auto all = ops::alibi_slopes(static_cast<int>(c.H + c.head0));
        layout.alibi_slopes.assign(all.begin() + c.head0, all.end());
      }
      DropoutMask mask;
      mask.p = c.p;
      mask.seed = 0x1234567890ull;
      mask.stream = 5;
      mask.iteration = 3;
      mask.first_sample = 11;
      const int64_t W = (c.H + 2 * c.G) * c.hs;
      const Tensor qkv = random_tensor({c.B, c.T, W}, f.rng, -2, 2, DType::f32);
      const Tensor dout = random_tensor({c.B, c.T, c.H * c.hs}, f.rng, -1, 1, DType::f32);
      run_cross(f, h, {xin(qkv), xout(Tensor::zeros({c.B, c.T, c.H * c.hs}))}, [&](Context& x, const XArgs& a) {
        Tensor saved = ops::attention_saved_tensor(x, c.B, c.H, c.T, a[0].dtype());
        ops::attention_forward(x, a[1], saved, a[0], layout, mask, c.head0);
      });
      run_cross(f, h, {xin(qkv), xin(dout), xout(Tensor::zeros({c.B, c.T, W}))},
                [&](Context& x, const XArgs& a) {
                  Tensor saved = ops::attention_saved_tensor(x, c.B, c.H, c.T, a[0].dtype());
                  Tensor out = x.device == Device::cuda ? to_device(Tensor::zeros({c.B, c.T, c.H * c.hs}, a[0].dtype()))
                                                        : Tensor::zeros({c.B, c.T, c.H * c.hs}, a[0].dtype());
                  ops::attention_forward(x, out, saved, a[0], layout, mask, c.head0);
                  ops::attention_backward(x, a[2], a[1], a[0], saved, layout, mask, c.head0);
                },
                h == DType::f32 ? 1 : 4);
    }
  }
}
