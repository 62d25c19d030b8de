// RMSNorm (Zhang & Sennrich; LLaMA's normalization): out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps),
// no mean subtraction and no bias. Laid out as LayerNorm in elementwise.cpp: rows split over threads;
// the weight gradient split over fixed column blocks, each summing its columns over rows in order, so
// no result depends on the thread count and each half of the backward is the full call's bitwise.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.hpp"

namespace troupe::cpu {

namespace {
constexpr int64_t kColumnBlock = 32;  // columns per task of the weight-gradient sum
}  // namespace

template <class T>
void rmsnorm_forward(ThreadPool& pool, T* out, T* rstd, const T* x, const T* w, int64_t N, int64_t C, double eps) {
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* xr = x + n * C;  // (C)
      T ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
      // As LayerNorm: the mean square and eps meet in double, so eps is not rounded to T first.
      T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(C) + eps));
      T* o = out + n * C;  // (C)
      for (int64_t c = 0; c < C; ++c) o[c] = xr[c] * r * w[c];
      rstd[n] = r;
    }
  }, 16);
}

// With xhat = x * rstd and g = dout * w:  dx = rstd * (g - xhat * mean(g * xhat)),  dw = sum_n dout * xhat.
template <class T>
void rmsnorm_backward(ThreadPool& pool, T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                      int64_t N, int64_t C) {
  if (dx) pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* xr = x + n * C;
      const T* dr = dout + n * C;
      const T r = rstd[n];
      T sum_g_xhat = 0;
      for (int64_t c = 0; c < C; ++c) sum_g_xhat += dr[c] * w[c] * (xr[c] * r);
      const T mean_g_xhat = sum_g_xhat / static_cast<T>(C);
      T* dxr = dx + n * C;
      for (int64_t c = 0; c < C; ++c) dxr[c] += r * (dr[c] * w[c] - (xr[c] * r) * mean_g_xhat);
    }
  }, 16);
  if (!dw) return;
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  pool.for_each_task(blocks, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C;
      const T* dr = dout + n * C;
      const T r = rstd[n];
      for (int64_t c = c0; c < c1; ++c) dw[c] += dr[c] * (xr[c] * r);
    }
  });
}

#define TROUPE_INSTANTIATE(T)                                                                                \
  template void rmsnorm_forward<T>(ThreadPool&, T*, T*, const T*, const T*, int64_t, int64_t, double);       \
  template void rmsnorm_backward<T>(ThreadPool&, T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t);
TROUPE_INSTANTIATE(float)
TROUPE_INSTANTIATE(double)
#undef TROUPE_INSTANTIATE

}  // namespace troupe::cpu
