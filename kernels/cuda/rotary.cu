// Rotary position embeddings and row dropout on the device, forward and backward
// (kernels/cuda/cuda_ops.hpp). Rotary: the angles p base^(-2i/r) and their cos / sin in double,
// rounded to f32, the pair rotated in f32 (the CPU's kernels/cpu/rotary.cpp); the backward rotates
// by -angle. Dropout: kernels/dropout.hpp's Philox rule per element; the backward is the same call.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"

namespace troupe::cuda {

namespace {

// One thread per (row n, head h, pair i).
template <class T>
__global__ void rotary_kernel(T* x, int64_t N, int64_t T_, int64_t W, int64_t col0, int64_t n_heads, int64_t head_dim,
                              int64_t half, double base, bool interleaved, int64_t pos0, bool inverse) {
  const int64_t total = N * n_heads * half;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k % half, h = (k / half) % n_heads, n = k / (half * n_heads);
    const double inv_freq = pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
    const double angle = static_cast<double>(pos0 + n % T_) * inv_freq;
    const float c = static_cast<float>(cos(angle)), s = static_cast<float>(inverse ? -sin(angle) : sin(angle));
    T* head = x + n * W + col0 + h * head_dim;
    const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const float a = ld(head, ia), b = ld(head, ib);
    st(head, ia, a * c - b * s);
    st(head, ib, b * c + a * s);
  }
}

void rotary(Context& ctx, const Tensor& x, int64_t col0, int n_heads, int head_dim, const ops::RotaryParams& p,
            bool inverse) {
  check_device(ctx, {&x}, "rotary: a device tensor on a CUDA context");
  TROUPE_CHECK(x.rank() == 3 && p.rotary_dim > 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= head_dim &&
                   col0 >= 0 && col0 + int64_t{n_heads} * head_dim <= x.dim(2),
               "rotary: x (B,T,W) holds the heads; rotary_dim even, <= head_dim");
  const int64_t T_ = x.dim(1), N = x.dim(0) * T_, half = p.rotary_dim / 2;
  with_type(x.dtype(), "rotary", [&](auto tag) {
    using T = decltype(tag);
    rotary_kernel<T><<<blocks_for(N * n_heads * half), kThreads, 0, stream_of(ctx)>>>(
        dptr<T>(x), N, T_, x.dim(2), col0, n_heads, head_dim, half, p.base, p.interleaved, p.pos0, inverse);
  });
  TROUPE_CUDA_LAUNCHED("rotary");
}

// x[r, c] *= factor of row g = row0 + r (b = g / seq_len, t = g % seq_len), element t C + c.
template <class T>
__global__ void dropout_rows_kernel(T* x, int64_t rows, int64_t C, int64_t row0, int64_t seq_len, DeviceDropout d) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < rows * C; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t g = row0 + k / C, c = k % C;
    st(x, k, ld(x, k) * dropout_factor(d, g / seq_len, (g % seq_len) * C + c));
  }
}

}  // namespace

void rotary_forward(Context& ctx, const Tensor& x, int64_t col0, int n_heads, int head_dim,
                    const ops::RotaryParams& p) {
  rotary(ctx, x, col0, n_heads, head_dim, p, false);
}

void rotary_backward(Context& ctx, const Tensor& dx, int64_t col0, int n_heads, int head_dim,
                     const ops::RotaryParams& p) {
  rotary(ctx, dx, col0, n_heads, head_dim, p, true);
}

void dropout_rows(Context& ctx, const Tensor& x, const DropoutMask& mask, int64_t row0, int64_t seq_len) {
  check_device(ctx, {&x}, "dropout: a device tensor on a CUDA context");
  TROUPE_CHECK(x.rank() == 2 && row0 >= 0 && seq_len > 0 && mask.active(), "dropout_rows: x is (rows, C), p > 0");
  const int64_t rows = x.dim(0), C = x.dim(1);
  with_type(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    dropout_rows_kernel<T><<<blocks_for(rows * C), kThreads, 0, stream_of(ctx)>>>(dptr<T>(x), rows, C, row0, seq_len,
                                                                                    device_dropout(mask));
  });
  TROUPE_CUDA_LAUNCHED("dropout");
}

}  // namespace troupe::cuda
