#include "model/params.hpp"

#include <algorithm>
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

// Narrows a whole-tensor spec to rank r's slice of a t-way split along spec.tp_split_dim. `part_sizes`:
// the global sizes of the split dimension's parts, in order (empty: tp_split_parts equal parts of the
// dimension); the vocabulary's one part is its padded size.
void apply_split(ParamSpec& p, int t, int r, std::vector<int64_t> part_sizes = {}) {
  if (p.tp_split_dim < 0) return;
  const int d = p.tp_split_dim;
  if (part_sizes.empty()) {
    const int64_t whole = p.global_shape[d];
    TROUPE_CHECK(whole % p.tp_split_parts == 0, "apply_split: equal parts must divide the dimension");
    part_sizes.assign(static_cast<size_t>(p.tp_split_parts), whole / p.tp_split_parts);
  }
  TROUPE_CHECK(static_cast<int>(part_sizes.size()) == p.tp_split_parts, "apply_split: one size per part");
  ParamSlice& sl = p.slice;
  sl.dim = d;
  sl.offsets.clear();
  sl.extents.clear();
  int64_t start = 0;
  for (int64_t part : part_sizes) {
    TROUPE_CHECK(part % t == 0,
                 "tensor-parallel size must divide the split dimension of every parameter (heads, hidden size)");
    sl.offsets.push_back(start + r * (part / t));
    sl.extents.push_back(part / t);
    start += part;
  }
  Shape local;
  for (int i = 0; i < p.global_shape.rank(); ++i) local.push_back(i == d ? sl.local_extent() : p.global_shape[i]);
  p.local_shape = local;
}

}  // namespace

int64_t ParamSlice::local_extent() const {
  int64_t n = 0;
  for (int64_t e : extents) n += e;
  return n;
}

