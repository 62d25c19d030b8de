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

// ---- mixture of experts (docs/MOE.md) ----
// Which anchor's gating an MoE layer follows (the two dialects of the flags, docs/COMPAT.md; the
// anchors' code read in docs/MOE_SEMANTICS.md):
//   deepspeed  DeepSpeed-MoE as Megatron-DeepSpeed builds it (deepspeed/moe/sharded_moe.py): softmax
//              over all experts; top-1 (the combine weight is the chosen expert's probability, Random
//              Token Selection picks which tokens an over-full expert keeps), top-2 (the second
//              expert by Gumbel-max sampling on the logits, dropping by position with every first
//              choice ahead of any second, the kept weights renormalised) or top-k, k > 2 (keeping
//              the largest probabilities, the kept weights renormalised); capacity
//              ceil(S / E * factor * k) in float32 as DeepSpeed rounds it, raised to min_capacity;
//              l_aux = E * sum_e mean_s(p_se) * mean_s(s's first choice is e) (k > 2: all k choices,
//              divided by k). A layer given one expert is a dense layer, as in Megatron-DeepSpeed.
//   megatron   Megatron-Core's TopKRouter (megatron/core/transformer/moe/router.py): logits with a
//              bias when the model has biases; top-k of the logits and a softmax over the k (or,
//              pre_softmax, top-k of the softmax over all experts); dropless, or capacity
//              ceil(S k / E * factor) per expert dropping by probability or position; the switch
//              load-balancing loss (aux_loss, seq_aux_loss) on the softmax over all experts and the
//              z-loss on the logits.
// Tokens are ordered as both anchors order them, position-major (row t * B + b of a micro-batch of B
// sequences of T tokens): "first come" means an earlier position across the micro-batch; ties (of
// weights, of RTS draws, of tokens that are all routed alike) keep the earlier position.
// Where troupe differs on purpose: every random draw comes from the counter-based generator keyed by
// global token position (the same on every layout), and evaluation draws nothing (no RTS, no Gumbel
// noise, no jitter: DeepSpeed draws in evaluation too), so an evaluation is deterministic.
enum class MoeRouter : uint8_t { deepspeed, megatron };
// --moe-router-load-balancing-type (Megatron-Core; the deepspeed router always has its l_aux).
enum class MoeLoadBalancing : uint8_t { aux_loss, seq_aux_loss, none };
// --moe-token-drop-policy (Megatron-Core): which tokens an over-full expert keeps.
enum class MoeDropPolicy : uint8_t { probs, position };

// Megatron's spellings ("LayerNorm", "RMSNorm"; "learned_absolute", "rope", "alibi", "none";
// "gelu", "swiglu"); parse returns false for anything else.
const char* to_string(Normalization n);
const char* to_string(PositionEmbedding p);
const char* to_string(MlpActivation a);
const char* to_string(MoeRouter r);         // "deepspeed", "megatron"
const char* to_string(MoeLoadBalancing b);  // "aux_loss", "seq_aux_loss", "none"
const char* to_string(MoeDropPolicy d);     // "probs", "position"
bool parse(const std::string& text, Normalization& out);
bool parse(const std::string& text, PositionEmbedding& out);
bool parse(const std::string& text, MlpActivation& out);
bool parse(const std::string& text, MoeRouter& out);
bool parse(const std::string& text, MoeLoadBalancing& out);
bool parse(const std::string& text, MoeDropPolicy& out);

// Mixture-of-experts layers (empty num_experts: a dense model). A MoE layer replaces the MLP of its
// transformer layer by a router (E, C) and E experts, each an MLP of the model's family (GELU, or
// SwiGLU for LLaMA/Mixtral, with the model's biases) of width expert_ffn_hidden; residual adds PR-MoE's
// dense MLP and its two-way mixing coefficient, shared_expert_ffn Megatron-Core's shared expert. The
// routing of a micro-batch depends on its S = B * T tokens only, never on the layout (docs/MOE.md).
struct MoeConfig {
  // Experts of each MoE layer: one value for every MoE layer, or one per MoE layer in order
  // (Megatron-DeepSpeed's --num-experts list). Each >= 1 (deepspeed: 1 makes the layer dense).
  std::vector<int> num_experts;
  // Layer n (counted from 1) is an MoE layer when n % layer_freq == 0: Megatron-DeepSpeed's
  // --expert-interval (default 2 there), and Megatron-Core's --moe-layer-freq 1 (its default).
  int layer_freq = 1;
  // One 0/1 per layer (1: MoE); non-empty overrides layer_freq. Megatron-Core's --moe-layer-freq as
  // a list, and its integer N > 1 too, which selects layers 0, N, 2N, ... counted from 0 (not
  // layer_freq's rule); Megatron-DeepSpeed's --num-experts list with some values 1 (those layers
  // keep the dense MLP there).
  std::vector<int> layer_pattern;
  MoeRouter router = MoeRouter::megatron;
  int topk = 2;                      // --topk / --moe-router-topk: k
  int ffn_hidden = 0;                // --moe-ffn-hidden-size: each expert's width; 0: the model's
  // Capacity per expert of a micro-batch of S tokens: ceil(S * k / E * factor), at least
  // min_capacity. drop_tokens false: dropless (every routed token is computed).
  bool drop_tokens = true;           // deepspeed: !--disable-moe-token-dropping; megatron: a factor given
  double capacity_factor = 1.0;      // training: --moe-train-capacity-factor / --moe-expert-capacity-factor
  double eval_capacity_factor = 1.0; // evaluation: --moe-eval-capacity-factor (megatron: the same factor)
  int min_capacity = 0;              // --moe-min-capacity (deepspeed only; Megatron-DeepSpeed's default 4)
  MoeDropPolicy drop_policy = MoeDropPolicy::probs;  // megatron router
  bool pad_to_capacity = false;      // --moe-pad-expert-input-to-capacity: accepted, the same result
  // deepspeed router's random draws (training only; evaluation draws nothing: RTS keeps by position,
  // the second expert is the second-largest logit):
  bool random_token_selection = true;        // top-1 RTS (DeepSpeed's use_rts default)
  bool second_expert_sampling = true;        // top-2 Gumbel sampling (!--disable-moe-top2-2nd-expert-sampling)
  // megatron router:
  MoeLoadBalancing load_balancing = MoeLoadBalancing::aux_loss;
  bool pre_softmax = false;          // --moe-router-pre-softmax
  double z_loss_coeff = 0;           // --moe-z-loss-coeff
  double input_jitter_eps = 0;       // --moe-input-jitter-eps: router input * U(1 - eps, 1 + eps), training
  // The load-balancing loss's coefficient (--moe-loss-coeff, --moe-aux-loss-coeff): the objective of
  // a micro-batch is its mean LM loss + aux_loss_coeff * the sum over MoE layers of their l_aux
  // (deepspeed) or load-balancing loss (megatron), + the z-losses.
  double aux_loss_coeff = 0;
  bool residual = false;             // --mlp-type residual (PR-MoE)
  int shared_expert_ffn = 0;         // --moe-shared-expert-intermediate-size (0: none)

