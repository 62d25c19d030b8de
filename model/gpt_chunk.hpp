// One shard of the GPT model (every family GptConfig describes: GPT-2, LLaMA, BLOOM) under tensor and
// pipeline parallelism: the layers of one model chunk (a pipeline stage holds v >= 1 chunks, see
// include/troupe/schedule.hpp) as seen by one tensor-parallel rank, with Megatron-LM's tensor-parallel
// scheme:
//   c_attn (fused QKV), mlp.c_fc   column-parallel: rank r holds output rows [r*O/t, (r+1)*O/t) of
//                                  each of the `tp_split_parts` blocks (q, k, v for c_attn, unequal
//                                  with grouped-query attention; gate, up for SwiGLU's c_fc); the
//                                  attention heads and key/value groups split the same way (H/t
//                                  heads and G/t groups per rank)
//   attn.c_proj, mlp.c_proj        row-parallel: rank r holds input columns [r*I/t, (r+1)*I/t); the
//                                  partial products are all-reduced (forward) and the bias added once
//   wte, lm_head (untied)          vocabulary-parallel: rank r holds rows [r*Vp/t, (r+1)*Vp/t) of the
//                                  padded table (Vp = vocab padded to a multiple of 128*t); the
//                                  embedding lookup is masked and all-reduced; the loss is a
//                                  vocabulary-parallel cross-entropy (max, sum of exponentials and
//                                  target logit all-reduced over the TP group) with padding columns
//                                  masked out, so the loss never depends on t or the padding
//   norms (LayerNorm or RMSNorm, ln_embd), wpe, biases of row-parallel layers: replicated on every
//                                  TP rank
// The family's pieces (rotary, ALiBi, SwiGLU, no biases, embedding LayerNorm): model/gpt_chunk_layer.cpp
// and model/gpt_chunk_tp.cpp.
// The all-reduce in forward is paired with its dual in backward (Megatron's f and g operators).
// With sequence_parallel, the rows between the tensor-parallel regions (LayerNorms, residual adds,
// hidden dropout) are split over the TP ranks: all-gather before each
// column-parallel layer, reduce-scatter after each row-parallel layer (and in backward the duals);
// the gradients of the LayerNorms, which then see only a rank's rows, are all-reduced over the TP
// group, so they stay identical on every rank. (Row-parallel biases and wpe are added once, by TP
// rank 0, inside the sum the reduction forms; their gradients come from the full-row output gradient
// every rank holds, so they need no reduction and are identical on every rank as well.)
//
// Rows. A micro-batch of B sequences of T tokens is N = B*T rows of C channels, row n = b*T + t
// (context parallelism: T = seq_length / cp rows of each sequence, row t at global position pos[t]). The
// activation passed between pipeline stages is (N, C), or with sequence_parallel this rank's row
// block: rows [rows_offset(r), rows_offset(r) + rows(r)) with rows(r) = N/t, the first N % t ranks one
// more (the counts of comm's all_gather_v / reduce_scatter_v).
//
// Pipeline. The first chunk of stage 0 (has_embedding) reads token windows; the last chunk of stage
// p-1 (has_head) holds ln_f and, for the tied output head, a copy of wte, and computes the loss. When
// both are in one chunk (p == 1) they share one wte. Otherwise the runtime keeps the two copies equal
// by summing their gradients over the embedding group (first and last stage, same TP rank) before
// the optimizer step; both start equal because initialisation is defined in global coordinates. An
// untied head (untie_embeddings_and_output_weights) holds lm_head instead and shares nothing.
//
// Activation slots. A pipeline stage holds several micro-batches between forward and backward; the
// chunk keeps `slots` sets of saved activations and every call names its slot (0 .. slots-1).
//
// Recompute (Megatron's --recompute-granularity): none keeps every activation backward needs; full
// keeps only each layer's input and recomputes the layer's forward at the start of its backward;
// selective keeps everything but the attention probabilities (B, H/t, T, T) and recomputes the
// attention core from the saved QKV in backward. Results are bitwise those of `none`.
//
// Dropout (model/dropout.hpp: placement and keys): training forwards apply the model's
// hidden_dropout and attention_dropout with masks keyed by the MicroBatchKey the forward names; the
// slot keeps the key, so backward, full and selective recompute and the weight pass use the same
// masks. Hidden dropout on this rank's rows (all N, or its row block under sequence parallelism) in
// the residual stream; in backward the mask is applied to the gathered branch gradient. A site
// with probability 0 runs no dropout code at all. forward_eval never drops.
//
// Split backward (zero-bubble schedules): backward(..., defer_weight_grads = true) computes only the
// gradient with respect to the chunk's input (what the previous stage waits for) and keeps what the
// weight pass needs in the slot; backward_weight(slot) then accumulates the parameter gradients.
// The sum is bitwise that of an unsplit backward.
//
// Parameters, units and ZeRO. Parameters are grouped in units, each contiguous in the flat parameter
// and gradient buffers, in this order: wte alone (when has_embedding, or has_head with the tied head;
// one unit even when both), the embedding's others (has_embedding: wpe and / or ln_embd's weight and
// bias, whichever the family has; none for rotary or ALiBi without ln_embd), one unit per layer, ln_f
// (weight, and bias for LayerNorm; has_head), lm_head alone (has_head, untied). wte is a unit
// of its own so that the embedding copy and the head copy on different stages have the same unit
// layout (the runtime partitions every unit over data-parallel ranks and sums the two copies'
// gradient partitions). Spec order inside a unit follows gpt2_param_specs. By default the chunk allocates flat_params() and flat_grads() itself. With
// UnitHooks, the runtime (ZeRO stage 3) instead provides each unit's parameters when the chunk needs
// them (acquire_params before a unit's forward or backward work, release_params after), and may
// provide each unit's gradient buffer (ZeRO 2/3: a transient buffer that the runtime reduce-scatters)
// and learns when a unit's gradients of a micro-batch are complete (grads_ready: after its weight
// gradients are accumulated, i.e. after backward or, when deferred, after backward_weight).
//
// Determinism: every result is a deterministic function of inputs, parameters and the TP group's
// (deterministic) collectives. For t = 1 and p = 1 the chunk computes bitwise what GptModel computes.
// Every parameter gradient receives one contribution per micro-batch, in backward order, whatever
// the order of the calls (so F0 F1 B0 B1 accumulates bitwise as F0 B0 F1 B1 does).
// Failures: misuse (shapes, slot states) is a TROUPE_CHECK; so is a failed TP collective, since the
// calls have no error channel (the rank's supervisor sees the process fail).
// Not thread-safe: the owning rank actor calls it from its thread.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/context.hpp"
#include "kernels/tensor.hpp"
#include "model/dropout.hpp"
#include "troupe/model_config.hpp"
#include "model/params.hpp"
#include "model/ring_attention.hpp"