bool is_expert_param(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

std::vector<ParamSpec> gpt2_shard_specs(const GptConfig& c, int tp_size, int tp_rank, const ExpertShard& ex) {
  TROUPE_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tensor-parallel rank out of range");
  const int t = tp_size, r = tp_rank;
  const int H = c.num_attention_heads, G = c.query_groups();
  TROUPE_CHECK(H % t == 0 && G % t == 0 && H % G == 0,
               "tensor-parallel size must divide the attention heads and the query groups, and the groups the heads");
  const int64_t C = c.hidden_size, F = c.ffn_hidden_size(), hs = c.head_size();
  const int64_t A = c.attention_size();  // H hs: the attention output's width
  const bool swiglu = c.activation == MlpActivation::swiglu;
  const bool rms = c.normalization == Normalization::rmsnorm;
  const bool bias = c.add_bias_linear;
  const double std = c.init_method_std;
  const double residual_std = std / std::sqrt(2.0 * c.num_layers);
  const int64_t Vp = c.padded_vocab_size(t);
  std::vector<ParamSpec> specs;
  auto add = [&](ParamSpec p, std::vector<int64_t> parts = {}) {
    apply_split(p, t, r, std::move(parts));
    specs.push_back(std::move(p));
  };
  // A norm: weight (ones), and a bias (zeros) unless RMSNorm; `layernorm` forces LayerNorm (ln_embd).
  auto norm = [&](const std::string& n, bool layernorm) {
    add(spec(n + ".weight", {C}, InitKind::ones, 0, false));
    if (layernorm) add(spec(n + ".bias", {C}, InitKind::zeros, 0, false));
  };
  // Vocabulary-parallel embedding, split over rows of the padded table.
  add(spec("transformer.wte.weight", {c.vocab_size, C}, InitKind::normal, std, true, 0), {Vp});
  if (c.position_embedding == PositionEmbedding::learned_absolute)
    add(spec("transformer.wpe.weight", {c.max_position_embeddings, C}, InitKind::normal, std, true));
  if (c.embed_layernorm) norm("transformer.ln_embd", true);
  // Column-parallel fused QKV: rows [q (H hs) | k (G hs) | v (G hs)], each part split over the ranks.
  const std::vector<int64_t> qkv_parts = {H * hs, G * hs, G * hs};
  // c_fc: one part, or SwiGLU's [gate (F) | up (F)].
  const int fc_n = swiglu ? 2 : 1;
  // An MLP of width `width` under `prefix` (c_fc, c_proj): split over the TP ranks like Megatron's
  // (split false: whole on every rank).
  auto mlp = [&](const std::string& prefix, int64_t width, bool split) {
    const std::vector<int64_t> parts = swiglu ? std::vector<int64_t>{width, width} : std::vector<int64_t>{width};
    const int tp_dim0 = split ? 0 : -1, tp_dim1 = split ? 1 : -1;
    add(spec(prefix + "c_fc.weight", {fc_n * width, C}, InitKind::normal, std, true, tp_dim0, fc_n), parts);
    if (bias) add(spec(prefix + "c_fc.bias", {fc_n * width}, InitKind::zeros, 0, false, tp_dim0, fc_n), parts);
    add(spec(prefix + "c_proj.weight", {C, width}, InitKind::normal_residual, residual_std, true, tp_dim1));
    if (bias) add(spec(prefix + "c_proj.bias", {C}, InitKind::zeros, 0, false));
  };
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    norm(h + "ln_1", !rms);
    add(spec(h + "attn.c_attn.weight", {c.qkv_size(), C}, InitKind::normal, std, true, 0, 3), qkv_parts);
    if (bias) add(spec(h + "attn.c_attn.bias", {c.qkv_size()}, InitKind::zeros, 0, false, 0, 3), qkv_parts);
    // Row-parallel output projection.
    add(spec(h + "attn.c_proj.weight", {C, A}, InitKind::normal_residual, residual_std, true, 1));
    if (bias) add(spec(h + "attn.c_proj.bias", {C}, InitKind::zeros, 0, false));
    norm(h + "ln_2", !rms);
    const int E = c.moe.experts_of(i, c.num_layers);
    // A dense layer's MLP, or PR-MoE's, a copy of the expert (Megatron-DeepSpeed deep-copies one MLP).
    if (E == 0 || c.moe.residual) mlp(h + "mlp.", E == 0 ? F : c.expert_ffn_hidden_size(), true);
    if (E > 0) {
      add(spec(h + "mlp.router.weight", {E, C}, InitKind::normal, std, true));
      if (bias && c.moe.router == MoeRouter::megatron) add(spec(h + "mlp.router.bias", {E}, InitKind::zeros, 0, false));
      if (c.moe.residual) {
        add(spec(h + "mlp.coefficient.weight", {2, C}, InitKind::normal, std, true));
        add(spec(h + "mlp.coefficient.bias", {2}, InitKind::zeros, 0, false));
      }
      if (c.moe.shared_expert_ffn > 0) mlp(h + "mlp.shared_expert.", c.moe.shared_expert_ffn, true);
      TROUPE_CHECK(ex.ep_size >= 1 && ex.ep_rank >= 0 && ex.ep_rank < ex.ep_size && E % ex.ep_size == 0,
                   "gpt2_shard_specs: the expert-parallel size must divide every layer's experts");
      const int local = E / ex.ep_size;
      for (int e = ex.ep_rank * local; e < (ex.ep_rank + 1) * local; ++e)
        mlp(h + "mlp.experts." + std::to_string(e) + ".", c.expert_ffn_hidden_size(), ex.tensor_parallel);
    }
  }
  norm("transformer.ln_f", !rms);
  // The untied output head: vocabulary-parallel like wte (Megatron's output_layer).
  if (c.untie_embeddings_and_output_weights)
    add(spec("lm_head.weight", {c.vocab_size, C}, InitKind::normal, std, true, 0), {Vp});
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
  // The block holding local index i_d (a handful of blocks: a linear walk).
  size_t j = 0;
  int64_t within = i_d;
  while (within >= sl.extents[j]) within -= sl.extents[j++];
  const int64_t g_d = sl.offsets[j] + within;
  if (g_d >= global_d) return -1;  // vocabulary padding
  return (outer * global_d + g_d) * inner + local_index % inner;
}

void init_parameter(const ParamSpec& spec, uint64_t seed, const Tensor& t) {
  TROUPE_CHECK(t.shape() == spec.local_shape, "init_parameter: tensor must have the spec's local shape");
  const ParamSlice& sl = spec.slice;
  TROUPE_CHECK(sl.dim < 0 ? spec.local_shape == spec.global_shape
                          : sl.dim < spec.local_shape.rank() && !sl.extents.empty() &&
                                sl.extents.size() == sl.offsets.size() &&
                                std::all_of(sl.extents.begin(), sl.extents.end(), [](int64_t e) { return e > 0; }) &&
                                spec.local_shape[sl.dim] == sl.local_extent(),
               "init_parameter: the spec's slice does not describe its local shape");
  if (t.device() != Device::cpu) {  // computed on the host, then one upload
    const Tensor host = Tensor::empty(t.shape(), t.dtype());
    init_parameter(spec, seed, host);
    t.copy_from(host);
    return;
  }
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
  if (is_16bit(t.dtype())) {  // the f32 values, rounded to nearest even: what an f32 master copy holds
    const Tensor f = Tensor::empty(t.shape(), DType::f32);
    float* d = f.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(value(i));
    t.copy_from(f.to(t.dtype()));
  } else if (t.dtype() == DType::f32) {
    float* d = t.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(value(i));
  } else {
    double* d = t.data<double>();
    for (int64_t i = 0; i < n; ++i) d[i] = value(i);
  }
}

}  // namespace troupe
