#include "troupe/model_config.hpp"

#include "model/config_moe.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

const char* to_string(Normalization n) { return n == Normalization::rmsnorm ? "RMSNorm" : "LayerNorm"; }
const char* to_string(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::learned_absolute: return "learned_absolute";
    case PositionEmbedding::rope: return "rope";
    case PositionEmbedding::alibi: return "alibi";
    case PositionEmbedding::none: return "none";
  }
  return "?";
}
const char* to_string(MlpActivation a) { return a == MlpActivation::swiglu ? "swiglu" : "gelu"; }

bool parse(const std::string& text, Normalization& out) {
  for (auto n : {Normalization::layernorm, Normalization::rmsnorm})
    if (text == to_string(n)) return out = n, true;
  return false;
}
bool parse(const std::string& text, PositionEmbedding& out) {
  for (auto p : {PositionEmbedding::learned_absolute, PositionEmbedding::rope, PositionEmbedding::alibi,
                 PositionEmbedding::none})
    if (text == to_string(p)) return out = p, true;
  return false;
}
bool parse(const std::string& text, MlpActivation& out) {
  for (auto a : {MlpActivation::gelu, MlpActivation::swiglu})
    if (text == to_string(a)) return out = a, true;
  return false;
}

const char* to_string(MoeRouter r) { return r == MoeRouter::deepspeed ? "deepspeed" : "megatron"; }
const char* to_string(MoeLoadBalancing b) {
  switch (b) {
    case MoeLoadBalancing::aux_loss: return "aux_loss";
    case MoeLoadBalancing::seq_aux_loss: return "seq_aux_loss";
    case MoeLoadBalancing::none: return "none";
  }
  return "?";
}
const char* to_string(MoeDropPolicy d) { return d == MoeDropPolicy::position ? "position" : "probs"; }
bool parse(const std::string& text, MoeRouter& out) {
  for (auto r : {MoeRouter::deepspeed, MoeRouter::megatron})
    if (text == to_string(r)) return out = r, true;
  return false;
}
bool parse(const std::string& text, MoeLoadBalancing& out) {
  for (auto b : {MoeLoadBalancing::aux_loss, MoeLoadBalancing::seq_aux_loss, MoeLoadBalancing::none})
    if (text == to_string(b)) return out = b, true;
  return false;
}
bool parse(const std::string& text, MoeDropPolicy& out) {
  for (auto d : {MoeDropPolicy::probs, MoeDropPolicy::position})
    if (text == to_string(d)) return out = d, true;
  return false;
}

namespace {
// Whether layer `layer` (0-based) is in the MoE layers' pattern, and which of them it is (-1: not);
// without `count`, 0 for any layer in it (O(1) but for the count, which the lists of experts need).
int pattern_index(const MoeConfig& m, int layer, int num_layers, bool count = true) {
  if (!m.enabled() || layer < 0 || layer >= num_layers) return -1;
  auto in = [&](int l) {
    if (!m.layer_pattern.empty())
      return l < static_cast<int>(m.layer_pattern.size()) && m.layer_pattern[static_cast<size_t>(l)] != 0;
    return m.layer_freq > 0 && (l + 1) % m.layer_freq == 0;
  };
  if (!in(layer)) return -1;
  if (!count) return 0;
  int n = 0;
  for (int l = 0; l < layer; ++l) n += in(l) ? 1 : 0;
  return n;
}
}  // namespace

int MoeConfig::experts_of(int layer, int num_layers) const {
  const int i = pattern_index(*this, layer, num_layers, /*count=*/num_experts.size() > 1);
  if (i < 0) return 0;
  int e = 0;
  if (num_experts.size() == 1) e = num_experts[0];
  else if (i < static_cast<int>(num_experts.size())) e = num_experts[static_cast<size_t>(i)];
  // Megatron-DeepSpeed: a layer of one expert is a dense layer ("dense, not MoE").
  return router == MoeRouter::deepspeed && e <= 1 ? 0 : std::max(e, 0);
}

bool MoeConfig::is_moe_layer(int layer, int num_layers) const { return experts_of(layer, num_layers) > 0; }

int MoeConfig::moe_layers(int num_layers) const {
  int n = 0;
  for (int l = 0; l < num_layers; ++l) n += is_moe_layer(l, num_layers) ? 1 : 0;
  return n;
}

int MoeConfig::moe_index(int layer, int num_layers) const {
  if (!is_moe_layer(layer, num_layers)) return -1;
  int n = 0;
  for (int l = 0; l < layer; ++l) n += is_moe_layer(l, num_layers) ? 1 : 0;
  return n;
}

