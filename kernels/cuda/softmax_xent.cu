// Fused softmax + cross-entropy over the vocabulary on the device (kernels/cuda/cuda_ops.hpp), with
// the CPU's arithmetic (kernels/cpu/softmax_xent.cpp): the row maximum over the real columns [0,
// valid) (exact in any order), exp(logit - max) in f32, their sum in double; loss = max + log(sum) -
// logit[target] in double; the gradient grad_scale * (softmax - onehot) written over the logits in
// place: exp(logit - max) * f32(grad_scale / sum), minus f32(grad_scale) at the target, 0 in the
// padding columns [valid, Vp).
//
// One block per row, three passes over it (max, sum, gradient): exp(logit - max) is recomputed in
// the third pass rather than kept in the logits, so a 16-bit row is rounded once (the gradient), as
// the CPU's 16-bit layer does; without a gradient the logits are left as they were. The block sums
// run in a fixed order (each thread's strided columns, then block_sum over a fixed kXentRowThreads threads):
// deterministic.
//
// The CPU stops on a target outside [0, valid); a kernel cannot, so that row's loss is NaN (and its
// gradient NaN over the real columns), which the loss and the overflow check (count_nonfinite) show.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace troupe::cuda {

namespace {

#define ROW_STRIDE(j, n) for (int64_t j = threadIdx.x; j < (n); j += blockDim.x)

template <class T, class L>
__global__ void softmax_xent_kernel(L* losses, T* logits, const int32_t* targets, int64_t Vp, int64_t valid,
                                    double grad_scale) {
  __shared__ float fshared[32];
  __shared__ double dshared[32];
  const int64_t n = blockIdx.x;
  T* row = logits + n * Vp;
  const int64_t target = targets[n];
  const bool bad = target < 0 || target >= valid;
  // Read before the gradient pass overwrites it: the block reductions in between synchronise.
  const float target_logit = threadIdx.x == 0 && !bad ? ld(row, target) : 0.0f;
  float m = -INFINITY;
  ROW_STRIDE(j, valid) m = fmaxf(m, ld(row, j));
  const float mx = block_max(m, fshared);
  double s = 0;
  ROW_STRIDE(j, valid) s += static_cast<double>(expf(ld(row, j) - mx));
  const double sum = block_sum(s, dshared);
  if (threadIdx.x == 0) {
    const double loss = bad ? static_cast<double>(NAN)
                            : static_cast<double>(mx) + log(sum) - static_cast<double>(target_logit);
    st(losses, n, static_cast<float>(loss));
  }
  if (grad_scale == 0.0) return;
  const float factor = static_cast<float>(grad_scale / sum), scale = static_cast<float>(grad_scale);
  // Each thread reads and writes only its own columns, after every thread's max and sum passes.
  ROW_STRIDE(j, Vp) {
    float g = 0.0f;
    if (j < valid) {
      // __fmul_rn: never contracted with the subtraction below, as the CPU's two roundings.
      g = bad ? NAN : __fmul_rn(expf(ld(row, j) - mx), factor);
      if (j == target) g -= scale;
    }
    st(row, j, g);
  }
}

}  // namespace

void softmax_cross_entropy(Context& ctx, const Tensor& losses, const Tensor& logits, const Tensor& targets,
                           int64_t valid, double grad_scale) {
  check_device(ctx, {&losses, &logits, &targets}, "softmax_cross_entropy: device tensors on a CUDA context");
  const int64_t Vp = logits.dim(-1);
  TROUPE_CHECK(Vp > 0, "softmax_cross_entropy: logits are (N,Vp), Vp > 0");
  const int64_t N = logits.numel() / Vp;
  TROUPE_CHECK(losses.numel() == N && targets.numel() == N, "softmax_cross_entropy: shapes");
  TROUPE_CHECK(valid > 0 && valid <= Vp, "softmax_cross_entropy: 0 < valid <= Vp");
  TROUPE_CHECK(targets.dtype() == DType::i32, "softmax_cross_entropy: targets are i32");
  TROUPE_CHECK(N <= INT32_MAX, "softmax_cross_entropy: fewer than 2^31 rows (one block each)");
  if (N == 0) return;
  with_type(logits.dtype(), "softmax_cross_entropy", [&](auto lt) {
    using T = decltype(lt);
    with_same_or_f32<T>(losses, "softmax_cross_entropy: losses are f32 or the logits' dtype", [&](auto ls) {
      using L = decltype(ls);
      softmax_xent_kernel<T, L><<<static_cast<unsigned>(N), kXentRowThreads, 0, stream_of(ctx)>>>(
          dptr<L>(losses), dptr<T>(logits), dptr<int32_t>(targets), Vp, valid, grad_scale);
    });
  });
  TROUPE_CUDA_LAUNCHED("softmax_cross_entropy");
}

}  // namespace troupe::cuda
