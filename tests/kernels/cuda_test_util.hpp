// The cross-backend harness of the CUDA op tests (label gpu): an op runs on the CPU backend and on
// the CUDA backend from the same inputs, and each result the op writes is compared. f32 results
// agree within 1e-5 of the largest reference value (the backends sum in different orders); 16-bit
// results within two rounding units of it (a sum near a rounding boundary may round the other way:
// one ulp = 2u).
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device_info.hpp"
#include "kernels/device_memory.hpp"
#include "kernels/ops.hpp"
#include "kernels/thread_pool.hpp"
#include "tests/kernels/grad_check.hpp"
#include "tests/test_util.hpp"

namespace troupe::test {

struct CrossFixture {
  ThreadPool pool{2};
  Context cpu;
  std::unique_ptr<cuda::DeviceContext> gpu;
  std::mt19937_64 rng{0xc0da};
  CrossFixture() {
    cpu.pool = &pool;
    auto g = cuda::DeviceContext::create(0);
    REQUIRE(g.is_ok());
    gpu = std::move(g).value();
  }
};


inline Tensor to_device(const Tensor& host) {
  auto d = device_empty(host.shape(), host.dtype());
  REQUIRE(d.is_ok());
  REQUIRE(copy_tensor(d.value(), host).is_ok());
  return d.value();
}

inline Tensor to_host(const Tensor& dev) {
  Tensor h = Tensor::empty(dev.shape(), dev.dtype());
  REQUIRE(copy_tensor(h, dev).is_ok());
  return h;
}

// One argument: its value (f32, or i32 / f64 as the op wants), whether it is stored in the call's
// 16-bit type, whether the op writes it (then it is compared).
struct XArg {
  Tensor init;
  bool narrow = true;
  bool result = false;
};
inline XArg xin(Tensor t, bool narrow = true) { return {std::move(t), narrow, false}; }
inline XArg xout(Tensor t, bool narrow = true) { return {std::move(t), narrow, true}; }

using XArgs = std::vector<Tensor>;
using XCall = std::function<void(Context&, const XArgs&)>;

// max |got - want| / max |want| over the elements, in double.
inline double cross_error(const Tensor& got, const Tensor& want) {
  const Tensor g = got.to(DType::f64), w = want.to(DType::f64);
  double err = 0, scale = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double a = g.data<double>()[i], b = w.data<double>()[i];
    if (std::isnan(b) || std::isnan(a)) return std::isnan(a) && std::isnan(b) ? err : INFINITY;
    err = std::max(err, std::abs(a - b));
    scale = std::max(scale, std::abs(b));
  }
  return scale > 0 ? err / scale : err;
}

inline double cross_bound(DType t) {
  return t == DType::bf16 ? 2 * 0x1p-8 + 1e-5 : t == DType::f16 ? 2 * 0x1p-11 + 1e-5 : 1e-5;
}

// Runs `call` on both backends with the arguments in dtype `h` (f32, bf16 or f16) where narrow;
// returns the worst cross_error over the results and checks each against its bound.
inline double run_cross(CrossFixture& f, DType h, const std::vector<XArg>& args, const XCall& call,
                        double bound_factor = 1) {
  std::vector<Tensor> host, dev;
  for (const XArg& a : args)
    host.push_back(!a.init.defined() ? Tensor() : a.narrow && h != DType::f32 ? a.init.to(h) : a.init.clone());
  for (const Tensor& t : host) dev.push_back(t.defined() ? to_device(t) : Tensor());
  call(f.cpu, host);
  call(f.gpu->ctx(), dev);
  REQUIRE(f.gpu->synchronize().is_ok());
  double worst = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].result || !host[i].defined()) continue;
    const double e = cross_error(to_host(dev[i]), host[i]);
    INFO("result argument " << i << " in " << dtype_name(host[i].dtype()) << ": error " << e);
    CHECK(e <= bound_factor * cross_bound(host[i].dtype()));
    worst = std::max(worst, e);
  }
  return worst;
}

inline const DType kCrossTypes[] = {DType::f32, DType::bf16, DType::f16};

}  // namespace troupe::test
