// GFLOP/s of the bf16 GEMM (kernels/cpu/gemm_bf16.hpp) beside the fp32 gemm() on the same shapes:
//   bf16        gemm_bf16 on its avx512_bf16 kernel (bf16 operands, fp32 accumulation, fp32 C)
//   widen+sgemm gemm_bf16 on its widen_sgemm kernel (the fallback: bf16 -> fp32, then gemm())
//   fp32        gemm<float> on fp32 operands already in memory (today's training path)
// The shapes are the linear layers of the reference models on one micro-batch (8 x 256 = 2048
// rows): GPT-2 and LLaMA, 4 layers, hidden 384 (LLaMA: 6 heads in 2 query groups, SwiGLU 1024),
// forward (x W^T), dx (dout W) and dW (dout^T x) each; GPT-2's tied head on one 320-row chunk of the
// 50304-column logits; and 2048^3. Then troupe's sgemm peak (kernels/peak.hpp) on the same pool.
//   build/bench/bench_bf16_gemm [threads [name]]   (bench/bf16_gemm.sh runs 1 and 2 threads; name:
//                                                  only the shapes whose name contains it)
// Each figure is the best of at least 5 timed calls (and 0.5 s of all three) after a warm-up call,
// the three taking turns.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/gemm_bf16.hpp"
#include "kernels/peak.hpp"

using namespace troupe;
using cpu::Bf16Kernel;

namespace {

// Best time of each function over rounds that call them in turn (so a busy machine slows all
// alike): one warm-up call each, then at least 5 rounds and 0.5 s of calls.
std::vector<double> best_seconds(const std::vector<std::function<void()>>& fs) {
  std::vector<double> best(fs.size(), 1e30);
  for (const auto& f : fs) f();
  double spent = 0;
  for (int round = 0; round < 5 || spent < 0.5; ++round)
    for (size_t i = 0; i < fs.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fs[i]();
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best[i] = std::min(best[i], t);
      spent += t;
    }
  return best;
}

struct Case {
  std::string name;
  bool ta, tb;
  int64_t M, N, K;
};

// The three GEMMs of a linear layer y (rows, out) = x (rows, in) W^T, W (out, in), as linear.cpp
// calls them.
void add_linear(std::vector<Case>& cases, const std::string& name, int64_t rows, int64_t in,
                int64_t out) {
  cases.push_back({name + " fwd", false, true, rows, out, in});
  cases.push_back({name + " dx", false, false, rows, in, out});
  cases.push_back({name + " dW", true, false, out, in, rows});
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::string only = argc > 2 ? argv[2] : "";
  configure_blas_threads();
  ThreadPool pool(threads);
  const int64_t rows = 8 * 256, C = 384;
  std::vector<Case> cases;
  add_linear(cases, "gpt2 qkv 384->1152", rows, C, 3 * C);
  add_linear(cases, "gpt2 attn-out 384->384", rows, C, C);
  add_linear(cases, "gpt2 fc 384->1536", rows, C, 4 * C);
  add_linear(cases, "gpt2 proj 1536->384", rows, 4 * C, C);
  add_linear(cases, "llama qkv 384->640", rows, C, C + 2 * 2 * 64);
  add_linear(cases, "llama gate-up 384->2048", rows, C, 2 * 1024);
  add_linear(cases, "llama down 1024->384", rows, 1024, C);
  add_linear(cases, "gpt2 head 384->50304 (320 rows)", 320, C, 50304);
  cases.push_back({"square 2048^3", false, false, 2048, 2048, 2048});

  const bool fast = cpu::bf16_kernel_supported(Bf16Kernel::avx512_bf16);
  std::printf("bf16 GEMM vs fp32 gemm(), %d thread(s); gemm_bf16's kernel here: %s\n\n", threads,
              cpu::bf16_kernel_name(cpu::bf16_gemm_kernel()));
  std::printf("| shape | trans | M | N | K | bf16 GFLOP/s | widen+sgemm GFLOP/s | fp32 GFLOP/s | "
              "bf16 / fp32 | bf16 / widen |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  double sum_fast = 0, sum_widen = 0, sum_f32 = 0, flops_all = 0;
  for (const Case& c : cases) {
    if (c.name.find(only) == std::string::npos) continue;
    const int64_t a_elems = c.M * c.K, b_elems = c.K * c.N;
    std::vector<uint16_t> a16(a_elems), b16(b_elems);
    std::vector<float> a32(a_elems), b32(b_elems), out(c.M * c.N, 0.0f);
    for (int64_t i = 0; i < a_elems; ++i) a32[i] = cpu::bf16_to_float(a16[i] = cpu::float_to_bf16(0.1f * u(g)));
    for (int64_t i = 0; i < b_elems; ++i) b32[i] = cpu::bf16_to_float(b16[i] = cpu::float_to_bf16(0.1f * u(g)));
    // Compact operands: A (M,K) or (K,M), B (K,N) or (N,K).
    const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
    const double flops = 2.0 * c.M * c.N * c.K;
    auto bf16 = [&](Bf16Kernel k) {
      return [&, k] {
        cpu::gemm_bf16(k, pool, c.ta, c.tb, c.M, c.N, c.K, 1.0f, a16.data(), lda, b16.data(), ldb,
                       0.0f, out.data(), c.N);
      };
    };
    std::vector<std::function<void()>> fs{bf16(Bf16Kernel::widen_sgemm), [&] {
      cpu::gemm<float>(pool, c.ta, c.tb, c.M, c.N, c.K, 1.0f, a32.data(), lda, b32.data(), ldb,
                       0.0f, out.data(), c.N);
    }};
    if (fast) fs.push_back(bf16(Bf16Kernel::avx512_bf16));
    const std::vector<double> t = best_seconds(fs);
    const double t_widen = t[0], t_f32 = t[1], t_fast = fast ? t[2] : 0;
    const double g_fast = fast ? flops / t_fast / 1e9 : 0, g_widen = flops / t_widen / 1e9,
                 g_f32 = flops / t_f32 / 1e9;
    std::printf("| %s | %c%c | %lld | %lld | %lld | %.1f | %.1f | %.1f | %.2fx | %.2fx |\n",
                c.name.c_str(), c.ta ? 'T' : 'N', c.tb ? 'T' : 'N', static_cast<long long>(c.M),
                static_cast<long long>(c.N), static_cast<long long>(c.K), g_fast, g_widen, g_f32,
                g_fast / g_f32, g_fast / g_widen);
    if (c.name.rfind("square", 0) != 0) {  // the model's shapes, summed as one step would be
      sum_fast += t_fast;
      sum_widen += t_widen;
      sum_f32 += t_f32;
      flops_all += flops;
    }
  }
  std::printf("| all model shapes (time-weighted) | | | | | %.1f | %.1f | %.1f | %.2fx | %.2fx |\n",
              fast ? flops_all / sum_fast / 1e9 : 0.0, flops_all / sum_widen / 1e9,
              flops_all / sum_f32 / 1e9, fast ? sum_f32 / sum_fast : 0.0,
              fast ? sum_widen / sum_fast : 0.0);
  std::printf("\nsgemm peak measured by troupe (kernels/peak.hpp, 1536^3): %.1f GFLOP/s\n",
              measure_sgemm_peak_gflops(pool));
  return 0;
}
