// One mixture-of-experts layer against a dense layer of the same FLOPs, forward + backward on one
// rank (issue 28, docs/PERFORMANCE.md "Mixture of experts"). Sizes of the reference benchmark:
// hidden 384, 6 heads, seq 256, micro-batch 8 (N = 2048 tokens); the MoE layer has 8 GELU experts
// of width 4h = 1536, Megatron-Core's top-2 router, dropless, aux loss 0.01; the dense layer's MLP
// has width k * 1536 = 3072, so both MLPs compute 2 * 2 * N * C * 3072 FLOPs forward (the router
// adds 0.26%).
//
//   1. whole layer  GptChunk holding one transformer layer (no embedding, no head), the real code
//                   path: forward + backward (input and weight gradients), ms and GFLOP/s of model
//                   FLOPs, MoE / dense;
//   2. MLP part     the same runs, cut by an OpProbe that timestamps every op point the chunk shows
//                   (model/op_probe.hpp): the MLP branch alone (ln_2's output -> the branch output,
//                   and its backward), and the MoE layer's phases with their share;
//   3. expert GEMMs the GEMMs the MoE layer runs (model/gpt_chunk_moe.cpp: one linear per expert on
//   its
//                   row block, rows as routed in part 1) against the same GEMMs on the dense (N,
//                   kFe) block: forward, input gradient and weight gradient, GFLOP/s and the ratio;
//   4. routing      moe_route and moe_route_backward alone on the (N, E) logits (single-threaded).
// Every figure is the median over `reps` rounds (MoE and dense timed in turns, so load from other
// processes falls on both), with the range. Not a test: nothing here is checked.
//   build/bench/bench_moe_layer [threads (2)] [reps (10)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.hpp"
#include "model/gpt_chunk.hpp"
#include "model/moe_routing.hpp"
#include "model/op_probe.hpp"

