// Fused softmax + cross-entropy over a vocabulary row, with its backward written in place. The logits
// row is used as scratch (it holds exp values afterwards when no gradient is asked for).
// Rows split over threads; inside a row, 16 partial accumulators let the compiler vectorise the max
// and the sum while keeping a fixed summation order.
#include <algorithm>
#include <cmath>
#include <limits>

#include "troupe/check.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::cpu {

namespace {
constexpr int kLanes = 16;

template <class T>
T row_max(const T* x, int64_t n) {
  T acc[kLanes];
  std::fill(acc, acc + kLanes, -std::numeric_limits<T>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = std::max(acc[l], x[j + l]);
  T m = -std::numeric_limits<T>::infinity();
  for (int l = 0; l < kLanes; ++l) m = std::max(m, acc[l]);
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// x = exp(x - shift). One function for the forward and for the vocabulary-parallel backward, which
// recomputes these values and must get them bitwise.
template <class T>
void exp_inplace(T* x, int64_t n, T shift) {
  for (int64_t j = 0; j < n; ++j) x[j] = fast_exp(x[j] - shift);
}

// Replaces x by exp(x - shift) and returns the sum (two vectorisable passes over a row that stays in
// cache).
template <class T>
double exp_inplace_sum(T* x, int64_t n, T shift) {
  exp_inplace(x, n, shift);
  T acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[j + l];
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; j < n; ++j) s += x[j];
  return s;
}
}  // namespace

template <class T>
void softmax_cross_entropy(ThreadPool& pool, T* losses, T* logits, const int32_t* targets, int64_t N,
                           int64_t Vp, int64_t valid, double grad_scale) {
  const bool want_grad = grad_scale != 0.0;
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      T* row = logits + n * Vp;  // (Vp)
      const int64_t target = targets[n];
      TROUPE_CHECK(target >= 0 && target < valid, "target token outside the real vocabulary");
      const T target_logit = row[target];
      const T mx = row_max(row, valid);
      const double sum = exp_inplace_sum(row, valid, mx);  // the row is scratch either way
      losses[n] = static_cast<T>(static_cast<double>(mx) + std::log(sum) - static_cast<double>(target_logit));
      if (!want_grad) continue;
      // row now holds exp(logit - max); turn it into grad_scale * (softmax - onehot).
      const T factor = static_cast<T>(grad_scale / sum);
      for (int64_t j = 0; j < valid; ++j) row[j] *= factor;
      row[target] -= static_cast<T>(grad_scale);
      std::fill(row + valid, row + Vp, T(0));
    }
  }, 8);
}

// The pieces below repeat softmax_cross_entropy's arithmetic step for step (same helpers, same
// casts), so that with one shard they give its results bitwise.
template <class T>
void xent_local_stats(ThreadPool& pool, double* row_max_out, double* target_logit, const T* logits,
                      const int32_t* targets, int64_t N, int64_t Vl, int64_t vocab_begin, int64_t valid) {
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* row = logits + n * Vl;  // (Vl)
      const int64_t t = static_cast<int64_t>(targets[n]) - vocab_begin;
      TROUPE_CHECK(targets[n] >= 0, "target token must not be negative");
      target_logit[n] = t >= 0 && t < valid ? static_cast<double>(row[t]) : 0.0;
      row_max_out[n] = valid > 0 ? static_cast<double>(row_max(row, valid)) : -std::numeric_limits<double>::infinity();
    }
  }, 8);
}

template <class T>
void xent_exp_sum(ThreadPool& pool, double* sum_exp, T* logits, const double* row_max_in, int64_t N, int64_t Vl,
                  int64_t valid) {
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      sum_exp[n] = exp_inplace_sum(logits + n * Vl, valid, static_cast<T>(row_max_in[n]));
  }, 8);
}

template <class T>
void xent_loss(ThreadPool& pool, T* losses, const double* row_max_in, const double* sum_exp,
               const double* target_logit, int64_t N) {
  for (int64_t n = 0; n < N; ++n)
    losses[n] = static_cast<T>(row_max_in[n] + std::log(sum_exp[n]) - target_logit[n]);
}

template <class T>
void xent_backward(ThreadPool& pool, T* logits, const double* row_max_in, const double* sum_exp,
                   const int32_t* targets, int64_t N, int64_t Vl, int64_t vocab_begin, int64_t valid,
                   double grad_scale) {
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      T* row = logits + n * Vl;  // (Vl): raw logits in, their gradient out
      exp_inplace(row, valid, static_cast<T>(row_max_in[n]));
      const T factor = static_cast<T>(grad_scale / sum_exp[n]);
      for (int64_t j = 0; j < valid; ++j) row[j] *= factor;
      const int64_t t = static_cast<int64_t>(targets[n]) - vocab_begin;
      if (t >= 0 && t < valid) row[t] -= static_cast<T>(grad_scale);
      std::fill(row + valid, row + Vl, T(0));
    }
  }, 8);
}

#define TROUPE_INSTANTIATE(T)                                                                          \
  template void xent_local_stats<T>(ThreadPool&, double*, double*, const T*, const int32_t*, int64_t,  \
                                    int64_t, int64_t, int64_t);                                        \
  template void xent_exp_sum<T>(ThreadPool&, double*, T*, const double*, int64_t, int64_t, int64_t);   \
  template void xent_loss<T>(ThreadPool&, T*, const double*, const double*, const double*, int64_t);   \
  template void xent_backward<T>(ThreadPool&, T*, const double*, const double*, const int32_t*,        \
                                 int64_t, int64_t, int64_t, int64_t, double);
TROUPE_INSTANTIATE(float)
TROUPE_INSTANTIATE(double)
#undef TROUPE_INSTANTIATE

template void softmax_cross_entropy<float>(ThreadPool&, float*, float*, const int32_t*, int64_t, int64_t,
                                           int64_t, double);
template void softmax_cross_entropy<double>(ThreadPool&, double*, double*, const int32_t*, int64_t,
                                            int64_t, int64_t, double);

}  // namespace troupe::cpu
