// Causal self-attention on the device (kernels/cuda/cuda_ops.hpp), flash-style: no (T, T) matrix is
// ever in memory. The forward keeps each query row's log-sum-exp L_i (B, H, T) f32 for the backward
// (ops::attention_saved_tensor), and an online softmax over the key rows j <= i:
//   s_ij = q_i.k_j / sqrt(hs) + slope_h (j - i);  P_ij = exp(s_ij - L_i);  out_i = sum_j P_ij f_ij v_j
// with f_ij the dropout factor of probability (b, h, i, j) (kernels/dropout.hpp's rule, regenerated
// from Philox, as on the CPU). The backward recomputes P from L:
//   D_i = sum_j P_ij dP_ij,  dP_ij = f_ij dout_i.v_j,  dS_ij = P_ij (dP_ij - D_i)
//   dq_i = scale sum_j dS_ij k_j   (one thread per query row, j in order)
//   dk_j = scale sum_{h in g, i >= j} dS_ij q_i,  dv_j = sum_{h in g, i >= j} P_ij f_ij dout_i
//                                   (one thread per key row of a group: its query heads, then rows,
//                                    in order; no atomics, so the result never changes)
// Grouped-query attention: query head h reads key/value group h / (H / G).
//
// This first version is the reference shape of the algorithm: one thread per row with its head_dim
// accumulators in registers / local memory, rows read from global memory through the caches. It
// computes what the CPU does (tests/kernels/test_cuda_attention.cpp); the tiled tensor-core
// version (shared-memory tiles of K and V, mma) replaces the loops once it can be measured on a GPU.
#include <cmath>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device_memory.hpp"

namespace troupe::cuda {

namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kRowThreads = 128;

struct AttnArgs {
  int64_t B, T, H, G, hs;
  float scale;
  const float* slopes;  // H slopes on the device, or null
  DeviceDropout drop;
  int64_t head0;
};

// The dropout factor of probability (b, h, i, j): element ((head0 + h) T + i) T + j of its sample.
__device__ float drop_factor(const AttnArgs& a, int64_t b, int64_t h, int64_t i, int64_t j) {
  return dropout_factor(a.drop, b, ((a.head0 + h) * a.T + i) * a.T + j);
}

template <class T>
__device__ float dot_row(const T* x, const float* y, int64_t n) {
  float s = 0;
  for (int64_t d = 0; d < n; ++d) s += ld(x, d) * y[d];
  return s;
}

__device__ float score(const AttnArgs& a, float qk, int64_t h, int64_t i, int64_t j) {
  float s = a.scale * qk;
  if (a.slopes != nullptr) s += a.slopes[h] * float(j - i);
  return s;
}

// One thread per (b, h, i).
template <class T>
__global__ void attention_forward_kernel(T* out, float* lse, const T* qkv, AttnArgs a) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= a.B * a.H * a.T) return;
  const int64_t i = idx % a.T, h = (idx / a.T) % a.H, b = idx / (a.T * a.H);
  const int64_t W = (a.H + 2 * a.G) * a.hs, g = h / (a.H / a.G);
  const T* base = qkv + b * a.T * W;
  float q[kMaxHeadDim], acc[kMaxHeadDim];
  for (int64_t d = 0; d < a.hs; ++d) {
    q[d] = ld(base + i * W + h * a.hs, d);
    acc[d] = 0;
  }
  float m = -INFINITY, l = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const T* k = base + j * W + a.H * a.hs + g * a.hs;
    const float s = score(a, dot_row(k, q, a.hs), h, i, j);
    if (s > m) {
      const float corr = expf(m - s);  // 0 at the first key (m = -inf)
      l *= corr;
      for (int64_t d = 0; d < a.hs; ++d) acc[d] *= corr;
      m = s;
    }
    const float p = expf(s - m);
    l += p;
    const float f = drop_factor(a, b, h, i, j);
    if (f != 0.0f) {
      const T* v = k + a.G * a.hs;
      for (int64_t d = 0; d < a.hs; ++d) acc[d] += p * f * ld(v, d);
    }
  }
  const float inv = 1.0f / l;
  T* o = out + (b * a.T + i) * a.H * a.hs + h * a.hs;
  for (int64_t d = 0; d < a.hs; ++d) st(o, d, acc[d] * inv);
  lse[idx] = m + logf(l);
}

