#include "kernels/peak.hpp"

#include <algorithm>
#include <chrono>

#include "kernels/context.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/tensor.hpp"

namespace troupe {

double measure_sgemm_peak_gflops(ThreadPool& pool, double seconds, int n) {
  configure_blas_threads();
  Tensor a = Tensor::empty({n, n}), b = Tensor::empty({n, n}), c = Tensor::zeros({n, n});
  for (int64_t i = 0; i < a.numel(); ++i) {
    a.data<float>()[i] = static_cast<float>((i % 17) - 8) * 0.01f;
    b.data<float>()[i] = static_cast<float>((i % 13) - 6) * 0.01f;
  }
  auto once = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::gemm<float>(pool, false, false, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f, c.data<float>(), n);
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
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

}  // namespace troupe
