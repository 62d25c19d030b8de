// LayerNorm and RMSNorm on the device (kernels/cuda/cuda_ops.hpp), forward and backward side by side,
// with the CPU's arithmetic (kernels/cpu/elementwise.cpp, kernels/cpu/rmsnorm.cpp) in f32 registers:
// the mean square (or variance) meets eps in double, dx accumulates (+=), dweight and dbias accumulate.
//
// Launch shapes: the forward and the input gradient run one block per row, row_threads(C) threads
// striding over the columns, the row sums through block_sum (a fixed order). The parameter gradients
// (sums over rows) run in two passes without atomics: blocks of kParamCols columns x kParamLanes row
// lanes sum chunks of kParamRows rows into f32 partials (each lane its rows in order, then the lanes
// in order), then one thread per column adds the chunks' partials in chunk order into the gradient.
// Every shape is a function of N and C only, so the bits do not depend on the device or the run, and
// a split half (dx alone, or dweight/dbias alone) launches exactly the kernels of the full call.
//
// Types: x, out, dout and dx share one storage type T (f32, bf16 or f16); the weight, the bias, the
// statistics (mean and rstd together) and each parameter gradient are stored in T or in f32 (mixed
// precision's f32 gradients beside 16-bit weights), each widened exactly on load and rounded once
// on store.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device_memory.hpp"

namespace troupe::cuda {

namespace {

constexpr int kParamCols = 32;      // columns of a partial-sum block: one warp, coalesced loads
constexpr int kParamLanes = 8;      // row lanes of a partial-sum block
constexpr int64_t kParamRows = 64;  // rows of a chunk (one partial per chunk and column)
constexpr int kMaxRowThreads = 512;

// A warp multiple covering the row, at most kMaxRowThreads: a function of C only, so the block sums'
// order does not depend on the device.
int row_threads(int64_t C) {
  const int64_t t = (C + 31) / 32 * 32;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(t, 32), kMaxRowThreads));
}

#define ROW_STRIDE(c, C) for (int64_t c = threadIdx.x; c < (C); c += blockDim.x)

// ---- LayerNorm ----------------------------------------------------------------------------------

// One block per row. m = sum(x) / C, v = sum((x - m)^2), r = 1 / sqrt(v / C + eps) in double;
// out = (x - m) * r * w + b. mean and rstd keep the unrounded f32 m and r (rounded once if 16-bit).
template <class T, class W, class B, class S>
__global__ void layernorm_forward_kernel(T* out, S* mean, S* rstd, const T* x, const W* w, const B* b, int64_t C,
                                         double eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  float s = 0;
  ROW_STRIDE(c, C) s += ld(xr, c);
  const float m = block_sum(s, shared) / static_cast<float>(C);
  float v = 0;
  ROW_STRIDE(c, C) {
    const float d = ld(xr, c) - m;
    v += d * d;
  }
  v = block_sum(v, shared);
  const float r = static_cast<float>(1.0 / sqrt(static_cast<double>(v) / static_cast<double>(C) + eps));
  T* o = out + row * C;
  ROW_STRIDE(c, C) st(o, c, (ld(xr, c) - m) * r * ld(w, c) + ld(b, c));
  if (threadIdx.x == 0) {
    st(mean, row, m);
    st(rstd, row, r);
  }
}

