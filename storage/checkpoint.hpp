// The one entry to saved checkpoints, whatever their version: version 3 (and 2) is what saves write,
// one shard file per rank plus metadata.json (storage/sharded_checkpoint.hpp); version 1, one HDF5
// file per iteration, is read only (storage/checkpoint_v1.hpp). Checkpoint::open decides which a
// directory holds, once; every reader -- loading into any layout, `troupe ckpt info`, conversion,
// Hugging Face export (storage/hf_export.hpp) -- goes through the Checkpoint it returns and never
// asks for the version. Directory layout (Megatron's convention):
//
//   DIR/latest_checkpointed_iteration.txt     "10\n"
//   DIR/iter_0000010/...                      the iteration's files (docs/CHECKPOINT.md)
//
// Errors: every failure of a file, its data or its contents is a Status naming the file (and the
// tensor) and the fix. A caller's tensor that contradicts its own NamedTensor (not host f32, fewer
// rows than global_shape, other dimensions differing) is a bug and aborts through TROUPE_CHECK.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"
#include "troupe/status.hpp"

namespace troupe {

class ShardSetReader;
struct ShardReadOptions;

// A tensor with its global identity. `tensor` is host f32; its leading rows cover global_shape and
// any further rows (vocabulary padding) are neither saved nor read (they are zeroed on load).
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
  std::string layout_json;  // versions 2, 3: the parallel layout that wrote it (JSON object), else empty
  // Version 3: the run that wrote it (JSON object: "id" and the identity fields a resume checks,
  // config/run_identity.hpp); empty for checkpoints written before runs had an identity.
  std::string run_json;
  int format_version = 3;  // as read back; saves write 3
};

struct CheckpointContents {
  std::vector<NamedTensor> params;
  std::vector<NamedTensor> exp_avg;     // AdamW first moments, same names as params (may be empty)
  std::vector<NamedTensor> exp_avg_sq;  // AdamW second moments
};

// One dataset of a checkpoint, for inspection (`troupe ckpt info`).
struct CheckpointTensorInfo {
  // Without a leading '/': "model/<name>", "optimizer/exp_avg/<name>".
  std::string path;
  Shape shape;
};

// The iteration in DIR/latest_checkpointed_iteration.txt; an error names the file and what is
// wrong.
Result<int64_t> latest_iteration(const std::string& dir);

class Checkpoint {
 public:
  // Iteration `iteration` of DIR: finds which version it is, checks its format and reads its
  // metadata (no tensor data). A missing iteration is an error listing the iterations DIR holds.
  static Result<Checkpoint> open(const std::string& dir, int64_t iteration);
  // The iteration latest_checkpointed_iteration.txt names.
  static Result<Checkpoint> open_latest(const std::string& dir);

  const std::string& dir() const { return dir_; }
  int64_t iteration() const { return meta_.iteration; }
  const CheckpointMeta& meta() const { return meta_; }
  // Where it lies, for messages and sizes: the iteration directory (versions 2, 3) or its one file.
  const std::string& location() const { return location_; }
  // Bytes of its files on disk.
  uint64_t bytes() const;
  // The files a reader opens; each version-3 shard's header is checked against metadata.json.
  Result<std::vector<std::string>> files() const;
  // A reader over every tensor, of any layout (storage/shard_file.hpp); options.verify_at_open
  // false: each file is checked before its first value is read, not at open (a rank's load).
  Result<std::unique_ptr<ShardSetReader>> reader() const;
  Result<std::unique_ptr<ShardSetReader>> reader(const ShardReadOptions& options) const;
  // Rank `rank`'s of a job of `world` processes in layout `layout_json` (ParallelConfig::to_json):
  // over the shards it reads when metadata.json says which and the layout that wrote it is this one
  // (a multi-host snapshot, whose host's folder holds those: shards_read_by), else over every file,
  // as reader(options).
  Result<std::unique_ptr<ShardSetReader>> reader_for(int rank, int world, const std::string& layout_json,
                                                     ShardReadOptions options) const;
  // Every tensor: model, then optimizer/exp_avg, then optimizer/exp_avg_sq, each sorted by name with
  // numbers in numeric order (transformer.h.2 before transformer.h.10). Reads no tensor data.
  Result<std::vector<CheckpointTensorInfo>> tensors() const;
  // Fills the caller's tensors, by name; the rows beyond global_shape are zeroed. A missing tensor,
  // a shape that differs from global_shape or a checksum mismatch is an error naming the file and
  // the tensor; then the contents of `into` are unspecified. Tensors of the checkpoint that `into`
  // does not name are ignored (a pipeline stage loads its own layers). With load_optimizer false
  // the moments in `into` are left untouched; with it true, a checkpoint saved without optimizer
  // state is an error.
  Status load(const CheckpointContents& into, bool load_optimizer) const;

 private:
  Checkpoint() = default;
  std::string dir_, location_;
  bool sharded_ = false;
  CheckpointMeta meta_;
};

// Shorthands of Checkpoint::open(dir, iteration) followed by meta(), load() and tensors().
Result<CheckpointMeta> read_checkpoint_meta(const std::string& dir, int64_t iteration);
Status load_checkpoint(const std::string& dir, int64_t iteration, const CheckpointContents& into,
                       bool load_optimizer);
Result<std::vector<CheckpointTensorInfo>> list_checkpoint_tensors(const std::string& dir, int64_t iteration);

}  // namespace troupe
