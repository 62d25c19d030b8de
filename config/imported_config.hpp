// The training config a Hugging Face folder stands for (storage/hf_import.hpp): what
// `troupe ckpt import` stores in the checkpoint it writes, and what `troupe train --load HF_FOLDER`
// checks its flags against (check_finetune, config/run_identity.hpp). And the other direction: which
// Hugging Face class a run's model is, for `troupe ckpt export --format hf`.
#pragma once
#include "storage/hf_import.hpp"
#include "troupe/model_config.hpp"
#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// TrainConfig's defaults with the model of config.json and the tokenizer: the folder's vocab.json and
// merges.txt (GPT2BPETokenizer), else the type troupe's own export recorded, else (GPT-2 only)
// GPT2BPETokenizer without files (a GPT-2 vocabulary is GPT-2's BPE); a LLaMA or BLOOM without a
// record keeps TrainConfig's default type.
//   GPT-2  seq_length = n_positions.
//   LLaMA  RMSNorm, rope (rotate-half unless troupe's export recorded rotary_interleaved; base
//          rope_theta), SwiGLU of intermediate_size, num_query_groups = num_key_value_heads,
//          kv_channels = head_dim (when not hidden / heads), biases = attention_bias, untied unless
//          tie_word_embeddings; seq_length = the recorded one, else max_position_embeddings.
//   Mixtral  LLaMA's, no biases, and an MoE block in every layer: num_local_experts experts of width
//          intermediate_size (ffn_hidden_size), Megatron-Core's router (moe.router megatron, no
//          pre-softmax: HF's renormalised top k is the softmax over the top k logits), topk =
//          num_experts_per_tok, dropless, the load-balancing aux loss with aux_loss_coeff =
//          router_aux_loss_coef (troupe's export records its own load-balancing type, z-loss and
//          jitter in config.json's "troupe" block; they are restored).
//   BLOOM  LayerNorm, ALiBi, GELU of 4h, biases, LayerNorm on the embeddings, tied unless
//          tie_word_embeddings is false; positions and seq_length the recorded ones, else
//          kBloomSeqLength.
TrainConfig imported_train_config(const HfModel& model);

// --load of a Hugging Face folder by a config that names no tokenizer (TrainConfig's default:
// GPT2BPETokenizer without vocabulary files, no tokenizer_model): the folder's own tokenizer, the
// type troupe's export recorded in config.json when its files are there, else vocab.json and
// merges.txt (GPT2BPETokenizer), tokenizer.json (HuggingFaceTokenizer, the folder), tokenizer.model
// (Llama2Tokenizer). Returns the start-up note saying what it took ("" when nothing changed: not a
// Hugging Face folder, a tokenizer named, or none in the folder); bad input for an unreadable
// config.json.
Result<std::string> take_hf_folder_tokenizer(TrainConfig& config);

// The Hugging Face class of `model` and its sizes: GPT-2 (the defaults of every family field),
// LLaMA (RMSNorm, rope over whole heads, SwiGLU, no embedding LayerNorm, no learned positions) or
// BLOOM (LayerNorm, ALiBi, GELU of 4h, biases, embedding LayerNorm, MHA with hidden / heads per
// head); a model with experts: Mixtral (LLaMA's without biases, Megatron-Core's router without
// pre-softmax, dropless, an MoE block in every layer with one expert count, no PR-MoE, no shared
// expert). Anything else is refused as bad input naming, for each class, what the model lacks.
Result<HfArch> hf_arch_of(const GptConfig& model);

}  // namespace troupe
