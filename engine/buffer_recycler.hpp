// Host buffers for snapshots that come back when the last tensor viewing one goes, to be handed out
// again. In-memory snapshots (--save-memory-interval) copy the whole model state every few
// iterations; fresh buffers each time meant a page fault and a page cleared per 4 KiB in the
// training path, and unmapping them again after the write. The snapshots of a run repeat the same
// sizes, so a buffer of the size asked for is taken from the shelf when there is one.
//
// Snapshot files. A snapshot's shard, once written into the tmpfs, is kept by the recycler (a hard
// link, SNAPSHOT_DIR/.recycle/<shard file>.<pid>.<n>). Once its iteration is dropped (the link is
// the file's only name), the recycler maps the file and hands out the places its large pieces
// occupy: the next snapshot's copies land in the file's pages, and its writer turns that file into
// the new shard where it lies (storage/shard_file.hpp, ShardFileReuse): the shard's bytes are
// copied once, in the training path, instead of a second time by the writer. Files alternate (the
// newest snapshot's, and the one being filled); at most two are kept. One recycler per rank: a
// shard's pieces must come back to that shard's file. The links go with the recycler; those of a
// process killed before it could remove them are removed by the next recycler of that shard, or of
// any shard once that process no longer runs (the folder itself goes at the end of the run).
//
// Thread safety: take() from the rank's and its optimizer's threads, file_holding and after_write
// from the offload writer's, buffers returned from any.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "kernels/tensor.hpp"
#include "storage/shard_file.hpp"

namespace troupe {

// Whether the kept file named `name` in a .recycle folder ("<file>.<pid>.<n>") is a process's that
// no longer runs (killed before it could remove it): anyone may remove it then.
bool kept_link_orphaned(const std::string& name);

class BufferRecycler {
 public:
  BufferRecycler();
  ~BufferRecycler();  // frees what is on the shelf and lets the kept files go (buffers still out are freed when they come back)
  BufferRecycler(const BufferRecycler&) = delete;
  BufferRecycler& operator=(const BufferRecycler&) = delete;

  // A host tensor, contents unspecified (a returned buffer's old values, a kept file's place of that
  // size, or fresh memory).
  Tensor take(const Shape& shape, DType dtype);
  // Bytes of the buffers on the shelf, how many takes were served from it, and from kept files.
  int64_t shelved_bytes() const;
  int64_t reused() const;
  int64_t from_files() const;

  // The writer, before it writes a snapshot's shard: the kept file the pieces were copied into, if
  // any (take() leaves it alone until after_write).
  std::optional<ShardFileReuse> file_holding(const ShardContents& contents);
  // The writer, after: `path` was written (ok) with `stats`; `reuse` is what file_holding returned.
  // The file at `path` is kept for a later snapshot.
  void after_write(const std::string& path, bool ok, const ShardWriteStats& stats,
                   const std::optional<ShardFileReuse>& reuse);

 private:
  struct Shelf;
  std::shared_ptr<Shelf> shelf_;
};

}  // namespace troupe
