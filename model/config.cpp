#include "troupe/model_config.hpp"

#include <string>

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

int GptConfig::ffn_hidden_size() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (activation == MlpActivation::swiglu) return static_cast<int>((4.0 * hidden_size * 2 / 3) / 64) * 64;
  return 4 * hidden_size;
}

int GptConfig::rotary_dim() const {
  if (position_embedding != PositionEmbedding::rope) return 0;
  const int d = static_cast<int>(head_size() * rotary_percent);
  return d - d % 2;
}

int64_t GptConfig::padded_vocab_size(int tensor_parallel_size) const {
  const int64_t multiple = static_cast<int64_t>(make_vocab_size_divisible_by) * tensor_parallel_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

int64_t GptConfig::num_parameters() const {
  const int64_t C = hidden_size, L = num_layers;
  const int64_t per_layer = 12 * C * C + 13 * C;
  return vocab_size * C + static_cast<int64_t>(max_position_embeddings) * C + L * per_layer + 2 * C;
}

double GptConfig::flops_per_iteration(int64_t tokens) const {
  const double s = seq_length, l = num_layers, h = hidden_size;
  const double V = static_cast<double>(padded_vocab_size(1));
  return 72.0 * static_cast<double>(tokens) * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
}

Status GptConfig::validate() const {
  auto bad = [](const std::string& flag, const std::string& what, const std::string& fix) {
    return Status::error(flag + " " + what + " -- " + fix);
  };
  // Upper bounds far beyond any trainable model keep every size product inside int64 and every
  // per-layer size (4 x hidden) inside int; the memory check refuses what does not fit long before.
  constexpr int kMaxLayers = 1 << 20, kMaxWidth = 1 << 24, kMaxSeq = 1 << 24;
  if (num_layers <= 0 || num_layers > kMaxLayers)
    return bad("--num-layers", "must be 1 to " + std::to_string(kMaxLayers) + ", got " + std::to_string(num_layers),
               "pass e.g. --num-layers 4");
  if (hidden_size <= 0 || hidden_size > kMaxWidth)
    return bad("--hidden-size", "must be 1 to " + std::to_string(kMaxWidth) + ", got " + std::to_string(hidden_size),
               "pass e.g. --hidden-size 256");
  if (seq_length > kMaxSeq || max_position_embeddings > kMaxSeq)
    return bad("--seq-length", "and --max-position-embeddings must be at most " + std::to_string(kMaxSeq),
               "use a shorter sequence");
  if (num_attention_heads <= 0)
    return bad("--num-attention-heads", "must be positive", "pass e.g. --num-attention-heads 4");
  if (hidden_size % num_attention_heads != 0)
    return bad("--num-attention-heads",
               std::to_string(num_attention_heads) + " does not divide --hidden-size " + std::to_string(hidden_size),
               "choose a head count that divides the hidden size");
  if (seq_length <= 0) return bad("--seq-length", "must be positive", "pass e.g. --seq-length 256");
  if (max_position_embeddings < seq_length)
    return bad("--max-position-embeddings",
               std::to_string(max_position_embeddings) + " is smaller than --seq-length " + std::to_string(seq_length),
               "make it at least the sequence length");
  if (make_vocab_size_divisible_by <= 0)
    return bad("--make-vocab-size-divisible-by", "must be positive", "use the default 128");
  if (vocab_size <= 0) return bad("vocabulary", "is empty", "check --tokenizer-type and its vocabulary files");
  if (!(layernorm_epsilon > 0)) return bad("layernorm epsilon", "must be positive", "use 1e-5");
  if (!(init_method_std > 0)) return bad("--init-method-std", "must be positive", "use 0.02");
  if (!(hidden_dropout >= 0 && hidden_dropout < 1))
    return bad("--hidden-dropout", "must be at least 0 and below 1", "use e.g. 0.1, or 0 for none");
  if (!(attention_dropout >= 0 && attention_dropout < 1))
    return bad("--attention-dropout", "must be at least 0 and below 1", "use e.g. 0.1, or 0 for none");
  return Status::ok();
}

}  // namespace troupe
