#include "kernels/peak.hpp"

#include <algorithm>
#include <chrono>

#include "kernels/context.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/tensor.hpp"
#include "troupe/check.hpp"

namespace troupe {

double measure_sgemm_gflops(ThreadPool& pool, int m, int n, int k, double seconds) {
  TROUPE_CHECK(m >= 1 && n >= 1 && k >= 1, "measure_sgemm_gflops: every size is at least 1");
  configure_blas_threads();
  Tensor a = Tensor::empty({m, k}), b = Tensor::empty({k, n}), c = Tensor::zeros({m, n});
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = static_cast<float>((i % 17) - 8) * 0.01f;
  for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = static_cast<float>((i % 13) - 6) * 0.01f;
  auto once = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::gemm<float>(pool, false, false, m, n, k, 1.0f, a.data<float>(), k, b.data<float>(), n, 0.0f, c.data<float>(), n);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  once();  // warm-up: packing buffers, page faults
  double best = 1e30, spent = 0;
  int runs = 0;
  while (spent < seconds || runs < 3) {
    const double t = once();
    best = std::min(best, t);
    spent += t;
    ++runs;
  }
  return 2.0 * m * n * static_cast<double>(k) / std::max(best, 1e-9) / 1e9;
}

double measure_sgemm_peak_gflops(ThreadPool& pool, double seconds, int n) {
  return measure_sgemm_gflops(pool, n, n, n, seconds);
}

}  // namespace troupe
