// AdamW, sums of squares and scaling: elementwise over flat parameter buffers.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.hpp"

namespace troupe::cpu {

namespace {
constexpr int64_t kGrain = 16384;
constexpr int64_t kSumChunk = 8192;  // fixed chunks: the reduction order never depends on threads
}  // namespace

template <class T>
void adamw_update(ThreadPool& pool, T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2);
  const T one_b1 = static_cast<T>(1.0 - beta1), one_b2 = static_cast<T>(1.0 - beta2);
  const T step_size = static_cast<T>(lr / bc1);
  const T inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
  const T e = static_cast<T>(eps);
  const T decay = static_cast<T>(lr * weight_decay);
  pool.parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T mi = b1 * m[i] + one_b1 * g[i];
      T vi = b2 * v[i] + one_b2 * g[i] * g[i];
      m[i] = mi;
      v[i] = vi;
      // p -= lr * (m / bc1) / (sqrt(v / bc2) + eps) + lr * wd * p
      p[i] = p[i] - decay * p[i] - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + e);
    }
  }, kGrain);
}

template <class T>
double sum_squares(ThreadPool& pool, const T* x, int64_t n) {
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
  pool.for_each_task(chunks, [&](int64_t c) {
    const int64_t i0 = c * kSumChunk, i1 = std::min(n, i0 + kSumChunk);
    double acc[8] = {};
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8)
      for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(x[i + l]) * x[i + l];
    double s = 0;
    for (int l = 0; l < 8; ++l) s += acc[l];
    for (; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[c] = s;
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template <class T>
void scale(ThreadPool& pool, T* x, int64_t n, double factor) {
  const T f = static_cast<T>(factor);
  pool.parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] *= f;
  }, kGrain);
}

#define TROUPE_INSTANTIATE(T)                                                                     \
  template void adamw_update<T>(ThreadPool&, T*, const T*, T*, T*, int64_t, double, double, double, \
                                double, double, int64_t);                                         \
  template double sum_squares<T>(ThreadPool&, const T*, int64_t);                                 \
  template void scale<T>(ThreadPool&, T*, int64_t, double);
TROUPE_INSTANTIATE(float)
TROUPE_INSTANTIATE(double)
#undef TROUPE_INSTANTIATE

}  // namespace troupe::cpu
