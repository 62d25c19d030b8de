// What a training configuration needs in host memory, computed before anything is allocated, so that
// a configuration that cannot fit is refused with the flag to lower (exit 2) instead of dying of an
// allocation failure or the OOM killer half-way through setup.
//
// The estimate is a lower bound of what the job will hold per process (fp32, CPU backend), computed
// per pipeline stage s of the layout (tp t, pp p, dp d) and summed over the ranks this process runs:
//   parameters of a rank    its tensor-parallel shard of the stage's ceil(L / p) layers (qkv, the
//                           projection, fc1 and fc2 split 1/t; norms and the row-parallel biases
//                           whole), plus on the first stage wte (Vp/t rows of the padded vocabulary),
//                           wpe (learned positions) and the embedding LayerNorm, on the last ln_f and
//                           the head: lm_head (untied) or, with p > 1, the tied copy of wte. An
//                           MoE layer (model.moe) holds, in place of the MLP: the router (E, C)
//                           whole, E / ep of its experts (expert_model_parallel_size) each split 1/t
//                           when expert-TP is TP (expert_tensor_parallel_size 0 or t) or whole when
//                           it is 1, PR-MoE's dense MLP (split) and coefficient (whole), the shared
//                           expert (split like the MLP)
//   model states            ZeRO's formula over those Psi parameters (fp32 weights 4 Psi, gradients
//                           4 Psi, Adam moments 8 Psi): stage 0 16 Psi, 1 8 Psi + 8 Psi/d, 2 4 Psi +
//                           12 Psi/d, 3 16 Psi/d bytes (the moments, 8 Psi/d, are on disk with
//                           --offload-optimizer nvme). Mixed precision (--bf16, --fp16): 16-bit
//                           weights 2 Psi, gradients 4 Psi (fp32) or 2 Psi, optimizer states 12 Psi
//                           (fp32 master weights and moments; + 4 Psi of fp32 main gradients with
//                           16-bit ones), partitioned as above: stage 0 (2+4+12) Psi, ..., and the
//                           activations and logits in 2-byte elements. The experts' states are
//                           partitioned over their expert-data-parallel group, d / ep ranks
//   activations             Korthikanti et al.'s per-layer count (Reducing Activation Recomputation
//                           in Large Transformer Models, 2022, sec. 4) in fp32 and adapted to the
//                           family: per token and layer 4C floats whole (the two norms' inputs and
//                           outputs; /t with --sequence-parallel) + (qkv (H + 2G) hs + the attention
//                           output H hs + the MLP's activations, 2F for GELU and 3F for SwiGLU; an
//                           MoE layer's: k experts' 2Fe or 3Fe / expert-TP, the router's 2E, and
//                           the residual MLP's and shared expert's like the MLP's) / t +
//                           the attention probabilities H T / t; dropout masks are not stored (they
//                           are functions of the seed). Selective recompute keeps all but the
//                           probabilities (one layer's, while it recomputes); full recompute keeps
//                           each layer's input (C per token) plus one layer's activations. The last
//                           stage also holds one micro-batch's logits, Vp/t floats per token. Stage s
//                           holds min(p - s, m) micro-batches at once (1F1B, interleaved, zero-bubble;
//                           GPipe: m), m the micro-batches per iteration on a replica.
// Context parallelism (cp > 1): every per-token figure counts the T / cp tokens of each sequence a rank
// holds, the probabilities become each row's log-sum-exp (H / t floats per token: ring attention
// keeps no (T, T) matrix) plus the compute threads' score tiles while a block is computed (128 x
// T/cp per thread, 2 in the backward, 4 with attention dropout, f32), and ZeRO partitions
// over the d x cp ranks that hold the same parameters. The all-to-all (Ulysses, --cp-comm-type a2a)
// keeps the probabilities of whole sequences of H / (t cp) heads (H T / t per local token, as
// without cp) and the gathered q, k, v.
// It is compared with the memory this process can have: MemAvailable (/proc/meminfo), and the
// cgroup's memory.max minus its current use when lower, divided among the ranks started on the host.
// TROUPE_MEMORY_CHECK=off skips the comparison (the plan is still printed by callers).
//
// Every product is computed in double: absurd flag values (--hidden-size 2147483644) give a huge
// estimate, never an integer overflow.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/footprint.hpp"
#include "troupe/train_config.hpp"
#include "troupe/status.hpp"