namespace troupe {

class OpProbe;

enum class Recompute : uint8_t { none, full, selective };

struct ChunkSpec {
  GptConfig model;
  int first_layer = 0;   // global index of this chunk's first transformer layer
  int num_layers = 0;    // may be 0 (e.g. a stage that only holds the embedding and the head)
  bool has_embedding = false;
  bool has_head = false;
  int tp_size = 1;
  int tp_rank = 0;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  int micro_batch = 1;   // B: sequences per micro-batch
  int slots = 1;         // activation slots (micro-batches in flight on this chunk)
  // Parameters and activations: f32; f64 for gradient checks; bf16 or f16 for mixed precision, where
  // every op computes in f32 (kernels/ops.hpp) and the normalisation statistics and the token losses
  // stay f32.
  DType dtype = DType::f32;
  // With a 16-bit dtype: the parameter gradients' type (f32: Megatron's main gradients, accumulated and
  // reduced in fp32; or dtype itself). Ignored otherwise (the gradients are dtype).
  DType grad_dtype = DType::f32;
  // Rows of logits the fused head handles at a time (bounds its (rows, Vp/t) buffer); 0: GptModel's
  // rule (about 16M elements), which t = 1, p = 1 needs to be bitwise GptModel.
  int64_t head_chunk_rows = 0;
  // Where parameters, gradients and activations live (Device::cuda: on the GPU of the thread's
  // DeviceScope, kernels/device_memory.hpp; the chunk is then run with that GPU's Context). Token
  // windows come as host tensors either way: the chunk checks them on the host and uploads them.
  Device device = Device::cpu;
  // MoE layers: each expert split over the TP ranks like the MLP (expert-TP = TP), or whole on every
  // TP rank (expert-TP 1; model/params.hpp's ExpertShard).
  bool expert_tensor_parallel = true;
  // Expert parallelism: this shard holds experts [ep_rank E/ep, (ep_rank + 1) E/ep) of each MoE layer
  // and exchanges tokens with the other ep_size - 1 shards of its expert-parallel group (the
  // communicator given to the constructor; replicas running the same schedule).
  int ep_size = 1, ep_rank = 0;
  // Context parallelism (docs/PARALLEL.md, "Long sequences"): the sequence is split over the cp_size
  // ranks of the context-parallel group (the communicator given to the constructor), this shard
  // holding rows at positions context_parallel_positions(seq_length, cp_size, cp_rank) of every
  // sequence (Megatron's load balancing); attention is ring attention over that group
  // (model/ring_attention.hpp). seq_length must be a multiple of 2 cp_size; CPU only; no MoE layers.
  int cp_size = 1, cp_rank = 0;
  CpComm cp_comm = CpComm::p2p;  // how the key/value blocks travel (--cp-comm-type)
  // Rank r holds rows [r T/cp, (r+1) T/cp) instead of Megatron's load-balanced chunks: DeepSpeed-
  // Ulysses' layout (--ds-sequence-parallel-size), with cp_comm a2a; seq_length a multiple of cp.
  bool cp_contiguous = false;
};

// Which layers model chunk `chunk` of pipeline stage `stage` holds, with p stages and v chunks per
// stage: virtual stage k = chunk*p + stage gets layers [k*L/(p*v), (k+1)*L/(p*v)) rounded so the
// first (L mod p*v) virtual stages get one more. has_embedding for k == 0, has_head for k == p*v-1.
ChunkSpec chunk_layers(const GptConfig& model, int stages, int chunks, int stage, int chunk);

// One MoE layer's routing statistics, summed over the training micro-batches since the last
// take_moe_stats (a recompute's forward is not counted again).
struct MoeLayerStats {
  int layer = 0;                       // global transformer layer
  int64_t micro_batches = 0;
  double lb_loss = 0, z_loss = 0;      // sums over the micro-batches, before their coefficients
  std::vector<int64_t> routed, kept;   // (E) assignments per expert before / after the capacity
  int64_t dropped = 0;
};

struct UnitInfo {
  int64_t param_offset = 0;  // into the flat parameter / gradient buffers
  int64_t numel = 0;
  // An MoE layer's experts: reduced and partitioned over the expert-data-parallel group (the replicas
  // holding the same experts) instead of the data-parallel group.
  bool expert = false;
  std::vector<int> specs;    // indices into specs()
};

enum class Pass : uint8_t { forward, backward };

struct UnitHooks {
  // ZeRO-3: called before the chunk reads unit u's parameters; returns a tensor of unit(u).numel
  // elements (the chunk's dtype) holding them, valid until release_params(u, pass).
  std::function<Tensor(int unit, Pass pass)> acquire_params;
  std::function<void(int unit, Pass pass)> release_params;
  // ZeRO-2/3: the buffer unit u's gradients accumulate into (unit(u).numel elements), asked for
  // before the unit's weight gradients of a micro-batch are computed; null = the chunk's own.
  std::function<Tensor(int unit)> grad_buffer;
  // Unit u's weight gradients of micro-batch `micro` (in slot `slot`) are accumulated.
  std::function<void(int unit, int slot)> grads_ready;
};

class GptChunk {
 public:
  // hooks.acquire_params set: no parameter storage is allocated (flat_params() undefined).
  // ep: the expert-parallel group (ep_size ranks, this one at ep_rank); null when ep_size is 1.
  // cp: the context-parallel group (cp_size ranks, this one at cp_rank); null when cp_size is 1.
  GptChunk(const ChunkSpec& spec, comm::Communicator* tp, UnitHooks hooks = {}, comm::Communicator* ep = nullptr,
           comm::Communicator* cp = nullptr);

