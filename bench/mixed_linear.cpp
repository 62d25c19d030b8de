// The 16-bit layer's cost on the linear layer at the reference benchmark's shapes (N = 8*256 rows,
// 384 -> 1152 (qkv) and 384 -> 1536 (fc)): ms per call of linear_forward and linear_backward with every
// floating tensor f32, then bf16, then fp16 (widen to f32, the f32 GEMM, round back; see
// docs/PRECISION.md), and the 16-bit / f32 time ratio. Best of 15, the three dtypes timed in turns.
//   build/bench/bench_mixed_linear [threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "kernels/half.hpp"
#include "kernels/ops.hpp"

using namespace troupe;

namespace {
Tensor rnd(const Shape& s, std::mt19937& g, DType t) {
  Tensor x = Tensor::empty(s);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = u(g) * 0.1f;
  return x.to(t);
}
// Best-of-15 times of several calls, measured in turns (one call of each per round) so that load from
// other processes on the machine falls on all of them alike.
std::vector<double> best_ms(const std::vector<std::function<void()>>& fs) {
  std::vector<double> best(fs.size(), 1e30);
  for (const auto& f : fs) f();
  for (int r = 0; r < 15; ++r)
    for (size_t i = 0; i < fs.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fs[i]();
      best[i] =
          std::min(best[i], std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  configure_blas_threads();
  ThreadPool pool(threads);
  Context ctx;
  ctx.pool = &pool;
  std::printf("conversion path: %s, %d threads\n", half::cpu_path_name(half::active_cpu_path()), threads);
  std::printf("%-26s %10s %10s %10s %10s %10s\n", "op", "f32 ms", "bf16 ms", "bf16/f32", "f16 ms", "f16/f32");
  const int64_t N = 8 * 256, I = 384;
  for (const int64_t O : {int64_t{1152}, int64_t{1536}}) {
    std::vector<std::function<void()>> fwd_calls, bwd_calls;
    for (const DType t : {DType::f32, DType::bf16, DType::f16}) {
      std::mt19937 g(1);
      const Tensor x = rnd({N, I}, g, t), w = rnd({O, I}, g, t), b = rnd({O}, g, t), out = rnd({N, O}, g, t);
      const Tensor dout = rnd({N, O}, g, t), dx = rnd({N, I}, g, t), dw = rnd({O, I}, g, t), db = rnd({O}, g, t);
      fwd_calls.push_back([&ctx, out, x, w, b] { ops::linear_forward(ctx, out, x, w, b); });
      bwd_calls.push_back([&ctx, dx, dw, db, dout, x, w] { ops::linear_backward(ctx, dx, dw, db, dout, x, w); });
    }
    const std::vector<double> fwd = best_ms(fwd_calls), bwd = best_ms(bwd_calls);
    char name[64];
    std::snprintf(name, sizeof name, "linear_forward 384->%lld", static_cast<long long>(O));
    std::printf("%-26s %10.3f %10.3f %10.2f %10.3f %10.2f\n", name, fwd[0], fwd[1], fwd[1] / fwd[0], fwd[2],
                fwd[2] / fwd[0]);
    std::snprintf(name, sizeof name, "linear_backward 384->%lld", static_cast<long long>(O));
    std::printf("%-26s %10.3f %10.3f %10.2f %10.3f %10.2f\n", name, bwd[0], bwd[1], bwd[1] / bwd[0], bwd[2],
                bwd[2] / bwd[0]);
  }
  // Decoding's shapes (GPT-2 124M: width 768; qkv, fc and the 50257-word head) at 1 and 16 tokens per
  // step: the forward only, where a 16-bit weight is read a block at a time (gemm_half_weight.hpp).
  std::printf("\n%-26s %10s %10s %10s %10s %10s\n", "decode forward", "f32 ms", "bf16 ms", "bf16/f32", "f16 ms",
              "f16/f32");
  for (const int64_t rows : {int64_t{1}, int64_t{4}, int64_t{16}, int64_t{64}, int64_t{256}, int64_t{512}}) {
    for (const int64_t O : {int64_t{2304}, int64_t{3072}, int64_t{50257}}) {
      const int64_t In = 768;
      std::vector<std::function<void()>> calls;
      for (const DType t : {DType::f32, DType::bf16, DType::f16}) {
        std::mt19937 g(1);
        const Tensor x = rnd({rows, In}, g, t), w = rnd({O, In}, g, t), out = rnd({rows, O}, g, t);
        calls.push_back([&ctx, out, x, w] { ops::linear_forward(ctx, out, x, w, Tensor()); });
      }
      const std::vector<double> ms = best_ms(calls);
      char name[64];
      std::snprintf(name, sizeof name, "%lld x 768->%lld", static_cast<long long>(rows), static_cast<long long>(O));
      std::printf("%-26s %10.3f %10.3f %10.2f %10.3f %10.2f\n", name, ms[0], ms[1], ms[1] / ms[0], ms[2],
                  ms[2] / ms[0]);
    }
  }
  return 0;
}
