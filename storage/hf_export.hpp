// Hugging Face exports of a checkpoint of any version and layout (`troupe ckpt export`).
#pragma once
#include <string>

#include "storage/checkpoint.hpp"
#include "storage/hf_names.hpp"
#include "troupe/status.hpp"

namespace troupe {

// `--format hf`: the folder GPT2LMHeadModel.from_pretrained(DIR) loads, as save_pretrained writes
// it (docs/CHECKPOINT.md, "Hugging Face folders"):
//   config.json             GPT2Config: the sizes, layer_norm_epsilon, gelu_new, tied embeddings,
//                           eos/bos of the tokenizer, dropout probabilities of the run (HF's 0.1
//                           when the run's config has none), plus "troupe": {tokenizer_type,
//                           source checkpoint, iteration}
//   model.safetensors       float32, GPT2LMHeadModel's keys without lm_head.weight (tied, as
//                           save_pretrained omits it), Conv1D weights transposed to (in, out), wte
//                           over the real vocabulary (troupe never trains its padding rows: their
//                           logits are masked, so the real-vocabulary model is exactly troupe's)
//   generation_config.json  bos/eos token ids
//   vocab.json, merges.txt, tokenizer_config.json
//                           when the checkpoint's run named GPT2BPETokenizer's --vocab-file and
//                           --merge-file (copied; they must still be readable)
// The folder is created when missing; these files in it are replaced (each written to NAME.tmp,
// fsync'd and renamed). Everything is checked and read before the first file is written, so a
// refused export writes nothing. Errors name the checkpoint, the tensor or the file.
Status export_hf_folder(const Checkpoint& checkpoint, const std::string& output_dir);

// `--format hf` of a LLaMA, Mixtral or BLOOM: the folder LlamaForCausalLM / MixtralForCausalLM /
// BloomForCausalLM.from_pretrained loads. `arch` is the run's model in HF terms
// (config/imported_config.hpp: hf_arch_of, from the checkpoint's config; GPT-2 takes the overload
// above). config.json holds the family's keys
// (LLaMA: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim, rms_norm_eps, rope_theta, tie_word_embeddings,
// max_position_embeddings, vocab_size, hidden_act "silu", attention_bias / mlp_bias; Mixtral:
// LLaMA's without the bias switches, intermediate_size the experts' width, num_local_experts,
// num_experts_per_tok, router_aux_loss_coef, sliding_window null; BLOOM: n_layer, n_head,
// hidden_size, layer_norm_epsilon, ...) and a "troupe" block (tokenizer type, seq_length,
// max_position_embeddings, rotary_interleaved; Mixtral: "moe" with the router's training-only
// settings) that the import reads back; model.safetensors the HF
// names (storage/hf_names.hpp: which rows of which troupe parameter each is). The checkpoint's
// tensors must be exactly the ones `arch` implies (every mismatch named at once). Files and refusals
// as above.
Status export_hf_folder(const Checkpoint& checkpoint, const std::string& output_dir, const HfArch& arch);

// `--format hf-h5`: one HDF5 file whose root datasets are exactly GPT2LMHeadModel's state-dict
// keys and shapes (lm_head.weight a copy of wte), with the HF config as root attributes (n_layer,
// n_embd, n_head, n_positions, vocab_size, layer_norm_epsilon), written to output_file + ".tmp" and
// renamed.
Status export_hf(const Checkpoint& checkpoint, const std::string& output_file);

}  // namespace troupe
