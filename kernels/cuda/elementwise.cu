// Elementwise ops and whole-tensor reductions on the device (kernels/cuda/cuda_ops.hpp): dtype
// conversion, the overflow count, residual adds, scaling, the sum of squares, GELU and the gated
// units, forward and backward side by side. One thread per element in a grid-stride loop; the
// reductions sum per block in a fixed order, then the block partials in order (no atomics).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device_memory.hpp"

namespace troupe::cuda {

namespace {

constexpr int kReduceBlocks = 512;  // fixed: the partials, and so the result, do not depend on the device

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

template <class D, class S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  GRID_STRIDE(i, n) st(dst, i, ld(src, i));
}

template <class T>
__global__ void count_nonfinite_kernel(const T* x, int64_t n, unsigned long long* partial) {
  __shared__ unsigned long long shared[32];
  unsigned long long c = 0;
  GRID_STRIDE(i, n) c += isfinite(ld(x, i)) ? 0 : 1;
  c = block_sum(c, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = c;
}

template <class T>
__global__ void sum_squares_kernel(const T* x, int64_t n, double* partial) {
  __shared__ double shared[32];
  double s = 0;
  GRID_STRIDE(i, n) {
    const double v = ld(x, i);
    s += v * v;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <class A>
__global__ void sum_partials_kernel(const A* partial, int count, A* total) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    A s = 0;
    for (int i = 0; i < count; ++i) s += partial[i];
    *total = s;
  }
}

template <class TO, class TB>
__global__ void add_kernel(TO* out, const TO* a, const TB* b, int64_t n) {
  GRID_STRIDE(i, n) st(out, i, ld(a, i) + ld(b, i));
}

template <class T>
__global__ void scale_kernel(T* x, int64_t n, float f) {
  GRID_STRIDE(i, n) st(x, i, ld(x, i) * f);
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = kGeluC * (x + kGeluA * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float u = kGeluC * (x + kGeluA * x * x * x);
  const float th = tanhf(u);
  const float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <class T>
__global__ void gelu_forward_kernel(T* out, const T* x, int64_t n) {
  GRID_STRIDE(i, n) st(out, i, gelu_tanh(ld(x, i)));
}

template <class T>
__global__ void gelu_backward_kernel(T* dx, const T* dout, const T* x, int64_t n) {
  GRID_STRIDE(i, n) st(dx, i, ld(dout, i) * gelu_tanh_grad(ld(x, i)));  // dx may alias dout: read first
}

template <class T>
__global__ void glu_forward_kernel(T* out, const T* gate_up, int64_t N, int64_t F, bool silu) {
  GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i % F;
    const float g = ld(gate_up, n * 2 * F + f), u = ld(gate_up, n * 2 * F + F + f);
    st(out, i, (silu ? g * sigmoid(g) : gelu_tanh(g)) * u);
  }
}

template <class T>
__global__ void glu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t F, bool silu) {
  GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i % F;
    const float g = ld(gate_up, n * 2 * F + f), u = ld(gate_up, n * 2 * F + F + f), d = ld(dout, i);
    if (silu) {
      const float s = sigmoid(g);
      st(dgate_up, n * 2 * F + f, d * u * (s * (1.0f + g * (1.0f - s))));
      st(dgate_up, n * 2 * F + F + f, d * (g * s));
    } else {
      st(dgate_up, n * 2 * F + f, d * u * gelu_tanh_grad(g));
      st(dgate_up, n * 2 * F + F + f, d * gelu_tanh(g));
    }
  }
}

// A device scratch buffer of `count` elements of A for the reductions.
template <class A>
Tensor scratch(const Context& ctx, int64_t count) {
  return troupe::cuda::scratch(ctx, Shape{count * static_cast<int64_t>(sizeof(A))}, DType::u8, "a reduction");
}

// Sums the kReduceBlocks partials on the device and brings the total to the host.
template <class A>
A finish_reduction(const Context& ctx, const Tensor& partials) {
  A* p = static_cast<A*>(partials.raw());
  sum_partials_kernel<A><<<1, 32, 0, stream_of(ctx)>>>(p, kReduceBlocks, p + kReduceBlocks);
  TROUPE_CUDA_LAUNCHED("reduction");
  A host = 0;
  check_cuda(cudaMemcpyAsync(&host, p + kReduceBlocks, sizeof(A), cudaMemcpyDeviceToHost, stream_of(ctx)),
             "reduction: copy to the host");
  check_cuda(cudaStreamSynchronize(stream_of(ctx)), "reduction");
  return host;
}

}  // namespace

void convert(Context& ctx, const Tensor& dst, const Tensor& src) {
  check_device(ctx, {&dst, &src}, "convert: device tensors on a CUDA context");
  TROUPE_CHECK(dst.numel() == src.numel(), "convert: dst and src hold the same number of elements");
  const int64_t n = src.numel();
  with_type(dst.dtype(), "convert", [&](auto d) {
    using D = decltype(d);
    with_type(src.dtype(), "convert", [&](auto s) {
      using S = decltype(s);
      convert_kernel<D, S><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(dptr<D>(dst), dptr<S>(src), n);
    });
  });
  TROUPE_CUDA_LAUNCHED("convert");
}

