// Hugging Face export of a checkpoint of any version (`troupe ckpt export --format hf`).
#pragma once
#include <string>

#include "storage/checkpoint.hpp"
#include "troupe/status.hpp"

namespace troupe {

// Writes one HDF5 file whose root datasets are exactly Hugging Face GPT2LMHeadModel's state-dict
// keys and shapes (Conv1D weights transposed to (in, out), lm_head.weight tied to wte, wte over the
// real vocabulary only), with the HF config as root attributes (n_layer, n_embd, n_head,
// n_positions, vocab_size, layer_norm_epsilon). The checkpoint must hold exactly a GPT-2 model's
// tensors (an optional untied lm_head.weight is used when present); anything else is an error
// naming the tensor. The output is written to output_file + ".tmp" and renamed (same durability
// recipe as save).
Status export_hf(const Checkpoint& checkpoint, const std::string& output_file);

}  // namespace troupe
