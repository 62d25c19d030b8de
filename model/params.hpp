// Parameter specs of the GPT-2 model: every parameter has a global name in Hugging Face GPT-2 naming
// and a global (layout-free) shape, so a shard of any parallel layout can say which slice of which
// global tensor it holds, and a checkpoint can be read by any layout.
//
// Orientation: linear weights are stored (out_features, in_features) as in Megatron and torch.nn.Linear.
// Hugging Face's GPT-2 uses Conv1D, (in, out): `troupe ckpt export --format hf` transposes them.
// Vocabulary: the global shape of transformer.wte.weight is (V, C) over the real vocabulary only. A shard
// allocates (Vp/t, C) rows of the padded vocabulary Vp; the padding rows start at zero, are masked out of the
// softmax, get zero gradient and so stay zero. They are never saved.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"
#include "troupe/model_config.hpp"

namespace troupe {

enum class InitKind : uint8_t {
  normal,           // N(0, init_method_std)
  normal_residual,  // N(0, init_method_std / sqrt(2 * num_layers)): outputs feeding the residual stream
  zeros,
  ones,
};

// Which part of the global tensor a shard holds along one dimension: `offsets.size()` blocks, block j
// covering global indices [offsets[j], offsets[j] + extents[j]) of dimension `dim`, laid out one
// after the other in the local tensor (local_shape[dim] = the sum of the extents; every other
// dimension is whole). dim == -1: the whole tensor. Global indices past global_shape[dim] are
// vocabulary padding (wte, lm_head): they exist locally, start at zero and are never saved.
//   wte, tp = 2, rank 1, Vp = 40:       dim 0, offsets {20}, extents {20}  (rows 37..39 padding when V = 37)
//   c_attn.weight (3C, C), tp = 3, r = 1: dim 0, offsets {C/3, C + C/3, 2C + C/3}, extents {C/3, C/3, C/3}
//   c_attn.weight with GQA ((H + 2G) hs, C), H = 4, G = 2, hs = 8, tp = 2, r = 1:
//                                       dim 0, offsets {16, 40, 56}, extents {16, 8, 8}  (q, k, v)
//   mlp.c_proj.weight (C, 4C), tp = 2, r = 0: dim 1, offsets {0}, extents {2C}
struct ParamSlice {
  int dim = -1;
  std::vector<int64_t> offsets;
  std::vector<int64_t> extents;  // one per block
  int64_t local_extent() const;  // the sum of the extents: local_shape[dim]
};

struct ParamSpec {
  std::string name;     // e.g. "transformer.h.3.attn.c_attn.weight"
  Shape global_shape;   // layout-free shape (real vocabulary for wte)
  Shape local_shape;    // what this shard allocates: its slice (1x1x1: the whole tensor, wte padded to (Vp, C))
  InitKind init = InitKind::normal;
  double init_std = 0;  // resolved standard deviation for normal kinds
  bool weight_decay = true;  // false for biases and LayerNorm parameters (Megatron's rule)
  // Tensor-parallel split: the dimension Megatron splits (-1: replicated). parts > 1 means the
  // dimension is a concatenation of `parts` blocks, each split separately over the ranks (fused QKV: 3,
  // [q | k | v], unequal with grouped-query attention; SwiGLU's c_fc: 2, [gate | up]). The blocks'
  // global sizes are the extents of the tp = 1 spec's slice.
  int tp_split_dim = -1;
  int tp_split_parts = 1;
  // What this shard holds (local_shape is its shape). A tensor-parallel split describes its blocks
  // even for tp = 1 (one block per part, covering the whole dimension); replicated: dim -1.
  ParamSlice slice;
};

// Every family uses GPT-2's scheme (docs/MODELS.md maps the names to each family's Hugging Face names):
//   RMSNorm: ln_1/ln_2/ln_f carry .weight only (init ones);  --disable-bias-linear: no attn/mlp .bias;
//   positions other than learned_absolute: no wpe;  --embed-layernorm: transformer.ln_embd.{weight,bias}
//   (a LayerNorm whatever the layers' normalization, as BLOOM's) after wte and wpe;  untied head:
//   lm_head.weight (V, C), vocabulary-parallel like wte, init normal, after ln_f;
//   attn.c_attn.weight ((H + 2G) hs, C) = [q (H hs) | k (G hs) | v (G hs)], 3 parts of unequal size,
//   tp rank r holding heads [r H/t, (r+1) H/t) and groups [r G/t, (r+1) G/t) of each;
//   attn.c_proj.weight (C, H hs);  SwiGLU: mlp.c_fc.weight (2F, C) = [gate (F) | up (F)], 2 parts.
// Specs in a fixed order: wte, [wpe], [ln_embd.weight, ln_embd.bias], h.0 ... h.{L-1} (each layer:
// ln_1.weight, [ln_1.bias], attn.c_attn.weight, [.bias], attn.c_proj.weight, [.bias], ln_2.weight,
// [ln_2.bias], mlp.c_fc.weight, [.bias], mlp.c_proj.weight, [.bias]), ln_f.weight, [ln_f.bias],
// [lm_head.weight]. GPT-2's defaults give wte, wpe, 12 per layer, ln_f's two. The single-shard
// (tp = 1) layout: gpt2_shard_specs(config, 1, 0).
std::vector<ParamSpec> gpt2_param_specs(const GptConfig& config);

// The same specs as held by tensor-parallel rank `tp_rank` of `tp_size` (Megatron's split):
//   wte, lm_head                         rows [r*Vp/t, (r+1)*Vp/t) of the padded vocabulary,
//                                        Vp = config.padded_vocab_size(t)
//   attn.c_attn (3 parts q, k, v), mlp.c_fc (1 part, SwiGLU 2: gate, up), and their biases
//                                        column-parallel: output rows [r*O/t, (r+1)*O/t) of each part
//   attn.c_proj.weight, mlp.c_proj.weight row-parallel: input columns [r*I/t, (r+1)*I/t)
//   everything else (wpe, norms, row-parallel biases) replicated.
// local_shape is the slice's shape. A size that t does not divide (heads, query groups, hidden size,
// ffn size) is a bug in the caller (TROUPE_CHECK): validate the layout first.
//
// Mixture of experts (config.moe): an MoE layer's mlp holds, after ln_2, in this order:
//   [mlp.c_fc.*, mlp.c_proj.*]        PR-MoE's dense MLP (residual)
//   mlp.router.weight (E, C), [mlp.router.bias (E): megatron router with biases]   replicated
//   [mlp.coefficient.weight (2, C), mlp.coefficient.bias (2)]   residual: replicated
//   [mlp.shared_expert.c_fc.*, mlp.shared_expert.c_proj.*]      the shared expert, split like the MLP
//   mlp.experts.<e>.c_fc.weight, [.bias], mlp.experts.<e>.c_proj.weight, [.bias]  for each expert e the
//                                     shard holds (global index e), split like the MLP when the experts
//                                     are tensor-parallel, else whole on every TP rank
struct ExpertShard {
  int ep_size = 1, ep_rank = 0;  // the shard holds experts [ep_rank E/ep, (ep_rank + 1) E/ep) of each layer
  bool tensor_parallel = true;   // experts split over the TP ranks (expert-TP = TP), or whole (expert-TP 1)
};
std::vector<ParamSpec> gpt2_shard_specs(const GptConfig& config, int tp_size, int tp_rank,
                                        const ExpertShard& experts = {});
// Whether a spec name belongs to an expert (".mlp.experts."): reduced over the expert-data-parallel group.
bool is_expert_param(const std::string& name);

// Row-major index into the global tensor (global_shape) of the local element `local_index`
// (row-major in local_shape), or -1 for a vocabulary padding element.
int64_t slice_global_index(const ParamSpec& spec, int64_t local_index);

// Fills `t` (shape spec.local_shape, f32 or f64) with the spec's initial values. Values depend only on
// (seed, spec.name, global element index): any slice of a global tensor, computed by any shard, gets
// the same numbers as the global tensor has at those indices. Padding rows are set to zero.
void init_parameter(const ParamSpec& spec, uint64_t seed, const Tensor& t);

}  // namespace troupe
