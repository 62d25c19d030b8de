// Linear layer: y = x W^T + b with W (O, I). All three GEMMs go through cpu::gemm (split over the pool).
#include <algorithm>

#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/gemm.hpp"

namespace troupe::cpu {

template <class T>
void linear_forward(ThreadPool& pool, T* out, const T* x, const T* w, const T* bias, int64_t N,
                    int64_t I, int64_t O) {
  if (bias) {
    pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) std::copy(bias, bias + O, out + n * O);
    }, 64);
  }
  // out (N,O) = x (N,I) @ W^T (I,O) [+ out]
  gemm<T>(pool, false, true, N, O, I, T(1), x, I, w, I, bias ? T(1) : T(0), out, O);
}

template <class T>
void linear_backward(ThreadPool& pool, T* dx, T* dw, T* dbias, const T* dout, const T* x, const T* w,
                     int64_t N, int64_t I, int64_t O) {
  // dx (N,I) = dout (N,O) @ W (O,I)
  if (dx) gemm<T>(pool, false, false, N, I, O, T(1), dout, O, w, I, T(0), dx, I);
  // dW (O,I) += dout^T (O,N) @ x (N,I)
  if (dw) gemm<T>(pool, true, false, O, I, N, T(1), dout, O, x, I, T(1), dw, I);
  // db (O) += sum over rows of dout
  if (dbias) column_sums_accumulate<T>(pool, dbias, dout, N, O);
}

template void linear_forward<float>(ThreadPool&, float*, const float*, const float*, const float*,
                                    int64_t, int64_t, int64_t);
template void linear_forward<double>(ThreadPool&, double*, const double*, const double*,
                                     const double*, int64_t, int64_t, int64_t);
template void linear_backward<float>(ThreadPool&, float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t);
template void linear_backward<double>(ThreadPool&, double*, double*, double*, const double*,
                                      const double*, const double*, int64_t, int64_t, int64_t);

}  // namespace troupe::cpu
