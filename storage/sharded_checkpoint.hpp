// Checkpoint directories of parallel layouts (format version 2; docs/CHECKPOINT.md):
//
//   DIR/latest_checkpointed_iteration.txt       as in version 1
//   DIR/iter_0000010/shard_00000.h5 ...         one per rank that owns something (storage/shard_file.hpp)
//   DIR/iter_0000010/metadata.json              written last, once every shard is durable
//
// metadata.json: {"format": "troupe-checkpoint", "format_version": 2, "iteration", "consumed_samples",
// "optimizer_step", "config" (the train config as a JSON string), "rng" (string), "layout" (object:
// the parallel sizes that wrote it, informational), "shards": ["shard_00000.h5", ...]}.
//
// A save: every rank writes its shard (shard_file_path; temporary name, fsync, rename), then after
// all ranks are done one process calls commit_sharded_checkpoint: metadata.json atomically, the
// directory fsync'd, then the latest pointer. A crash at any moment leaves the previous checkpoint
// the latest one; an iteration directory without metadata.json is an unfinished save that loads
// refuse with a message saying so.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/status.hpp"
#include "storage/checkpoint.hpp"
#include "storage/shard_file.hpp"

namespace troupe {

std::string iteration_dir(const std::string& dir, int64_t iteration);        // "DIR/iter_0000010"
std::string shard_file_path(const std::string& dir, int64_t iteration, int rank);  // ".../shard_00003.h5"
// Creates DIR/iter_N (and DIR); errors name the directory and the fix.
Status prepare_iteration_dir(const std::string& dir, int64_t iteration);
// True when DIR/iter_N holds a version-2 checkpoint (metadata.json, or shards without it: unfinished).
bool is_sharded_checkpoint(const std::string& dir, int64_t iteration);

// "shard_00000.h5" ... for ranks 0 .. ranks-1 (metadata.json's "shards").
std::vector<std::string> shard_file_names(int ranks);

Status commit_sharded_checkpoint(const std::string& dir, const CheckpointMeta& meta, const std::string& layout_json,
                                 const std::vector<std::string>& shard_names);

// The shard files of a finished version-2 checkpoint (each must exist), full paths.
Result<std::vector<std::string>> sharded_checkpoint_files(const std::string& dir, int64_t iteration);
Result<CheckpointMeta> read_sharded_meta(const std::string& dir, int64_t iteration);

// What a reader opens for iteration N of DIR, whichever version wrote it: the shards of version 2,
// the one file of version 1 (ShardSetReader reads both).
Result<std::vector<std::string>> checkpoint_files(const std::string& dir, int64_t iteration);

// The shard of a one-rank job: every tensor whole, one piece covering it, values copied (a
// snapshot: training may change the tensors right after).
ShardContents whole_tensor_shard(const CheckpointContents& contents);
// Fills whole tensors (their global shapes) from a checkpoint of any version and layout; the moments
// too when load_optimizer. Errors name the tensor and the file.
Status read_whole_tensors(ShardSetReader& reader, const CheckpointContents& into, bool load_optimizer);

// Iteration directories newer than `latest` that hold shards but no metadata.json: saves a crash
// interrupted (the latest pointer never moved to them). Loads ignore them; callers report them.
std::vector<int64_t> unfinished_saves(const std::string& dir, int64_t latest);

}  // namespace troupe
