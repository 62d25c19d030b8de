// Finite-difference gradient checks in double precision.
#pragma once
#include <cmath>
#include <functional>
#include <random>

#include <catch2/catch.hpp>

#include "kernels/tensor.hpp"

namespace troupe::test {

inline Tensor random_tensor(const Shape& shape, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0,
                            DType dtype = DType::f64) {
  Tensor t = Tensor::empty(shape, DType::f64);
  std::uniform_real_distribution<double> u(lo, hi);
  double* d = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = u(rng);
    if (std::abs(v) < 1e-3) v = 0.25;  // non-zero inputs
    d[i] = v;
  }
  return dtype == DType::f64 ? t : t.to(dtype);
}

// n token ids, uniform in [0, vocab), i32.
inline Tensor random_tokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  Tensor t = Tensor::empty({n}, DType::i32);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(vocab - 1));
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = u(rng);
  return t;
}

// Weighted sum <t, w>: a scalar objective whose gradient w.r.t. t is w.
inline double dot(const Tensor& t, const Tensor& w) {
  double s = 0;
  const double* a = t.data<double>();
  const double* b = w.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` (d objective / d x) with central differences of `objective` in x, element by
// element (every element up to max_checks, then a strided sample).
inline void check_gradient(const std::function<double()>& objective, const Tensor& x, const Tensor& analytic,
                           const char* what, double rtol = 1e-6, double atol = 1e-8, int64_t max_checks = 400) {
  REQUIRE(x.numel() == analytic.numel());
  double* xd = x.data<double>();
  const double* g = analytic.data<double>();
  const double h = 1e-5;
  const int64_t n = x.numel();
  const int64_t stride = n <= max_checks ? 1 : n / max_checks + 1;
  int64_t failures = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const double saved = xd[i];
    xd[i] = saved + h;
    const double fp = objective();
    xd[i] = saved - h;
    const double fm = objective();
    xd[i] = saved;
    const double fd = (fp - fm) / (2 * h);
    if (std::abs(fd - g[i]) > atol + rtol * std::max(std::abs(fd), std::abs(g[i]))) {
      if (failures++ < 5) UNSCOPED_INFO(what << "[" << i << "]: finite difference " << fd << " vs backward " << g[i]);
    }
  }
  CHECK(failures == 0);
}

// max |a - b| / (1 + |b|) over all elements; a, b f64 or f32.
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  Tensor x = a.dtype() == DType::f64 ? a : a.to(DType::f64);
  Tensor y = b.dtype() == DType::f64 ? b : b.to(DType::f64);
  REQUIRE(x.numel() == y.numel());
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    m = std::max(m, std::abs(x.data<double>()[i] - y.data<double>()[i]) / (1.0 + std::abs(y.data<double>()[i])));
  return m;
}

}  // namespace troupe::test