namespace troupe {

// One pipeline stage's figures for one of its ranks.
struct StageMemory {
  double parameters = 0;          // this rank's parameters (allocated: padded vocabulary rows included)
  double model_state_bytes = 0;   // weights, gradients and Adam moments after ZeRO: the sum of
  double weight_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;  // these three
  double activation_bytes = 0;    // at the peak: the micro-batches in flight (+ the last stage's logits),
                                  // the scratch and ZeRO's transient buffers, of which
  double zero_buffer_bytes = 0;   // ZeRO-2/3's gradient buffers in flight and ZeRO-3's gathered units
  double micro_batches_in_flight = 0;
  double total() const { return model_state_bytes + activation_bytes; }
};

struct MemoryEstimate {
  double model_state_bytes = 0;  // per process
  double activation_bytes = 0;   // per process
  double total() const { return model_state_bytes + activation_bytes; }
  int ranks_in_process = 1;
  // The plan per rank: every stage (index = pipeline stage), the activations of one micro-batch on
  // stage 0 under each recompute granularity (for the plan's comparison), and the logits.
  std::vector<StageMemory> stages;
  double micro_batch_activation_none = 0, micro_batch_activation_selective = 0, micro_batch_activation_full = 0;
  double logits_bytes = 0;
  // Attention's per-rank scratch on the CPU, in each stage's activation_bytes: ring attention's
  // (context parallelism, p2p or all_gather) score tiles of the compute threads, 128 x T/cp f32
  // elements each, 2 per thread in the backward (4 with attention dropout); otherwise the
  // whole-sequence kernel's (T, T) gradient of the probabilities per busy thread ((2T + 1) T with
  // attention dropout).
  double attention_scratch_bytes = 0;
  // Ring attention's buffers, allocated once per rank (cp > 1, p2p or all_gather): K/V blocks in
  // hand and in flight, their gradients, the accumulators; in each stage's activation_bytes.
  double ring_workspace_bytes = 0;
  // The largest rank's figures (the one that decides whether a GPU or host fits).
  const StageMemory& largest_stage() const;
};

// world_size: ranks started (1: every rank of the layout runs in this process). model: a model given
// in code, one StageFootprint per virtual stage (check_model fills them): its GPT layers, embedding
// and head count as GPT's, its custom blocks by their declared parameters (their TP slices) and
// boundary tensors (per micro-batch in flight); null: GPT's own model of config.model.
MemoryEstimate estimate_memory(const TrainConfig& config, int world_size,
                               const std::vector<StageFootprint>* model = nullptr);

// The plan printed before training and by `troupe train --dry-run`: the model's parameters and
// FLOPs, then per rank the parameters, model states (ZeRO stage) and activations (recompute), one
// line each. resident_now > 0: the bytes this process holds already (resident_bytes_now()), added
// for the expected peak of the process.
std::vector<std::string> memory_plan_lines(const TrainConfig& config, int world_size, double resident_now = -1);

// This process's resident memory now (/proc/self/statm); negative when unreadable.
double resident_bytes_now();

// Bytes this process may still use: min(MemAvailable, cgroup memory.max - memory.current); a
// negative value when neither can be read.
double available_memory_bytes();

// Bad input when the estimate exceeds `available` / local_ranks (ranks sharing this host), naming
// the figures and the flags that lower the biggest part.
Status check_memory(const TrainConfig& config, int world_size, int local_ranks, double available,
                    const std::vector<StageFootprint>* model = nullptr);

}  // namespace troupe
