// An MoE layer's MLP on one tensor-parallel rank (docs/MOE.md):
//
//   logits = x_r W_router^T [+ b_router]      x_r = x, or x * U(1 - eps, 1 + eps) (input jitter)
//   routing = moe_route(logits)               model/moe_routing.hpp: experts, drops, weights, losses
//   y_i = expert_e(x_n)                       for every kept assignment i = (token n, expert e), the
//                                             local experts' rows gathered expert by expert
//   routed_n = sum_j w_nj y_(n,j)             in assignment order j
//   out = routed [+ shared_expert(x)]         or PR-MoE: routed * c0 + mlp(x) * c1 with
//                                             c = softmax(x W_coef^T + b_coef)
//
// Tensor parallelism. Every TP rank sees all N rows of x (gathered under sequence parallelism) and the
// same replicated router, so every rank routes alike. Experts split over TP (expert-TP = TP) are
// column/row-parallel like the MLP: their outputs y are partial sums, all-reduced over TP before they
// are weighted (the weights' gradient needs the whole y); whole experts (expert-TP 1) compute y
// whole on every rank. The shared expert and PR-MoE's dense MLP are split like the MLP and
// all-reduced. So the output is whole on every rank, and the layer takes its rows of it.
// In backward, d(out) is whole and alike on every rank; d(x) is returned as this rank's share: the
// split pieces' input gradients (partial sums) plus, on TP rank 0 only, the gradients every rank
// computes whole (router, coefficient, whole experts), so the TP reduction of the layer sums each
// once. Gradients of replicated parameters come from whole tensors and are alike on every rank.
//
// The objective adds moe_loss_weight * (aux_loss_coeff * lb_loss + z_loss_coeff * z_loss) per
// micro-batch (moe_loss_weight = grad_scale * N: the head's weight on a micro-batch's mean loss).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "kernels/ops.hpp"
#include "model/gpt_chunk_impl.hpp"

namespace troupe {

namespace {

// The stream of an MoE layer's draws, apart from the dropout masks' (4 * layer + site).
constexpr uint32_t kMoeStream = 0x40000000u;
constexpr int kJitter = 2;  // the third purpose besides MoeDraw::rts, MoeDraw::gumbel

// u in (0, 1) for element `element` of global sample `sample` of stream `purpose` of `layer`.
double uniform_at(const MicroBatchKey& key, int layer, int purpose, int64_t sample, int64_t element) {
  DropoutMask m;
  m.seed = key.seed;
  m.iteration = static_cast<uint32_t>(key.iteration);
  m.stream = kMoeStream + 4 * static_cast<uint32_t>(layer) + static_cast<uint32_t>(purpose);
  uint32_t w[4];
  m.words(sample, element / 4, w);
  return (static_cast<double>(w[element % 4]) + 0.5) * 0x1p-32;
}

Tensor& ensure(Tensor& t, const Shape& shape, DType dtype, Device device) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dtype) t = Tensor::empty(shape, dtype, device);
  return t;
}

std::vector<double> host_values(const Tensor& t) {
  const Tensor h = t.dtype() == DType::f64 ? t.to_host() : t.to(DType::f64);
  const double* d = h.data<double>();
  return std::vector<double>(d, d + h.numel());
}

void set_values(const Tensor& t, const std::vector<double>& v) {
  const Tensor h = Tensor::wrap(const_cast<double*>(v.data()), t.shape(), DType::f64, nullptr);
  t.copy_from(t.dtype() == DType::f64 ? h : h.to(t.dtype()));
}

// Elementwise host loops on f32 or f64 tensors: the compute type (below).
template <class F>
void with_type(DType dtype, F&& f) {
  if (dtype == DType::f64) f(double{});
  else if (dtype == DType::f32) f(float{});
  else TROUPE_CHECK(false, "MoE host loops compute in f32 or f64");
}

