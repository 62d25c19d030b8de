#include "plan/host.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

#include "config/memory_estimate.hpp"
#include "kernels/peak.hpp"
#include "kernels/thread_pool.hpp"

namespace troupe::plan {

namespace {

double copy_bandwidth() {
  const size_t n = size_t{64} << 20;
  std::unique_ptr<char[]> a(new char[n]), b(new char[n]);
  std::memset(a.get(), 1, n);
  std::memset(b.get(), 2, n);
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.get(), a.get(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * static_cast<double>(n) / s);  // read and write
    std::swap(a, b);
  }
  return best;
}

}  // namespace

const HostFigures& this_host() {
  static const HostFigures figures = [] {
    HostFigures h;
    h.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    ThreadPool pool(h.cores);
    h.sgemm_peak_gflops = measure_sgemm_peak_gflops(pool, 0.5);
    h.memory_bandwidth = copy_bandwidth();
    const double available = available_memory_bytes();
    h.available_bytes = available > 0 ? available : 4.0 * 1024 * 1024 * 1024;
    return h;
  }();
  return figures;
}

double measured_gemm_efficiency(int threads, double m, double n, double k) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int>, double> measured;
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  const HostFigures& h = this_host();
  threads = std::clamp(threads, 1, h.cores);
  auto bucket = [](double x) {
    const double clamped = std::clamp(x, 1.0, 4096.0);
    return static_cast<int>(std::lround(std::exp2(std::round(std::log2(clamped)))));
  };
  const auto key = std::make_tuple(threads, bucket(m), bucket(n), bucket(k));
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = measured.find(key); it != measured.end()) return it->second;
  auto& pool = pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  const double gflops = measure_sgemm_gflops(*pool, std::get<1>(key), std::get<2>(key), std::get<3>(key));
  const double share = h.sgemm_peak_gflops * threads / h.cores;
  const double efficiency = std::clamp(gflops / std::max(1e-9, share), 1e-4, 1.0);
  measured.emplace(key, efficiency);
  return efficiency;
}

Cluster this_host_cluster(int ranks) {
  const HostFigures& h = this_host();
  return measured_cpu_cluster(ranks, h.cores, h.sgemm_peak_gflops, h.memory_bandwidth, h.available_bytes);
}

}  // namespace troupe::plan
