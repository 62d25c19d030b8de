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
//   every dataset: attribute crc32 (int64), CRC-32 of its little-endian f32 bytes, checked on load
//
// Durability: the file is written under a temporary name, fsync'd, renamed, and the directory
// fsync'd; only then does latest_checkpointed_iteration.txt change (same recipe), so a crash during
// a save leaves the previous checkpoint loadable. Not thread-safe per directory: one writer at a
// time.
//
// Errors: every failure of a file, its data or its contents is a Status naming the file (and the
// tensor) and the fix. A caller's tensor that contradicts its own NamedTensor (not host f32, fewer
// rows than global_shape, other dimensions differing) is a bug and aborts through TROUPE_CHECK.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/status.hpp"
#include "kernels/tensor.hpp"

namespace troupe {

// A tensor with its global identity. `tensor` is host f32; its leading rows cover global_shape and
// any further rows (vocabulary padding) are neither saved nor read (they are zeroed on load).
struct NamedTensor {
  std::string name;
  Shape global_shape;
  Tensor tensor;
};

inline constexpr int kCheckpointFormatVersion = 1;

struct CheckpointMeta {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  int64_t optimizer_step = 0;
  std::string config_json;  // the full training config
  std::string rng_json;     // RNG state (seed and counters)
  std::string layout_json;  // version 2: the parallel layout that wrote it (JSON object), else empty
  // Version 2: the run that wrote it (JSON object: "id" and the identity fields a resume checks,
  // config/run_identity.hpp); empty for checkpoints written before runs had an identity.
  std::string run_json;
  // As read back by read_checkpoint_meta; save always writes kCheckpointFormatVersion.
  int format_version = kCheckpointFormatVersion;
};

struct CheckpointContents {
  std::vector<NamedTensor> params;
  std::vector<NamedTensor> exp_avg;     // AdamW first moments, same names as params (may be empty)
  std::vector<NamedTensor> exp_avg_sq;  // AdamW second moments
};

// "DIR/iter_0000010/model_optim_rng.h5"
std::string checkpoint_file(const std::string& dir, int64_t iteration);

// Writes checkpoint_file(dir, meta.iteration) (replacing an existing one atomically), then points
// latest_checkpointed_iteration.txt at it. Names must be non-empty, without '/', unique per
// section. The optimizer group is written only when exp_avg or exp_avg_sq is non-empty. On failure
// the previous files are untouched (a temporary file may remain; it is overwritten by the next
// save).
Status save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                       const CheckpointContents& contents);

// The iteration in DIR/latest_checkpointed_iteration.txt; an error names the file and what is
// wrong.
Result<int64_t> latest_iteration(const std::string& dir);

Result<CheckpointMeta> read_checkpoint_meta(const std::string& dir, int64_t iteration);

// Fills the caller's tensors from the checkpoint, by name; the rows beyond global_shape are zeroed.
// A missing tensor, a shape that differs from global_shape or a checksum mismatch is an error
// naming the file and the tensor; then the contents of `into` are unspecified. Tensors of the file
// that `into` does not name are ignored (a pipeline stage loads its own layers). With
// load_optimizer false the moments in `into` are left untouched; with it true, a checkpoint saved
// without optimizer state is an error.
Status load_checkpoint(const std::string& dir, int64_t iteration, const CheckpointContents& into,
                       bool load_optimizer);

// One dataset of a checkpoint, for inspection (`troupe ckpt info`).
struct CheckpointTensorInfo {
  // Inside the file, without the leading '/': "model/<name>", "optimizer/exp_avg/<name>".
  std::string path;
  Shape shape;
};

// Every tensor of the checkpoint: model, then optimizer/exp_avg, then optimizer/exp_avg_sq, each
// sorted by name with numbers in numeric order (transformer.h.2 before transformer.h.10). Reads no
// tensor data.
Result<std::vector<CheckpointTensorInfo>> list_checkpoint_tensors(const std::string& dir,
                                                                  int64_t iteration);

// Writes one HDF5 file whose root datasets are exactly Hugging Face GPT2LMHeadModel's state-dict
// keys and shapes (Conv1D weights transposed to (in, out), lm_head.weight tied to wte, wte over the
// real vocabulary only), with the HF config as root attributes (n_layer, n_embd, n_head,
// n_positions, vocab_size, layer_norm_epsilon). The checkpoint must hold exactly a GPT-2 model's
// tensors (an optional untied lm_head.weight is used when present); anything else is an error
// naming the tensor. The output is written to output_file + ".tmp" and renamed (same durability
// recipe as save).
Status export_hf(const std::string& dir, int64_t iteration, const std::string& output_file);

}  // namespace troupe