// What the host loops, the router and PR-MoE's coefficient compute in: f64 in an f64 model, else f32.
// A 16-bit model's tensors are widened exactly for them and their results rounded once into the
// model's dtype, as every op does (kernels/ops.hpp); the router's logits, its input and their
// gradients stay f32 (DeepSpeed's gate always runs in fp32; Megatron-Core's with --moe-router-dtype fp32).
DType compute_type(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

// t in the compute type ct: t itself, or a widened host copy.
Tensor widened(const Tensor& t, DType ct) { return t.dtype() == ct ? t : t.to(ct); }

// Where a loop writes dst's values in the compute type: dst itself, or a temporary that narrow_into
// rounds into dst afterwards.
Tensor result_buffer(const Tensor& dst, DType ct) {
  return dst.dtype() == ct ? dst : Tensor::empty(dst.shape(), ct, Device::cpu);
}
void narrow_into(Context& ctx, const Tensor& dst, const Tensor& buffer) {
  if (buffer.raw() != dst.raw()) ops::convert(ctx, dst, buffer);
}

// fn(first, last) over ranges of rows [0, n) on the rank's pool, for loops in which every row is
// computed by itself (so where the ranges fall changes no bit).
void for_rows(Context& ctx, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (ctx.pool != nullptr && n > 64) ctx.pool->parallel_for(n, fn, 64);
  else fn(0, n);
}

// Every cp rank's gathered rows (rank-major, (B, T, width) each) placed at their global rows
// b * Tg + position: the whole sequences' (B * Tg, width).
std::vector<double> whole_rows(const std::vector<double>& gathered, const std::vector<std::vector<int64_t>>& positions,
                               int64_t B, int64_t T, int64_t Tg, int64_t width) {
  std::vector<double> out(static_cast<size_t>(B * Tg * width), 0.0);
  for (size_t q = 0; q < positions.size(); ++q)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i)
        std::copy_n(gathered.data() + ((static_cast<int64_t>(q) * B + b) * T + i) * width, width,
                    out.data() + (b * Tg + positions[q][static_cast<size_t>(i)]) * width);
  return out;
}

}  // namespace

void GptChunk::Impl::moe_exchange(const Tensor& send, const std::vector<size_t>& send_rows, const Tensor& recv,
                                  const std::vector<size_t>& recv_rows, const char* what, int layer) {
  std::vector<size_t> sc(send_rows.size()), rc(recv_rows.size());
  for (size_t q = 0; q < sc.size(); ++q) {
    sc[q] = send_rows[q] * static_cast<size_t>(C);
    rc[q] = recv_rows[q] * static_cast<size_t>(C);
  }
  const auto issued = std::chrono::steady_clock::now();
  comm::wait_or_throw(ep->all_to_all_v(send.raw(), sc, recv.raw(), rc, dtype), "MoE token all-to-all",
                      comm::WaitGroup::dp);
  comm::report_collective_span(std::string("MoE ") + what + " all-to-all, h." + std::to_string(layer), issued);
}

void GptChunk::Impl::permute_rows(const Tensor& from, const Tensor& to, const std::vector<int64_t>& perm,
                                  bool inverse) {
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(dtype);
  const char* src = static_cast<const char*>(from.raw());
  char* dst = static_cast<char*>(to.raw());
  for (size_t r = 0; r < perm.size(); ++r) {
    const size_t a = inverse ? static_cast<size_t>(perm[r]) : r, b = inverse ? r : static_cast<size_t>(perm[r]);
    std::memcpy(dst + a * row_bytes, src + b * row_bytes, row_bytes);
  }
}

// Context parallelism (docs/MOE.md, "Long sequences"): the routing reads the whole micro-batch in
// the anchors' order (capacity, drops, the load-balancing loss's sums), so every cp rank gathers the
// others' logits (B*T*E doubles each: small beside the tokens), places them at their global rows, and
// routes the B whole sequences alike; each keeps its rows. The losses are the whole micro-batch's,
// on every cp rank: the statistics count cp rank 0's (engine/rank_engine.cpp), and the logits'
// gradient of each rank's rows is its share of one objective term.
void GptChunk::Impl::moe_route_whole(const MoeConfig& cfg, int64_t E, int64_t routed_seqs, bool training,
                                     const MoeDraws& draws, MoeActs& a, int layer) {
  const int64_t k = cfg.topk;
  std::vector<double> all(static_cast<size_t>(cps * N * E));
  const auto issued = std::chrono::steady_clock::now();
  comm::wait_or_throw(cp->all_gather(a.logits_host.data(), all.data(), static_cast<size_t>(N * E), DType::f64),
                      "MoE router logits all-gather over cp", comm::WaitGroup::other);
  comm::report_collective_span("cp all-gather MoE logits, h." + std::to_string(layer), issued);
  a.logits_whole = whole_rows(all, ring.positions, B, T, Tg, E);
  a.routing_whole = moe_route(cfg, a.logits_whole.data(), routed_seqs, Tg, E, training, draws);
  const MoeRouting& w = a.routing_whole;
  MoeRouting& mine = a.routing;
  mine = MoeRouting{};
  mine.S = N;
  mine.E = E;
  mine.k = k;
  mine.B = B;
  mine.T = T;
  mine.capacity = w.capacity;
  mine.expert.assign(static_cast<size_t>(N * k), -1);
  mine.kept.assign(static_cast<size_t>(N * k), 0);
  mine.weight.assign(static_cast<size_t>(N * k), 0.0);
  for (int64_t b = 0; b < routed_seqs; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const size_t from = static_cast<size_t>((b * Tg + pos[static_cast<size_t>(i)]) * k + j);
        const size_t to = static_cast<size_t>((b * T + i) * k + j);
        mine.expert[to] = w.expert[from];
        mine.kept[to] = w.kept[from];
        mine.weight[to] = w.weight[from];
      }
  // The whole micro-batch's figures, for the statistics.
  mine.routed = w.routed;
  mine.kept_count = w.kept_count;
  mine.dropped = w.dropped;
  mine.lb_loss = w.lb_loss;
  mine.z_loss = w.z_loss;
}

