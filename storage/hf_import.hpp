// Hugging Face folders of GPT-2, LLaMA, Mixtral and BLOOM (what GPT2LMHeadModel / LlamaForCausalLM /
// MixtralForCausalLM / BloomForCausalLM.save_pretrained write, and the Hub's released checkpoints)
// read into troupe's parameters: `troupe ckpt import --format hf` and `troupe train --load
// HF_FOLDER` (docs/CHECKPOINT.md, "Hugging Face folders").
//
//   DIR/config.json                    GPT2Config: model_type "gpt2", n_layer, n_embd, n_head,
//                                      n_positions, vocab_size, layer_norm_epsilon, ...;
//                                      LlamaConfig: model_type "llama", hidden_size,
//                                      intermediate_size, num_hidden_layers, num_attention_heads,
//                                      num_key_value_heads, head_dim, rms_norm_eps, rope_theta,
//                                      attention_bias = mlp_bias, tie_word_embeddings, hidden_act
//                                      "silu", no rope_scaling;  MixtralConfig: model_type
//                                      "mixtral", LlamaConfig's sizes (no bias switches),
//                                      num_local_experts, num_experts_per_tok,
//                                      router_aux_loss_coef, router_jitter_noise 0, sliding_window
//                                      null or >= max_position_embeddings;  BloomConfig: model_type "bloom",
//                                      hidden_size, n_layer, n_head, layer_norm_epsilon, vocab_size,
//                                      tie_word_embeddings, no apply_residual_connection_post_layernorm
//   DIR/model.safetensors              the weights (storage/safetensors.hpp), or, sharded:
//   DIR/model.safetensors.index.json   {"metadata": {...}, "weight_map": {NAME: FILE}} and the FILEs
//   DIR/vocab.json, DIR/merges.txt     GPT-2's BPE tokenizer files, when present
//
// Names: GPT2LMHeadModel's state-dict keys (transformer.wte.weight, transformer.h.{i}.attn.c_attn.weight,
// ...) or GPT2Model's (the same without "transformer.", as in the Hub's gpt2 repository);
// lm_head.weight may be present (it must then equal transformer.wte.weight: troupe ties them) or
// absent; the attention-mask buffers .attn.bias and .attn.masked_bias of older files are ignored.
// Conv1D weights, (in, out) in the file, are transposed to troupe's (out, in); F16 and BF16 values
// are widened to float32 exactly. So an export (storage/hf_export.hpp) imports back bitwise.
//
// LLaMA, Mixtral and BLOOM tensors carry their classes' names (storage/hf_names.hpp maps them to
// troupe's parameters: q/k/v_proj joined into c_attn, gate/up_proj (Mixtral's experts' w1/w3) into
// c_fc, BLOOM's per-head QKV rows reordered; q and k rows permuted back when troupe's export
// recorded rotary_interleaved); Llama's rotary_emb.inv_freq buffers are ignored; lm_head.weight is
// required when untied and must equal the embedding when present in a tied model.
//
// Refused, every problem at once, as bad input naming the folder and the fix: a config that is none of
// the three (or a LLaMA/BLOOM option troupe's model does not have), a GPT-2 config with an
// activation other than GELU's tanh form or attention options troupe's model does not have, sizes
// beyond troupe's bounds, tensors missing, unexpected or of the wrong shape for that config, a dtype
// other than F32/F16/BF16, a GPT-2 lm_head that differs from wte, and any malformed or hostile
// file (the safetensors reader's rules; config.json and the index are read within bounds:
// kMaxHfJsonBytes, JSON without exceptions, index file names plain names in the folder).
//
// Thread safety: none needed; the functions hold no state.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "storage/checkpoint.hpp"
#include "storage/hf_names.hpp"
#include "troupe/status.hpp"

namespace troupe {

inline constexpr size_t kMaxHfJsonBytes = size_t{64} << 20;

// The parts of the HF config troupe's model has (the class's defaults where config.json leaves a key
// out), in GPT2Config's names for the sizes every family has; `arch` holds the family and all its
// sizes (storage/hf_names.hpp).
struct HfGpt2Config {
  int64_t n_layer = 12, n_embd = 768, n_head = 12, n_positions = 1024, vocab_size = 50257;
  double layer_norm_epsilon = 1e-5;
  int64_t bos_token_id = 50256, eos_token_id = 50256;
  std::string tokenizer_type;  // "troupe": {"tokenizer_type"} of troupe's own exports, else ""
  HfArch arch;                 // family gpt2 for a GPT2Config
  // "troupe": {"seq_length"} of troupe's own exports, else 0 (the import takes the positions; BLOOM,
  // which has no position limit, kBloomSeqLength).
  int64_t seq_length = 0;
};

// The sequence length a BLOOM folder without troupe's record is imported with (BLOOM's training
// length).
inline constexpr int64_t kBloomSeqLength = 2048;

// config.json's text. `where` starts every message ("DIR/config.json: ").
Result<HfGpt2Config> parse_hf_config(std::string_view text, const std::string& where);
// model.safetensors.index.json's text: the weight map, tensor name -> file name.
Result<std::map<std::string, std::string>> parse_safetensors_index(std::string_view text, const std::string& where);

// True when DIR holds config.json and model.safetensors or model.safetensors.index.json (and is
// therefore read as a Hugging Face folder, not a troupe checkpoint).
bool is_hf_folder(const std::string& dir);

struct HfModel {
  HfGpt2Config config;
  std::vector<NamedTensor> params;  // troupe's names, orientation and global shapes, whole
  std::string vocab_file, merge_file;  // DIR/vocab.json and DIR/merges.txt when both exist, else ""
};
// Reads and checks the whole folder (see the top); the tensors are in memory afterwards.
Result<HfModel> read_hf_folder(const std::string& dir);

// Writes `model` as a troupe checkpoint of one shard (format version 3) at meta.iteration of DIR,
// with meta's config, run and counters, no optimizer state; then moves the latest pointer.
Status write_hf_checkpoint(const HfModel& model, const std::string& dir, const CheckpointMeta& meta);

}  // namespace troupe