  bool enabled() const { return !num_experts.empty(); }
  // Whether global layer `layer` (0-based) of a model of `num_layers` layers is an MoE layer.
  bool is_moe_layer(int layer, int num_layers) const;
  // How many MoE layers a model of num_layers has, and the index among them of an MoE layer.
  int moe_layers(int num_layers) const;
  int moe_index(int layer, int num_layers) const;
  // Experts of global layer `layer` (0 for a dense layer).
  int experts_of(int layer, int num_layers) const;
  // The capacity of an expert for S tokens (training or evaluation factor); S * k when not dropping.
  int64_t capacity(int64_t tokens, int experts, bool training) const;
  bool operator==(const MoeConfig&) const = default;
};

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
  MoeConfig moe;                    // mixture of experts (none by default)

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
  // An expert's MLP width: moe.ffn_hidden when set, else ffn_hidden_size().
  int expert_ffn_hidden_size() const { return moe.ffn_hidden > 0 ? moe.ffn_hidden : ffn_hidden_size(); }
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
  // (x2 with SwiGLU, + bias), fc2 F C (+ C), the final norm, and an untied head V C. An MoE layer
  // of E experts of width Fe has in place of its MLP (model/params.hpp's tensors): the router E C
  // (+ E, the megatron router with biases), E experts each an MLP of width Fe (biases as the MLP's),
  // PR-MoE's dense MLP (a copy of the expert) and coefficient 2C + 2 (residual), the shared expert's
  // MLP of its width. Mixtral-8x7B: 46,702,792,704.
  int64_t num_parameters() const;
  // Model FLOPs of one forward+backward over `tokens` tokens in sequences of seq_length, without
  // recomputation: Megatron-LM's num_floating_point_operations (megatron/training/training.py, the
  // dense transformer): 3 (forward, two backward GEMMs) x 2 (FMA) x tokens x [L (C F e + C (q + 2 kv)
  // + q C) + C Vp] + 3 x 2 x tokens x s x L q (QK^T and PV, halved by the causal mask), with
  // q = H hs, kv = G hs, e = 3 with SwiGLU else 2, Vp the padded vocabulary (tp 1). On an MoE
  // layer C F e becomes what one token computes: k experts C Fe e, the router C E, the residual
  // MLP C Fe e + 2C, the shared expert C Fs e (Megatron-LM counts the k experts and the shared
  // expert, not the router; dropped tokens are counted as computed).
  double flops_per_iteration(int64_t tokens) const;

  // Every problem of the architecture apart from the vocabulary (set later by the tokenizer), one
  // message each, "FLAG what -- fix": sizes in range (bounds that keep every size product inside
  // int64 and every width inside int), heads divide the hidden size (without --kv-channels), query
  // groups divide the heads, a positive MLP width, the rotary settings (rope only; percent in (0, 1],
  // an even rotary dimension >= 2, a positive base), a positive norm epsilon, dropout in [0, 1);
  // with experts, MoeConfig's (model/config_moe.cpp): counts >= 1, the layer rule and its lists'
  // lengths, k in [1, every layer's experts] (1 or 2 with the deepspeed router), the capacity,
  // coefficients >= 0, jitter in [0, 1), and each router's own settings only with it (residual:
  // deepspeed; shared expert, z-loss, jitter, pre-softmax, load-balancing type: megatron). The
  // flags named are the router's dialect's (--topk or --moe-router-topk).
  std::vector<std::string> architecture_problems() const;
  // architecture_problems() and the vocabulary, all at once ("N problems:" and one line each).
  Status validate() const;
};

}  // namespace troupe
