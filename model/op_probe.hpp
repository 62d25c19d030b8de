// A look at every op's result as a stage computes it: the NaN locator's checks
// (engine/nan_watch.hpp) and the place where fault injection writes its NaN
// (engine/fault_injection.hpp, TROUPE_FAULT_NAN). A stage without a probe (the default) only tests a
// null pointer per op.
//
// Points. A point names an op by where it is (a transformer layer by its global index, GPT's
// embedding or head, a custom block by name) and the op's name as the code calls it, with a direction:
//   forward   the op's output, right after the op
//   backward  what the op's backward writes: the gradient with respect to its input ("grad input")
//   weight    the op's parameter gradients, after they were accumulated
// GPT's names (gpt_probe_names(), in the order a layer's forward computes them; ln1, ln2 and ln_f
// are the family's norm, LayerNorm or RMSNorm (weight only)):
//   layer  ln1               ln_1(x) (Nl,C)              d(layer input) (Nl,C), after ln_1's part   weight, bias
//          attention_qkv     c_attn: q, k, v (N,QKVl)    d(ln_1 output) (Nl,C), reduced over tp      weight, bias
//          attention_rotary  q, k rotated (rope only) (N,QKVl)  d(c_attn output) (N,QKVl)            -
//          attention_scores  causal softmax(q k^T / sqrt(hs) [+ ALiBi]) (B*Hl*T,T)   d(q, k, v) (N,QKVl)  -
//          attention_output  the core's output P v (N,Al)                  -                         -
//          attention_proj    c_proj, reduced over tp (Nl,C)  d(attention output) (N,Al)             weight, bias
//          residual1         x + attention_proj (Nl,C)   d(attention branch) (N,C)                   -
//          ln2               ln_2(residual1) (Nl,C)      d(residual1) (Nl,C), after ln_2's part      weight, bias
//          mlp_fc1           c_fc (N,Fl)                 d(ln_2 output) (Nl,C), reduced over tp      weight, bias
//          mlp_gelu          gelu(c_fc) (N,Fl)           d(c_fc output) (N,Fl)                       -
//          mlp_swiglu        silu(gate) * up (SwiGLU; instead of mlp_gelu) (N,Fl)  d(c_fc output) (N,2Fl)  -
//          mlp_fc2           c_proj, reduced over tp (Nl,C)  d(gelu output) (N,Fl)                  weight, bias
//          residual2         residual1 + mlp_fc2: the layer's output (Nl,C)   d(mlp branch) (N,C)   -
//   embedding lookup         token + position embedding (Nl,C)   -                                   wte, wpe
//          ln_embd           LayerNorm of the lookup (embed_layernorm) (Nl,C)  d(lookup) (Nl,C)     weight, bias
//   head   ln_f              ln_f (Nl,C)                 d(chunk output) (Nl,C)                      weight, bias
//          logits            a row chunk of logits (rows,Vl)  d(ln_f output) (Nl,C), reduced        wte or lm_head
//          loss              a row chunk's token losses (rows)  d(logits) of the row chunk           -
// A custom block (model/custom_stage.hpp): forward each output tensor by its name and "loss" (the
// loss block's sum); backward each input's gradient by the input's name; weight "params" (all of
// the block's parameter gradients).
// Recomputation (--recompute-granularity, the head's logits in backward) passes the forward points
// again, with the same values.
//
// Thread safety: a probe is called on the stage's thread only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"

namespace troupe {

enum class ProbeDir : uint8_t { forward, backward, weight };
const char* probe_dir_name(ProbeDir d);  // "forward", "backward", "weight"

// ProbePoint::layer of what is not a transformer layer.
constexpr int kEmbeddingProbe = -1, kHeadProbe = -2, kCustomProbe = -3;

struct ProbePoint {
  int layer = 0;            // global transformer layer, or one of the k*Probe values
  const char* tensor = "";  // the op's name: "mlp_fc1", a custom block's tensor name
  ProbeDir dir = ProbeDir::forward;
  const char* block = "";   // kCustomProbe: the block's name
};

// "layer 3", "the embedding", "the head", "custom block zloss_head".
std::string probe_where(const ProbePoint& at);
// For people: "layer 3 mlp fc1 output", "layer 3 ln2 grad input", "the head logits weight grad".
std::string describe(const ProbePoint& at);
// As TROUPE_FAULT_NAN writes it: "layer3:mlp_fc1:forward", "custom.zloss_head:loss:forward".
std::string probe_id(const ProbePoint& at);

class OpProbe {
 public:
  virtual ~OpProbe() = default;
  // After the op that wrote `result` (f32 or f64; the tensor may be written to).
  virtual void after(const ProbePoint& at, const Tensor& result) = 0;
};

// One of GPT's op names and the directions it has (the table above).
struct ProbeName {
  const char* where;  // "layer", "embedding", "head"
  const char* tensor;
  bool forward, backward, weight;
};
const std::vector<ProbeName>& gpt_probe_names();

// Index of the first element of `t` that is NaN or infinite (f32 or f64; other types: -1), or -1.
int64_t first_non_finite(const Tensor& t);
int64_t count_non_finite(const Tensor& t);

}  // namespace troupe
