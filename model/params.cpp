#include "model/params.hpp"

#include <cmath>
#include <numbers>

namespace troupe {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Uniform in (0, 1) from 53 random bits.
double to_open_unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

// N(0, 1) for element `index` of the stream `key` (Box-Muller on two counter-derived uniforms).
double normal_at(uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(key + 2 * index);
  const uint64_t b = splitmix64(key + 2 * index + 1);
  return std::sqrt(-2.0 * std::log(to_open_unit(a))) * std::cos(2.0 * std::numbers::pi * to_open_unit(b));
}

ParamSpec spec(std::string name, Shape shape, InitKind init, double std, bool decay, int split_dim = -1,
               int parts = 1) {
  ParamSpec p;
  p.name = std::move(name);
  p.global_shape = shape;
  p.local_shape = shape;
  p.init = init;
  p.init_std = std;
  p.weight_decay = decay;
  p.tp_split_dim = split_dim;
  p.tp_split_parts = parts;
  return p;
}

// Narrows a whole-tensor spec to rank r's slice of a t-way split along spec.tp_split_dim; `padded` is
// the padded extent of that dimension when it has vocabulary padding (wte), else 0.
void apply_split(ParamSpec& p, int t, int r, int64_t padded) {
  if (p.tp_split_dim < 0) return;
  const int d = p.tp_split_dim;
  const int64_t whole = padded > 0 ? padded : p.global_shape[d];
  const int64_t part = whole / p.tp_split_parts;
  TROUPE_CHECK(whole % p.tp_split_parts == 0 && part % t == 0,
               "tensor-parallel size must divide the split dimension of every parameter (heads, hidden size)");
  ParamSlice& sl = p.slice;
  sl.dim = d;
  sl.extent = part / t;
  sl.offsets.clear();
  for (int j = 0; j < p.tp_split_parts; ++j) sl.offsets.push_back(j * part + r * sl.extent);
  Shape local;
  for (int i = 0; i < p.global_shape.rank(); ++i)
    local.push_back(i == d ? sl.extent * p.tp_split_parts : p.global_shape[i]);
  p.local_shape = local;
}

}  // namespace

std::vector<ParamSpec> gpt2_shard_specs(const GptConfig& c, int tp_size, int tp_rank) {
  TROUPE_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tensor-parallel rank out of range");
  const int64_t C = c.hidden_size, F = c.ffn_hidden_size();
  const double std = c.init_method_std;
  const double residual_std = std / std::sqrt(2.0 * c.num_layers);
  std::vector<ParamSpec> specs;
  // Vocabulary-parallel embedding, split over rows of the padded table.
  specs.push_back(spec("transformer.wte.weight", {c.vocab_size, C}, InitKind::normal, std, true, 0));
  specs.push_back(spec("transformer.wpe.weight", {c.max_position_embeddings, C}, InitKind::normal, std, true));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    specs.push_back(spec(h + "ln_1.weight", {C}, InitKind::ones, 0, false));
    specs.push_back(spec(h + "ln_1.bias", {C}, InitKind::zeros, 0, false));
    // Column-parallel fused QKV: rows are [q | k | v], each split over tensor-parallel ranks.
    specs.push_back(spec(h + "attn.c_attn.weight", {3 * C, C}, InitKind::normal, std, true, 0, 3));
    specs.push_back(spec(h + "attn.c_attn.bias", {3 * C}, InitKind::zeros, 0, false, 0, 3));
    // Row-parallel output projection.
    specs.push_back(spec(h + "attn.c_proj.weight", {C, C}, InitKind::normal_residual, residual_std, true, 1));
    specs.push_back(spec(h + "attn.c_proj.bias", {C}, InitKind::zeros, 0, false));
    specs.push_back(spec(h + "ln_2.weight", {C}, InitKind::ones, 0, false));
    specs.push_back(spec(h + "ln_2.bias", {C}, InitKind::zeros, 0, false));
    specs.push_back(spec(h + "mlp.c_fc.weight", {F, C}, InitKind::normal, std, true, 0));
    specs.push_back(spec(h + "mlp.c_fc.bias", {F}, InitKind::zeros, 0, false, 0));
    specs.push_back(spec(h + "mlp.c_proj.weight", {C, F}, InitKind::normal_residual, residual_std, true, 1));
    specs.push_back(spec(h + "mlp.c_proj.bias", {C}, InitKind::zeros, 0, false));
  }
  specs.push_back(spec("transformer.ln_f.weight", {C}, InitKind::ones, 0, false));
  specs.push_back(spec("transformer.ln_f.bias", {C}, InitKind::zeros, 0, false));
  for (size_t i = 0; i < specs.size(); ++i)
    apply_split(specs[i], tp_size, tp_rank, i == 0 ? c.padded_vocab_size(tp_size) : 0);
  return specs;
}

std::vector<ParamSpec> gpt2_param_specs(const GptConfig& c) { return gpt2_shard_specs(c, 1, 0); }

int64_t slice_global_index(const ParamSpec& spec, int64_t local_index) {
  const ParamSlice& sl = spec.slice;
  if (sl.dim < 0) return local_index;
  const int d = sl.dim;
  int64_t inner = 1;  // elements per index of dimension d (same locally and globally)
  for (int i = d + 1; i < spec.local_shape.rank(); ++i) inner *= spec.local_shape[i];
  const int64_t local_d = spec.local_shape[d], global_d = spec.global_shape[d];
  const int64_t outer = local_index / (local_d * inner);
  const int64_t i_d = local_index / inner % local_d;
  const int64_t g_d = sl.offsets[static_cast<size_t>(i_d / sl.extent)] + i_d % sl.extent;
  if (g_d >= global_d) return -1;  // vocabulary padding
  return (outer * global_d + g_d) * inner + local_index % inner;
}

void init_parameter(const ParamSpec& spec, uint64_t seed, const Tensor& t) {
  TROUPE_CHECK(t.shape() == spec.local_shape, "init_parameter: tensor must have the spec's local shape");
  const ParamSlice& sl = spec.slice;
  TROUPE_CHECK(sl.dim < 0 ? spec.local_shape == spec.global_shape
                          : sl.dim < spec.local_shape.rank() && sl.extent > 0 &&
                                spec.local_shape[sl.dim] == static_cast<int64_t>(sl.offsets.size()) * sl.extent,
               "init_parameter: the spec's slice does not describe its local shape");
  const int64_t n = t.numel();
  const uint64_t key = splitmix64(seed ^ splitmix64(fnv1a(spec.name)));
  // Local element i takes the value of its global element: the stream is indexed globally.
  auto value = [&](int64_t local) -> double {
    const int64_t i = slice_global_index(spec, local);
    if (i < 0) return 0.0;  // vocabulary padding
    switch (spec.init) {
      case InitKind::zeros: return 0.0;
      case InitKind::ones: return 1.0;
      case InitKind::normal:
      case InitKind::normal_residual: return spec.init_std * normal_at(key, static_cast<uint64_t>(i));
    }
    return 0.0;
  };
  if (t.dtype() == DType::f32) {
    float* d = t.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(value(i));
  } else {
    double* d = t.data<double>();
    for (int64_t i = 0; i < n; ++i) d[i] = value(i);
  }
}

}  // namespace troupe
