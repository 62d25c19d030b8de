// What one training iteration of a layout costs on a cluster: its time, from the model's operations
// costed one by one, and its memory per rank, from troupe's memory plan (config/memory_estimate.hpp,
// the same figures `troupe train --dry-run` prints).
//
// Time (docs/PLAN.md, "The model"):
//   GEMMs          2 M N K FLOPs at the device's peak times the profile's GEMM efficiency times the
//                  wave utilisation (tiles of `gemm_tile` x `gemm_tile` over the device's compute
//                  units: a GEMM of 109 tiles on 108 SMs runs two waves), or the time its operands
//                  take through memory, whichever is longer, plus a kernel's fixed cost. Each
//                  layer's qkv, projection, fc1 and fc2 on the rank's tensor-parallel shard; the
//                  backward's input- and weight-gradient GEMMs (their own shapes); the head's.
//   attention      QK^T and PV as batched GEMMs of (queries x keys x head size) per head, half of
//                  them when the masked blocks are skipped; tiled (flash, ring) attention keeps
//                  (T, T) out of memory, otherwise the scores, the softmax and the dropout pass
//                  through memory.
//   element-wise   norms, bias + activation, dropout + residual, rotary: bytes through memory.
//   collectives    alpha-beta over the groups as they lie on the nodes (Megatron's rank order
//                  tp-cp-ep-dp-pp): a group inside a node runs at the NVLink bandwidth, one that
//                  spans nodes at the share of the nodes' network its members on a node have;
//                  ring all-reduce 2 (n-1)/n bytes / bandwidth + 2 (n-1) latencies, all-gather and
//                  reduce-scatter half that, a send bytes / bandwidth + one latency. Tensor
//                  parallelism: two all-reduces (or all-gather + reduce-scatter pairs with sequence
//                  parallelism) per layer forward, two backward, two more in a recomputed forward;
//                  context parallelism: the ring's key/value blocks (gradients too in the
//                  backward); Ulysses: four all-to-alls per layer each way; pipeline: one
//                  activation per micro-batch and stage boundary each way; data parallelism: the
//                  gradients' all-reduce (ZeRO 1-2: reduce-scatter and the parameters' all-gather;
//                  ZeRO-3 also gathers the parameters for every micro-batch's forward and backward).
//   pipeline       the stages' forward, backward (and zb-h1's weight) costs run through the real
//                  action list (sched::simulate), with each boundary's send as the hop.
//   optimizer      the Adam step's bytes through device memory (with --offload-optimizer cpu: the
//                  gradients and parameters over PCIe and the step in host memory).
// The profile says what the program overlaps and how well its kernels run (Profile below).
//
// Mixture-of-experts models are not costed yet: predict refuses them (bad input naming the flag).
// Thread safety: pure functions of their arguments.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "plan/cluster.hpp"
#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe::plan {

// How a training program executes on a device: its kernels' efficiency and what it overlaps. Few and
// physical; the same for every layout and every run predicted (docs/PLAN.md gives each one's source).
struct Profile {
  std::string name;               // "troupe" or "megatron"
  double gemm_efficiency = 0.8;   // of the peak, for a GEMM whose tiles fill every compute unit
  int gemm_tile = 128;            // a GEMM tile's rows and columns (0: no wave quantisation, the CPU)
  double memory_efficiency = 0.8; // of the memory bandwidth, for element-wise kernels and GEMM operands
  double kernel_seconds = 4e-6;   // fixed cost of one kernel (launch and tail)
  double link_efficiency = 0.8;   // of a link's bandwidth, for a collective's bytes (NCCL's bus bandwidth)
  bool tiled_attention = true;    // flash-style tiles: no (T, T) scores or probabilities through memory
  bool causal_skip = true;        // the blocks above the diagonal are not computed
  double attention_efficiency = 0.5;  // tiled attention's FLOP rate, of the GEMM rate
  double tp_overlap = 0;          // fraction of tensor-parallel communication hidden behind compute
  double cp_overlap = 0.8;        // fraction of the ring's key/value exchange hidden behind attention
  double pp_overlap = 0;          // fraction of a pipeline send hidden
  double dp_overlap = 0;          // fraction of the gradients' reduction hidden behind the backward
  double zero3_overlap = 0.5;     // fraction of ZeRO-3's parameter gathers hidden behind compute
  bool scatter_gather = true;     // a pipeline send across nodes goes 1/t per tensor-parallel rank
  // The head's backward computes the logits again from the saved ln_f output (troupe keeps no (n, V)
  // logits per micro-batch): once in a backward, and in zb-h1's B and W each, except where the
  // backward follows its forward at once and runs inside it (1F1B's last stage without tensor
  // parallelism). Megatron keeps the logits: false.
  bool head_recompute = false;
  // Megatron's execution as its code runs it (docs/PLAN.md, "Profiles", cites each):
  // the pipeline's exchanges block the stage (batch_isend_irecv, wait, torch.cuda.synchronize; the
  // receiver gathers the scatter-gather pieces after): 1F1B exchanges after each forward and each
  // backward, interleaved once per forward-backward pair; the stage computes nothing meanwhile.
  bool blocking_p2p = false;
  // The logits go to fp32 for the vocab-parallel cross-entropy (no --fp16-lm-cross-entropy): the
  // conversion, max, subtract, exp, sum and divide forward, the scale and conversion back backward,
  // in bytes per logit (38 forward, 14 backward); otherwise the softmax reads and writes the 16-bit
  // logits once each way.
  bool fp32_cross_entropy = false;
  // Each micro-batch's gradients added into the accumulated ones by an element-wise pass (Megatron's
  // main_grad hook: read the new gradient, read and write the sum; DeepSpeed's BF16_Optimizer adds the
  // bf16 gradients into fp32 copies the same way). troupe's weight-gradient GEMMs accumulate in place.
  bool accumulation_pass = false;
  // ZeRO-1 in bf16 as DeepSpeed's BF16_Optimizer runs it: the fp32 gradients all-reduced over dp
  // (buffered_allreduce_fallback), not reduce-scattered.
  bool zero1_all_reduce = false;
  // The optimizer step as separate passes (Megatron's Float16Optimizer: 16-bit gradients copied to
  // fp32, fp16's unscale with the inf check, the gradients' norm, Adam, the fp32 weights copied back,
  // the gradients zeroed); otherwise troupe's one fused pass.
  bool unfused_optimizer = false;
  // Measured GEMM efficiency by shape (the CPU: plan/host.hpp's measured_gemm_efficiency on the
  // rank's cores): when set, a GEMM takes 2MNK / (peak x this(M, N, K)) and the tile, wave and
  // memory terms above do not apply (the measurement has them).
  std::function<double(double m, double n, double k)> measured_gemm;
};