int64_t count_nonfinite(Context& ctx, const Tensor& t) {
  check_device(ctx, {&t}, "count_nonfinite: a device tensor on a CUDA context");
  Tensor partials = scratch<unsigned long long>(ctx, kReduceBlocks + 1);
  with_type(t.dtype(), "count_nonfinite", [&](auto tag) {
    using T = decltype(tag);
    count_nonfinite_kernel<T><<<kReduceBlocks, kThreads, 0, stream_of(ctx)>>>(
        dptr<T>(t), t.numel(), static_cast<unsigned long long*>(partials.raw()));
  });
  TROUPE_CUDA_LAUNCHED("count_nonfinite");
  return static_cast<int64_t>(finish_reduction<unsigned long long>(ctx, partials));
}

double sum_squares(Context& ctx, const Tensor& t) {
  check_device(ctx, {&t}, "sum_squares: a device tensor on a CUDA context");
  Tensor partials = scratch<double>(ctx, kReduceBlocks + 1);
  with_type(t.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    sum_squares_kernel<T><<<kReduceBlocks, kThreads, 0, stream_of(ctx)>>>(dptr<T>(t), t.numel(),
                                                                           static_cast<double*>(partials.raw()));
  });
  TROUPE_CUDA_LAUNCHED("sum_squares");
  return finish_reduction<double>(ctx, partials);
}

void residual_forward(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  check_device(ctx, {&out, &a, &b}, "residual: device tensors on a CUDA context");
  TROUPE_CHECK(out.numel() == a.numel() && a.numel() == b.numel(), "residual: shapes");
  TROUPE_CHECK(out.dtype() == a.dtype(), "residual: out and a share a dtype on the CUDA backend");
  const int64_t n = a.numel();
  with_type(out.dtype(), "residual", [&](auto o) {
    using TO = decltype(o);
    with_type(b.dtype(), "residual", [&](auto bt) {
      using TB = decltype(bt);
      add_kernel<TO, TB><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(dptr<TO>(out), dptr<TO>(a), dptr<TB>(b), n);
    });
  });
  TROUPE_CUDA_LAUNCHED("residual");
}

void scale_inplace(Context& ctx, const Tensor& t, double factor) {
  check_device(ctx, {&t}, "scale: a device tensor on a CUDA context");
  with_type(t.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<blocks_for(t.numel()), kThreads, 0, stream_of(ctx)>>>(dptr<T>(t), t.numel(),
                                                                             static_cast<float>(factor));
  });
  TROUPE_CUDA_LAUNCHED("scale");
}

void gelu_forward(Context& ctx, const Tensor& out, const Tensor& x) {
  check_device(ctx, {&out, &x}, "gelu: device tensors on a CUDA context");
  TROUPE_CHECK(out.dtype() == x.dtype(), "gelu: out and x share a dtype");
  with_type(x.dtype(), "gelu", [&](auto tag) {
    using T = decltype(tag);
    gelu_forward_kernel<T><<<blocks_for(x.numel()), kThreads, 0, stream_of(ctx)>>>(dptr<T>(out), dptr<T>(x), x.numel());
  });
  TROUPE_CUDA_LAUNCHED("gelu");
}

void gelu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  check_device(ctx, {&dx, &dout, &x}, "gelu backward: device tensors on a CUDA context");
  TROUPE_CHECK(dx.dtype() == x.dtype() && dout.dtype() == x.dtype(), "gelu backward: one dtype");
  with_type(x.dtype(), "gelu backward", [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<T><<<blocks_for(x.numel()), kThreads, 0, stream_of(ctx)>>>(dptr<T>(dx), dptr<T>(dout),
                                                                                     dptr<T>(x), x.numel());
  });
  TROUPE_CUDA_LAUNCHED("gelu backward");
}

void glu_forward(Context& ctx, const Tensor& out, const Tensor& gate_up, ops::GluKind kind) {
  check_device(ctx, {&out, &gate_up}, "glu: device tensors on a CUDA context");
  const int64_t F = gate_up.dim(-1) / 2, N = gate_up.numel() / (2 * F);
  with_type(gate_up.dtype(), "glu", [&](auto tag) {
    using T = decltype(tag);
    glu_forward_kernel<T><<<blocks_for(N * F), kThreads, 0, stream_of(ctx)>>>(dptr<T>(out), dptr<T>(gate_up), N, F,
                                                                               kind == ops::GluKind::swiglu);
  });
  TROUPE_CUDA_LAUNCHED("glu");
}

void glu_backward(Context& ctx, const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up, ops::GluKind kind) {
  check_device(ctx, {&dgate_up, &dout, &gate_up}, "glu backward: device tensors on a CUDA context");
  const int64_t F = gate_up.dim(-1) / 2, N = gate_up.numel() / (2 * F);
  with_type(gate_up.dtype(), "glu backward", [&](auto tag) {
    using T = decltype(tag);
    glu_backward_kernel<T><<<blocks_for(N * F), kThreads, 0, stream_of(ctx)>>>(
        dptr<T>(dgate_up), dptr<T>(dout), dptr<T>(gate_up), N, F, kind == ops::GluKind::swiglu);
  });
  TROUPE_CUDA_LAUNCHED("glu backward");
}

}  // namespace troupe::cuda