int64_t MoeConfig::capacity(int64_t tokens, int experts, bool training) const {
  if (!drop_tokens || experts <= 0) return tokens * topk;
  const double factor = training ? capacity_factor : eval_capacity_factor;
  // ceil(S * k / E * factor), rounded as each anchor computes it (the ceiling of a product that lands
  // near an integer depends on the arithmetic): DeepSpeed's _capacity in float32,
  // ceil(fp32(S / E) * fp32(factor * k)), raised to min_capacity; Megatron-Core's get_capacity in
  // double, ceil((S * k / E) * factor), without a minimum.
  const double S = static_cast<double>(tokens), E = experts, k = topk;
  if (router == MoeRouter::deepspeed) {
    const float c = std::ceil(static_cast<float>(S / E) * static_cast<float>(factor * k));
    const int64_t cap = c >= static_cast<float>(tokens * topk) ? tokens * topk : static_cast<int64_t>(c);
    return std::max<int64_t>(cap, min_capacity);
  }
  const double c = std::ceil((S * k / E) * factor);
  return c >= S * k ? tokens * topk : static_cast<int64_t>(c);
}

namespace {
// A derived size of an unvalidated config (the flag readers ask before validate() refuses it):
// saturated into int, never an overflow (validate() bounds the real ones far below).
int saturate(double v) {
  if (!(v > std::numeric_limits<int>::min())) return std::numeric_limits<int>::min();
  if (v >= std::numeric_limits<int>::max()) return std::numeric_limits<int>::max();
  return static_cast<int>(v);
}
}  // namespace

int GptConfig::ffn_hidden_size() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (activation == MlpActivation::swiglu)
    return saturate(std::floor(4.0 * hidden_size * 2 / 3 / 64) * 64);  // int((4h * 2/3) / 64) * 64, h > 0
  return saturate(4.0 * hidden_size);
}

int GptConfig::rotary_dim() const {
  if (position_embedding != PositionEmbedding::rope) return 0;
  const int d = saturate(std::trunc(head_size() * rotary_percent));
  return d - d % 2;
}