// One thread per (b, h, i): D_i, then dq_i; D goes to `dsum` for the key-row kernel.
template <class T>
__global__ void attention_dq_kernel(T* dqkv, float* dsum, const T* dout, const T* qkv, const float* lse, AttnArgs a) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= a.B * a.H * a.T) return;
  const int64_t i = idx % a.T, h = (idx / a.T) % a.H, b = idx / (a.T * a.H);
  const int64_t W = (a.H + 2 * a.G) * a.hs, g = h / (a.H / a.G);
  const T* base = qkv + b * a.T * W;
  float q[kMaxHeadDim], dO[kMaxHeadDim], dq[kMaxHeadDim];
  const T* dor = dout + (b * a.T + i) * a.H * a.hs + h * a.hs;
  for (int64_t d = 0; d < a.hs; ++d) {
    q[d] = ld(base + i * W + h * a.hs, d);
    dO[d] = ld(dor, d);
    dq[d] = 0;
  }
  const float L = lse[idx];
  float D = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const T* k = base + j * W + a.H * a.hs + g * a.hs;
    const float p = expf(score(a, dot_row(k, q, a.hs), h, i, j) - L);
    D += p * drop_factor(a, b, h, i, j) * dot_row(k + a.G * a.hs, dO, a.hs);
  }
  for (int64_t j = 0; j <= i; ++j) {
    const T* k = base + j * W + a.H * a.hs + g * a.hs;
    const float p = expf(score(a, dot_row(k, q, a.hs), h, i, j) - L);
    const float dp = drop_factor(a, b, h, i, j) * dot_row(k + a.G * a.hs, dO, a.hs);
    const float ds = p * (dp - D);
    for (int64_t d = 0; d < a.hs; ++d) dq[d] += ds * ld(k, d);
  }
  T* out = dqkv + (b * a.T + i) * W + h * a.hs;
  for (int64_t d = 0; d < a.hs; ++d) st(out, d, a.scale * dq[d]);
  dsum[idx] = D;
}

// One thread per (b, g, j): dk_j and dv_j over the group's query heads and the rows i >= j.
template <class T>
__global__ void attention_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* dsum,
                                     AttnArgs a) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= a.B * a.G * a.T) return;
  const int64_t j = idx % a.T, g = (idx / a.T) % a.G, b = idx / (a.T * a.G);
  const int64_t W = (a.H + 2 * a.G) * a.hs, R = a.H / a.G, C = a.H * a.hs;
  const T* base = qkv + b * a.T * W;
  float k[kMaxHeadDim], v[kMaxHeadDim], dk[kMaxHeadDim], dv[kMaxHeadDim];
  for (int64_t d = 0; d < a.hs; ++d) {
    k[d] = ld(base + j * W + C + g * a.hs, d);
    v[d] = ld(base + j * W + C + a.G * a.hs + g * a.hs, d);
    dk[d] = dv[d] = 0;
  }
  for (int64_t h = g * R; h < (g + 1) * R; ++h) {
    for (int64_t i = j; i < a.T; ++i) {
      const T* q = base + i * W + h * a.hs;
      const T* dor = dout + (b * a.T + i) * C + h * a.hs;
      const int64_t row = (b * a.H + h) * a.T + i;
      const float p = expf(score(a, dot_row(q, k, a.hs), h, i, j) - lse[row]);
      const float f = drop_factor(a, b, h, i, j);
      const float dp = f * dot_row(dor, v, a.hs);
      const float ds = p * (dp - dsum[row]);
      for (int64_t d = 0; d < a.hs; ++d) {
        dv[d] += p * f * ld(dor, d);
        dk[d] += ds * ld(q, d);
      }
    }
  }
  T* dkr = dqkv + (b * a.T + j) * W + C + g * a.hs;
  T* dvr = dkr + a.G * a.hs;
  for (int64_t d = 0; d < a.hs; ++d) {
    st(dkr, d, a.scale * dk[d]);
    st(dvr, d, dv[d]);
  }
}

struct Prepared {
  AttnArgs args;
  Tensor slopes;  // keeps the device copy alive until the kernels ran (the allocator orders reuse by stream)
};

