// AdamW fused over a partition on the device (kernels/cuda/cuda_ops.hpp): one pass reads the
// parameter, gradient and both moments and writes the three updated ones, in f32 registers, with
// the CPU's formula (kernels/cpu/optimizer.cpp): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr wd p + (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace troupe::cuda {

namespace {

struct AdamConstants {
  float b1, b2, one_b1, one_b2, step_size, inv_sqrt_bc2, eps, decay;
};

template <class P, class G, class M>
__global__ void adamw_kernel(P* p, const G* g, M* m, M* v, int64_t n, AdamConstants c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float gi = ld(g, i);
    const float mi = c.b1 * ld(m, i) + c.one_b1 * gi;
    const float vi = c.b2 * ld(v, i) + c.one_b2 * gi * gi;
    st(m, i, mi);
    st(v, i, vi);
    const float pi = ld(p, i);
    st(p, i, pi - c.decay * pi - c.step_size * mi / (sqrtf(vi) * c.inv_sqrt_bc2 + c.eps));
  }
}

}  // namespace

void adamw_update(Context& ctx, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const ops::AdamWParams& hp) {
  check_device(ctx, {&param, &grad, &exp_avg, &exp_avg_sq}, "adamw: device tensors on a CUDA context");
  const int64_t n = param.numel();
  TROUPE_CHECK(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n, "adamw: shapes");
  TROUPE_CHECK(exp_avg.dtype() == exp_avg_sq.dtype(), "adamw: both moments share a dtype on the CUDA backend");
  TROUPE_CHECK(hp.step >= 1, "adamw: step is 1-based");
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  AdamConstants c{static_cast<float>(hp.beta1),      static_cast<float>(hp.beta2),
                  static_cast<float>(1.0 - hp.beta1), static_cast<float>(1.0 - hp.beta2),
                  static_cast<float>(hp.lr / bc1),   static_cast<float>(1.0 / std::sqrt(bc2)),
                  static_cast<float>(hp.eps),        static_cast<float>(hp.lr * hp.weight_decay)};
  with_type(param.dtype(), "adamw", [&](auto pt) {
    using P = decltype(pt);
    with_type(grad.dtype(), "adamw", [&](auto gt) {
      using G = decltype(gt);
      with_type(exp_avg.dtype(), "adamw", [&](auto mt) {
        using M = decltype(mt);
        adamw_kernel<P, G, M><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(
            dptr<P>(param), dptr<G>(grad), dptr<M>(exp_avg), dptr<M>(exp_avg_sq), n, c);
      });
    });
  });
  TROUPE_CUDA_LAUNCHED("adamw");
}

}  // namespace troupe::cuda