  const ChunkSpec& spec() const;
  // This shard's parameters: global name and shape, the local (slice) shape, and where the slice sits
  // in the global tensor (ParamSpec::slice). wte: the shard's padded rows.
  const std::vector<ParamSpec>& specs() const;
  const std::vector<UnitInfo>& units() const;
  const Tensor& flat_params() const;  // all units, contiguous (undefined under acquire_params)
  const Tensor& flat_grads() const;   // all units, contiguous (undefined under grad_buffer)
  std::vector<Tensor> params() const; // views, spec order (resident parameters only)
  std::vector<Tensor> grads() const;
  // Whether spec i counts in the global gradient norm on this shard: false for copies of a
  // parameter another shard also counts (replicated over TP: only tp_rank 0 counts; the head's copy
  // of wte when the embedding lives on another stage).
  bool counts_in_norm(int spec) const;

  // Fills the resident parameters from the seed, in global coordinates (init_parameter).
  void init(uint64_t seed);
  void zero_grad();

  // Rows exchanged with the neighbouring chunks (see "Rows").
  int64_t boundary_rows() const;

  // Shows every op's result to `probe` (model/op_probe.hpp: the points and their names), or to
  // nobody (null, the default). The probe outlives the calls it sees.
  void set_probe(OpProbe* probe);

