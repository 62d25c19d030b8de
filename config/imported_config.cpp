#include "config/imported_config.hpp"

namespace troupe {

TrainConfig imported_train_config(const HfModel& m) {
  TrainConfig c;
  const HfGpt2Config& h = m.config;
  c.model.num_layers = static_cast<int>(h.n_layer);
  c.model.hidden_size = static_cast<int>(h.n_embd);
  c.model.num_attention_heads = static_cast<int>(h.n_head);
  c.model.max_position_embeddings = static_cast<int>(h.n_positions);
  c.model.seq_length = static_cast<int>(h.n_positions);
  c.model.vocab_size = h.vocab_size;
  c.model.layernorm_epsilon = h.layer_norm_epsilon;
  c.tokenizer_type = !m.vocab_file.empty() ? "GPT2BPETokenizer"
                     : !h.tokenizer_type.empty() ? h.tokenizer_type
                                                 : "GPT2BPETokenizer";
  if (c.tokenizer_type == "GPT2BPETokenizer") {
    c.vocab_file = m.vocab_file;
    c.merge_file = m.merge_file;
  }
  return c;
}

}  // namespace troupe