using namespace troupe;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Stat {
  double median = 0, lo = 0, hi = 0;
};
Stat stat(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

// Timestamps of the op points of layer 0, by "op:direction", the first of each per pass.
class PhaseClock : public OpProbe {
 public:
  void after(const ProbePoint& at, const Tensor&) override {
    if (at.layer != 0) return;
    marks_.emplace(std::string(at.tensor) + ":" + probe_dir_name(at.dir), Clock::now());
  }
  void clear() { marks_.clear(); }
  // ms from point a to point b (both must have been seen).
  double between(const std::string& a, const std::string& b) const {
    const auto ia = marks_.find(a), ib = marks_.find(b);
    if (ia == marks_.end() || ib == marks_.end()) {
      std::fprintf(stderr, "bench_moe_layer: op point %s or %s not seen\n", a.c_str(), b.c_str());
      std::exit(1);
    }
    return std::chrono::duration<double, std::milli>(ib->second - ia->second).count();
  }

 private:
  std::map<std::string, Clock::time_point> marks_;  // emplace keeps the first
};

GptConfig layer_config(bool moe) {
  GptConfig m;
  m.num_layers = 1;
  m.hidden_size = 384;
  m.num_attention_heads = 6;
  m.seq_length = 256;
  m.max_position_embeddings = 256;
  m.vocab_size =
      128;  // no embedding or head in the chunk; the FLOP count's head term is removed below
  if (moe) {
    m.moe.num_experts = {8};
    m.moe.router = MoeRouter::megatron;
    m.moe.topk = 2;
    m.moe.drop_tokens = false;
    m.moe.load_balancing = MoeLoadBalancing::aux_loss;
    m.moe.aux_loss_coeff = 0.01;
  } else {
    m.ffn_hidden = 2 * 4 * 384;  // k * the expert's width
  }
  return m;
}

// One transformer layer as a chunk of its own, its input and output gradient.
struct LayerRun {
  GptConfig model;
  GptChunk chunk;
  Tensor x, out, dout, din;
  PhaseClock clock;
  int64_t iteration = 0;

  LayerRun(const GptConfig& m, int B, std::mt19937& g) : model(m), chunk(spec(m, B), nullptr) {
    chunk.init(1234);
    const int64_t N = int64_t{B} * m.seq_length, C = m.hidden_size;
    x = Tensor::empty({N, C});
    dout = Tensor::empty({N, C});
    out = Tensor::empty({N, C});
    din = Tensor::empty({N, C});
    std::normal_distribution<float> n(0, 1);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n(g);
    for (int64_t i = 0; i < dout.numel(); ++i) dout.data<float>()[i] = 1e-3f * n(g);
    chunk.set_probe(&clock);
  }
  static ChunkSpec spec(const GptConfig& m, int B) {
    ChunkSpec s;
    s.model = m;
    s.num_layers = 1;
    s.micro_batch = B;
    return s;
  }
  // forward + backward (input and weight gradients) of one micro-batch; ms.
  double step(Context& ctx) {
    clock.clear();
    const MicroBatchKey key{1234, iteration++, 0};
    const auto t0 = Clock::now();
    chunk.forward(ctx, 0, Tensor(), x, out, 1.0 / static_cast<double>(x.dim(0)), false, key);
    chunk.backward(ctx, 0, dout, din);
    return ms_since(t0);
  }
};

// Model FLOPs of one layer's forward + backward over N tokens (GptConfig's count, the head
// removed), and of its MLP (or MoE) branch alone.
double layer_flops(const GptConfig& m, int64_t N) {
  return m.flops_per_iteration(N) -
         6.0 * static_cast<double>(N) * m.hidden_size * static_cast<double>(m.padded_vocab_size(1));
}
double mlp_flops(const GptConfig& m, int64_t N) {
  const double C = m.hidden_size, n = static_cast<double>(N);
  if (!m.moe.enabled()) return 6.0 * n * 2.0 * C * m.ffn_hidden_size();
  return 6.0 * n * (m.moe.topk * 2.0 * C * m.expert_ffn_hidden_size() + C * m.moe.num_experts[0]);
}

Tensor rnd(const Shape& s, std::mt19937& g) {
  Tensor t = Tensor::empty(s);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.05f * u(g);
  return t;
}

// The MLP GEMMs over row blocks (one per expert; the dense layer: one block of N rows): fc1 (rows,
// C) -> (rows, F), fc2 (rows, F) -> (rows, C), as model/gpt_chunk_moe.cpp calls them per expert.
struct BlockGemms {
  std::vector<int64_t> offs;  // row blocks
  int64_t C, F;
  Tensor x, h, y, dy, dh, dx;
  std::vector<Tensor> w1, b1, w2, b2, dw1, db1, dw2, db2;

  BlockGemms(const std::vector<int64_t>& rows, int64_t C_, int64_t F_, std::mt19937& g)
      : C(C_), F(F_) {
    offs.push_back(0);
    for (int64_t r : rows) offs.push_back(offs.back() + r);
    const int64_t K = offs.back();
    x = rnd({K, C}, g), h = rnd({K, F}, g), y = rnd({K, C}, g), dy = rnd({K, C}, g),
    dh = rnd({K, F}, g);
    dx = rnd({K, C}, g);
    for (size_t e = 0; e < rows.size(); ++e) {
      w1.push_back(rnd({F, C}, g)), b1.push_back(rnd({F}, g)), w2.push_back(rnd({C, F}, g)),
          b2.push_back(rnd({C}, g));
      dw1.push_back(rnd({F, C}, g)), db1.push_back(rnd({F}, g)), dw2.push_back(rnd({C, F}, g));
      db2.push_back(rnd({C}, g));
    }
  }
  template <class Fn>
  void each(Fn&& f) {
    for (size_t e = 0; e + 1 < offs.size(); ++e)
      if (offs[e + 1] > offs[e]) f(e, offs[e], offs[e + 1]);
  }
  void forward(Context& ctx) {
    each([&](size_t e, int64_t r0, int64_t r1) {
      ops::linear_forward(ctx, h.rows(r0, r1), x.rows(r0, r1), w1[e], b1[e]);
      ops::linear_forward(ctx, y.rows(r0, r1), h.rows(r0, r1), w2[e], b2[e]);
    });
  }
  void backward_input(Context& ctx) {
    const Tensor none;
    each([&](size_t e, int64_t r0, int64_t r1) {
      ops::linear_backward(ctx, dh.rows(r0, r1), none, none, dy.rows(r0, r1), none, w2[e]);
      ops::linear_backward(ctx, dx.rows(r0, r1), none, none, dh.rows(r0, r1), none, w1[e]);
    });
  }
  void backward_weight(Context& ctx) {
    const Tensor none;
    each([&](size_t e, int64_t r0, int64_t r1) {
      ops::linear_backward(ctx, none, dw2[e], db2[e], dy.rows(r0, r1), h.rows(r0, r1), none);
      ops::linear_backward(ctx, none, dw1[e], db1[e], dh.rows(r0, r1), x.rows(r0, r1), none);
    });
  }
  // The activation between the two GEMMs, per block as the MoE layer runs it.
  void gelu_fwd(Context& ctx) {
    each([&](size_t, int64_t r0, int64_t r1) {
      ops::gelu_forward(ctx, h.rows(r0, r1), dh.rows(r0, r1));
    });
  }
  void gelu_bwd(Context& ctx) {
    each([&](size_t, int64_t r0, int64_t r1) {
      ops::gelu_backward(ctx, dh.rows(r0, r1), h.rows(r0, r1), dh.rows(r0, r1));
    });
  }
  double flops_per_pass() const { return 2.0 * 2.0 * static_cast<double>(offs.back()) * C * F; }
};

void row(const char* name, const Stat& moe, const Stat& dense, double moe_flops,
         double dense_flops) {
  std::printf("| %s | %.1f (%.1f-%.1f) | %.1f | %.1f (%.1f-%.1f) | %.1f | **%.0f%%** |\n", name,
              moe.median, moe.lo, moe.hi, moe_flops / moe.median / 1e6, dense.median, dense.lo,
              dense.hi, dense_flops / dense.median / 1e6,
              100.0 * (moe_flops / moe.median) / (dense_flops / dense.median));
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  if (threads < 1 || reps < 1) {
    std::fprintf(stderr, "usage: bench_moe_layer [threads >= 1] [reps >= 1]\n");
    return 2;
  }
  configure_blas_threads();
  ThreadPool pool(threads);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937 g(1);
  const int B = 8;
  LayerRun moe(layer_config(true), B, g), dense(layer_config(false), B, g);
  const int64_t N = int64_t{B} * moe.model.seq_length, C = moe.model.hidden_size;
  const int64_t E = moe.model.moe.num_experts[0], k = moe.model.moe.topk,
                Fe = moe.model.expert_ffn_hidden_size();
  for (int w = 0; w < 2; ++w) moe.step(ctx), dense.step(ctx);
  std::vector<int64_t> kept;  // rows per expert of the last MoE forward
  (void)moe.chunk.take_moe_stats();

  // Parts 1 and 2: the layer, cut at the op points.
  std::map<std::string, std::vector<double>> t;
  for (int r = 0; r < reps; ++r) {
    t["moe layer"].push_back(moe.step(ctx));
    const PhaseClock& m = moe.clock;
    t["moe mlp"].push_back(m.between("ln2:forward", "mlp_fc2:forward") +
                           m.between("residual2:backward", "mlp_fc1:backward") +
                           m.between("ln1:backward", "ln2:weight"));
    t["moe router fwd"].push_back(m.between("ln2:forward", "moe_router:forward"));
    t["moe route+dispatch+experts fwd"].push_back(
        m.between("moe_router:forward", "moe_experts:forward"));
    t["moe combine fwd"].push_back(m.between("moe_experts:forward", "mlp_fc2:forward"));
    t["moe dy scatter+experts dgrad"].push_back(
        m.between("residual2:backward", "moe_experts:backward"));
    t["moe dx combine+route bwd"].push_back(
        m.between("moe_experts:backward", "moe_router:backward"));
    t["moe router dgrad"].push_back(m.between("moe_router:backward", "mlp_fc1:backward"));
    t["moe router wgrad"].push_back(m.between("ln1:backward", "moe_router:weight"));
    t["moe experts wgrad"].push_back(m.between("moe_router:weight", "ln2:weight"));
    t["dense layer"].push_back(dense.step(ctx));
    const PhaseClock& d = dense.clock;
    t["dense mlp"].push_back(d.between("ln2:forward", "mlp_fc2:forward") +
                             d.between("residual2:backward", "mlp_fc1:backward") +
                             d.between("ln1:backward", "ln2:weight"));
    const std::vector<MoeLayerStats> st = moe.chunk.take_moe_stats();
    kept = st.at(0).kept;
  }

  // Part 3: the expert GEMMs on the rows as routed, against the dense block.
  BlockGemms eg(kept, C, Fe, g), dg({N}, C, k * Fe, g);
  for (int r = 0; r < reps + 1; ++r) {
    const bool timed = r > 0;
    auto time = [&](const char* name, const std::function<void()>& f) {
      const auto t0 = Clock::now();
      f();
      if (timed) t[name].push_back(ms_since(t0));
    };
    time("moe gelu fwd", [&] { eg.gelu_fwd(ctx); });
    time("moe gelu bwd", [&] { eg.gelu_bwd(ctx); });
    time("moe gemm fwd", [&] { eg.forward(ctx); });
    time("dense gemm fwd", [&] { dg.forward(ctx); });
    time("moe gemm dgrad", [&] { eg.backward_input(ctx); });
    time("dense gemm dgrad", [&] { dg.backward_input(ctx); });
    time("moe gemm wgrad", [&] { eg.backward_weight(ctx); });
    time("dense gemm wgrad", [&] { dg.backward_weight(ctx); });
  }

  // Part 4: the routing alone, on logits like the router's (std 0.4).
  std::vector<double> logits(static_cast<size_t>(N * E)), dweight(static_cast<size_t>(N * k)),
      dl(logits.size());
  std::normal_distribution<double> nd(0, 0.4);
  for (double& v : logits) v = nd(g);
  for (double& v : dweight) v = nd(g);
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    const MoeRouting rt =
        moe_route(moe.model.moe, logits.data(), B, moe.model.seq_length, E, true, MoeDraws{});
    t["moe_route"].push_back(ms_since(t0));
    t0 = Clock::now();
    moe_route_backward(moe.model.moe, rt, logits.data(), dweight.data(), 0.01, 0, dl.data());
    t["moe_route_backward"].push_back(ms_since(t0));
  }

  std::printf(
      "bench_moe_layer: %d threads, median (range) of %d rounds; N = %lld tokens, hidden %lld, "
      "%lld experts of width %lld, top-%lld, dropless; dense MLP width %lld\n",
      threads, reps, static_cast<long long>(N), static_cast<long long>(C),
      static_cast<long long>(E), static_cast<long long>(Fe), static_cast<long long>(k),
      static_cast<long long>(k * Fe));
  std::printf("rows per expert (last round):");
  for (int64_t r : kept) std::printf(" %lld", static_cast<long long>(r));
  std::printf(
      "\n\n| forward + backward | MoE ms | MoE GFLOP/s | dense ms | dense GFLOP/s | MoE rate / "
      "dense |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  row("whole layer (GptChunk)", stat(t["moe layer"]), stat(t["dense layer"]),
      layer_flops(moe.model, N), layer_flops(dense.model, N));
  row("MLP branch in the layer", stat(t["moe mlp"]), stat(t["dense mlp"]), mlp_flops(moe.model, N),
      mlp_flops(dense.model, N));
  const double gf = eg.flops_per_pass(), dgf = dg.flops_per_pass();
  auto sum3 = [&](const char* p) {
    const std::string s(p);
    std::vector<double> v;
    for (int r = 0; r < reps; ++r)
      v.push_back(t[s + " gemm fwd"][r] + t[s + " gemm dgrad"][r] + t[s + " gemm wgrad"][r]);
    return stat(v);
  };
  row("expert GEMMs alone (fwd+dgrad+wgrad)", sum3("moe"), sum3("dense"), 3 * gf, 3 * dgf);
  row("  forward", stat(t["moe gemm fwd"]), stat(t["dense gemm fwd"]), gf, dgf);
  row("  input gradient", stat(t["moe gemm dgrad"]), stat(t["dense gemm dgrad"]), gf, dgf);
  row("  weight gradient", stat(t["moe gemm wgrad"]), stat(t["dense gemm wgrad"]), gf, dgf);

  const double mlp = stat(t["moe mlp"]).median;
  std::printf("\nThe MoE branch's %.1f ms (median), by op points (model/gpt_chunk_moe.cpp):\n\n",
              mlp);
  std::printf("| phase | ms | range | share |\n|---|---:|---:|---:|\n");
  for (const char* p : {"moe router fwd", "moe route+dispatch+experts fwd", "moe combine fwd",
                        "moe dy scatter+experts dgrad", "moe dx combine+route bwd",
                        "moe router dgrad", "moe router wgrad", "moe experts wgrad"}) {
    const Stat s = stat(t[p]);
    std::printf("| %s | %.1f | %.1f-%.1f | %.0f%% |\n", p + 4, s.median, s.lo, s.hi,
                100.0 * s.median / mlp);
  }
  const Stat rf = stat(t["moe_route"]), rb = stat(t["moe_route_backward"]);
  const double fwd_ops = stat(t["moe gemm fwd"]).median + stat(t["moe gelu fwd"]).median,
               dgrad_ops = stat(t["moe gemm dgrad"]).median + stat(t["moe gelu bwd"]).median;
  std::printf(
      "\nAlone: moe_route %.2f ms (%.2f-%.2f), moe_route_backward %.2f ms (%.2f-%.2f), one "
      "thread.\n",
      rf.median, rf.lo, rf.hi, rb.median, rb.lo, rb.hi);
  std::printf(
      "Host loops, estimated as a phase's median less the median of its GEMMs and GELU alone: "
      "forward routing + dispatch %.1f ms, backward d(y) scatter %.1f ms (GELU alone: %.1f ms "
      "forward, %.1f ms backward).\n",
      stat(t["moe route+dispatch+experts fwd"]).median - fwd_ops,
      stat(t["moe dy scatter+experts dgrad"]).median - dgrad_ops, stat(t["moe gelu fwd"]).median,
      stat(t["moe gelu bwd"]).median);
  return 0;
}