// One block per row: with dn = dout * w and xhat = (x - m) * r,
// dx += r * (dn - mean(dn) - xhat * mean(dn * xhat)).
template <class T, class W, class S>
__global__ void layernorm_dx_kernel(T* dx, const T* dout, const T* x, const W* w, const S* mean, const S* rstd,
                                    int64_t C) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  const T* dr = dout + row * C;
  const float m = ld(mean, row), r = ld(rstd, row);
  float sum_dn = 0, sum_dn_xhat = 0;
  ROW_STRIDE(c, C) {
    const float dn = ld(dr, c) * ld(w, c);
    sum_dn += dn;
    sum_dn_xhat += dn * (ld(xr, c) - m) * r;
  }
  const float mean_dn = block_sum(sum_dn, shared) / static_cast<float>(C);
  const float mean_dn_xhat = block_sum(sum_dn_xhat, shared) / static_cast<float>(C);
  T* dxr = dx + row * C;
  ROW_STRIDE(c, C) {
    const float xhat = (ld(xr, c) - m) * r;
    st(dxr, c, ld(dxr, c) + r * (ld(dr, c) * ld(w, c) - mean_dn - xhat * mean_dn_xhat));
  }
}

// ---- RMSNorm ------------------------------------------------------------------------------------

// One block per row: r = 1 / sqrt(sum(x^2) / C + eps) in double; out = x * r * w.
template <class T, class W, class S>
__global__ void rmsnorm_forward_kernel(T* out, S* rstd, const T* x, const W* w, int64_t C, double eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  float ss = 0;
  ROW_STRIDE(c, C) {
    const float v = ld(xr, c);
    ss += v * v;
  }
  ss = block_sum(ss, shared);
  const float r = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(C) + eps));
  T* o = out + row * C;
  ROW_STRIDE(c, C) st(o, c, ld(xr, c) * r * ld(w, c));
  if (threadIdx.x == 0) st(rstd, row, r);
}

// One block per row: with g = dout * w and xhat = x * r, dx += r * (g - xhat * mean(g * xhat)).
template <class T, class W, class S>
__global__ void rmsnorm_dx_kernel(T* dx, const T* dout, const T* x, const W* w, const S* rstd, int64_t C) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  const T* dr = dout + row * C;
  const float r = ld(rstd, row);
  float sum_g_xhat = 0;
  ROW_STRIDE(c, C) sum_g_xhat += ld(dr, c) * ld(w, c) * (ld(xr, c) * r);
  const float mean_g_xhat = block_sum(sum_g_xhat, shared) / static_cast<float>(C);
  T* dxr = dx + row * C;
  ROW_STRIDE(c, C) st(dxr, c, ld(dxr, c) + r * (ld(dr, c) * ld(w, c) - (ld(xr, c) * r) * mean_g_xhat));
}

// ---- the parameter gradients: fixed-order partial sums over rows, then their sum in chunk order ----

// Block (kParamCols, kParamLanes) at blockIdx.x = chunk * tiles + tile: columns [tile * kParamCols, +
// kParamCols), rows [chunk * kParamRows, + kParamRows). Lane l sums rows l, l + kParamLanes, ... of
// the chunk in order; lane 0 adds the lanes in order and writes partial[chunk * C + c].
// LayerNorm (kLayer): pw gets dout * (x - m) * r, pb gets dout. RMSNorm: pw gets dout * (x * r), no pb.
template <class T, class S, bool kLayer>
__global__ void norm_param_partials_kernel(float* pw, float* pb, const T* dout, const T* x, const S* mean,
                                           const S* rstd, int64_t N, int64_t C, int64_t tiles) {
  __shared__ float sw[kParamLanes][kParamCols], sb[kParamLanes][kParamCols];
  const int64_t tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles;
  const int64_t c = tile * kParamCols + threadIdx.x;
  const int64_t r1 = (chunk + 1) * kParamRows < N ? (chunk + 1) * kParamRows : N;
  float aw = 0, ab = 0;
  if (c < C) {
    for (int64_t n = chunk * kParamRows + threadIdx.y; n < r1; n += kParamLanes) {
      const float d = ld(dout, n * C + c), xv = ld(x, n * C + c), r = ld(rstd, n);
      if constexpr (kLayer) {
        aw += d * (xv - ld(mean, n)) * r;
        ab += d;
      } else {
        aw += d * (xv * r);
      }
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float w = 0, b = 0;
  for (int l = 0; l < kParamLanes; ++l) {
    w += sw[l][threadIdx.x];
    b += sb[l][threadIdx.x];
  }
  pw[chunk * C + c] = w;
  if constexpr (kLayer) pb[chunk * C + c] = b;
}

// grad[c] += sum over chunks k, in order, of partial[k * C + c]; one thread per column.
template <class G>
__global__ void param_finish_kernel(G* grad, const float* partial, int64_t chunks, int64_t C) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < C; c += int64_t{gridDim.x} * blockDim.x) {
    float s = 0;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * C + c];
    st(grad, c, ld(grad, c) + s);
  }
}

