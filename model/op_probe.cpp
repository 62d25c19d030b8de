#include "model/op_probe.hpp"

#include <cmath>

namespace troupe {

const char* probe_dir_name(ProbeDir d) {
  switch (d) {
    case ProbeDir::forward: return "forward";
    case ProbeDir::backward: return "backward";
    default: return "weight";
  }
}

std::string probe_where(const ProbePoint& at) {
  if (at.layer >= 0) return "layer " + std::to_string(at.layer);
  if (at.layer == kEmbeddingProbe) return "the embedding";
  if (at.layer == kHeadProbe) return "the head";
  return std::string("custom block ") + at.block;
}

std::string describe(const ProbePoint& at) {
  std::string name = at.tensor;
  if (at.layer == kCustomProbe) {  // a custom block's points are its boundary tensors, by name
    if (at.dir == ProbeDir::weight) return probe_where(at) + " parameter gradients";
    if (name == "loss") return probe_where(at) + " loss";
    return probe_where(at) + " tensor \"" + name + "\"" + (at.dir == ProbeDir::backward ? " (its gradient)" : "");
  }
  if (name != "ln_f")  // "mlp fc1", but GPT-2's own "ln_f"
    for (char& c : name)
      if (c == '_') c = ' ';
  const char* what = at.dir == ProbeDir::forward    ? " output"
                     : at.dir == ProbeDir::backward ? " grad input"
                                                    : " weight grad";
  return probe_where(at) + " " + name + what;
}

std::string probe_id(const ProbePoint& at) {
  std::string where = at.layer >= 0                  ? "layer" + std::to_string(at.layer)
                      : at.layer == kEmbeddingProbe ? std::string("embedding")
                      : at.layer == kHeadProbe      ? std::string("head")
                                                    : std::string("custom.") + at.block;
  return where + ":" + at.tensor + ":" + probe_dir_name(at.dir);
}

const std::vector<ProbeName>& gpt_probe_names() {
  static const std::vector<ProbeName> names = {
      {"layer", "ln1", true, true, true},
      {"layer", "attention_qkv", true, true, true},
      {"layer", "attention_rotary", true, true, false},
      {"layer", "attention_scores", true, true, false},
      {"layer", "attention_output", true, false, false},
      {"layer", "attention_proj", true, true, true},
      {"layer", "residual1", true, true, false},
      {"layer", "ln2", true, true, true},
      {"layer", "mlp_fc1", true, true, true},
      {"layer", "mlp_gelu", true, true, false},
      {"layer", "mlp_swiglu", true, true, false},
      {"layer", "moe_router", true, true, true},  // MoE layers: the router's logits
      {"layer", "moe_experts", true, true, false},  // the experts' outputs, d(their inputs)
      {"layer", "moe_output", true, false, false},  // the MoE block's output before the residual
      {"layer", "mlp_fc2", true, true, true},
      {"layer", "residual2", true, true, false},
      {"embedding", "lookup", true, false, true},
      {"embedding", "ln_embd", true, true, true},
      {"head", "ln_f", true, true, true},
      {"head", "logits", true, true, true},
      {"head", "loss", true, true, false},
  };
  return names;
}

namespace {
template <class T>
int64_t first_bad(const T* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return -1;
}
template <class T>
int64_t count_bad(const T* p, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += std::isfinite(p[i]) ? 0 : 1;
  return c;
}
}  // namespace

int64_t first_non_finite(const Tensor& given) {
  if (!given.defined()) return -1;
  const Tensor t = given.to_host();  // a GPU tensor is read back (the watch's replay only)
  if (t.dtype() == DType::f32) return first_bad(t.data<float>(), t.numel());
  if (t.dtype() == DType::f64) return first_bad(t.data<double>(), t.numel());
  if (is_16bit(t.dtype())) return first_bad(t.to(DType::f32).data<float>(), t.numel());  // widening keeps Inf/NaN
  return -1;
}

int64_t count_non_finite(const Tensor& given) {
  if (!given.defined()) return 0;
  const Tensor t = given.to_host();
  if (t.dtype() == DType::f32) return count_bad(t.data<float>(), t.numel());
  if (t.dtype() == DType::f64) return count_bad(t.data<double>(), t.numel());
  if (is_16bit(t.dtype())) return count_bad(t.to(DType::f32).data<float>(), t.numel());
  return 0;
}

}  // namespace troupe
