// Checkpoints, first version: one HDF5 file per checkpoint holding every parameter under its global
// name and global shape, the AdamW state, the iteration, consumed samples, RNG state and the full
// config. Layout on disk (Megatron's directory convention):
//
//   DIR/latest_checkpointed_iteration.txt     "10\n"
//   DIR/iter_0000010/model_optim_rng.h5
//
// Inside the file (h5py-readable; the format is specified in docs/CHECKPOINT.md):
//   /model/<global name>               f32 dataset of the global shape
//   /optimizer/exp_avg/<global name>   f32, same shape
//   /optimizer/exp_avg_sq/<global name>
//   root attributes: format ("troupe-checkpoint"), format_version (1), iteration, consumed_samples,
//                    optimizer_step, config (JSON string), rng (JSON string)
//
// Durability: the file is written under a temporary name, fsync'd, renamed, and the directory fsync'd;
// only then does latest_checkpointed_iteration.txt change (same recipe), so a crash during a save
// leaves the previous checkpoint loadable. Not thread-safe per directory: one writer at a time.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/status.hpp"
#include "kernels/tensor.hpp"

namespace troupe {

// A tensor with its global identity. `tensor` is host f32; its leading rows cover global_shape and any
// further rows (vocabulary padding) are neither saved nor read (they are zeroed on load).
struct NamedTensor {
  std::string name;
  Shape global_shape;
  Tensor tensor;
};

struct CheckpointMeta {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  int64_t optimizer_step = 0;
  std::string config_json;  // the full training config
  std::string rng_json;     // RNG state (seed and counters)
  int format_version = 1;
};

struct CheckpointContents {
  std::vector<NamedTensor> params;
  std::vector<NamedTensor> exp_avg;     // AdamW first moments, same names as params (may be empty)
  std::vector<NamedTensor> exp_avg_sq;  // AdamW second moments
};

// "DIR/iter_0000010/model_optim_rng.h5"
std::string checkpoint_file(const std::string& dir, int64_t iteration);

Status save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const CheckpointContents& contents);

// The iteration in DIR/latest_checkpointed_iteration.txt; an error names the file and what is wrong.
Result<int64_t> latest_iteration(const std::string& dir);

Result<CheckpointMeta> read_checkpoint_meta(const std::string& dir, int64_t iteration);

// Fills the caller's tensors from the checkpoint, by name. A missing tensor or a shape that differs from
// global_shape is an error naming the file and the tensor. With load_optimizer false the moments in
// `into` are left untouched.
Status load_checkpoint(const std::string& dir, int64_t iteration, const CheckpointContents& into,
                       bool load_optimizer);

// Writes one HDF5 file whose root datasets are exactly Hugging Face GPT2LMHeadModel's state-dict keys
// and shapes (Conv1D weights transposed to (in, out), lm_head.weight tied to wte, wte over the real
// vocabulary only).
Status export_hf(const std::string& dir, int64_t iteration, const std::string& output_file);

}  // namespace troupe
