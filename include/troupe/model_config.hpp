// GPT-2 architecture hyper-parameters (Megatron's names) and the derived sizes.
#pragma once
#include <cstdint>
#include <string>

#include "troupe/status.hpp"

namespace troupe {

struct GptConfig {
  int num_layers = 4;
  int hidden_size = 256;
  int num_attention_heads = 4;
  int seq_length = 256;
  int max_position_embeddings = 256;
  int64_t vocab_size = 0;                  // the tokenizer's real vocabulary (EOD included)
  int make_vocab_size_divisible_by = 128;  // Megatron's --make-vocab-size-divisible-by
  double layernorm_epsilon = 1e-5;
  double init_method_std = 0.02;
  // Dropout probabilities (Megatron's --hidden-dropout, --attention-dropout), 0 <= p < 1, applied in
  // training only: hidden on the embedding output and on each residual branch (attention and MLP
  // output, before the residual add), attention on the attention probabilities. The masks are a
  // function of (seed, iteration, global sample, layer, element), the same on every parallel layout
  // (docs/COMPAT.md, "Dropout"). 0 here: a GptConfig built in code is the model without dropout;
  // the command line (and troupe::parse_train_flags) defaults both to Megatron's 0.1.
  double hidden_dropout = 0;
  double attention_dropout = 0;

  int ffn_hidden_size() const { return 4 * hidden_size; }
  int head_size() const { return hidden_size / num_attention_heads; }
  // Real vocabulary rounded up to a multiple of make_vocab_size_divisible_by * tp (Megatron's rule).
  int64_t padded_vocab_size(int tensor_parallel_size = 1) const;
  // Parameters of the real model (padding rows excluded), tied embedding counted once.
  int64_t num_parameters() const;
  // Model FLOPs of one forward+backward over `tokens` tokens in sequences of seq_length, the
  // Megatron-LM paper's count without recomputation: 72 B s l h^2 (1 + s/6h + V/16lh) for B*s tokens.
  double flops_per_iteration(int64_t tokens) const;

  // Checks the combination: heads divide hidden size, seq <= positions, sizes positive.
  Status validate() const;
};

}  // namespace troupe