  // Forward of one micro-batch into `slot`. tokens: (B, seq_length+1) i32 windows (whole sequences,
  // also under context parallelism), needed when has_embedding
  // (inputs) or has_head (targets), else undefined. input: (boundary_rows(), C) unless
  // has_embedding. out: (boundary_rows(), C) unless has_head. With has_head returns the sum of the
  // B*T token losses (identical on every TP rank; under context parallelism this rank's rows', which
  // the cp group's ranks add up) and keeps what backward needs for
  // grad_scale * d(sum)/d(logits): the reduced row max and sum of exponentials (backward recomputes
  // the logits chunk by chunk, so no (B*T, Vp/t) buffer stays per slot); else returns 0. tokens may
  // be passed (and are then ignored) when neither is needed.
  // head_backward_now (has_head, t = 1; ignored otherwise): the caller's next call on this chunk is
  // backward(slot) without deferral, so the head's backward runs here, row chunk by row chunk on the
  // logits just computed (GptModel's fused softmax cross-entropy): backward recomputes no logits, and
  // the gradients are bitwise those of the unfused calls. Any other next call is a TROUPE_CHECK.
  // key: what this micro-batch's dropout masks are keyed by (ignored when the model has none).
  double forward(Context& ctx, int slot, const Tensor& tokens, const Tensor& input, const Tensor& out,
                 double grad_scale, bool head_backward_now = false, const MicroBatchKey& key = {});
  // Backward of the micro-batch in `slot`: dout (boundary_rows(), C) unless has_head; din
  // (boundary_rows(), C) unless has_embedding (then undefined). Accumulates parameter gradients
  // unless defer_weight_grads. Frees the slot unless weight gradients are deferred.
  void backward(Context& ctx, int slot, const Tensor& dout, const Tensor& din, bool defer_weight_grads = false);
  // The deferred weight pass of `slot`; frees the slot.
  void backward_weight(Context& ctx, int slot);

  // Evaluation: forward without saving anything for backward; returns the loss sum when has_head.
  // valid_sequences (0 .. B; -1: all B): only the first valid_sequences sequences' token losses are
  // summed, so a last, partial micro-batch can be padded to B sequences by the caller.
  double forward_eval(Context& ctx, const Tensor& tokens, const Tensor& input, const Tensor& out,
                      int64_t valid_sequences = -1);

  // Bytes this chunk holds, by kind (for the memory report): resident parameters, resident
  // gradients, and activation slots plus scratch.
  // The MoE layers' statistics since the last call (empty without MoE layers), and resets them.
  std::vector<MoeLayerStats> take_moe_stats();

  int64_t param_bytes() const;
  int64_t grad_bytes() const;
  int64_t activation_bytes() const;

  ~GptChunk();
  GptChunk(const GptChunk&) = delete;
  GptChunk& operator=(const GptChunk&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
