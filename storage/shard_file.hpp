// Shard files of layout-free checkpoints (format version 2, docs/CHECKPOINT.md): each rank of a
// parallel job writes the pieces of the global tensors it owns, each piece tagged with where its
// values sit in the global tensor, so any other layout can read exactly the elements it needs from
// whichever files hold them. This is the storage half of resharding; which rank owns what (tensor
// slices, ZeRO partitions, replicas written once) is the caller's business.
//
// A piece is a list of runs of consecutive row-major global indices and the values for them, in
// order. Examples, for a (4, 6) tensor (global index = row * 6 + column):
//   rows 2..3 (a tensor-parallel split of dimension 0)   runs {(12, 12)}
//   columns 3..5 (a split of dimension 1)                runs {(3, 3), (9, 3), (15, 3), (21, 3)}
//   elements 5..8 of that column slice (a ZeRO range)    runs {(11, 1), (15, 3)}
//
// One shard file (HDF5, h5py-readable; format version 3, docs/CHECKPOINT.md):
//   bytes 0..511: the integrity header (an HDF5 user block, which HDF5 and h5py skip): magic,
//                 the file's length and the CRC-32 of bytes 512.. (the HDF5 data), its own CRC-32
//   /<section>/<global name>         f32 values, 1-D, with attribute crc32
//   /<section>/<global name>.runs    int64 (k, 2): (global start, length) per run, with crc32
//   attributes of each values dataset: global_shape (string "[4, 6]")
//   root attributes: format "troupe-checkpoint-shard", format_version 3, rank
// where <section> is model, optimizer/exp_avg or optimizer/exp_avg_sq.
//
// Reading never hands a byte to libhdf5: storage/h5_reader.hpp parses the files within bounds, the
// integrity header is checked (the whole file's CRC-32, once per file and process) before that, and
// every piece's values against their own CRC-32 when read. Version-2 shards (no header) and
// version-1 checkpoint files read too. A corrupted or crafted file is an error naming it, never a
// crash, and no allocation exceeds what the files hold.
//
// Thread safety: none; files are written once and read many times.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/status.hpp"
#include "kernels/tensor.hpp"
#include "storage/h5_reader.hpp"

