// Checkpoints, first version, read only: one HDF5 file per checkpoint holding every parameter under
// its global name and global shape, the AdamW state, the iteration, consumed samples, RNG state and
// the full config. Saves write version 3 (storage/sharded_checkpoint.hpp); a version-1 checkpoint
// still loads, converts and exports through the facade of storage/checkpoint.hpp, which is the only
// caller of this file. Layout on disk (Megatron's directory convention):
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
//   (the shard reader of storage/shard_file.hpp reads these files too).
#pragma once
#include <cstdint>
#include <string>

#include "storage/checkpoint.hpp"
#include "troupe/status.hpp"

namespace troupe {

inline constexpr int kV1FormatVersion = 1;
inline constexpr const char* kV1FormatName = "troupe-checkpoint";

// "DIR/iter_0000010/model_optim_rng.h5"
std::string checkpoint_file(const std::string& dir, int64_t iteration);

// The metadata of the version-1 file `file`, which lies in the directory of `iteration`: format and
// version checked, every root attribute present with its type (the bounded reader of
// storage/h5_reader.hpp parses it, never libhdf5). Errors are bad input naming the file.
Result<CheckpointMeta> read_v1_meta(const std::string& file, int64_t iteration);

}  // namespace troupe
