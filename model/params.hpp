// Parameter specs of the GPT-2 model: every parameter has a global name in Hugging Face GPT-2 naming
// and a global (layout-free) shape, so a shard of any parallel layout can say which slice of which
// global tensor it holds, and a checkpoint can be read by any layout.
//
// Orientation: linear weights are stored (out_features, in_features) as in Megatron and torch.nn.Linear.
// Hugging Face's GPT-2 uses Conv1D, (in, out): `troupe ckpt export --format hf` transposes them.
// Vocabulary: the global shape of transformer.wte.weight is (V, C) over the real vocabulary only. A shard
// allocates (Vp, C) with Vp the padded vocabulary; the padding rows start at zero, are masked out of the
// softmax, get zero gradient and so stay zero. They are never saved.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"
#include "model/config.hpp"

namespace troupe {

enum class InitKind : uint8_t {
  normal,           // N(0, init_method_std)
  normal_residual,  // N(0, init_method_std / sqrt(2 * num_layers)): outputs feeding the residual stream
  zeros,
  ones,
};

struct ParamSpec {
  std::string name;     // e.g. "transformer.h.3.attn.c_attn.weight"
  Shape global_shape;   // layout-free shape (real vocabulary for wte)
  Shape local_shape;    // what a single (1x1x1) shard allocates: wte padded to (Vp, C)
  InitKind init = InitKind::normal;
  double init_std = 0;  // resolved standard deviation for normal kinds
  bool weight_decay = true;  // false for biases and LayerNorm parameters (Megatron's rule)
  // Tensor-parallel split: the dimension Megatron splits (-1: replicated). parts > 1 means the
  // dimension is a concatenation of `parts` equal blocks split separately (fused QKV: 3).
  int tp_split_dim = -1;
  int tp_split_parts = 1;
};

// Specs in a fixed order: wte, wpe, h.0 ... h.{L-1}, ln_f.
std::vector<ParamSpec> gpt2_param_specs(const GptConfig& config);

// Fills `t` (shape spec.local_shape, f32 or f64) with the spec's initial values. Values depend only on
// (seed, spec.name, global element index): any slice of a global tensor, computed by any shard, gets
// the same numbers. Rows beyond global_shape (vocabulary padding) are set to zero.
void init_parameter(const ParamSpec& spec, uint64_t seed, const Tensor& t);

}  // namespace troupe