namespace troupe {

struct GlobalRun {
  int64_t start = 0;   // row-major index into the global tensor
  int64_t length = 0;  // > 0
  bool operator==(const GlobalRun&) const = default;
};

struct TensorPiece {
  std::string name;  // global name, e.g. "transformer.h.0.attn.c_attn.weight"
  Shape global_shape;
  std::vector<GlobalRun> runs;
  Tensor values;  // host f32, numel == sum of run lengths (any shape; read as 1-D)
};

enum class ShardSection : uint8_t { model, exp_avg, exp_avg_sq };
const char* shard_section_path(
    ShardSection s);  // "model", "optimizer/exp_avg", "optimizer/exp_avg_sq"

struct ShardContents {
  std::map<ShardSection, std::vector<TensorPiece>> sections;  // a name at most once per section
};

// Merges consecutive indices into runs: global_index(i) for local element i in [0, n), skipping
// elements whose index is negative (vocabulary padding, never saved).
std::vector<GlobalRun> runs_from_indices(int64_t n,
                                         const std::function<int64_t(int64_t)>& global_index);

// Builds the file's HDF5 structure in memory, then writes PATH.tmp, fsyncs it and renames it to PATH
// (storage/durable.hpp), creating PATH's directory when missing. The values of pieces of 64 KiB or
// more are written straight from the pieces into the places reserved for them in the file (one copy
// of their bytes, their checksum computed once). Pieces must lie inside their global shape and hold
// as many values as their runs cover (TROUPE_CHECK: a caller's bug). On failure nothing is left
// under PATH.tmp, and when PATH's directory is an iteration directory of an unfinished save (no
// metadata.json) it is removed: that save can no longer complete (discard_unfinished_save,
// storage/sharded_checkpoint.hpp). The rvalue form frees the pieces' values once the file is
// written. `stats`, when given, says how the file was made.
//
// `reuse`: a shard file no checkpoint refers to any more, mapped in this process, into whose pages
// the pieces were copied (engine/buffer_recycler.hpp hands out its large pieces' places). When
// every large piece that lies in it lies exactly where this file's layout puts it (the others go to
// places of their size it has free), that file becomes PATH where it lies (the HDF5 structure,
// zeros, the other pieces and the header are written: the pieces in place are not copied again);
// otherwise PATH is written anew and `reuse` is left as it was. The bytes are the same either way.
struct ShardRegion {
  uint64_t offset = 0, bytes = 0;
  bool operator==(const ShardRegion&) const = default;
};
struct ShardFileReuse {
  std::string path;               // its name now (renamed to PATH.tmp, then PATH, when used)
  const uint8_t* base = nullptr;  // where it is mapped
  uint64_t bytes = 0;
  std::vector<ShardRegion> regions;  // its large pieces' places (ShardWriteStats::reserved)
};
struct ShardWriteStats {
  uint64_t file_bytes = 0;
  uint64_t image_bytes = 0;            // what libhdf5 built in memory (the rest: pieces and zeros)
  std::vector<ShardRegion> reserved;   // the large pieces' places in the file, ascending
  bool in_place = false;               // `reuse` became the file
  int64_t pieces_in_place = 0;         // then: the pieces not copied again
};
Status write_shard_file(const std::string& path, int rank, const ShardContents& contents,
                        ShardWriteStats* stats = nullptr, const ShardFileReuse* reuse = nullptr);
Status write_shard_file(const std::string& path, int rank, ShardContents&& contents,
                        ShardWriteStats* stats = nullptr);

// What the integrity header of a version-3 shard records (metadata.json records it too).
struct ShardDigest {
  uint64_t bytes = 0;  // the whole file
  uint32_t crc32 = 0;  // of bytes 512 .. bytes-1
  bool operator==(const ShardDigest&) const = default;
};
// The digest in a shard's header after checking the header itself (not the data it covers);
// nullopt for a file without one (format versions 1 and 2). Errors name the file.
Result<std::optional<ShardDigest>> read_shard_digest(const std::string& path);
// The digest of a whole shard file held in memory (a copy received from another process) after
// checking its header and the CRC-32 of its data against it. Errors name `name`.
Result<ShardDigest> verify_shard_bytes(std::string_view bytes, const std::string& name);

// A file to read, by name (for messages) and bytes.
struct ShardSource {
  std::string name;
  std::shared_ptr<const h5read::ByteSource> bytes;
};
struct ShardReadOptions {
  // Check each headed file's CRC-32. Off only in fuzz targets, which must reach the parser with
  // any bytes (a crafted file can carry a matching checksum).
  bool verify_whole_file = true;
  // When: at open, before its index is parsed (the default: a damaged file is refused whatever
  // the command reads of it), or -- false -- before the first value read from the file. Deferred, a
  // process reads and checks only the files holding what it reads -- a rank of a job of N
  // processes one or a few shards, not all N -- and parses the others' small indexes only (a
  // training job's load, actors/rank_actor.cpp). No value is read from a file before its check.
  bool verify_at_open = true;
  // The files may leave elements of a tensor uncovered (a rank's own few shards of a multi-host
  // snapshot: storage/sharded_checkpoint.hpp's shards_read_by); reading one fails naming it.
  bool allow_gaps = false;
};

// Reads the elements any layout needs from a set of shard files. open() checks each file's
// integrity header and reads its index (names, shapes, runs: small); values are read per piece when
// first needed and checked against their checksum, the file's whole CRC-32 before its first. Overlapping pieces (replicas) are allowed; the
// first file listed wins. Every tensor must be covered whole by the files together (else open names
// the first missing element), so a global shape never claims more elements than the files hold.
class ShardSetReader {
 public:
  static Result<std::unique_ptr<ShardSetReader>> open(const std::vector<std::string>& paths,
                                                      const ShardReadOptions& options = {});
  static Result<std::unique_ptr<ShardSetReader>> open(const std::vector<ShardSource>& files,
                                                      const ShardReadOptions& options = {});
  ~ShardSetReader();

  // The tensors of a section with their global shapes, over all files.
  std::map<std::string, Shape> tensors(ShardSection section) const;
  bool has(ShardSection section, const std::string& name) const;

  // Fills `out` (host f32, numel == sum of run lengths) with the values at `runs` of tensor `name`.
  // Errors name the tensor and the file: a missing tensor, a global shape that differs from
  // `global_shape`, an index no file covers, a checksum mismatch or a damaged file.
  Status read(ShardSection section, const std::string& name, const Shape& global_shape,
              const std::vector<GlobalRun>& runs, const Tensor& out);

 private:
  struct Impl;
  explicit ShardSetReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
