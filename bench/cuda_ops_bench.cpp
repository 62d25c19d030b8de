// Each CUDA op of the GPT model at GPT-2 350M's sizes (24 layers, hidden 1024, 16 heads, sequence
// 1024, micro-batch 8, vocabulary 50304) in bf16 on GPU 0: ms per call, and against the peaks
// measured in the same run -- TFLOP/s against the best of cuBLASLt's bf16 GEMM on 8192^3 (and the
// datasheet's dense bf16 figure given with --peak-tflops), GB/s against a device-to-device copy of
// 1 GiB. The share of one iteration's op time says where a step goes (bench/run_gpu_bench.sh runs
// it beside the end-to-end figures; docs/PERFORMANCE.md keeps them).
//   build/bench/bench_cuda_ops [--peak-tflops 989]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device_info.hpp"
#include "kernels/device_memory.hpp"
#include "kernels/ops.hpp"

using namespace troupe;

namespace {

std::mt19937 rng(1);

// A device tensor of uniform values in [-0.1, 0.1) (rounded to `dtype`).
Tensor rnd(const Shape& s, DType dtype = DType::bf16) {
  Tensor host = Tensor::empty(s);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = u(rng);
  return host.to(dtype).on(Device::cuda);
}

}  // namespace

int main(int argc, char** argv) {
  double datasheet = 989;  // H200 / H100 SXM dense bf16
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--peak-tflops") == 0) datasheet = std::atof(argv[i + 1]);
  if (query_devices().cuda_devices < 1) {
    std::fprintf(stderr, "bench_cuda_ops: no usable GPU (%s)\n", query_devices().cuda_detail.c_str());
    return 1;
  }
  auto made = cuda::DeviceContext::create(0);
  if (!made) {
    std::fprintf(stderr, "bench_cuda_ops: %s\n", made.status().message().c_str());
    return 1;
  }
  auto device = std::move(made).value();
  Context& ctx = device->ctx();
  DeviceScope on({0, reinterpret_cast<uint64_t>(ctx.stream)});
  auto time_ms = [&](const std::function<void()>& f) {
    f();
    (void)device->synchronize();
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      (void)device->synchronize();
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };

  // The peaks of this GPU, measured now.
  const int64_t G = 8192;
  Tensor ga = rnd({G, G}), gb = rnd({G, G}), gc = rnd({G, G});
  const double gemm_ms = time_ms([&] { ops::linear_forward(ctx, gc, ga, gb, Tensor()); });
  const double peak_tflops = 2.0 * G * G * G / gemm_ms / 1e9;
  ga = gb = gc = Tensor();
  Tensor big_a = Tensor::empty({int64_t{1} << 28}, DType::f32, Device::cuda), big_b = Tensor::empty({int64_t{1} << 28}, DType::f32, Device::cuda);
  const double copy_ms = time_ms([&] { big_b.copy_from(big_a); });
  const double peak_gbs = 2.0 * static_cast<double>(big_a.nbytes()) / copy_ms / 1e6;
  big_a = big_b = Tensor();

  const int64_t B = 8, T = 1024, C = 1024, H = 16, F = 4 * C, V = 50257, Vp = 50304, N = B * T, L = 24;
  const int64_t chunk = 2048;
  const size_t e = 2;  // bytes per bf16 element
  Tensor x = rnd({N, C}), y = rnd({N, C}), dx = rnd({N, C});
  Tensor mean = rnd({N}, DType::f32), rstd = rnd({N}, DType::f32);
  Tensor w = rnd({C}), b = rnd({C}), dw = rnd({C}, DType::f32), db = rnd({C}, DType::f32);
  Tensor wqkv = rnd({3 * C, C}), bqkv = rnd({3 * C}), qkv = rnd({B, T, 3 * C}), dqkv = rnd({B, T, 3 * C});
  Tensor dwqkv = rnd({3 * C, C}, DType::f32), dbqkv = rnd({3 * C}, DType::f32);
  Tensor wfc = rnd({F, C}), bfc = rnd({F}), fc = rnd({N, F}), dfc = rnd({N, F});
  Tensor dwfc = rnd({F, C}, DType::f32), dbfc = rnd({F}, DType::f32), wp = rnd({C, F}), dwp = rnd({C, F}, DType::f32);
  Tensor att = rnd({B, T, C}), datt = rnd({B, T, C});
  Tensor lse = ops::attention_saved_tensor(ctx, B, H, T, DType::bf16);
  Tensor wte = rnd({Vp, C}), dwte = rnd({Vp, C}, DType::f32), logits = rnd({chunk, Vp}), losses = rnd({N}, DType::f32);
  Tensor host_targets = Tensor::empty({N}, DType::i32);
  for (int64_t i = 0; i < N; ++i) host_targets.data<int32_t>()[i] = static_cast<int32_t>(i * 7919 % V);
  Tensor targets = host_targets.on(Device::cuda);
  Tensor master = rnd({C * F}, DType::f32), grad = rnd({C * F}, DType::f32), m1 = rnd({C * F}, DType::f32),
         m2 = rnd({C * F}, DType::f32);

  struct Row {
    std::string name;
    double ms, flops, bytes;
    int64_t per_iter;
  };
  std::vector<Row> rows;
  auto add = [&](const std::string& n, double flops, double bytes, int64_t per_iter, const std::function<void()>& f) {
    rows.push_back({n, time_ms(f), flops, bytes, per_iter});
  };
  const double nc = static_cast<double>(N * C) * e;
  add("layernorm fwd (N,C)", 0, 2 * nc, 2 * L + 1, [&] { ops::layernorm_forward(ctx, y, mean, rstd, x, w, b, 1e-5); });
  add("layernorm bwd (N,C)", 0, 3 * nc, 2 * L + 1, [&] { ops::layernorm_backward(ctx, dx, dw, db, y, x, w, mean, rstd); });
  add("linear fwd qkv C->3C", 2.0 * N * C * 3 * C, 0, L, [&] { ops::linear_forward(ctx, qkv.view({N, 3 * C}), x, wqkv, bqkv); });
  add("linear bwd qkv", 4.0 * N * C * 3 * C, 0, L,
      [&] { ops::linear_backward(ctx, dx, dwqkv, dbqkv, dqkv.view({N, 3 * C}), x, wqkv); });
  // Causal attention: half of the (T, T) scores; backward recomputes them (2.5x the forward).
  const double att_flops = 4.0 * B * H * T * T * (C / H) / 2;
  add("attention fwd (causal)", att_flops, 0, L, [&] { ops::attention_forward(ctx, att, lse, qkv, static_cast<int>(H)); });
  add("attention bwd (causal)", 2.5 * att_flops, 0, L,
      [&] { ops::attention_backward(ctx, dqkv, datt, qkv, lse, static_cast<int>(H)); });
  add("linear fwd proj C->C", 2.0 * N * C * C, 0, L, [&] { ops::linear_forward(ctx, y, x, wqkv.rows(0, C), b); });
  add("linear bwd proj C->C", 4.0 * N * C * C, 0, L,
      [&] { ops::linear_backward(ctx, dx, dwqkv.rows(0, C), db, y, x, wqkv.rows(0, C)); });
  add("linear fwd fc C->4C", 2.0 * N * C * F, 0, L, [&] { ops::linear_forward(ctx, fc, x, wfc, bfc); });
  add("linear bwd fc", 4.0 * N * C * F, 0, L, [&] { ops::linear_backward(ctx, dx, dwfc, dbfc, fc, x, wfc); });
  add("linear fwd proj 4C->C", 2.0 * N * C * F, 0, L, [&] { ops::linear_forward(ctx, y, fc, wp, b); });
  add("linear bwd proj 4C->C", 4.0 * N * C * F, 0, L, [&] { ops::linear_backward(ctx, dfc, dwp, db, y, fc, wp); });
  add("gelu fwd (N,4C)", 0, 2 * 4 * nc, L, [&] { ops::gelu_forward(ctx, dfc, fc); });
  add("gelu bwd (N,4C)", 0, 3 * 4 * nc, L, [&] { ops::gelu_backward(ctx, dfc, dfc, fc); });
  add("residual add (N,C)", 0, 3 * nc, 2 * L, [&] { ops::add_inplace(ctx, y, x); });
  const int64_t chunks = (N + chunk - 1) / chunk;
  add("head logits fwd (chunk)", 2.0 * chunk * C * Vp, 0, 2 * chunks,
      [&] { ops::linear_forward(ctx, logits, x.rows(0, chunk), wte, Tensor()); });
  add("softmax xent (chunk)", 0, 2.0 * chunk * Vp * e, chunks,
      [&] { ops::softmax_cross_entropy(ctx, losses.rows(0, chunk), logits, targets.rows(0, chunk), V, 1e-4); });
  add("head bwd (chunk)", 4.0 * chunk * C * Vp, 0, chunks,
      [&] { ops::linear_backward(ctx, dx.rows(0, chunk), dwte, Tensor(), logits, x.rows(0, chunk), wte); });
  add("embedding fwd", 0, 2 * nc, 1, [&] { ops::embedding_forward(ctx, x.view({B, T, C}), targets.view({B, T}), wte, wte.rows(0, T)); });
  ops::AdamWParams hp;
  hp.lr = 1e-4;
  hp.step = 10;
  // AdamW over one layer's fc weight (4M elements of fp32 master, gradient and moments); a step of
  // 350M parameters is 85 of these.
  add("adamw (4M fp32, per layer-fc)", 0, 7.0 * static_cast<double>(C * F) * 4, 85,
      [&] { ops::adamw_update(ctx, master, grad, m1, m2, hp); });

  double total = 0, flops = 0;
  for (const Row& r : rows) {
    total += r.ms * static_cast<double>(r.per_iter);
    flops += r.flops * static_cast<double>(r.per_iter);
  }
  std::printf("GPU 0: bf16 GEMM 8192^3 %.0f TFLOP/s (datasheet %.0f), device copy %.0f GB/s -- measured now\n",
              peak_tflops, datasheet, peak_gbs);
  std::printf("%-32s %9s %9s %8s %9s %8s %7s\n", "op", "ms/call", "TFLOP/s", "of GEMM", "GB/s", "of copy", "share");
  for (const Row& r : rows) {
    const double tf = r.flops > 0 ? r.flops / r.ms / 1e9 : 0, gbs = r.bytes > 0 ? r.bytes / r.ms / 1e6 : 0;
    std::printf("%-32s %9.3f %9.1f %7.1f%% %9.0f %7.1f%% %6.1f%%\n", r.name.c_str(), r.ms, tf,
                tf > 0 ? 100 * tf / peak_tflops : 0.0, gbs, gbs > 0 ? 100 * gbs / peak_gbs : 0.0,
                100.0 * r.ms * static_cast<double>(r.per_iter) / total);
  }
  std::printf("one iteration's ops (GPT-2 350M, micro-batch 8 x 1024): %.1f ms, %.1f TFLOP/s = %.1f%% of the "
              "datasheet's %.0f\n",
              total, flops / total / 1e9, 100 * flops / total / 1e9 / datasheet, datasheet);
  return 0;
}