// troupe's own execution on `cluster` (the default profile), and Megatron-LM's as published in
// Narayanan et al. 2021 (fused kernels, no flash attention, no overlap of the tensor-, pipeline- or
// data-parallel communication, the scatter-gather optimisation). Unknown names: bad input.
Result<Profile> profile_named(const std::string& name, const Cluster& cluster);

// One collective (or the sends of one kind) over an iteration, on the busiest rank.
struct CollectiveCost {
  std::string name;      // "tp all-reduce", "dp all-reduce", "pp send", "cp ring", ...
  int group_size = 1;
  bool crosses_nodes = false;
  double bytes = 0;      // per iteration on one rank (each call's payload summed)
  double seconds = 0;    // per iteration
  double exposed = 0;    // the part not hidden behind compute
};

struct Prediction {
  // Memory per rank (the memory plan's largest stage) and whether it fits the device.
  bool fits = true;
  std::string why_not;  // empty when it fits
  double weight_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
  double memory_per_rank_bytes = 0;
  double memory_capacity_bytes = 0;  // the device's memory less its reserve
  double parameters_per_rank = 0;    // the largest stage's parameters on one rank (what dp reduces)
  // Time.
  double forward_seconds = 0, backward_seconds = 0;  // one micro-batch on the busiest (virtual) stage
  double bubble_fraction = 0;       // idle share of the pipeline (from the simulator, or theory when not simulated)
  bool simulated = false;
  double pipeline_seconds = 0;      // the micro-batches through the pipeline
  double dp_exposed_seconds = 0, optimizer_seconds = 0;
  double iteration_seconds = 0;
  double tokens_per_second = 0;
  double model_tflops_per_gpu = 0;     // Megatron's count (no recomputation)
  double hardware_tflops_per_gpu = 0;  // with the recomputed forward passes
  double mfu = 0;                      // model FLOP/s over the peak
  std::vector<CollectiveCost> collectives;
};

// The memory half of predict: cheap (no costing), for pruning a search.
Prediction predict_memory(const TrainConfig& layout, const Cluster& cluster);

// The prediction of `layout` (a TrainConfig with its sizes set and validated for world =
// cluster.world(): tp x cp x pp x dp = world) on `cluster` under `profile`. simulate: run the action
// list through sched::simulate for the bubble; otherwise theory's bubble for equal stages (a search's
// first pass). A layout that does not fit is still timed (fits false, why_not says by how much).
// MoE models: bad input.
Result<Prediction> predict(const TrainConfig& layout, const Cluster& cluster, const Profile& profile, bool simulate = true);

// The pieces, exposed for the tests (and the docs' worked examples).
// A GEMM of (M x K) x (K x N), `batch` times, with `bytes` per element, at peak FLOP/s.
double gemm_seconds(double m, double n, double k, double batch, double bytes, double peak, const Cluster& cluster,
                    const Profile& profile);
// How a group of `size` ranks `stride` apart lies on nodes of cluster.devices_per_node ranks.
struct GroupPlacement {
  int size = 1;
  int per_node = 1;        // members sharing a node
  bool crosses_nodes = false;
  double bandwidth = 0;    // bytes/s per rank, one direction, before the link efficiency
  double latency = 0;
};
GroupPlacement place_group(int64_t stride, int size, const Cluster& cluster);
enum class Collective { all_reduce, all_gather, reduce_scatter, all_to_all, send };
// `bytes`: the whole buffer (all_reduce: its size; all_gather: the gathered result; reduce_scatter:
// the input; all_to_all: one rank's send buffer; send: the message).
double collective_seconds(Collective kind, double bytes, const GroupPlacement& group, const Profile& profile);

}  // namespace troupe::plan
