// Times every op of the GPT model at the reference benchmark's sizes (4 layers, hidden 384, 6 heads,
// seq 256, micro-batch 8, vocabulary 50304) and prints ms per call, GFLOP/s for the GEMM-bound ones,
// and the share of one iteration's time. Tells where a training step goes. Below it, the model
// families' ops at the same sizes (RMSNorm, SwiGLU, rotary, grouped-query attention with ALiBi), beside
// the GPT-2 op each one replaces; they are not part of the iteration's sum.
//   build/bench/bench_ops [threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.hpp"

using namespace troupe;

namespace {
Tensor rnd(const Shape& s, std::mt19937& g) {
  Tensor t = Tensor::empty(s);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(g) * 0.1f;
  return t;
}
double time_ms(const std::function<void()>& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
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
  std::mt19937 g(1);
  const int64_t B = 8, T = 256, C = 384, H = 6, F = 4 * C, V = 50257, Vp = 50304, N = B * T, L = 4;
  const int64_t chunk = 320;
  Tensor x = rnd({N, C}, g), y = rnd({N, C}, g), mean = rnd({N}, g), rstd = rnd({N}, g);
  for (int64_t i = 0; i < N; ++i) rstd.data<float>()[i] = 1.0f;
  Tensor w = rnd({C}, g), b = rnd({C}, g), dw = rnd({C}, g), db = rnd({C}, g);
  Tensor wqkv = rnd({3 * C, C}, g), bqkv = rnd({3 * C}, g), qkv = rnd({B, T, 3 * C}, g), dqkv = rnd({B, T, 3 * C}, g);
  Tensor wfc = rnd({F, C}, g), bfc = rnd({F}, g), fc = rnd({N, F}, g), dfc = rnd({N, F}, g);
  Tensor wp = rnd({C, F}, g), dwp = rnd({C, F}, g), dwqkv = rnd({3 * C, C}, g), dwfc = rnd({F, C}, g), dbf = rnd({F}, g);
  Tensor att = rnd({B, T, C}, g), probs = rnd({B, H, T, T}, g);
  Tensor wte = rnd({Vp, C}, g), dwte = rnd({Vp, C}, g), logits = rnd({chunk, Vp}, g), losses = rnd({N}, g);
  Tensor targets = Tensor::empty({N}, DType::i32);
  for (int64_t i = 0; i < N; ++i) targets.data<int32_t>()[i] = static_cast<int32_t>(i * 7919 % V);
  Tensor dx = rnd({N, C}, g);

  struct Row {
    std::string name;
    double ms;
    double flops;
    int64_t per_iter;
  };
  std::vector<Row> rows;
  auto add = [&](const std::string& n, double flops, int64_t per_iter, const std::function<void()>& f) {
    rows.push_back({n, time_ms(f), flops, per_iter});
  };
  add("layernorm fwd (N,C)", 0, 2 * L + 1, [&] { ops::layernorm_forward(ctx, y, mean, rstd, x, w, b, 1e-5); });
  add("layernorm bwd (N,C)", 0, 2 * L + 1, [&] { ops::layernorm_backward(ctx, dx, dw, db, y, x, w, mean, rstd); });
  add("linear fwd qkv C->3C", 2.0 * N * C * 3 * C, L, [&] { ops::linear_forward(ctx, qkv.view({N, 3 * C}), x, wqkv, bqkv); });
  add("linear bwd qkv", 4.0 * N * C * 3 * C, L, [&] { ops::linear_backward(ctx, dx, dwqkv, bqkv, dqkv.view({N, 3 * C}), x, wqkv); });
  add("attention fwd", 4.0 * B * H * T * T * (C / H), L, [&] { ops::attention_forward(ctx, att, probs, qkv, H); });
  add("attention bwd", 8.0 * B * H * T * T * (C / H), L, [&] { ops::attention_backward(ctx, dqkv, att, qkv, probs, H); });
  add("linear fwd fc C->4C", 2.0 * N * C * F, L, [&] { ops::linear_forward(ctx, fc, x, wfc, bfc); });
  add("linear bwd fc", 4.0 * N * C * F, L, [&] { ops::linear_backward(ctx, dx, dwfc, dbf, fc, x, wfc); });
  add("linear fwd proj 4C->C", 2.0 * N * C * F, L, [&] { ops::linear_forward(ctx, y, fc, wp, b); });
  add("linear bwd proj", 4.0 * N * C * F, L, [&] { ops::linear_backward(ctx, dfc, dwp, db, y, fc, wp); });
  add("linear fwd proj C->C", 2.0 * N * C * C, L, [&] { ops::linear_forward(ctx, y, x, wqkv.rows(0, C), b); });
  add("linear bwd proj C->C", 4.0 * N * C * C, L, [&] { ops::linear_backward(ctx, dx, dwqkv.rows(0, C), db, y, x, wqkv.rows(0, C)); });
  add("gelu fwd (N,4C)", 0, L, [&] { ops::gelu_forward(ctx, dfc, fc); });
  add("gelu bwd (N,4C)", 0, L, [&] { ops::gelu_backward(ctx, dfc, dfc, fc); });
  add("residual add (N,C)", 0, 2 * L, [&] { ops::add_inplace(ctx, y, x); });
  const int64_t chunks = (N + chunk - 1) / chunk;
  add("head logits fwd (chunk)", 2.0 * chunk * C * Vp, chunks, [&] { ops::linear_forward(ctx, logits, x.rows(0, chunk), wte, Tensor()); });
  add("softmax xent (chunk)", 0, chunks, [&] { ops::softmax_cross_entropy(ctx, losses.rows(0, chunk), logits, targets.rows(0, chunk), V, 1e-4); });
  add("head bwd (chunk)", 4.0 * chunk * C * Vp, chunks, [&] { ops::linear_backward(ctx, dx.rows(0, chunk), dwte, Tensor(), logits, x.rows(0, chunk), wte); });
  add("embedding fwd", 0, 1, [&] { ops::embedding_forward(ctx, x.view({B, T, C}), targets.view({B, T}), wte, wte.rows(0, T)); });
  add("embedding bwd", 0, 1, [&] { ops::embedding_backward(ctx, dwte, dwte.rows(0, T), x.view({B, T, C}), targets.view({B, T})); });

  // The model families' ops (calls 0: outside the GPT-2 iteration). SwiGLU on Megatron's F = 1024
  // for C = 384; GQA with 6 query heads of 64 in 2 and 1 key/value groups.
  const int64_t Fs = 1024;
  Tensor gate_up = rnd({N, 2 * Fs}, g), glu = rnd({N, Fs}, g), dgate_up = rnd({N, 2 * Fs}, g);
  add("rmsnorm fwd (N,C)", 0, 0, [&] { ops::rmsnorm_forward(ctx, y, rstd, x, w, 1e-5); });
  add("rmsnorm bwd (N,C)", 0, 0, [&] { ops::rmsnorm_backward(ctx, dx, dw, y, x, w, rstd); });
  add("swiglu fwd (N,2F)->(N,F)", 0, 0, [&] { ops::glu_forward(ctx, glu, gate_up, ops::GluKind::swiglu); });
  add("swiglu bwd", 0, 0, [&] { ops::glu_backward(ctx, dgate_up, glu, gate_up, ops::GluKind::swiglu); });
  ops::RotaryParams rp;
  rp.rotary_dim = static_cast<int>(C / H);
  add("rotary q+k (B,T,3C)", 0, 0, [&] {
    ops::rotary_forward(ctx, qkv, 0, static_cast<int>(H), static_cast<int>(C / H), rp);
    ops::rotary_forward(ctx, qkv, C, static_cast<int>(H), static_cast<int>(C / H), rp);
  });
  for (int groups : {2, 1}) {
    ops::AttentionLayout layout;
    layout.n_head = static_cast<int>(H);
    layout.n_group = groups;
    layout.head_dim = static_cast<int>(C / H);
    const int64_t W = (H + 2 * groups) * (C / H);
    Tensor gqkv = rnd({B, T, W}, g), gdqkv = rnd({B, T, W}, g);
    const std::string name = groups == 1 ? "MQA" : "GQA G=" + std::to_string(groups);
    add("attention fwd " + name, 4.0 * B * H * T * T * (C / H), 0, [&] { ops::attention_forward(ctx, att, probs, gqkv, layout); });
    add("attention bwd " + name, 8.0 * B * H * T * T * (C / H), 0, [&] { ops::attention_backward(ctx, gdqkv, att, gqkv, probs, layout); });
    if (groups == 2) {
      layout.alibi_slopes = ops::alibi_slopes(static_cast<int>(H));
      add("attention fwd " + name + " ALiBi", 4.0 * B * H * T * T * (C / H), 0, [&] { ops::attention_forward(ctx, att, probs, gqkv, layout); });
    }
  }

  double total = 0, flops = 0;
  for (auto& r : rows) {
    total += r.ms * r.per_iter;
    flops += r.flops * r.per_iter;
  }
  std::printf("%-26s %9s %9s %8s %7s\n", "op", "ms/call", "GFLOP/s", "calls", "share");
  for (auto& r : rows) {
    if (r.per_iter == 0 && &r != &rows.front() && (&r - 1)->per_iter != 0) std::printf("model families (not in the sum):\n");
    std::printf("%-26s %9.2f %9.1f %8lld %6.1f%%\n", r.name.c_str(), r.ms, r.flops > 0 ? r.flops / r.ms / 1e6 : 0.0,
                static_cast<long long>(r.per_iter), 100.0 * r.ms * r.per_iter / total);
  }
  std::printf("sum over one iteration (ops only, no optimizer): %.1f ms, %.1f GFLOP/s on %d thread(s)\n", total,
              flops / total / 1e6, threads);
  return 0;
}
