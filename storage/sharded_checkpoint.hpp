// Checkpoint directories of parallel layouts (format version 3, reading 2 too; docs/CHECKPOINT.md):
//
//   DIR/latest_checkpointed_iteration.txt       as in version 1
//   DIR/iter_0000010/shard_00000.h5 ...         one per rank (storage/shard_file.hpp)
//   DIR/iter_0000010/metadata.json              written last, once every shard is durable
//
// metadata.json: {"format": "troupe-checkpoint", "format_version": 3, "iteration",
// "consumed_samples", "optimizer_step", "config" (the train config as a JSON string), "rng"
// (string), "layout" (object: the parallel sizes that wrote it, informational), "run" (object: the
// run identity), "shards":
// [{"file": "shard_00000.h5", "bytes": N, "crc32": C}, ...]} where bytes and crc32 repeat each
// shard's integrity header (version 2: "shards" is a list of file names).
//
// A save: every rank writes its shard (shard_file_path; temporary name, fsync, rename; the first
// one creates iter_N), then after all ranks are done one process calls commit_sharded_checkpoint:
// metadata.json atomically, the directory fsync'd, then the latest pointer. A crash at any moment
// leaves the previous checkpoint the latest one; an iteration directory without metadata.json is an
// unfinished save that loads refuse with a message saying so. A save that fails (a full disk, an
// I/O error) removes its iteration directory: it can never complete.
//
// Reading: metadata.json is parsed within bounds (parse_checkpoint_metadata: at most
// kMaxMetadataBytes, numbers range-checked, shard names of the form shard_NNNNN.h5 only), and every
// shard's header must match what metadata.json records before the shard is opened
// (sharded_checkpoint_files).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/status.hpp"
#include "storage/checkpoint.hpp"
#include "storage/shard_file.hpp"

namespace troupe {

std::string iteration_dir(const std::string& dir, int64_t iteration);  // "DIR/iter_0000010"
// The folder of a run's in-memory snapshots (--save-memory-interval): BASE/troupe-memory-KEY, BASE
// /dev/shm when empty (the temporary directory where there is no /dev/shm); KEY the launcher's run id
// under troupe launch (its restarted ranks find the folder again), else the process id.
std::string memory_snapshot_dir(const std::string& base, const std::string& key);
// Who owns a snapshot folder: DIR/owner holds "PID START" of the process that removes the folder at
// its end (the training process, or under troupe launch the launcher), START its start time in clock
// ticks since boot (/proc/PID/stat), so that a reused pid is not taken for the owner.
Status write_snapshot_owner(const std::string& dir, int pid);
// An owner file's text, "PID START" and a newline (at most kMaxOwnerBytes; PID 1..2^22, START -1 or
// more): anything else is no owner (the folder is left alone).
inline constexpr size_t kMaxOwnerBytes = 64;
struct SnapshotOwner {
  int pid = 0;
  int64_t start = 0;
};
std::optional<SnapshotOwner> parse_snapshot_owner(std::string_view text);
// Removes the snapshot folders (troupe-memory-*) beside `dir` whose owner is gone: a process killed
// with SIGKILL (or by the OOM killer) cannot remove its folder, and a tmpfs keeps it in memory until
// the machine restarts. Folders without an owner file, or whose owner lives, stay. Returns the
// folders removed.
std::vector<std::string> sweep_abandoned_snapshot_folders(const std::string& dir);
std::string shard_file_path(const std::string& dir, int64_t iteration,
                            int rank);  // ".../shard_00003.h5"
// Checks that DIR (or, when missing, the folder it would be created in) can be written; creates
// nothing: the first shard written creates DIR/iter_N, so a save that fails or never writes leaves
// no empty folder. Errors name the folder and the fix.
Status prepare_iteration_dir(const std::string& dir, int64_t iteration);
// Removes an iteration directory that holds no metadata.json (an unfinished or failed save): its
// shards and temporaries, then the directory if nothing else is in it. Never touches a finished
// checkpoint. Best effort (a read-only folder keeps them).
void discard_unfinished_save(const std::string& iteration_directory);
// True when DIR/iter_N holds a version-2 checkpoint (metadata.json, or shards without it:
// unfinished).
bool is_sharded_checkpoint(const std::string& dir, int64_t iteration);

// "shard_00000.h5" ... for ranks 0 .. ranks-1 (metadata.json's "shards").
std::vector<std::string> shard_file_names(int ranks);

// Records every shard's digest (read from its header: each must exist and be complete) in
// metadata.json, then moves the latest pointer. When it fails before the pointer moved, the
// iteration directory is discarded (discard_unfinished_save).
Status commit_sharded_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                                 const std::string& layout_json,
                                 const std::vector<std::string>& shard_names);

