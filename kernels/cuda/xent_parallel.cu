// The vocabulary-parallel cross-entropy's pieces on the device (kernels/ops.hpp, "in pieces";
// kernels/cuda/cuda_ops.hpp): the caller all-reduces the f64 row statistics over the tensor-parallel
// group between them. One block per row; the maximum is order-free, the sums run in a fixed order
// (each thread's strided columns, then the block's threads in order), so results never change.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace troupe::cuda {

namespace {

template <class T>
__global__ void local_stats_kernel(double* row_max, double* target_logit, const T* logits, const int32_t* targets,
                                   int64_t Vl, int64_t vocab_begin, int64_t valid) {
  __shared__ double shared[32];
  const int64_t n = blockIdx.x;
  const T* row = logits + n * Vl;
  double m = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) m = fmax(m, double(ld(row, j)));
  m = block_max(m, shared);
  if (threadIdx.x == 0) {
    row_max[n] = m;
    const int64_t t = int64_t{targets[n]} - vocab_begin;
    target_logit[n] = t >= 0 && t < valid ? double(ld(row, t)) : 0.0;
  }
}

template <class T>
__global__ void exp_sum_kernel(double* sum_exp, T* logits, const double* row_max, int64_t Vl, int64_t valid) {
  __shared__ double shared[32];
  const int64_t n = blockIdx.x;
  T* row = logits + n * Vl;
  const float m = static_cast<float>(row_max[n]);
  double s = 0;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
    const float e = expf(ld(row, j) - m);
    st(row, j, e);
    s += e;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) sum_exp[n] = s;
}

template <class T>
__global__ void loss_kernel(T* losses, const double* row_max, const double* sum_exp, const double* target_logit,
                            int64_t N) {
  const int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (n < N) st(losses, n, static_cast<float>(row_max[n] + log(sum_exp[n]) - target_logit[n]));
}

template <class T>
__global__ void backward_kernel(T* logits, const double* row_max, const double* sum_exp, const int32_t* targets,
                                int64_t Vl, int64_t vocab_begin, int64_t valid, double grad_scale) {
  const int64_t n = blockIdx.x;
  T* row = logits + n * Vl;
  const float m = static_cast<float>(row_max[n]), factor = static_cast<float>(grad_scale / sum_exp[n]);
  const int64_t t = int64_t{targets[n]} - vocab_begin;
  for (int64_t j = threadIdx.x; j < Vl; j += blockDim.x) {
    float g = 0;
    if (j < valid) {
      // Rounded multiply, then subtract: no fused multiply-add, so one shard gives the fused op's bits.
      g = __fmul_rn(expf(ld(row, j) - m), factor);
      if (j == t) g = __fsub_rn(g, static_cast<float>(grad_scale));
    }
    st(row, j, g);
  }
}

void check_rows(const Tensor& t, int64_t N, const char* what) {
  TROUPE_CHECK(t.dtype() == DType::f64 && t.numel() == N, what);
}

}  // namespace

void xent_local_stats(Context& ctx, const Tensor& row_max, const Tensor& target_logit, const Tensor& logits,
                      const Tensor& targets, int64_t vocab_begin, int64_t valid) {
  check_device(ctx, {&row_max, &target_logit, &logits, &targets}, "xent: device tensors on a CUDA context");
  const int64_t Vl = logits.dim(-1), N = logits.numel() / Vl;
  TROUPE_CHECK(valid >= 0 && valid <= Vl && targets.numel() == N && targets.dtype() == DType::i32,
               "xent: logits (N,Vl), targets (N) i32, 0 <= valid <= Vl");
  check_rows(row_max, N, "xent: row_max is (N) f64");
  check_rows(target_logit, N, "xent: target_logit is (N) f64");
  if (N == 0) return;
  with_type(logits.dtype(), "xent", [&](auto tag) {
    using T = decltype(tag);
    local_stats_kernel<T><<<static_cast<unsigned>(N), kXentRowThreads, 0, stream_of(ctx)>>>(
        dptr<double>(row_max), dptr<double>(target_logit), dptr<T>(logits), dptr<int32_t>(targets), Vl, vocab_begin,
        valid);
  });
  TROUPE_CUDA_LAUNCHED("xent local stats");
}

void xent_exp_sum(Context& ctx, const Tensor& sum_exp, const Tensor& logits, const Tensor& row_max, int64_t valid) {
  check_device(ctx, {&sum_exp, &logits, &row_max}, "xent: device tensors on a CUDA context");
  const int64_t Vl = logits.dim(-1), N = logits.numel() / Vl;
  TROUPE_CHECK(valid >= 0 && valid <= Vl, "xent: 0 <= valid <= Vl");
  check_rows(sum_exp, N, "xent: sum_exp is (N) f64");
  check_rows(row_max, N, "xent: row_max is (N) f64");
  if (N == 0) return;
  with_type(logits.dtype(), "xent", [&](auto tag) {
    using T = decltype(tag);
    exp_sum_kernel<T><<<static_cast<unsigned>(N), kXentRowThreads, 0, stream_of(ctx)>>>(
        dptr<double>(sum_exp), dptr<T>(logits), dptr<double>(row_max), Vl, valid);
  });
  TROUPE_CUDA_LAUNCHED("xent exp sum");
}

void xent_loss(Context& ctx, const Tensor& losses, const Tensor& row_max, const Tensor& sum_exp,
               const Tensor& target_logit) {
  check_device(ctx, {&losses, &row_max, &sum_exp, &target_logit}, "xent: device tensors on a CUDA context");
  const int64_t N = losses.numel();
  check_rows(row_max, N, "xent: row_max is (N) f64");
  check_rows(sum_exp, N, "xent: sum_exp is (N) f64");
  check_rows(target_logit, N, "xent: target_logit is (N) f64");
  if (N == 0) return;
  with_type(losses.dtype(), "xent", [&](auto tag) {
    using T = decltype(tag);
    loss_kernel<T><<<blocks_for(N), kThreads, 0, stream_of(ctx)>>>(dptr<T>(losses), dptr<double>(row_max),
                                                                    dptr<double>(sum_exp), dptr<double>(target_logit), N);
  });
  TROUPE_CUDA_LAUNCHED("xent loss");
}

void xent_backward(Context& ctx, const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                   const Tensor& targets, int64_t vocab_begin, int64_t valid, double grad_scale) {
  check_device(ctx, {&logits, &row_max, &sum_exp, &targets}, "xent: device tensors on a CUDA context");
  const int64_t Vl = logits.dim(-1), N = logits.numel() / Vl;
  TROUPE_CHECK(valid >= 0 && valid <= Vl && targets.numel() == N && targets.dtype() == DType::i32,
               "xent backward: logits (N,Vl), targets (N) i32, 0 <= valid <= Vl");
  check_rows(row_max, N, "xent: row_max is (N) f64");
  check_rows(sum_exp, N, "xent: sum_exp is (N) f64");
  if (N == 0) return;
  with_type(logits.dtype(), "xent backward", [&](auto tag) {
    using T = decltype(tag);
    backward_kernel<T><<<static_cast<unsigned>(N), kXentRowThreads, 0, stream_of(ctx)>>>(
        dptr<T>(logits), dptr<double>(row_max), dptr<double>(sum_exp), dptr<int32_t>(targets), Vl, vocab_begin, valid,
        grad_scale);
  });
  TROUPE_CUDA_LAUNCHED("xent backward");
}

}  // namespace troupe::cuda
