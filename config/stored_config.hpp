// The training config a checkpoint stores, trusted only as far as the checkpoint's own tensors
// vouch for it: a metadata.json is outside bytes, and its config says how large a model to build.
// A crafted config (hidden size 4096 over a 0.07M-parameter checkpoint) must not make `troupe eval`
// or `troupe ckpt convert` allocate gigabytes before any tensor is read, so the config is accepted
// only when every parameter its model has (gpt2_param_specs: names and global shapes) is among the
// checkpoint's tensors with that shape. The shard readers bound those shapes by the files' sizes,
// so what is built afterwards is bounded by the checkpoint's size. Errors are bad input naming the
// first parameter that differs and the file.
#pragma once
#include <cstdint>
#include <string>

#include "troupe/train_config.hpp"
#include "troupe/status.hpp"

namespace troupe {

// iteration < 0: the latest. A checkpoint of a model given in code (tensors GPT's model does not
// have) is refused naming one of them and the way to evaluate it, unless model_in_code: then its
// other tensors are the caller's to check, and GPT's are checked as above only when gpt_blocks (the
// caller's model has GPT blocks).
Result<TrainConfig> stored_config(const std::string& dir, int64_t iteration = -1, bool model_in_code = false,
                                  bool gpt_blocks = true);

}  // namespace troupe
