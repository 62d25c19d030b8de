#include "plan/cost_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "config/memory_estimate.hpp"
#include "plan/host.hpp"
#include "troupe/schedule.hpp"

namespace troupe::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// One layer's work on one rank for one micro-batch (seconds), and what it sends.
struct LayerCost {
  double forward = 0;        // compute and exposed communication of the forward
  double backward_input = 0; // input gradients: dgrad GEMMs, attention's backward, element-wise backward
  double backward_weight = 0;// weight-gradient GEMMs
  double recompute = 0;      // what the backward runs again first (full: the forward; selective: attention)
  double attention_forward = 0;
  double tp_bytes = 0, tp_seconds = 0, tp_exposed = 0;  // per micro-batch, forward + backward (+ recompute)
  double cp_bytes = 0, cp_seconds = 0, cp_exposed = 0;
};

struct Shape {
  double m, n, k;
};

double add_collective(std::vector<CollectiveCost>& list, const std::string& name, const GroupPlacement& g,
                      double bytes, double seconds, double exposed) {
  for (CollectiveCost& c : list)
    if (c.name == name) {
      c.bytes += bytes;
      c.seconds += seconds;
      c.exposed += exposed;
      return exposed;
    }
  list.push_back({name, g.size, g.crosses_nodes, bytes, seconds, exposed});
  return exposed;
}

}  // namespace

Result<Profile> profile_named(const std::string& name, const Cluster& cluster) {
  Profile p;
  if (name == "troupe") {
    p.name = "troupe";
    if (cluster.is_cpu()) {
      // The peak is the sgemm measured on the spot, and every GEMM shape's efficiency is measured
      // here too, on the rank's cores.
      p.gemm_efficiency = 1.0;
      p.gemm_tile = 0;
      const int threads = std::max(1, cluster.device.compute_units);
      p.measured_gemm = [threads](double m, double n, double k) { return measured_gemm_efficiency(threads, m, n, k); };
      p.memory_efficiency = 0.7;
      p.kernel_seconds = 2e-6;
      p.link_efficiency = 0.7;
      // Whole sequences: kernels/cpu/attention.cpp skips the masked blocks but keeps the (T, T)
      // probabilities; ring attention (cp > 1) is tiled.
      p.tiled_attention = false;
    }
    // troupe reduces each unit's gradients as the last micro-batch's backward completes it
    // (docs/PARALLEL.md, "ZeRO"), prefetches ZeRO-3's next unit, and overlaps the ring's exchange.
    p.dp_overlap = 1.0;
    p.zero3_overlap = 0.5;
    p.cp_overlap = 0.8;
    p.head_recompute = true;
    return p;
  }
  if (name == "megatron") {
    // Megatron-LM as Narayanan et al. 2021 ran it: cuBLAS GEMMs, fused softmax and bias-GELU but the
    // (T, T) scores through memory, blocking tensor- and pipeline-parallel communication, the
    // gradients' all-reduce after the backward, and the scatter-gather sends across nodes.
    p.name = "megatron";
    p.tiled_attention = false;
    p.causal_skip = false;
    p.tp_overlap = 0;
    p.pp_overlap = 0;
    p.dp_overlap = 0;
    p.zero3_overlap = 0;
    p.cp_overlap = 0;
    p.scatter_gather = true;
    p.blocking_p2p = true;
    p.fp32_cross_entropy = true;
    p.accumulation_pass = true;
    p.zero1_all_reduce = true;
    p.unfused_optimizer = true;
    return p;
  }
  return Status::bad_input("--profile " + (name.size() > 64 ? name.substr(0, 64) + "..." : name) +
                           " is not a profile -- use troupe (troupe's own execution, the default) or megatron "
                           "(Megatron-LM's as published)");
}

double gemm_seconds(double m, double n, double k, double batch, double bytes, double peak, const Cluster& cluster,
                    const Profile& profile) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  const double flops = 2 * m * n * k * batch;
  if (profile.measured_gemm) return flops / (peak * profile.measured_gemm(m, n, k)) + batch * profile.kernel_seconds;
  double utilisation = 1;
  if (profile.gemm_tile > 0) {
    const double tile = profile.gemm_tile;
    const double units = std::max(1, cluster.device.compute_units);
    const double tiles = batch * std::ceil(m / tile) * std::ceil(n / tile);
    const double waves = std::ceil(tiles / units);
    utilisation = tiles / (waves * units);
  }
  const double compute = flops / (peak * profile.gemm_efficiency * utilisation);
  const double memory = bytes * batch * (m * k + k * n + m * n) / (cluster.device.memory_bandwidth * profile.memory_efficiency);
  return std::max(compute, memory) + profile.kernel_seconds;
}