// As above with every shard's digest given (one per name) instead of read from the headers: a
// host's folder of a multi-host in-memory snapshot holds only some of the shards it lists. reads
// (empty, or one list per shard): metadata.json's "reads", the shards each shard's rank reads when
// it resumes the layout that wrote it (storage/shard_coverage.hpp).
Status commit_sharded_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                                 const std::string& layout_json,
                                 const std::vector<std::string>& shard_names,
                                 const std::vector<ShardDigest>& digests,
                                 const std::vector<std::vector<int>>& reads = {});
// metadata.json of DIR/iter_N as text (at most kMaxMetadataBytes, parsed and checked).
Result<std::string> read_checkpoint_metadata_text(const std::string& dir, int64_t iteration);
// Makes DIR/iter_N the latest checkpoint of DIR: writes `metadata_text` (another folder's
// metadata.json of that iteration; it must parse and record N) as its metadata.json unless one is
// there, then moves the latest pointer, and removes the iteration folders after N (snapshots no
// other folder completed). The shards are copied in first.
Status install_checkpoint_metadata(const std::string& dir, int64_t iteration, const std::string& metadata_text);

// What DIR holds of each finished iteration (metadata.json readable): the run id it records, how
// many shards it lists, and which of them are present with the header metadata.json records (their
// data's checksums are checked when they are read). Iterations ascending; unreadable ones skipped.
struct HeldIteration {
  int64_t iteration = 0;
  std::string run_id;
  int shards = 0;
  std::vector<int> present;  // ascending shard indices
};
std::vector<HeldIteration> held_iterations(const std::string& dir);

// metadata.json, parsed and checked (the fuzz target's entry). `where` starts error messages.
inline constexpr size_t kMaxMetadataBytes = size_t{64} << 20;
struct CheckpointMetadata {
  CheckpointMeta meta;                              // format_version 2 or 3
  std::vector<std::string> shards;                  // file names inside the iteration directory
  std::vector<std::optional<ShardDigest>> digests;  // version 3: one per shard
  // A multi-host snapshot's "reads" (version 3, optional in each shard's entry, all or none): for
  // each shard, the shards (ascending) its rank reads when it resumes the same layout. Empty: none.
  std::vector<std::vector<int>> reads;
};
Result<CheckpointMetadata> parse_checkpoint_metadata(std::string_view text,
                                                     const std::string& where);

// The shard files of a finished version-2 or -3 checkpoint, full paths; each must exist and
// (version 3) carry the header metadata.json records.
Result<std::vector<std::string>> sharded_checkpoint_files(const std::string& dir,
                                                          int64_t iteration);
Result<CheckpointMeta> read_sharded_meta(const std::string& dir, int64_t iteration);
// The shard files rank `rank` of a job of `world` processes reads, when DIR/iter_N's metadata.json
// records "reads" for `world` shards (a multi-host snapshot, whose hosts hold the shards their ranks
// read): those only, checked as above (a ShardSetReader over them needs allow_gaps). nullopt when it
// records none, or for another number of shards.
Result<std::optional<std::vector<std::string>>> shards_read_by(const std::string& dir, int64_t iteration, int rank,
                                                               int world);


// The shard of a one-rank job: every tensor whole, one piece covering it, values copied (a
// snapshot: training may change the tensors right after).
ShardContents whole_tensor_shard(const CheckpointContents& contents);
// Fills whole tensors (their global shapes) from a checkpoint of any version and layout; the
// moments too when load_optimizer. Errors name the tensor and the file.
Status read_whole_tensors(ShardSetReader& reader, const CheckpointContents& into,
                          bool load_optimizer);

// Iteration directories newer than `latest` that hold shards but no metadata.json: saves a crash
// interrupted (the latest pointer never moved to them). Loads ignore them; callers report them.
std::vector<int64_t> unfinished_saves(const std::string& dir, int64_t latest);
// Removes DIR's iteration folders older than `iteration` (an in-memory snapshot's predecessors, once
// it is complete).
void drop_older_iterations(const std::string& dir, int64_t iteration);

// The bytes of the regular files under `dir` (0 when it cannot be read).
uint64_t directory_bytes(const std::string& dir);

}  // namespace troupe