void GptChunk::Impl::moe_route_whole_backward(const MoeConfig& cfg, const MoeActs& a, const std::vector<double>& dweight,
                                              double lb_scale, double z_scale, std::vector<double>& dlogits,
                                              int layer) {
  const int64_t k = cfg.topk, E = a.routing_whole.E;
  std::vector<double> all(static_cast<size_t>(cps * N * k));
  const auto issued = std::chrono::steady_clock::now();
  comm::wait_or_throw(cp->all_gather(dweight.data(), all.data(), static_cast<size_t>(N * k), DType::f64),
                      "MoE combine-weight gradient all-gather over cp", comm::WaitGroup::other);
  comm::report_collective_span("cp all-gather MoE weight gradient, h." + std::to_string(layer), issued);
  const std::vector<double> whole = whole_rows(all, ring.positions, B, T, Tg, k);
  std::vector<double> dwhole(static_cast<size_t>(B * Tg * E));
  moe_route_backward(cfg, a.routing_whole, a.logits_whole.data(), whole.data(), lb_scale, z_scale, dwhole.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      std::copy_n(dwhole.data() + (b * Tg + pos[static_cast<size_t>(i)]) * E, E, dlogits.data() + (b * T + i) * E);
}

void GptChunk::Impl::moe_forward(Context& ctx, int l, int layer, const Layer& p, const Tensor& x, MoeActs& a,
                                 const Tensor& out) {
  const MoeLayout& mo = moe_layout[l];
  const MoeConfig& cfg = spec.model.moe;
  const int64_t E = mo.E, k = cfg.topk;
  const Device dev = spec.device;
  const MicroBatchKey* key = key_now;
  const bool training = key != nullptr;
  const Tensor none;
  constexpr ProbeDir F = ProbeDir::forward;

  // The router's input and logits.
  const DType ct = compute_type(dtype);
  Tensor xr = x;
  if (training && cfg.input_jitter_eps > 0) {
    ensure(a.xr, {N, C}, ct, dev);
    const double eps = cfg.input_jitter_eps;
    const Tensor xw = widened(x, ct);
    with_type(ct, [&](auto zero) {
      using T_ = decltype(zero);
      const T_* src = xw.data<T_>();
      T_* dst = a.xr.data<T_>();
      for_rows(ctx, N, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t c = 0; c < C; ++c) {
            const double u = uniform_at(*key, layer, kJitter, key->first_sample + n / T, position_of(n) * C + c);
            dst[n * C + c] = static_cast<T_>(src[n * C + c] * (1 - eps + 2 * eps * u));
          }
      });
    });
    xr = a.xr;
  } else {
    a.xr = Tensor();
  }
  ensure(a.logits, {N, E}, ct, dev);
  ops::linear_forward(ctx, a.logits, xr, p.moe.router, p.moe.router_b);
  look(layer, "moe_router", F, a.logits);
  a.logits_host = host_values(a.logits);
  const std::vector<double>& logits = a.logits_host;
  MoeDraws draws;
  if (training) {
    const MicroBatchKey kk = *key;
    const int64_t TT = Tg;  // draws by global row: whole sequences (context parallelism routes them whole)
    draws = [kk, layer, TT, E](MoeDraw purpose, int64_t row, int64_t e) {
      return uniform_at(kk, layer, static_cast<int>(purpose), kk.first_sample + row / TT, (row % TT) * E + e);
    };
  }
  // An evaluation batch padded to B sequences routes its valid sequences only: padding takes no
  // expert's capacity and gets no output.
  const int64_t routed_seqs = training ? B : std::max<int64_t>(1, loss_rows / T);
  if (cps > 1) moe_route_whole(cfg, E, routed_seqs, training, draws, a, layer);
  else a.routing = moe_route(cfg, logits.data(), routed_seqs, T, E, training, draws);
  if (routed_seqs < B) {
    MoeRouting& pad = a.routing;
    pad.expert.resize(static_cast<size_t>(N * k), -1);
    pad.kept.resize(static_cast<size_t>(N * k), 0);
    pad.weight.resize(static_cast<size_t>(N * k), 0.0);
  }
  const MoeRouting& rt = a.routing;

  // Dispatch (EP: the expert-parallel group's P ranks, rank q holding experts [q El, (q+1) El)). Send
  // side: this rank's kept assignments, peer by peer, expert by expert, tokens in row order. Expert
  // side: the rows every peer sent for this rank's experts, expert by expert, peers in order. With
  // P = 1 the two orders are one and nothing moves.
  const int P = spec.ep_size;
  const int El = mo.El;
  a.send_assign.clear();
  a.row_of.assign(static_cast<size_t>(N * k), -1);
  std::vector<int64_t> cnt(static_cast<size_t>(P * El), 0);
  // One pass over the assignments (rows in order) into per-expert lists, then expert by expert:
  // expert e = q El + j is peer q's j-th, so expert order is peer-then-expert order.
  {
    std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
    for (int64_t i = 0; i < N * k; ++i)
      if (rt.kept[i]) by_expert[static_cast<size_t>(rt.expert[i])].push_back(i);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t i : by_expert[static_cast<size_t>(e)]) {
        a.row_of[i] = static_cast<int64_t>(a.send_assign.size());
        a.send_assign.push_back(i);
      }
      cnt[static_cast<size_t>(e)] = static_cast<int64_t>(by_expert[static_cast<size_t>(e)].size());
    }
  }
  const int64_t Ks = static_cast<int64_t>(a.send_assign.size());
  a.recv_cnt = cnt;
  if (P > 1) {
    a.recv_cnt.assign(cnt.size(), 0);
    const auto issued = std::chrono::steady_clock::now();
    comm::wait_or_throw(ep->all_to_all(cnt.data(), a.recv_cnt.data(), static_cast<size_t>(El), DType::i64),
                        "MoE token counts all-to-all", comm::WaitGroup::dp);
    comm::report_collective_span("MoE counts all-to-all, h." + std::to_string(layer), issued);
  }
  a.send_rows.assign(static_cast<size_t>(P), 0);
  a.recv_rows.assign(static_cast<size_t>(P), 0);
  for (int q = 0; q < P; ++q)
    for (int j = 0; j < El; ++j) {
      a.send_rows[q] += static_cast<size_t>(cnt[static_cast<size_t>(q * El + j)]);
      a.recv_rows[q] += static_cast<size_t>(a.recv_cnt[static_cast<size_t>(q * El + j)]);
    }
  // perm[r]: the received row (peer-major) of expert-major row r; offs: each local expert's rows.
  int64_t K = 0;
  a.offs.assign(static_cast<size_t>(El) + 1, 0);
  a.perm.clear();
  {
    std::vector<int64_t> peer0(static_cast<size_t>(P) + 1, 0);
    for (int q = 0; q < P; ++q) peer0[q + 1] = peer0[q] + static_cast<int64_t>(a.recv_rows[q]);
    for (int j = 0; j < El; ++j) {
      a.offs[j] = K;
      for (int q = 0; q < P; ++q) {
        int64_t at = peer0[q];
        for (int jj = 0; jj < j; ++jj) at += a.recv_cnt[static_cast<size_t>(q * El + jj)];
        for (int64_t i = 0; i < a.recv_cnt[static_cast<size_t>(q * El + j)]; ++i) a.perm.push_back(at + i);
        K += a.recv_cnt[static_cast<size_t>(q * El + j)];
      }
    }
    a.offs[El] = K;
  }
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(dtype);
  ensure(a.xd, {std::max<int64_t>(K, 1), C}, dtype, dev);
  ensure(a.h, {std::max<int64_t>(K, 1), mo.FCe}, dtype, dev);
  ensure(a.act, {std::max<int64_t>(K, 1), mo.Fe}, dtype, dev);
  ensure(a.y, {std::max<int64_t>(K, 1), C}, dtype, dev);
  {
    Tensor xs = P > 1 ? Tensor::empty({std::max<int64_t>(Ks, 1), C}, dtype, dev) : a.xd;
    const char* src = static_cast<const char*>(x.raw());
    char* dst = static_cast<char*>(xs.raw());
    for_rows(ctx, Ks, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        std::memcpy(dst + i * row_bytes, src + (a.send_assign[i] / k) * row_bytes, row_bytes);
    });
    if (P > 1) {
      Tensor xr = Tensor::empty({std::max<int64_t>(K, 1), C}, dtype, dev);
      moe_exchange(xs, a.send_rows, xr, a.recv_rows, "dispatch", layer);
      permute_rows(xr, a.xd, a.perm, false);
    }
  }
  for (int e = 0; e < El; ++e) {
    const int64_t r0 = a.offs[e], r1 = a.offs[e + 1];
    if (r1 == r0) continue;
    const auto& w = p.moe.experts[static_cast<size_t>(e)];
    const Tensor h = a.h.rows(r0, r1), act = a.act.rows(r0, r1);
    ops::linear_forward(ctx, h, a.xd.rows(r0, r1), w[0], w[1]);
    if (swiglu) ops::glu_forward(ctx, act, h, ops::GluKind::swiglu);
    else ops::gelu_forward(ctx, act, h);
    // A split expert's c_proj bias is added once, by TP rank 0, inside the sum the reduction forms.
    ops::linear_forward(ctx, a.y.rows(r0, r1), act, w[2], mo.split && r != 0 ? none : w[3]);
  }
  if (mo.split && K > 0) all_reduce(a.y.rows(0, K), comm::ReduceOp::sum);
  look(layer, "moe_experts", F, K > 0 ? a.y.rows(0, K) : Tensor());
  // The outputs of this rank's assignments, in send order.
  if (P > 1) {
    Tensor yr = Tensor::empty({std::max<int64_t>(K, 1), C}, dtype, dev);
    permute_rows(a.y, yr, a.perm, true);
    ensure(a.y_mine, {std::max<int64_t>(Ks, 1), C}, dtype, dev);
    moe_exchange(yr, a.recv_rows, a.y_mine, a.send_rows, "combine", layer);
  } else {
    a.y_mine = a.y;
  }

  // routed = sum_j w_nj y_(n,j), assignments in order.
  const bool residual = mo.coef_w >= 0;
  {
    const Tensor ob = result_buffer(out, ct), yw = widened(a.y_mine, ct);
    with_type(ct, [&](auto zero) {
      using T_ = decltype(zero);
      T_* o = ob.data<T_>();
      const T_* y = yw.data<T_>();
      for_rows(ctx, N, [&](int64_t n0, int64_t n1) {
        std::fill(o + n0 * C, o + n1 * C, T_(0));
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t j = 0; j < k; ++j) {
            const int64_t row = a.row_of[n * k + j];
            if (row < 0) continue;
            const T_ wt = static_cast<T_>(rt.weight[n * k + j]);
            for (int64_t c = 0; c < C; ++c) o[n * C + c] += wt * y[row * C + c];
          }
      });
    });
    narrow_into(ctx, out, ob);
  }
  // A dense MLP of this layer on all rows, whole (all-reduced over TP): PR-MoE's or the shared expert.
  auto dense = [&](const Tensor& fc, const Tensor& act, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                   const Tensor& b2, const Tensor& result) {
    ops::linear_forward(ctx, fc, x, w1, b1);
    if (swiglu) ops::glu_forward(ctx, act, fc, ops::GluKind::swiglu);
    else ops::gelu_forward(ctx, act, fc);
    ops::linear_forward(ctx, result, act, w2, r == 0 ? b2 : none);
    if (t > 1) all_reduce(result, comm::ReduceOp::sum);
  };
  if (residual) {
    ensure(a.routed, {N, C}, dtype, dev).copy_from(out);
    ensure(a.mlp_fc, {N, p.fc_w.dim(0)}, dtype, dev);
    ensure(a.mlp_act, {N, p.fcproj_w.dim(1)}, dtype, dev);
    ensure(a.mlp_out, {N, C}, dtype, dev);
    dense(a.mlp_fc, a.mlp_act, p.fc_w, p.fc_b, p.fcproj_w, p.fcproj_b, a.mlp_out);
    Tensor cl = Tensor::empty({N, 2}, ct, dev);
    ops::linear_forward(ctx, cl, x, p.moe.coef_w, p.moe.coef_b);
    const std::vector<double> z = host_values(cl);
    a.coef.resize(static_cast<size_t>(N * 2));
    for (int64_t n = 0; n < N; ++n) {
      const double m = std::max(z[n * 2], z[n * 2 + 1]);
      const double e0 = std::exp(z[n * 2] - m), e1 = std::exp(z[n * 2 + 1] - m);
      a.coef[n * 2] = e0 / (e0 + e1);
      a.coef[n * 2 + 1] = e1 / (e0 + e1);
    }
    const Tensor ob = result_buffer(out, ct), rw = widened(a.routed, ct), mw = widened(a.mlp_out, ct);
    with_type(ct, [&](auto zero) {
      using T_ = decltype(zero);
      T_* o = ob.data<T_>();
      const T_* mo_ = rw.data<T_>();
      const T_* ml = mw.data<T_>();
      for_rows(ctx, N, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
          const T_ c0 = static_cast<T_>(a.coef[n * 2]), c1 = static_cast<T_>(a.coef[n * 2 + 1]);
          for (int64_t c = 0; c < C; ++c) o[n * C + c] = mo_[n * C + c] * c0 + ml[n * C + c] * c1;
        }
      });
    });
    narrow_into(ctx, out, ob);
  }
  if (mo.FCs > 0) {
    ensure(a.sh_fc, {N, mo.FCs}, dtype, dev);
    ensure(a.sh_act, {N, mo.Fs}, dtype, dev);
    Tensor sh = Tensor::empty({N, C}, dtype, dev);
    dense(a.sh_fc, a.sh_act, p.moe.sh_fc_w, p.moe.sh_fc_b, p.moe.sh_proj_w, p.moe.sh_proj_b, sh);
    ops::add_inplace(ctx, out, sh);
  }
  look(layer, "moe_output", F, out);

  if (count_moe) {
    MoeLayerStats* st = nullptr;
    for (auto& s : moe_stats)
      if (s.layer == layer) st = &s;
    if (st == nullptr) {
      moe_stats.push_back(MoeLayerStats{});
      st = &moe_stats.back();
      st->layer = layer;
      st->routed.assign(static_cast<size_t>(E), 0);
      st->kept.assign(static_cast<size_t>(E), 0);
    }
    ++st->micro_batches;
    st->lb_loss += rt.lb_loss;
    st->z_loss += rt.z_loss;
    for (int64_t e = 0; e < E; ++e) {
      st->routed[e] += rt.routed[e];
      st->kept[e] += rt.kept_count[e];
    }
    st->dropped += rt.dropped;
  }
}

