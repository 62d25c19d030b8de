// Hugging Face exports of a checkpoint of any version and layout (`troupe ckpt export`).
#pragma once
#include <string>

#include "storage/checkpoint.hpp"
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

// `--format hf-h5`: one HDF5 file whose root datasets are exactly GPT2LMHeadModel's state-dict
// keys and shapes (lm_head.weight a copy of wte), with the HF config as root attributes (n_layer,
// n_embd, n_head, n_positions, vocab_size, layer_norm_epsilon), written to output_file + ".tmp" and
// renamed.
Status export_hf(const Checkpoint& checkpoint, const std::string& output_file);

}  // namespace troupe