int64_t GptConfig::padded_vocab_size(int tensor_parallel_size) const {
  const int64_t multiple = static_cast<int64_t>(make_vocab_size_divisible_by) * tensor_parallel_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

bool GptConfig::is_gpt2_family() const {
  const GptConfig gpt2;
  return normalization == gpt2.normalization && position_embedding == gpt2.position_embedding &&
         activation == gpt2.activation && add_bias_linear == gpt2.add_bias_linear &&
         untie_embeddings_and_output_weights == gpt2.untie_embeddings_and_output_weights &&
         embed_layernorm == gpt2.embed_layernorm && query_groups() == num_attention_heads &&
         (kv_channels == 0 || int64_t{kv_channels} * num_attention_heads == hidden_size) && ffn_hidden_size() == 4 * hidden_size;
}

const char* GptConfig::family_name() const {
  if (is_gpt2_family()) return "GPT-2";
  if (normalization == Normalization::rmsnorm && position_embedding == PositionEmbedding::rope &&
      activation == MlpActivation::swiglu)
    return "LLaMA";
  if (position_embedding == PositionEmbedding::alibi && embed_layernorm) return "BLOOM";
  return "custom";
}

int64_t GptConfig::num_parameters() const {
  const int64_t C = hidden_size, L = num_layers, V = vocab_size, F = ffn_hidden_size();
  const int64_t norm = normalization == Normalization::rmsnorm ? C : 2 * C;  // weight (+ bias)
  const int64_t fc1 = activation == MlpActivation::swiglu ? 2 * F : F;      // [gate | up] or one
  const int64_t qkv = qkv_size(), attn = attention_size();
  int64_t per_layer = 2 * norm + C * qkv + attn * C + C * fc1 + F * C;
  if (add_bias_linear) per_layer += qkv + C + fc1 + C;
  int64_t total = V * C + L * per_layer + norm;  // wte, the layers, ln_f
  if (position_embedding == PositionEmbedding::learned_absolute) total += int64_t{max_position_embeddings} * C;
  if (embed_layernorm) total += norm;
  if (untie_embeddings_and_output_weights) total += V * C;
  if (moe.enabled()) {
    // Each MoE layer's MLP in place of the dense one (model/config_moe.cpp).
    const int64_t dense_mlp = C * fc1 + F * C + (add_bias_linear ? fc1 + C : 0);
    for (int l = 0; l < num_layers; ++l)
      if (moe.is_moe_layer(l, num_layers)) total += moe_mlp_parameters(*this, moe.experts_of(l, num_layers)) - dense_mlp;
  }
  return total;
}

double GptConfig::flops_per_iteration(int64_t tokens) const {
  // Megatron-LM's num_floating_point_operations for a dense model (names as there): 3 passes
  // (forward, backward wgrad and dgrad) x 2 (an FMA is two operations).
  const double s = seq_length, L = num_layers, h = hidden_size;
  const double q = static_cast<double>(attention_size());                             // query_projection_size
  const double kv = static_cast<double>(query_groups()) * head_size();                // key/value_projection_size
  const double ffn_expansion = activation == MlpActivation::swiglu ? 3.0 : 2.0;
  const double Vp = static_cast<double>(padded_vocab_size(1));
  // Core attention: QK^T and softmax(QK^T) V, 2 s q each per token, halved by the causal mask.
  const double core = 6.0 * s * L * q;
  if (!moe.enabled()) {
    const double per_token = 6.0 * (L * (h * ffn_hidden_size() * ffn_expansion + h * (q + 2 * kv) + q * h) + h * Vp);
    return static_cast<double>(tokens) * (per_token + core);
  }
  // With experts, each layer's MLP as one token computes it (model/config_moe.cpp).
  double mlp = 0;
  for (int l = 0; l < num_layers; ++l)
    mlp += moe.is_moe_layer(l, num_layers) ? moe_mlp_macs_per_token(*this, moe.experts_of(l, num_layers))
                                           : h * ffn_hidden_size() * ffn_expansion;
  const double per_token = 6.0 * (mlp + L * (h * (q + 2 * kv) + q * h) + h * Vp);
  return static_cast<double>(tokens) * (per_token + core);
}

std::vector<std::string> GptConfig::architecture_problems() const {
  std::vector<std::string> out;
  auto bad = [&out](const std::string& flag, const std::string& what, const std::string& fix) {
    out.push_back(flag + " " + what + " -- " + fix);
  };
  auto num = [](double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  const auto str = [](int64_t v) { return std::to_string(v); };
  // Upper bounds far beyond any trainable model keep every size product inside int64 and every
  // per-layer width (2 x the MLP, heads x head size) inside int; the memory check refuses what does
  // not fit long before.
  constexpr int kMaxLayers = 1 << 20, kMaxWidth = 1 << 24, kMaxSeq = 1 << 24;
  if (num_layers <= 0 || num_layers > kMaxLayers)
    bad("--num-layers", "must be 1 to " + str(kMaxLayers) + ", got " + str(num_layers), "pass e.g. --num-layers 4");
  const bool width_ok = hidden_size > 0 && hidden_size <= kMaxWidth;
  if (!width_ok)
    bad("--hidden-size", "must be 1 to " + str(kMaxWidth) + ", got " + str(hidden_size), "pass e.g. --hidden-size 256");
  if (seq_length <= 0 || seq_length > kMaxSeq)
    bad("--seq-length", "must be 1 to " + str(kMaxSeq) + ", got " + str(seq_length), "pass e.g. --seq-length 256");
  if (max_position_embeddings > kMaxSeq)
    bad("--max-position-embeddings", "must be at most " + str(kMaxSeq) + ", got " + str(max_position_embeddings),
        "use a shorter sequence");
  else if (seq_length > 0 && max_position_embeddings < seq_length)
    bad("--max-position-embeddings",
        str(max_position_embeddings) + " is smaller than --seq-length " + str(seq_length),
        "make it at least the sequence length");
  const bool heads_ok = num_attention_heads > 0 && num_attention_heads <= kMaxWidth;
  if (!heads_ok)
    bad("--num-attention-heads", "must be 1 to " + str(kMaxWidth) + ", got " + str(num_attention_heads),
        "pass e.g. --num-attention-heads 4");
  if (kv_channels < 0 || kv_channels > kMaxWidth)
    bad("--kv-channels", "must be 1 to " + str(kMaxWidth) + ", got " + str(kv_channels),
        "leave it out for --hidden-size / --num-attention-heads, or pass the head dimension (e.g. 128)");
  else if (kv_channels == 0 && width_ok && heads_ok && hidden_size % num_attention_heads != 0)
    bad("--num-attention-heads", str(num_attention_heads) + " does not divide --hidden-size " + str(hidden_size),
        "choose a head count that divides the hidden size, or give the head dimension with --kv-channels");
  else if (heads_ok && kv_channels > 0 && int64_t{kv_channels} * num_attention_heads > kMaxWidth)
    bad("--kv-channels", str(kv_channels) + " x --num-attention-heads " + str(num_attention_heads) +
        " is above " + str(kMaxWidth), "use fewer heads or a smaller head dimension");
  if (num_query_groups < 0 || num_query_groups > kMaxWidth)
    bad("--num-query-groups", "must be positive, got " + str(num_query_groups),
        "give a group count that divides --num-attention-heads (1: multi-query attention), or leave it out");
  else if (heads_ok && num_query_groups > 0 && num_attention_heads % num_query_groups != 0)
    bad("--num-query-groups",
        str(num_query_groups) + " does not divide --num-attention-heads " + str(num_attention_heads),
        "each group of key/value heads serves a whole number of query heads: use a divisor of the head count");
  const bool head_ok = heads_ok && kv_channels >= 0 && kv_channels <= kMaxWidth && width_ok;
  if (ffn_hidden < 0 || ffn_hidden > 2 * kMaxWidth)
    bad("--ffn-hidden-size", "must be 1 to " + str(2 * kMaxWidth) + ", got " + str(ffn_hidden),
        "leave it out for 4 x --hidden-size (Megatron's SwiGLU rule with --swiglu), or pass e.g. 11008");
  else if (width_ok && ffn_hidden_size() <= 0)
    bad("--swiglu", "with --hidden-size " + str(hidden_size) +
        " gives Megatron's default MLP width int(4h x 2/3 / 64) x 64 = 0",
        "pass --ffn-hidden-size, e.g. " + str(std::max(1, 8 * hidden_size / 3)));
  if (position_embedding == PositionEmbedding::rope) {
    if (!(rotary_percent > 0 && rotary_percent <= 1))
      bad("--rotary-percent", "must be in (0, 1], got " + num(rotary_percent),
          "use 1.0 (every dimension of a head rotated) or e.g. 0.5");
    else if (head_ok && (kv_channels > 0 || hidden_size % num_attention_heads == 0) && rotary_dim() < 2)
      bad("--rotary-percent", num(rotary_percent) + " of the head dimension " + str(head_size()) +
          " rotates " + str(rotary_dim()) + " dimensions; rotary needs an even count of at least 2",
          "raise --rotary-percent or the head dimension");
    if (!(rotary_base > 0) || !std::isfinite(rotary_base))
      bad("--rotary-base", "must be a positive number, got " + num(rotary_base),
          "use 10000 (LLaMA-2) or 500000 (LLaMA-3)");
  } else {
    // Rotary settings without rotary: a script that meant rope but forgot to select it.
    const GptConfig d;
    const std::string fix = "add --position-embedding-type rope (or --use-rotary-position-embeddings), or drop it";
    const std::string what = std::string("has no effect with --position-embedding-type ") + to_string(position_embedding);
    if (rotary_percent != d.rotary_percent) bad("--rotary-percent", what, fix);
    if (rotary_base != d.rotary_base) bad("--rotary-base", what, fix);
    if (rotary_interleaved) bad("--rotary-interleaved", what, fix);
  }
  if (out.empty()) {
    // The count in double first: within int64 with room for the vocabulary's rows (each product of
    // num_parameters() then fits; a model this size is refused by the memory check long before).
    const double C = hidden_size, H = num_attention_heads, hs = head_size(), F = ffn_hidden_size();
    const double layer = C * (H + 2.0 * query_groups()) * hs + H * hs * C + 3 * C * F + 8 * C + 3 * F;
    if (layer * num_layers > 0x1p60)
      bad("--num-layers", str(num_layers) + " layers of " + num(layer) + " parameters are beyond 2^60",
          "make the model smaller");
  }
  if (!(layernorm_epsilon > 0) || !std::isfinite(layernorm_epsilon))
    bad("--norm-epsilon", "must be a positive number, got " + num(layernorm_epsilon), "use 1e-5");
  if (make_vocab_size_divisible_by <= 0)
    bad("--make-vocab-size-divisible-by", "must be positive", "use the default 128");
  if (!(init_method_std > 0) || !std::isfinite(init_method_std))
    bad("--init-method-std", "must be a positive number, got " + num(init_method_std), "use 0.02");
  for (const auto& [flag, p] : {std::pair{"--hidden-dropout", hidden_dropout},
                                std::pair{"--attention-dropout", attention_dropout}})
    if (!(p >= 0 && p < 1))
      bad(flag, "must be a probability at least 0 and below 1, got " + num(p),
          "use e.g. 0.1 (Megatron's default), or 0 for no dropout");
  append_moe_problems(*this, out);
  return out;
}

Status GptConfig::validate() const {
  std::vector<std::string> problems = architecture_problems();
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 31) - 1)
    problems.push_back("vocabulary of " + std::to_string(vocab_size) +
                       " tokens -- check --tokenizer-type and its vocabulary files");
  if (problems.empty()) return Status::ok();
  if (problems.size() == 1) return Status::error(problems[0]);
  std::string message = std::to_string(problems.size()) + " problems:";
  for (const std::string& p : problems) message += "\n  - " + p;
  return Status::error(message);
}

}  // namespace troupe