GroupPlacement place_group(int64_t stride, int size, const Cluster& cluster) {
  GroupPlacement g;
  g.size = std::max(1, size);
  const int64_t node = std::max(1, cluster.devices_per_node);
  stride = std::max<int64_t>(1, stride);
  // Members r, r + stride, ...: those within one node's span of ranks.
  g.per_node = stride >= node ? 1 : static_cast<int>(std::min<int64_t>(g.size, std::max<int64_t>(1, node / stride)));
  g.crosses_nodes = g.size > g.per_node;
  if (!g.crosses_nodes) {
    g.bandwidth = cluster.intra_node_bandwidth;
    g.latency = cluster.intra_node_latency;
  } else {
    // A node's network is shared by its devices; the group's members on a node carry its traffic
    // across (NCCL runs one ring per adapter), never faster than NVLink inside.
    const double share = cluster.inter_node_bandwidth / static_cast<double>(node);
    g.bandwidth = std::min(cluster.intra_node_bandwidth, share * g.per_node);
    g.latency = cluster.inter_node_latency;
  }
  return g;
}

double collective_seconds(Collective kind, double bytes, const GroupPlacement& g, const Profile& profile) {
  const double n = g.size;
  if (bytes <= 0) return 0;
  const double bw = g.bandwidth * profile.link_efficiency;
  switch (kind) {
    case Collective::send:
      return bytes / bw + g.latency;
    case Collective::all_reduce:
      if (n <= 1) return 0;
      return 2 * (n - 1) / n * bytes / bw + 2 * (n - 1) * g.latency;
    case Collective::all_gather:
    case Collective::reduce_scatter:
    case Collective::all_to_all:
      if (n <= 1) return 0;
      return (n - 1) / n * bytes / bw + (n - 1) * g.latency;
  }
  return 0;
}

Prediction predict_memory(const TrainConfig& layout, const Cluster& cluster) {
  TrainConfig c = layout;
  if (!cluster.is_cpu()) c.device = "cuda";  // GPU attention keeps no (T, T) scratch per thread
  const int world = static_cast<int>(std::min<int64_t>(cluster.world(), 1 << 30));
  const MemoryEstimate e = estimate_memory(c, world);
  const StageMemory& s = e.largest_stage();
  Prediction p;
  p.weight_bytes = s.weight_bytes;
  p.gradient_bytes = s.gradient_bytes;
  p.optimizer_bytes = s.optimizer_bytes;
  p.activation_bytes = s.activation_bytes;
  p.memory_per_rank_bytes = s.total();
  p.parameters_per_rank = s.parameters;
  p.memory_capacity_bytes = cluster.device.memory_bytes - cluster.device.memory_reserve_bytes;
  p.fits = p.memory_per_rank_bytes <= p.memory_capacity_bytes;
  if (!p.fits)
    p.why_not = fmt::format("out of memory: {:.2f} GiB per rank (states {:.2f}, activations {:.2f}), over the {:.2f} GiB "
                            "a device has",
                            p.memory_per_rank_bytes / kGiB, s.model_state_bytes / kGiB, s.activation_bytes / kGiB,
                            p.memory_capacity_bytes / kGiB);
  return p;
}