// f32 scratch on the call's stream; freed when the host function returns, the allocator reuses it
// only for later work on the same stream (so after these kernels).
Tensor scratch_f32(const Context& ctx, int64_t count) {
  return scratch(ctx, Shape{count}, DType::f32, "a norm's parameter-gradient partials");
}

struct ParamGrid {
  int64_t tiles, chunks;
  unsigned blocks() const { return static_cast<unsigned>(tiles * chunks); }
};
ParamGrid param_grid(int64_t N, int64_t C) {
  ParamGrid g{(C + kParamCols - 1) / kParamCols, (N + kParamRows - 1) / kParamRows};
  TROUPE_CHECK(g.tiles * g.chunks <= INT32_MAX, "norm backward: too many rows x columns for one grid");
  return g;
}

// grad[c] += the partials' sum (partial: (chunks, C)), grad stored in T or f32.
template <class T>
void finish_param(const Context& ctx, const Tensor& grad, const float* partial, int64_t chunks, int64_t C,
                  const char* types, const char* what) {
  with_same_or_f32<T>(grad, types, [&](auto g) {
    using G = decltype(g);
    param_finish_kernel<G><<<blocks_for(C), kThreads, 0, stream_of(ctx)>>>(dptr<G>(grad), partial, chunks, C);
  });
  TROUPE_CUDA_LAUNCHED(what);
}

// Rows and columns of a (..., C) tensor, checked for one block per row.
void rows_cols(const Tensor& x, int64_t& N, int64_t& C, const char* op) {
  C = x.dim(-1);
  TROUPE_CHECK(C > 0, op);
  N = x.numel() / C;
  TROUPE_CHECK(N <= INT32_MAX, op);
}

}  // namespace

void layernorm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, double eps) {
  check_device(ctx, {&out, &mean, &rstd, &x, &weight, &bias}, "layernorm: device tensors on a CUDA context");
  int64_t N = 0, C = 0;
  rows_cols(x, N, C, "layernorm: x is (N,C), C > 0, N < 2^31");
  TROUPE_CHECK(out.numel() == x.numel() && mean.numel() == N && rstd.numel() == N, "layernorm shapes");
  TROUPE_CHECK(weight.defined() && bias.defined() && weight.numel() == C && bias.numel() == C,
               "layernorm: weight and bias are (C)");
  TROUPE_CHECK(out.dtype() == x.dtype(), "layernorm: out and x share a dtype");
  TROUPE_CHECK(mean.dtype() == rstd.dtype(), "layernorm: mean and rstd share a dtype on the CUDA backend");
  if (N == 0) return;
  const char* types = "layernorm: weight, bias, mean and rstd are f32 or x's dtype";
  with_type(x.dtype(), "layernorm", [&](auto xt) {
    using T = decltype(xt);
    with_same_or_f32<T>(weight, types, [&](auto wt) {
      using W = decltype(wt);
      with_same_or_f32<T>(bias, types, [&](auto bt) {
        using B = decltype(bt);
        with_same_or_f32<T>(mean, types, [&](auto sd) {
          using S = decltype(sd);
          layernorm_forward_kernel<T, W, B, S><<<static_cast<unsigned>(N), row_threads(C), 0, stream_of(ctx)>>>(
              dptr<T>(out), dptr<S>(mean), dptr<S>(rstd), dptr<T>(x), dptr<W>(weight), dptr<B>(bias), C, eps);
        });
      });
    });
  });
  TROUPE_CUDA_LAUNCHED("layernorm");
}

void layernorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  check_device(ctx, {&dx, &dweight, &dbias, &dout, &x, &weight, &mean, &rstd},
               "layernorm backward: device tensors on a CUDA context");
  int64_t N = 0, C = 0;
  rows_cols(x, N, C, "layernorm backward: x is (N,C), C > 0, N < 2^31");
  TROUPE_CHECK(dout.numel() == x.numel(), "layernorm backward shapes");
  TROUPE_CHECK(!dx.defined() || (dx.numel() == x.numel() && weight.defined() && weight.numel() == C),
               "layernorm backward: dx, weight");
  TROUPE_CHECK(dweight.defined() == dbias.defined(), "layernorm backward: dweight and dbias come together");
  TROUPE_CHECK(!dweight.defined() || (dweight.numel() == C && dbias.numel() == C),
               "layernorm: dweight and dbias are (C)");
  TROUPE_CHECK(mean.numel() == N && rstd.numel() == N, "layernorm backward: mean and rstd are (N)");
  TROUPE_CHECK(dout.dtype() == x.dtype() && (!dx.defined() || dx.dtype() == x.dtype()),
               "layernorm backward: dx, dout and x share a dtype");
  TROUPE_CHECK(mean.dtype() == rstd.dtype(), "layernorm backward: mean and rstd share a dtype on the CUDA backend");
  if (N == 0) return;
  const char* types = "layernorm backward: weight, mean, rstd, dweight and dbias are f32 or x's dtype";
  with_type(x.dtype(), "layernorm backward", [&](auto xt) {
    using T = decltype(xt);
    if (dx.defined()) {
      with_same_or_f32<T>(weight, types, [&](auto wt) {
        using W = decltype(wt);
        with_same_or_f32<T>(mean, types, [&](auto sd) {
          using S = decltype(sd);
          layernorm_dx_kernel<T, W, S><<<static_cast<unsigned>(N), row_threads(C), 0, stream_of(ctx)>>>(
              dptr<T>(dx), dptr<T>(dout), dptr<T>(x), dptr<W>(weight), dptr<S>(mean), dptr<S>(rstd), C);
        });
      });
      TROUPE_CUDA_LAUNCHED("layernorm backward (dx)");
    }
    if (!dweight.defined()) return;
    const ParamGrid g = param_grid(N, C);
    const Tensor partial = scratch_f32(ctx, 2 * g.chunks * C);  // [dweight's | dbias's], (chunks, C) each
    float* pw = static_cast<float*>(partial.raw());
    with_same_or_f32<T>(mean, types, [&](auto sd) {
      using S = decltype(sd);
      norm_param_partials_kernel<T, S, true><<<g.blocks(), dim3(kParamCols, kParamLanes), 0, stream_of(ctx)>>>(
          pw, pw + g.chunks * C, dptr<T>(dout), dptr<T>(x), dptr<S>(mean), dptr<S>(rstd), N, C, g.tiles);
    });
    TROUPE_CUDA_LAUNCHED("layernorm backward (dweight, dbias partials)");
    finish_param<T>(ctx, dweight, pw, g.chunks, C, types, "layernorm backward (dweight)");
    finish_param<T>(ctx, dbias, pw + g.chunks * C, g.chunks, C, types, "layernorm backward (dbias)");
  });
}

