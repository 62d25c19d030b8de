// Hugging Face model classes' parameters under their names, and how each is made from troupe's,
// shared by the export (storage/hf_export.hpp) and the import (storage/hf_import.hpp).
//
// GPT2LMHeadModel: troupe's checkpoints use the same names (model/params.hpp); what differs is the
// orientation of the four Conv1D weights per layer: troupe stores linear weights (out, in) as
// torch.nn.Linear does, HF's Conv1D stores them (in, out).
//
// LlamaForCausalLM, MixtralForCausalLM and BloomForCausalLM (HfArch): every HF tensor is a set of rows of one troupe
// parameter (a 1-D tensor's rows are its elements), so an export and an import are the same row map
// read in the two directions, and a round trip is bitwise:
//   LLaMA  model.embed_tokens.weight = transformer.wte.weight;  per layer N (model.layers.N.):
//          input_layernorm = ln_1;  self_attn.q_proj / k_proj / v_proj = the [q | k | v] row blocks of
//          attn.c_attn (weight and bias);  self_attn.o_proj = attn.c_proj;  post_attention_layernorm =
//          ln_2;  mlp.gate_proj / up_proj = the [gate | up] halves of mlp.c_fc;  mlp.down_proj =
//          mlp.c_proj;  model.norm = transformer.ln_f;  lm_head.weight = lm_head.weight (untied).
//          HF's Llama rotates rotate-half pairs (i, i + hd/2). A troupe model with interleaved pairs
//          (2i, 2i+1) exports its q and k rows permuted within each head (HF row i <- troupe row 2i,
//          HF row hd/2 + i <- troupe row 2i + 1): q.k is unchanged by a common permutation of the
//          dimensions, and the permuted rows rotate in HF's pairs exactly as troupe's did in its own.
//   Mixtral  LLaMA's names for the embeddings, attention, norms and head; in place of the MLP, per
//          layer N (model.layers.N.block_sparse_moe.): gate = mlp.router (E, C);  per expert e
//          (experts.e.): w1 = the gate half of mlp.experts.e.c_fc (rows [0, F)), w3 = its up half
//          (rows [F, 2F)), w2 = mlp.experts.e.c_proj (C, F). Experts by global index, every layer.
//   BLOOM  transformer.word_embeddings = wte;  word_embeddings_layernorm = ln_embd;  per layer
//          (transformer.h.N.): input_layernorm = ln_1;  self_attention.query_key_value = attn.c_attn
//          with BLOOM's per-head [q k v] rows: HF row (h*3 + j)*hs + d <- troupe row j*C + h*hs + d;
//          self_attention.dense = attn.c_proj;  post_attention_layernorm = ln_2;  mlp.dense_h_to_4h =
//          mlp.c_fc;  mlp.dense_4h_to_h = mlp.c_proj;  transformer.ln_f = ln_f.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"

namespace troupe {

enum class HfRows : uint8_t {
  copy,       // the whole troupe tensor (or its rows [row0, row0 + hf rows))
  transpose,  // GPT-2's Conv1D weights: (in, out) of troupe's (out, in)
  rotary,     // rows [row0, ...) of heads of head_dim rows, each head's rows interleaved -> rotate-half
  bloom_qkv,  // BLOOM's fused QKV: per head [q k v] of troupe's [q | k | v]
};

struct HfTensor {
  std::string name;    // the HF key
  Shape troupe_shape;  // the troupe parameter's shape, (out, in) for linear weights
  Shape hf_shape;      // the HF tensor's shape; GPT-2 Conv1D weights (in, out)
  // The troupe parameter it comes from (empty: `name`, as for GPT-2) and which of its rows.
  std::string troupe_name;
  HfRows rows = HfRows::copy;
  int64_t row0 = 0;       // the first troupe row (copy, rotary)
  int64_t head_dim = 0;   // rotary, bloom_qkv: rows per head
  int64_t heads = 0;      // bloom_qkv: heads
};

// The state-dict keys of GPT2LMHeadModel in its order, without lm_head.weight (tied to wte).
std::vector<HfTensor> gpt2_hf_tensors(int64_t layers, int64_t vocab, int64_t positions, int64_t hidden);

// .attn.c_attn.weight, .attn.c_proj.weight, .mlp.c_fc.weight, .mlp.c_proj.weight.
bool is_conv1d_weight(const std::string& name);

// (rows, cols) row-major -> (cols, rows), in cache-sized tiles.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst);

enum class HfFamily : uint8_t { gpt2, llama, bloom, mixtral };
// "GPT2LMHeadModel", "LlamaForCausalLM", "BloomForCausalLM", "MixtralForCausalLM"
const char* hf_architecture(HfFamily f);

// The sizes of a LLaMA, Mixtral or BLOOM in Hugging Face's terms (and GPT-2's, which uses the first
// six). Mixtral is LLaMA's attention and norms with a sparse MoE block in every layer.
struct HfArch {
  HfFamily family = HfFamily::gpt2;
  int64_t layers = 0, hidden = 0, heads = 0, vocab = 0, positions = 0;
  int64_t groups = 0;    // key/value heads (LLaMA's num_key_value_heads); = heads otherwise
  int64_t head_dim = 0;  // hidden / heads unless LLaMA's head_dim says otherwise
  int64_t ffn = 0;       // intermediate_size (LLaMA; Mixtral: each expert's), 4 hidden (BLOOM, GPT-2)
  double eps = 1e-5;     // rms_norm_eps / layer_norm_epsilon
  double rope_theta = 10000;
  bool bias = true;                // LLaMA's attention_bias and mlp_bias (troupe has one switch for both)
  bool tied = true;                // tie_word_embeddings: no lm_head.weight of its own
  bool rotary_interleaved = false; // LLaMA, Mixtral: troupe's model pairs (2i, 2i+1) (export permutes q and k)
  // Mixtral: num_local_experts, num_experts_per_tok, router_aux_loss_coef (troupe's aux_loss_coeff),
  // and troupe's training-only router settings that MixtralConfig cannot hold (its "troupe" block
  // keeps them, so an import of troupe's own export restores them).
  int64_t experts = 0, topk = 0;
  double aux_loss_coef = 0;
  std::string load_balancing = "aux_loss";  // MoeLoadBalancing's spelling
  double z_loss_coeff = 0, input_jitter_eps = 0;
};

// The HF tensors of a LLaMA, Mixtral or BLOOM in save_pretrained's order (lm_head.weight last, when
// untied), each with the troupe parameter and rows it holds (troupe names: model/params.hpp).
std::vector<HfTensor> hf_family_tensors(const HfArch& arch);

// The troupe row of HF row `hf_row` of `t` (rows: dimension 0; 1-D tensors: elements).
int64_t hf_troupe_row(const HfTensor& t, int64_t hf_row);
// Copies between a troupe parameter (t.troupe_shape, f32) and the HF tensor (t.hf_shape, f32) by the
// row map. to_hf fills hf; from_hf fills the rows of troupe that t covers.
void rows_to_hf(const HfTensor& t, const float* troupe, float* hf);
void rows_from_hf(const HfTensor& t, const float* hf, float* troupe);

}  // namespace troupe