void GptChunk::Impl::moe_backward_input(Context& ctx, int l, int layer, const Layer& p, const Tensor& x,
                                        const MoeActs& a, const Tensor& dy, MoeStash& st, const Tensor& dx) {
  (void)x;
  const MoeLayout& mo = moe_layout[l];
  const MoeConfig& cfg = spec.model.moe;
  const int64_t E = mo.E, k = cfg.topk;
  const Device dev = spec.device;
  const MoeRouting& rt = a.routing;
  const int64_t K = a.offs.empty() ? 0 : a.offs.back();
  const Tensor none;
  constexpr ProbeDir Bk = ProbeDir::backward;
  const bool residual = p.moe.coef_w.defined();
  const DType ct = compute_type(dtype);

  dx.zero_();
  Tensor whole = Tensor::zeros({N, C}, dtype, dev);  // gradients every rank computes whole
  Tensor tmp = Tensor::empty({N, C}, dtype, dev);
  // d(routed): dy, or PR-MoE's share dy * c0; PR-MoE's dense MLP and coefficient.
  Tensor droute = dy;
  if (residual) {
    droute = Tensor::empty({N, C}, dtype, dev);
    ensure(st.dmlp_out, {N, C}, dtype, dev);
    ensure(st.dmlp_fc, {N, p.fc_w.dim(0)}, dtype, dev);
    ensure(st.dcoef, {N, 2}, ct, dev);
    std::vector<double> dcl(static_cast<size_t>(N * 2));
    const Tensor gw = widened(dy, ct), rw = widened(a.routed, ct), mw = widened(a.mlp_out, ct);
    const Tensor drb = result_buffer(droute, ct), dmb = result_buffer(st.dmlp_out, ct);
    with_type(ct, [&](auto zero) {
      using T_ = decltype(zero);
      const T_* g = gw.data<T_>();
      const T_* ro = rw.data<T_>();
      const T_* ml = mw.data<T_>();
      T_* dr = drb.data<T_>();
      T_* dm = dmb.data<T_>();
      for_rows(ctx, N, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
          const double c0 = a.coef[n * 2], c1 = a.coef[n * 2 + 1];
          double d0 = 0, d1 = 0;
          for (int64_t c = 0; c < C; ++c) {
            const int64_t i = n * C + c;
            dr[i] = static_cast<T_>(g[i] * static_cast<T_>(c0));
            dm[i] = static_cast<T_>(g[i] * static_cast<T_>(c1));
            d0 += static_cast<double>(g[i]) * ro[i];
            d1 += static_cast<double>(g[i]) * ml[i];
          }
          const double dot = c0 * d0 + c1 * d1;
          dcl[n * 2] = c0 * (d0 - dot);
          dcl[n * 2 + 1] = c1 * (d1 - dot);
        }
      });
    });
    narrow_into(ctx, droute, drb);
    narrow_into(ctx, st.dmlp_out, dmb);
    set_values(st.dcoef, dcl);
    ops::linear_backward(ctx, tmp, none, none, st.dcoef, none, p.moe.coef_w);
    ops::add_inplace(ctx, whole, tmp);
    Tensor dact = Tensor::empty({N, p.fcproj_w.dim(1)}, dtype, dev);
    ops::linear_backward(ctx, dact, none, none, st.dmlp_out, none, p.fcproj_w);
    if (swiglu) ops::glu_backward(ctx, st.dmlp_fc, dact, a.mlp_fc, ops::GluKind::swiglu);
    else ops::gelu_backward(ctx, st.dmlp_fc, dact, a.mlp_fc);
    ops::linear_backward(ctx, tmp, none, none, st.dmlp_fc, none, p.fc_w);
    ops::add_inplace(ctx, dx, tmp);
  }

  // The experts: d(y_i) = w_i d(routed)_n, d(w_i) = <d(routed)_n, y_i>, on the send side; then
  // d(y) to the experts' ranks, their input gradients back.
  const int P = spec.ep_size;
  const int64_t Ks = static_cast<int64_t>(a.send_assign.size());
  std::vector<double> dweight(static_cast<size_t>(N * k), 0.0);
  Tensor dy_mine = P > 1 ? Tensor::empty({std::max<int64_t>(Ks, 1), C}, dtype, dev) : Tensor();
  ensure(st.dy, {std::max<int64_t>(K, 1), C}, dtype, dev);
  ensure(st.dh, {std::max<int64_t>(K, 1), mo.FCe}, dtype, dev);
  if (P == 1) dy_mine = st.dy;
  {
    const Tensor gw = widened(droute, ct), yw = widened(a.y_mine, ct), db = result_buffer(dy_mine, ct);
    with_type(ct, [&](auto zero) {
      using T_ = decltype(zero);
      const T_* g = gw.data<T_>();
      const T_* y = yw.data<T_>();
      T_* d = db.data<T_>();
      for_rows(ctx, Ks, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t as = a.send_assign[i], n = as / k;
          const T_ wt = static_cast<T_>(rt.weight[as]);
          double dot = 0;
          for (int64_t c = 0; c < C; ++c) {
            d[i * C + c] = wt * g[n * C + c];
            dot += static_cast<double>(g[n * C + c]) * y[i * C + c];
          }
          dweight[as] = dot;
        }
      });
    });
    narrow_into(ctx, dy_mine, db);
  }
  if (P > 1) {
    Tensor dr = Tensor::empty({std::max<int64_t>(K, 1), C}, dtype, dev);
    moe_exchange(dy_mine, a.send_rows, dr, a.recv_rows, "combine-gradient", layer);
    permute_rows(dr, st.dy, a.perm, false);
  }
  Tensor dxd = Tensor::empty({std::max<int64_t>(K, 1), C}, dtype, dev);
  for (int e = 0; e < mo.El; ++e) {
    const int64_t r0 = a.offs[e], r1 = a.offs[e + 1];
    if (r1 == r0) continue;
    const auto& w = p.moe.experts[static_cast<size_t>(e)];
    Tensor dact = Tensor::empty({r1 - r0, mo.Fe}, dtype, dev);
    ops::linear_backward(ctx, dact, none, none, st.dy.rows(r0, r1), none, w[2]);
    if (swiglu) ops::glu_backward(ctx, st.dh.rows(r0, r1), dact, a.h.rows(r0, r1), ops::GluKind::swiglu);
    else ops::gelu_backward(ctx, st.dh.rows(r0, r1), dact, a.h.rows(r0, r1));
    ops::linear_backward(ctx, dxd.rows(r0, r1), none, none, st.dh.rows(r0, r1), none, w[0]);
  }
  look(layer, "moe_experts", Bk, K > 0 ? dxd.rows(0, K) : Tensor());
  Tensor dx_mine = dxd;
  if (P > 1) {
    Tensor dr = Tensor::empty({std::max<int64_t>(K, 1), C}, dtype, dev);
    permute_rows(dxd, dr, a.perm, true);
    dx_mine = Tensor::empty({std::max<int64_t>(Ks, 1), C}, dtype, dev);
    moe_exchange(dr, a.recv_rows, dx_mine, a.send_rows, "dispatch-gradient", layer);
  }
  // Split experts give partial sums (this rank's share); whole ones the whole gradient.
  {
    const Tensor& into = mo.split ? dx : whole;
    const Tensor sw = widened(dx_mine, ct), ib = widened(into, ct);
    with_type(ct, [&](auto zero) {
      using T_ = decltype(zero);
      const T_* src = sw.data<T_>();
      T_* dst = ib.data<T_>();
      // Row n gathers its kept assignments' gradients, j = 0 .. k-1 (send row row_of[n k + j]).
      for_rows(ctx, N, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t j = 0; j < k; ++j) {
            const int64_t i = a.row_of[n * k + j];
            if (i < 0) continue;
            for (int64_t c = 0; c < C; ++c) dst[n * C + c] += src[i * C + c];
          }
      });
    });
    narrow_into(ctx, into, ib);
  }

  // The router: its logits' gradient from the weights and the auxiliary losses.
  std::vector<double> dl(static_cast<size_t>(N * E));
  if (cps > 1)
    moe_route_whole_backward(cfg, a, dweight, moe_loss_weight * cfg.aux_loss_coeff, moe_loss_weight * cfg.z_loss_coeff,
                             dl, layer);
  else
    moe_route_backward(cfg, rt, a.logits_host.data(), dweight.data(), moe_loss_weight * cfg.aux_loss_coeff,
                       moe_loss_weight * cfg.z_loss_coeff, dl.data());
  ensure(st.dlogits, {N, E}, ct, dev);
  set_values(st.dlogits, dl);
  look(layer, "moe_router", Bk, st.dlogits);
  const Tensor dxr = ct == dtype ? tmp : Tensor::empty({N, C}, ct, dev);  // the router's input gradient
  ops::linear_backward(ctx, dxr, none, none, st.dlogits, none, p.moe.router);
  if (a.xr.defined()) {  // through the jitter: d x = d x_r * factor
    const MicroBatchKey* key = key_now;
    TROUPE_CHECK(key != nullptr, "MoE: a jittered router input without the micro-batch's key");
    const double eps = cfg.input_jitter_eps;
    with_type(ct, [&](auto zero) {
      using T_ = decltype(zero);
      T_* d = dxr.data<T_>();
      for_rows(ctx, N, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t c = 0; c < C; ++c) {
            const double u = uniform_at(*key, layer, kJitter, key->first_sample + n / T, position_of(n) * C + c);
            d[n * C + c] = static_cast<T_>(d[n * C + c] * (1 - eps + 2 * eps * u));
          }
      });
    });
  }
  ops::add_inplace(ctx, whole, dxr);

  // The shared expert (split over TP: partial sums).
  if (mo.FCs > 0) {
    ensure(st.dsh_fc, {N, mo.FCs}, dtype, dev);
    Tensor dact = Tensor::empty({N, mo.Fs}, dtype, dev);
    ops::linear_backward(ctx, dact, none, none, dy, none, p.moe.sh_proj_w);
    if (swiglu) ops::glu_backward(ctx, st.dsh_fc, dact, a.sh_fc, ops::GluKind::swiglu);
    else ops::gelu_backward(ctx, st.dsh_fc, dact, a.sh_fc);
    ops::linear_backward(ctx, tmp, none, none, st.dsh_fc, none, p.moe.sh_fc_w);
    ops::add_inplace(ctx, dx, tmp);
  }
  if (r == 0) ops::add_inplace(ctx, dx, whole);
}