void rmsnorm_forward(Context& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                     double eps) {
  check_device(ctx, {&out, &rstd, &x, &weight}, "rmsnorm: device tensors on a CUDA context");
  int64_t N = 0, C = 0;
  rows_cols(x, N, C, "rmsnorm: x is (N,C), C > 0, N < 2^31");
  TROUPE_CHECK(out.numel() == x.numel() && rstd.numel() == N, "rmsnorm: out is x's shape (N,C), rstd (N)");
  TROUPE_CHECK(weight.defined() && weight.numel() == C, "rmsnorm: weight is (C)");
  TROUPE_CHECK(out.dtype() == x.dtype(), "rmsnorm: out and x share a dtype");
  if (N == 0) return;
  const char* types = "rmsnorm: weight and rstd are f32 or x's dtype";
  with_type(x.dtype(), "rmsnorm", [&](auto xt) {
    using T = decltype(xt);
    with_same_or_f32<T>(weight, types, [&](auto wt) {
      using W = decltype(wt);
      with_same_or_f32<T>(rstd, types, [&](auto sd) {
        using S = decltype(sd);
        rmsnorm_forward_kernel<T, W, S><<<static_cast<unsigned>(N), row_threads(C), 0, stream_of(ctx)>>>(
            dptr<T>(out), dptr<S>(rstd), dptr<T>(x), dptr<W>(weight), C, eps);
      });
    });
  });
  TROUPE_CUDA_LAUNCHED("rmsnorm");
}

void rmsnorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd) {
  check_device(ctx, {&dx, &dweight, &dout, &x, &weight, &rstd}, "rmsnorm backward: device tensors on a CUDA context");
  int64_t N = 0, C = 0;
  rows_cols(x, N, C, "rmsnorm backward: x is (N,C), C > 0, N < 2^31");
  TROUPE_CHECK(dout.numel() == x.numel() && rstd.numel() == N, "rmsnorm backward: dout is x's shape, rstd (N)");
  TROUPE_CHECK(!dx.defined() || (dx.numel() == x.numel() && weight.defined() && weight.numel() == C),
               "rmsnorm backward: dx is x's shape and needs the weight (C)");
  TROUPE_CHECK(!dweight.defined() || dweight.numel() == C, "rmsnorm backward: dweight is (C)");
  TROUPE_CHECK(dout.dtype() == x.dtype() && (!dx.defined() || dx.dtype() == x.dtype()),
               "rmsnorm backward: dx, dout and x share a dtype");
  if (N == 0) return;
  const char* types = "rmsnorm backward: weight, rstd and dweight are f32 or x's dtype";
  with_type(x.dtype(), "rmsnorm backward", [&](auto xt) {
    using T = decltype(xt);
    if (dx.defined()) {
      with_same_or_f32<T>(weight, types, [&](auto wt) {
        using W = decltype(wt);
        with_same_or_f32<T>(rstd, types, [&](auto sd) {
          using S = decltype(sd);
          rmsnorm_dx_kernel<T, W, S><<<static_cast<unsigned>(N), row_threads(C), 0, stream_of(ctx)>>>(
              dptr<T>(dx), dptr<T>(dout), dptr<T>(x), dptr<W>(weight), dptr<S>(rstd), C);
        });
      });
      TROUPE_CUDA_LAUNCHED("rmsnorm backward (dx)");
    }
    if (!dweight.defined()) return;
    const ParamGrid g = param_grid(N, C);
    const Tensor partial = scratch_f32(ctx, g.chunks * C);
    with_same_or_f32<T>(rstd, types, [&](auto sd) {
      using S = decltype(sd);
      norm_param_partials_kernel<T, S, false><<<g.blocks(), dim3(kParamCols, kParamLanes), 0, stream_of(ctx)>>>(
          static_cast<float*>(partial.raw()), nullptr, dptr<T>(dout), dptr<T>(x), nullptr, dptr<S>(rstd), N, C,
          g.tiles);
    });
    TROUPE_CUDA_LAUNCHED("rmsnorm backward (dweight partials)");
    finish_param<T>(ctx, dweight, static_cast<const float*>(partial.raw()), g.chunks, C, types,
                    "rmsnorm backward (dweight)");
  });
}

}  // namespace troupe::cuda
