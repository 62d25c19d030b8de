// Transformer architecture hyper-parameters (Megatron's names) and the derived sizes. The defaults are
// GPT-2 (LayerNorm, learned absolute positions, GELU MLP of 4h, biases, tied embeddings); the family
// fields below describe LLaMA (RMSNorm, rotary, SwiGLU, grouped-query attention, no biases, untied
// head) and BLOOM (ALiBi, LayerNorm on the embeddings) with the same struct. docs/MODELS.md lists
// each family's flags.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

// --normalization (Megatron): LayerNorm (weight and bias) or RMSNorm (weight only).
enum class Normalization : uint8_t { layernorm, rmsnorm };
// --position-embedding-type: learned_absolute (a wpe table added to the embeddings), rope (rotary on
// q and k in every layer), alibi (BLOOM's linear biases on the attention scores), none.
enum class PositionEmbedding : uint8_t { learned_absolute, rope, alibi, none };
// The MLP's activation: GPT-2's tanh GELU on one fc1 of F rows, or SwiGLU (--swiglu): fc1 holds
// 2F rows [gate | up], the MLP computes silu(gate) * up.
enum class MlpActivation : uint8_t { gelu, swiglu };

// Megatron's spellings ("LayerNorm", "RMSNorm"; "learned_absolute", "rope", "alibi", "none";
// "gelu", "swiglu"); parse returns false for anything else.
const char* to_string(Normalization n);
const char* to_string(PositionEmbedding p);
const char* to_string(MlpActivation a);
bool parse(const std::string& text, Normalization& out);
bool parse(const std::string& text, PositionEmbedding& out);
bool parse(const std::string& text, MlpActivation& out);

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

  // ---- architecture family (defaults: GPT-2) ----
  Normalization normalization = Normalization::layernorm;        // --normalization
  PositionEmbedding position_embedding = PositionEmbedding::learned_absolute;  // --position-embedding-type
  MlpActivation activation = MlpActivation::gelu;                // --swiglu
  bool add_bias_linear = true;                      // --disable-bias-linear sets false: no linear biases
  bool untie_embeddings_and_output_weights = false; // own output head "lm_head.weight" (Vp, C)
  bool embed_layernorm = false;                     // BLOOM: a LayerNorm on the embedding output
  int num_query_groups = 0;       // --num-query-groups / --num-key-value-heads; 0: = heads (MHA); 1: MQA
  int kv_channels = 0;            // --kv-channels, the head dimension; 0: hidden / heads
  int ffn_hidden = 0;             // --ffn-hidden-size; 0: 4h (gelu) or Megatron's SwiGLU rule (below)
  double rotary_percent = 1.0;    // --rotary-percent: the share of each head's dims rotated (0, 1]
  double rotary_base = 10000;     // --rotary-base (HF's rope_theta)
  bool rotary_interleaved = false;  // --rotary-interleaved: pairs (2i, 2i+1) (Meta's original);
                                    // false: rotate-half pairs (i, i + r/2) (HF, Megatron's default)

  // The family switches alone, sizes untouched: LLaMA's RMSNorm, rotary (rotate-half), SwiGLU,
  // bias-free linears and untied head; BLOOM's ALiBi and LayerNorm on the embeddings (its LayerNorm,
  // GELU MLP, biases and tied head are GPT-2's). The presets (config/model_presets.hpp) start here.
  void set_llama_family() {
    normalization = Normalization::rmsnorm;
    position_embedding = PositionEmbedding::rope;
    activation = MlpActivation::swiglu;
    add_bias_linear = false;
    untie_embeddings_and_output_weights = true;
  }
  void set_bloom_family() {
    position_embedding = PositionEmbedding::alibi;
    embed_layernorm = true;
  }

  // ffn_hidden when set; else 4h for GELU, and for SwiGLU Megatron-LM's rule int((4h * 2/3) / 64) * 64
  // (two fc1 halves keep the parameter count near the 4h MLP's).
  int ffn_hidden_size() const;
  int head_size() const {
    return kv_channels > 0 ? kv_channels : num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
  }
  int query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  // Rows of the fused QKV projection: (heads + 2 groups) * head size; GPT-2: 3h.
  int64_t qkv_size() const {
    return static_cast<int64_t>(num_attention_heads + 2 * query_groups()) * head_size();
  }
  // The attention output width (input of attn.c_proj): heads * head size; GPT-2: h.
  int64_t attention_size() const { return static_cast<int64_t>(num_attention_heads) * head_size(); }
  // Dimensions of each head that rotary rotates (even): int(head_size * rotary_percent) rounded down
  // to even; 0 without rope.
  int rotary_dim() const;
  // Real vocabulary rounded up to a multiple of make_vocab_size_divisible_by * tp (Megatron's rule).
  int64_t padded_vocab_size(int tensor_parallel_size = 1) const;
  // Whether every family field has GPT-2's value (what the model of this build trains).
  bool is_gpt2_family() const;
  // "GPT-2", "LLaMA" (RMSNorm + rope + SwiGLU), "BLOOM" (ALiBi + embedding LayerNorm) or "custom".
  const char* family_name() const;
  // Parameters of the real model (padding rows excluded), tied embedding counted once, for every
  // family: wte V C, wpe P C (learned positions), the embedding LayerNorm, per layer two norms
  // (LayerNorm 2C, RMSNorm C), qkv C (H + 2G) hs (+ bias), the projection H hs C (+ C), fc1 C F
  // (x2 with SwiGLU, + bias), fc2 F C (+ C), the final norm, and an untied head V C.
  int64_t num_parameters() const;
  // Model FLOPs of one forward+backward over `tokens` tokens in sequences of seq_length, without
  // recomputation: Megatron-LM's num_floating_point_operations (megatron/training/training.py, the
  // dense transformer): 3 (forward, two backward GEMMs) x 2 (FMA) x tokens x [L (C F e + C (q + 2 kv)
  // + q C) + C Vp] + 3 x 2 x tokens x s x L q (QK^T and PV, halved by the causal mask), with
  // q = H hs, kv = G hs, e = 3 with SwiGLU else 2, Vp the padded vocabulary (tp 1).
  double flops_per_iteration(int64_t tokens) const;

  // Every problem of the architecture apart from the vocabulary (set later by the tokenizer), one
  // message each, "FLAG what -- fix": sizes in range (bounds that keep every size product inside
  // int64 and every width inside int), heads divide the hidden size (without --kv-channels), query
  // groups divide the heads, a positive MLP width, the rotary settings (rope only; percent in (0, 1],
  // an even rotary dimension >= 2, a positive base), a positive norm epsilon, dropout in [0, 1).
  std::vector<std::string> architecture_problems() const;
  // architecture_problems() and the vocabulary, all at once ("N problems:" and one line each).
  Status validate() const;
};

}  // namespace troupe