Result<Prediction> predict(const TrainConfig& layout, const Cluster& cluster, const Profile& profile, bool simulate) {
  const GptConfig& m = layout.model;
  Prediction out = predict_memory(layout, cluster);

  const bool mixed = layout.precision.sixteen_bit();
  const double act = mixed ? 2 : 4;
  const double peak = mixed ? cluster.device.peak_flops : cluster.device.peak_flops_fp32;
  const double bw = cluster.device.memory_bandwidth * profile.memory_efficiency;
  const double t = std::max(1, layout.tensor_model_parallel_size), p = std::max(1, layout.pipeline_model_parallel_size);
  const double cp = layout.sequence_ranks();
  const bool ulysses = cp > 1 && (layout.ds_sequence_parallel_size > 1 || layout.cp_comm_type == "a2a");
  const bool ring = cp > 1 && !ulysses;
  const int world = static_cast<int>(std::min<int64_t>(cluster.world(), 1 << 30));
  const double d = std::max(1, layout.resolved_dp(world));
  const double b = std::max(1, layout.micro_batch_size);
  const double s = m.seq_length;
  const double n = b * s / cp;  // tokens of a micro-batch on this rank
  const double C = m.hidden_size, H = m.num_attention_heads, G = m.query_groups(), hs = m.head_size();
  const double F = m.ffn_hidden_size(), Ft = F / t;
  const bool swiglu = m.activation == MlpActivation::swiglu;
  const bool sp = layout.sequence_parallel && t > 1;
  const double Vp = static_cast<double>(m.padded_vocab_size(static_cast<int>(t)));
  const std::string& recompute = layout.recompute_granularity;
  const double micro_batches = std::max(1.0, std::floor(layout.global_batch_size / (b * d)));

  // Where the groups lie (Megatron's order tp-cp-dp-pp: strides 1, t, t cp, t cp d).
  const GroupPlacement tp_group = place_group(1, static_cast<int>(t), cluster);
  const GroupPlacement cp_group = place_group(static_cast<int64_t>(t), static_cast<int>(cp), cluster);
  const GroupPlacement dp_group = place_group(static_cast<int64_t>(t), static_cast<int>(d * cp), cluster);
  const GroupPlacement pp_group = place_group(static_cast<int64_t>(t * cp * d), static_cast<int>(p), cluster);
  auto gemm = [&](const Shape& g) { return gemm_seconds(g.m, g.n, g.k, 1, act, peak, cluster, profile); };
  auto memory = [&](double bytes) { return bytes / bw + profile.kernel_seconds; };

  // ---- one layer, one micro-batch ----
  LayerCost L;
  const std::vector<Shape> linear = {
      {n, (H + 2 * G) * hs / t, C},       // qkv      (n, C) x (C, (H + 2G) hs / t)
      {n, C, H * hs / t},                 // proj     (n, H hs / t) x (H hs / t, C)
      {n, (swiglu ? 2 : 1) * Ft, C},      // fc1      (n, C) x (C, F / t), [gate | up] with SwiGLU
      {n, C, Ft},                         // fc2      (n, F / t) x (F / t, C)
  };
  double gemm_forward = 0, gemm_dgrad = 0, gemm_wgrad = 0;
  for (const Shape& g : linear) {
    gemm_forward += gemm(g);
    gemm_dgrad += gemm({g.m, g.k, g.n});  // dX (M, K) = dY (M, N) W^T
    gemm_wgrad += gemm({g.k, g.n, g.m});  // dW (K, N) = X^T (K, M) dY (M, N)
  }
  // Attention's core: per head, queries x keys x head size, for QK^T and PV.
  double heads = b * H / t, queries = s, keys = s;
  if (ring) queries = s / cp;
  if (ulysses) heads = b * H / (t * cp);
  double attention_backward = 0;
  // What of the (T, T) products runs: half with the masked blocks skipped.
  const double causal = profile.causal_skip ? 0.5 : 1;
  if (profile.tiled_attention || ring) {
    // Tiled (flash) attention, and ring attention's blocks on every device: no (T, T) through memory.
    const double flops = 2 * 2 * heads * queries * keys * hs * causal;
    L.attention_forward = flops / (peak * profile.gemm_efficiency * profile.attention_efficiency) + profile.kernel_seconds;
    attention_backward = 2.5 * L.attention_forward;  // dQ, dK, dV, dP and the scores again
  } else {
    // The scores and probabilities of every head pass through memory (Megatron's 2021 kernels: the
    // fused scale-mask-softmax reads the scores and writes the probabilities, dropout reads them and
    // writes them with a byte of mask; troupe's CPU kernel for whole sequences keeps the
    // probabilities for the backward, in f32).
    const double pbytes = cluster.is_cpu() ? 4 : act;
    const double scores = heads * queries * keys * causal;  // elements of (T, T) computed
    const double drop = m.attention_dropout > 0 ? 1 : 0;
    const double qk = causal * gemm_seconds(queries, keys, hs, heads, act, peak, cluster, profile);
    const double pv = causal * gemm_seconds(queries, hs, keys, heads, act, peak, cluster, profile);
    L.attention_forward = qk + pv + memory(scores * 2 * pbytes) + drop * memory(scores * (2 * pbytes + 1));
    attention_backward = 2 * (qk + pv) + memory(scores * 3 * pbytes) + drop * memory(scores * (2 * pbytes + 1));
  }
  // Element-wise kernels, bytes per token: the two norms (read, write C), the two dropout + residual
  // adds (read 2C, write C, a mask byte per element with dropout), bias + activation (GELU: read and
  // write F/t; SwiGLU: read 2F/t, write F/t), rotary on q and k. Under sequence parallelism the C-wide
  // ones run on 1/t of the tokens.
  const double rows = sp ? 1 / t : 1;
  const double hidden_mask = m.hidden_dropout > 0 ? 2 * C : 0;
  double elementwise = act * ((4 * C + 6 * C) * rows + (swiglu ? 3 : 2) * Ft) + hidden_mask * rows;
  if (m.position_embedding == PositionEmbedding::rope) elementwise += act * 2 * (H + G) * hs / t;
  const double elementwise_forward = 6 * profile.kernel_seconds + n * elementwise / bw;
  const double elementwise_backward = 2 * elementwise_forward;

  // Tensor parallelism: two all-reduces forward (all-gather + reduce-scatter pairs under sequence
  // parallelism: the same bytes), two backward, two more in a fully recomputed forward.
  if (t > 1) {
    const double bytes = n * C * act;
    const double one = collective_seconds(Collective::all_reduce, bytes, tp_group, profile);
    const double calls = 4 + (recompute == "full" ? 2 : 0);
    L.tp_bytes = calls * bytes;
    L.tp_seconds = calls * one;
    L.tp_exposed = L.tp_seconds * (1 - profile.tp_overlap);
  }
  const double tp_forward = t > 1 ? 2 * collective_seconds(Collective::all_reduce, n * C * act, tp_group, profile) *
                                        (1 - profile.tp_overlap)
                                  : 0;
  // Context parallelism: the ring sends cp - 1 key/value blocks (only the K/V heads) forward, blocks
  // and their gradients backward, overlapped with the attention of the block in hand; all_gather
  // gathers them instead; Ulysses' four all-to-alls each way.
  double cp_forward = 0, cp_backward = 0;
  if (cp > 1) {
    const double kv = 2 * n * G * hs / t * act;
    if (ring && layout.cp_comm_type == "p2p") {
      const double f = (cp - 1) * collective_seconds(Collective::send, kv, cp_group, profile);
      const double bk = 2 * f;
      L.cp_bytes = 3 * (cp - 1) * kv;
      L.cp_seconds = f + bk;
      cp_forward = std::max(0.0, f - profile.cp_overlap * L.attention_forward);
      cp_backward = std::max(0.0, bk - profile.cp_overlap * attention_backward);
    } else if (ring) {
      const double f = collective_seconds(Collective::all_gather, kv * cp, cp_group, profile);
      const double bk = f + collective_seconds(Collective::reduce_scatter, kv * cp, cp_group, profile);
      L.cp_bytes = 3 * kv * cp;
      L.cp_seconds = f + bk;
      cp_forward = f;
      cp_backward = bk;
    } else {
      const double in = n * (H + 2 * G) * hs / t * act, back = n * H * hs / t * act;
      const double f = collective_seconds(Collective::all_to_all, in, cp_group, profile) +
                       collective_seconds(Collective::all_to_all, back, cp_group, profile);
      L.cp_bytes = 2 * (in + back);
      L.cp_seconds = 2 * f;
      cp_forward = f;
      cp_backward = f;
    }
    L.cp_exposed = cp_forward + cp_backward;
  }
  L.forward = gemm_forward + L.attention_forward + elementwise_forward + tp_forward + cp_forward;
  L.backward_input = gemm_dgrad + attention_backward + elementwise_backward + (L.tp_exposed - tp_forward) -
                     (recompute == "full" ? tp_forward : 0) + cp_backward;
  L.backward_weight = gemm_wgrad;
  if (recompute == "full") L.recompute = L.forward;
  else if (recompute == "selective") L.recompute = L.attention_forward;

  // ---- mixture-of-experts layers: what replaces the dense MLP (docs/MOE.md) ----
  // Routing assumed balanced: each of the rank's n tokens goes to k experts, and the ranks of an
  // expert-parallel group send each other equal shares, so the rank's E / ep experts run n k rows
  // between them (a capacity factor of 1 or more drops nothing then). An MoE layer's cost is the
  // dense layer's without its MLP, plus the router (a GEMM to E logits, the softmax and top-k through
  // memory), the experts' GEMMs (one per local expert, n k ep / E rows each, width Fe / expert-TP),
  // their activation, the dispatch and combine (gathers through memory and, over ep > 1, two
  // all-to-alls of the n k rows forward and two backward, none hidden), and PR-MoE's dense MLP or a
  // shared expert where the model has one. Tensor-parallel traffic stays the dense layer's.
  const MoeConfig& moe = m.moe;
  const double ep = std::max(1, layout.expert_model_parallel_size);
  const double et = layout.expert_tensor_parallel_size == 1 ? 1 : t;
  const double Fe = m.expert_ffn_hidden_size(), k_top = std::max(1, moe.topk);
  auto mlp_of = [&](double width, double split, double rows, double batch) {  // {forward, dgrad, wgrad}
    const double w = width / split, fc = (swiglu ? 2 : 1) * w;
    const double e = memory(batch * rows * act * (swiglu ? 3 : 2) * w);
    auto g = [&](double mm, double nn, double kk) { return gemm_seconds(mm, nn, kk, batch, act, peak, cluster, profile); };
    return std::array<double, 3>{g(rows, fc, C) + g(rows, C, w) + e, g(rows, C, fc) + g(rows, w, C) + 2 * e,
                                 g(C, fc, rows) + g(w, C, rows)};
  };
  const std::array<double, 3> dense_mlp = mlp_of(F, t, n, 1);
  const GroupPlacement ep_group = place_group(static_cast<int64_t>(t * cp), static_cast<int>(ep), cluster);
  // One direction's pair of all-to-alls (dispatch and combine), the same for every MoE layer.
  const double ep_a2a =
      ep > 1 ? 2 * collective_seconds(Collective::all_to_all, n * k_top * C * act, ep_group, profile) : 0;
  auto moe_layer = [&](int experts) {
    LayerCost y = L;
    const double E = std::max(1, experts), local = std::max(1.0, E / ep), rows = n * k_top * ep / E;
    const std::array<double, 3> routed = mlp_of(Fe, et, rows, local);
    std::array<double, 3> extra{0, 0, 0};
    if (moe.residual) extra = dense_mlp;
    if (moe.shared_expert_ffn > 0) extra = mlp_of(moe.shared_expert_ffn, t, n, 1);
    const double router_f = gemm({n, E, C}) + memory(n * E * 4 * 3);
    const double router_b = gemm({n, C, E}) + memory(n * E * 4 * 2), router_w = gemm({C, E, n});
    const double moved = memory(2 * n * k_top * C * act);  // the rows gathered to their experts, and back
    y.forward += router_f + routed[0] + extra[0] + moved + ep_a2a - dense_mlp[0];
    y.backward_input += router_b + routed[1] + extra[1] + moved + ep_a2a - dense_mlp[1];
    y.backward_weight += router_w + routed[2] + extra[2] - dense_mlp[2];
    if (recompute == "full") y.recompute = y.forward;
    return y;
  };
  // Layer l's cost (0-based, global): the dense layer's, or its expert count's, made once per count.
  std::map<int, LayerCost> moe_costs;
  auto layer_cost = [&](int l) -> const LayerCost& {
    const int E = moe.enabled() ? moe.experts_of(l, m.num_layers) : 0;
    if (E <= 0) return L;
    auto it = moe_costs.find(E);
    if (it == moe_costs.end()) it = moe_costs.emplace(E, moe_layer(E)).first;
    return it->second;
  };

  // ---- the embedding and the head ----
  const double embedding_forward =
      memory(n * C * act * 2) + (t > 1 ? collective_seconds(Collective::all_reduce, n * C * act, tp_group, profile) : 0);
  const double embedding_backward = memory(n * C * act * 2);
  const Shape head{n, Vp / t, C};
  const bool interleaved = layout.pipeline_schedule == "interleaved";
  const bool split = layout.pipeline_schedule == "zb-h1";
  const double logits = gemm(head), softmax = memory(n * Vp / t * act * 2);
  // Megatron's fp32 cross-entropy: the conversion (read 16-bit, write fp32), max, subtract, exp, sum
  // and divide forward; the scale by the loss's gradient and the conversion back backward.
  const double loss_forward = profile.fp32_cross_entropy ? memory(n * Vp / t * (act + 4 + 4 + 8 + 8 + 4 + 8)) : softmax;
  const double loss_backward = profile.fp32_cross_entropy ? memory(n * Vp / t * (8 + 4 + act)) : softmax;
  const double head_forward = logits + loss_forward + memory(n * C * act * 2);
  // The head's input-gradient half (B) and weight-gradient half (W), each with the logits computed
  // again where the profile's execution does (Profile::head_recompute).
  const bool head_fused = t == 1 && !split && !interleaved && layout.pipeline_schedule != "gpipe";
  const double head_again = profile.head_recompute && !head_fused ? logits + softmax : 0;
  const double head_input = gemm({head.m, head.k, head.n}) + loss_backward + head_again;
  const double head_weight = gemm({head.k, head.n, head.m}) + (split ? head_again : 0);

  // ---- the pipeline ----
  const int v = interleaved && layout.num_layers_per_virtual_pipeline_stage > 0
                    ? std::max(1, m.num_layers / (static_cast<int>(p) * layout.num_layers_per_virtual_pipeline_stage))
                    : 1;
  const int stages = static_cast<int>(p);
  sched::StageCosts costs;
  const size_t slots = static_cast<size_t>(stages) * v;
  costs.forward.assign(slots, 0);
  costs.backward.assign(slots, 0);
  costs.weight.assign(slots, 0);
  // Each virtual stage's first layer: the GPT layers are numbered in the order of the virtual stages
  // (chunk c of stage st holds virtual stage c p + st).
  std::vector<int> first_layer(slots + 1, 0);
  for (size_t k = 0; k < slots; ++k) {
    const int st = static_cast<int>(k % static_cast<size_t>(stages));
    const int count = v > 1 ? layout.num_layers_per_virtual_pipeline_stage
                            : m.num_layers / stages + (st < m.num_layers % stages ? 1 : 0);
    first_layer[k + 1] = first_layer[k] + count;
  }
  const bool any_moe = moe.enabled();
  for (int c = 0; c < v; ++c) {
    for (int st = 0; st < stages; ++st) {
      const size_t i = static_cast<size_t>(st) * v + c;
      const size_t k = static_cast<size_t>(c) * stages + st;
      // zb-h1's W under full recompute rebuilds the layers' activations again (GptChunk::backward_weight).
      double f = 0, bk = 0, w = 0;
      for (int l = first_layer[k]; l < first_layer[k + 1]; ++l) {
        const LayerCost& y = any_moe ? layer_cost(l) : L;
        f += y.forward;
        bk += y.backward_input + y.recompute;
        w += y.backward_weight + (split && recompute == "full" ? y.recompute : 0);
      }
      if (st == 0 && c == 0) {
        f += embedding_forward;
        bk += embedding_backward;
      }
      if (st == stages - 1 && c == v - 1) {
        f += head_forward;
        bk += head_input;
        w += head_weight;
      }
      costs.forward[i] = f;
      if (split) {
        costs.backward[i] = bk;
        costs.weight[i] = w;
      } else {
        costs.backward[i] = bk + w;
      }
    }
  }
  // One activation (or its gradient) per micro-batch and boundary: with sequence parallelism each
  // tensor-parallel rank sends its 1/t of the rows; across nodes Megatron's scatter-gather sends 1/t
  // from each and all-gathers inside the node.
  if (stages > 1) {
    const double bytes = b * (s / cp) * C * act / (sp ? t : 1);
    double hop = collective_seconds(Collective::send, bytes, pp_group, profile);
    if (pp_group.crosses_nodes && profile.scatter_gather && t > 1 && !sp)
      hop = collective_seconds(Collective::send, bytes / t, pp_group, profile) +
            collective_seconds(Collective::all_gather, bytes, tp_group, profile);
    costs.hop = hop * (1 - profile.pp_overlap);
    const double sends = 2 * micro_batches * v;
    add_collective(out.collectives, "pp send", pp_group, sends * bytes, sends * hop, sends * costs.hop);
    if (profile.blocking_p2p) {
      // The exchange occupies the stage, and its data is there when the sender's exchange ends. 1F1B
      // exchanges after each forward that sends on and after each backward that sends back;
      // interleaved once per forward-backward pair, both directions together (half to each).
      const double share = v > 1 ? 0.5 : 1;
      for (int c = 0; c < v; ++c)
        for (int st = 0; st < stages; ++st) {
          const size_t i = static_cast<size_t>(st) * v + c, k = static_cast<size_t>(c) * stages + st;
          if (k + 1 < slots) costs.forward[i] += share * costs.hop;
          if (k > 0) costs.backward[i] += share * costs.hop;
        }
      costs.hop = 0;
    }
  }
  // Megatron's gradient accumulation: every micro-batch's gradients added into the sum by a pass over
  // the chunk's parameters (read the new one, read and write the sum) at the end of its backward.
  const double g_bytes = mixed && layout.precision.grad_dtype(layout.zero_stage) != PrecisionDType::fp32 ? 2 : 4;
  if (profile.accumulation_pass) {
    const double pass = memory(out.parameters_per_rank / v * (act + 2 * g_bytes));
    for (size_t i = 0; i < slots; ++i) (split ? costs.weight[i] : costs.backward[i]) += pass;
  }
  // The busiest stage's work per micro-batch (all its chunks).
  double busiest = 0, busiest_backward = 0;
  for (int st = 0; st < stages; ++st) {
    double work = 0, back = 0;
    for (int c = 0; c < v; ++c) {
      const size_t i = static_cast<size_t>(st) * v + c;
      work += costs.forward[i] + costs.backward[i] + costs.weight[i];
      back += costs.backward[i] + costs.weight[i];
    }
    if (work > busiest) {
      busiest = work;
      busiest_backward = back;
      out.forward_seconds = work - back;
      out.backward_seconds = back;
    }
  }
  const int m_count = static_cast<int>(std::min(1e7, micro_batches));
  sched::ScheduleSpec spec;
  spec.type = layout.pipeline_schedule == "gpipe"        ? sched::ScheduleType::gpipe
              : interleaved                             ? sched::ScheduleType::interleaved
              : split                                   ? sched::ScheduleType::zb_h1
                                                        : sched::ScheduleType::one_f_one_b;
  spec.stages = stages;
  spec.micro_batches = m_count;
  spec.chunks = v;
  if (stages == 1) {
    out.pipeline_seconds = m_count * busiest;
    out.bubble_fraction = 0;
    out.simulated = true;
  } else if (simulate) {
    auto schedule = sched::make_schedule(spec);
    if (!schedule) return schedule.status().as_bad_input();
    const sched::SimResult r = sched::simulate(schedule.value(), costs);
    out.pipeline_seconds = r.makespan;
    out.bubble_fraction = r.bubble;
    out.simulated = true;
  } else {
    // Theory's bubble for equal stages of the busiest stage's costs (zb-h1: the backward split in
    // its input and weight halves).
    const double f = out.forward_seconds / v, bk = out.backward_seconds / v;
    const double bubble = split ? sched::theoretical_bubble(spec, f, bk / 2, bk / 2) : sched::theoretical_bubble(spec, f, bk, 0);
    out.pipeline_seconds = m_count * busiest / (1 - bubble) + 2 * (p - 1) * costs.hop;
    out.bubble_fraction = 1 - m_count * busiest / out.pipeline_seconds;
  }

  // ---- data parallelism and the optimizer ----
  const double psi = out.parameters_per_rank;  // the memory half's estimate, not computed again
  const double dcp = d * cp;
  const int zero = layout.zero_stage;
  if (t > 1) {
    const double per_layer = L.tp_bytes;
    add_collective(out.collectives, sp ? "tp all-gather + reduce-scatter" : "tp all-reduce", tp_group,
                   per_layer * m.num_layers / p * micro_batches, L.tp_seconds * m.num_layers / p * micro_batches,
                   L.tp_exposed * m.num_layers / p * micro_batches);
  }
  if (any_moe && ep > 1) {  // four all-to-alls of n k C elements per MoE layer and micro-batch, none hidden
    const double calls = moe.moe_layers(m.num_layers) / p * micro_batches;
    add_collective(out.collectives, "ep all-to-all", ep_group, calls * 4 * n * k_top * C * act, calls * 2 * ep_a2a,
                   calls * 2 * ep_a2a);
  }
  if (cp > 1)
    add_collective(out.collectives, ring ? (layout.cp_comm_type == "p2p" ? "cp ring" : "cp all-gather") : "ulysses all-to-all",
                   cp_group, L.cp_bytes * m.num_layers / p * micro_batches, L.cp_seconds * m.num_layers / p * micro_batches,
                   L.cp_exposed * m.num_layers / p * micro_batches);
  double dp_exposed = 0;
  if (dcp > 1) {
    const double last_backward = busiest_backward;  // the gradients' reduction runs beside the last backward
    if (zero <= 1) {
      const double bytes = psi * g_bytes;
      // DeepSpeed's BF16_Optimizer all-reduces ZeRO-1's fp32 gradients (buffered_allreduce_fallback).
      const bool reduce = zero == 0 || (profile.zero1_all_reduce && layout.precision.dtype == PrecisionDType::bf16);
      const Collective kind = reduce ? Collective::all_reduce : Collective::reduce_scatter;
      const double sec = collective_seconds(kind, bytes, dp_group, profile);
      dp_exposed += add_collective(out.collectives, reduce ? "dp all-reduce" : "dp reduce-scatter", dp_group, bytes, sec,
                                   std::max(0.0, sec - profile.dp_overlap * last_backward));
    } else {
      const double bytes = psi * g_bytes;
      const double sec = collective_seconds(Collective::reduce_scatter, bytes, dp_group, profile);
      dp_exposed += add_collective(out.collectives, "dp reduce-scatter", dp_group, bytes * micro_batches,
                                   sec * micro_batches,
                                   micro_batches * std::max(0.0, sec - profile.dp_overlap * last_backward));
    }
    if (zero == 1 || zero == 2) {
      const double bytes = psi * act;
      const double sec = collective_seconds(Collective::all_gather, bytes, dp_group, profile);
      dp_exposed += add_collective(out.collectives, "dp all-gather (parameters)", dp_group, bytes, sec, sec);
    }
    if (zero == 3) {
      const double bytes = psi * act;
      const double sec = 2 * micro_batches * collective_seconds(Collective::all_gather, bytes, dp_group, profile);
      dp_exposed += add_collective(out.collectives, "zero-3 all-gather (parameters)", dp_group, 2 * micro_batches * bytes,
                                   sec, sec * (1 - profile.zero3_overlap));
    }
  }
  // Tied embeddings across stages: the first and the last stage sum wte's gradients.
  if (stages > 1 && !m.untie_embeddings_and_output_weights) {
    const GroupPlacement ends = place_group(static_cast<int64_t>(t * cp * d * (p - 1)), 2, cluster);
    const double bytes = Vp / t * C * g_bytes;
    const double sec = collective_seconds(Collective::all_reduce, bytes, ends, profile);
    dp_exposed += add_collective(out.collectives, "embedding all-reduce", ends, bytes, sec, sec);
  }
  out.dp_exposed_seconds = dp_exposed;
  // Adam: the fp32 master weights and both moments read and written, the gradient read, the working
  // copy written; partitioned over dp x cp from ZeRO-1 on.
  const double part = psi / (zero >= 1 ? dcp : 1);
  double step_bytes = part * (8 + 16 + g_bytes + (mixed ? 2 : 0));
  if (profile.unfused_optimizer) {
    // Megatron's Float16Optimizer, pass by pass: 16-bit gradients copied to fp32 (read 2, write 4),
    // fp16's unscale and inf check (read and write 4), the norm (read 4), Adam (read the weight,
    // gradient and both moments, write three), the weights copied back (read 4, write the 16-bit
    // copy), and every gradient zeroed for the next iteration.
    const double copy = g_bytes == 2 ? 2 + 4 : 0, unscale = layout.precision.dtype == PrecisionDType::fp16 ? 8 : 0;
    step_bytes = part * (copy + unscale + 4 + 28 + (mixed ? 4 + act : 0)) + psi * g_bytes;
  }
  if (layout.offload_optimizer == "cpu") {
    const double host = cluster.host_memory_bandwidth / std::max(1, cluster.devices_per_node) * profile.memory_efficiency;
    out.optimizer_seconds = part * (g_bytes + act) / (cluster.pcie_bandwidth * profile.link_efficiency) + step_bytes / host;
  } else {
    out.optimizer_seconds = step_bytes / bw;
  }

  out.iteration_seconds = out.pipeline_seconds + out.dp_exposed_seconds + out.optimizer_seconds;
  const double tokens = static_cast<double>(layout.global_batch_size) * s;
  out.tokens_per_second = tokens / out.iteration_seconds;
  const double model_flops = m.flops_per_iteration(static_cast<int64_t>(tokens));
  // Recomputation adds the layers' forward (full) or the attention's (selective), counted as Megatron
  // counts the forward: a third of the layers' model FLOPs; attention 2 x 2 s hs H per token, halved.
  const double head_flops = 3.0 * 2 * tokens * C * static_cast<double>(m.padded_vocab_size(1));
  double recompute_flops = 0;
  if (recompute == "full") recompute_flops = (model_flops - head_flops) / 3;
  else if (recompute == "selective") recompute_flops = tokens * m.num_layers * 2.0 * 2 * s * hs * H * 0.5;
  const double devices = static_cast<double>(cluster.world());
  out.model_tflops_per_gpu = model_flops / out.iteration_seconds / devices / 1e12;
  out.hardware_tflops_per_gpu = (model_flops + recompute_flops) / out.iteration_seconds / devices / 1e12;
  out.mfu = out.model_tflops_per_gpu * 1e12 / peak;
  return out;
}

}  // namespace troupe::plan
