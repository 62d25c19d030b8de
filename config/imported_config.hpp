// The training config a Hugging Face folder stands for (storage/hf_import.hpp): what
// `troupe ckpt import` stores in the checkpoint it writes, and what `troupe train --load HF_FOLDER`
// checks its flags against (check_finetune, config/run_identity.hpp).
#pragma once
#include "storage/hf_import.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// TrainConfig's defaults with the model of config.json (seq_length = n_positions) and the
// tokenizer: the folder's vocab.json and merges.txt (GPT2BPETokenizer), else the type troupe's own
// export recorded, else GPT2BPETokenizer without files (a GPT-2 vocabulary is GPT-2's BPE).
TrainConfig imported_train_config(const HfModel& model);

}  // namespace troupe