Prepared prepare(Context& ctx, const Tensor& qkv, const Tensor& lse, const ops::AttentionLayout& layout,
                 const DropoutMask& mask, int64_t head0) {
  TROUPE_CHECK(qkv.rank() == 3, "attention: qkv is (B,T,(H+2G)*hs)");
  const int64_t H = layout.n_head, G = layout.n_group > 0 ? layout.n_group : layout.n_head;
  TROUPE_CHECK(H > 0 && G > 0 && H % G == 0, "attention: the key/value groups divide the heads");
  const int64_t hs = layout.head_dim > 0 ? layout.head_dim : qkv.dim(2) / (H + 2 * G);
  TROUPE_CHECK(qkv.dim(2) == (H + 2 * G) * hs, "attention: qkv's last dim is (H + 2G) * head_dim");
  TROUPE_CHECK(hs <= kMaxHeadDim, "attention: the CUDA backend takes head_dim up to 256");
  Prepared p{};
  AttnArgs& a = p.args;
  a.B = qkv.dim(0);
  a.T = qkv.dim(1);
  a.H = H;
  a.G = G;
  a.hs = hs;
  TROUPE_CHECK(lse.dtype() == DType::f32 && lse.numel() == a.B * H * a.T,
               "attention: the CUDA backend keeps (B,H,T) f32 row statistics (ops::attention_saved_tensor)");
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  a.slopes = nullptr;
  if (!layout.alibi_slopes.empty()) {
    TROUPE_CHECK(static_cast<int64_t>(layout.alibi_slopes.size()) == H, "attention: one ALiBi slope per head");
    std::vector<float> host(layout.alibi_slopes.begin(), layout.alibi_slopes.end());
    p.slopes = scratch(ctx, Shape{H}, DType::f32, "attention: the ALiBi slopes");
    check_cuda(cudaMemcpyAsync(p.slopes.raw(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice,
                               stream_of(ctx)),
               "attention: the ALiBi slopes");
    check_cuda(cudaStreamSynchronize(stream_of(ctx)), "attention: the ALiBi slopes");  // host vector goes away
    a.slopes = static_cast<const float*>(p.slopes.raw());
  }
  a.drop = device_dropout(mask);
  a.head0 = head0;
  return p;
}

}  // namespace

void attention_forward(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const ops::AttentionLayout& layout, const DropoutMask& mask, int64_t head0) {
  check_device(ctx, {&out, &lse, &qkv}, "attention: device tensors on a CUDA context");
  const Prepared p = prepare(ctx, qkv, lse, layout, mask, head0);
  const AttnArgs& a = p.args;
  TROUPE_CHECK(out.dtype() == qkv.dtype() && out.numel() == a.B * a.T * a.H * a.hs, "attention: out is (B,T,H*hs)");
  with_type(qkv.dtype(), "attention", [&](auto tag) {
    using T = decltype(tag);
    attention_forward_kernel<T><<<blocks_for(a.B * a.H * a.T, kRowThreads), kRowThreads, 0, stream_of(ctx)>>>(
        dptr<T>(out), dptr<float>(lse), dptr<T>(qkv), a);
  });
  TROUPE_CUDA_LAUNCHED("attention");
}

void attention_backward(Context& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& lse,
                        const ops::AttentionLayout& layout, const DropoutMask& mask, int64_t head0) {
  check_device(ctx, {&dqkv, &dout, &qkv, &lse}, "attention backward: device tensors on a CUDA context");
  const Prepared p = prepare(ctx, qkv, lse, layout, mask, head0);
  const AttnArgs& a = p.args;
  TROUPE_CHECK(dqkv.dtype() == qkv.dtype() && dqkv.numel() == qkv.numel() && dout.dtype() == qkv.dtype() &&
                   dout.numel() == a.B * a.T * a.H * a.hs,
               "attention backward: dqkv is qkv's shape, dout (B,T,H*hs), one dtype");
  const Tensor dsum = scratch(ctx, Shape{a.B * a.H * a.T}, DType::f32, "attention backward: the row sums");
  with_type(qkv.dtype(), "attention backward", [&](auto tag) {
    using T = decltype(tag);
    attention_dq_kernel<T><<<blocks_for(a.B * a.H * a.T, kRowThreads), kRowThreads, 0, stream_of(ctx)>>>(
        dptr<T>(dqkv), dptr<float>(dsum), dptr<T>(dout), dptr<T>(qkv), dptr<float>(lse), a);
    attention_dkv_kernel<T><<<blocks_for(a.B * a.G * a.T, kRowThreads), kRowThreads, 0, stream_of(ctx)>>>(
        dptr<T>(dqkv), dptr<T>(dout), dptr<T>(qkv), dptr<float>(lse), dptr<float>(dsum), a);
  });
  TROUPE_CUDA_LAUNCHED("attention backward");
}

}  // namespace troupe::cuda