void GptChunk::Impl::moe_backward_weight(Context& ctx, int l, int layer, const Layer& g, const Tensor& x,
                                         const MoeActs& a, const Tensor& dy, const MoeStash& st) {
  const MoeLayout& mo = moe_layout[l];
  const Tensor none;
  constexpr ProbeDir W = ProbeDir::weight;
  const int64_t K = a.offs.empty() ? 0 : a.offs.back();
  ops::linear_backward(ctx, none, g.moe.router, g.moe.router_b, st.dlogits, a.xr.defined() ? a.xr : x, none);
  look(layer, "moe_router", W, g.moe.router);
  if (g.moe.coef_w.defined()) {
    ops::linear_backward(ctx, none, g.moe.coef_w, g.moe.coef_b, st.dcoef, x, none);
    ops::linear_backward(ctx, none, g.fcproj_w, g.fcproj_b, st.dmlp_out, a.mlp_act, none);
    ops::linear_backward(ctx, none, g.fc_w, g.fc_b, st.dmlp_fc, x, none);
  }
  if (mo.FCs > 0) {
    ops::linear_backward(ctx, none, g.moe.sh_proj_w, g.moe.sh_proj_b, dy, a.sh_act, none);
    ops::linear_backward(ctx, none, g.moe.sh_fc_w, g.moe.sh_fc_b, st.dsh_fc, x, none);
  }
  for (int e = 0; e < mo.El; ++e) {
    const int64_t r0 = a.offs[e], r1 = a.offs[e + 1];
    if (r1 == r0) continue;
    const auto& w = g.moe.experts[static_cast<size_t>(e)];
    ops::linear_backward(ctx, none, w[2], w[3], st.dy.rows(r0, r1), a.act.rows(r0, r1), none);
    ops::linear_backward(ctx, none, w[0], w[1], st.dh.rows(r0, r1), a.xd.rows(r0, r1), none);
  }
  (void)K;
}

}  // namespace troupe
