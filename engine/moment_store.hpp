// Where an optimizer partition keeps its Adam moments (--offload-optimizer), and how its step, its
// checkpoint save and its load reach them. The moments of segment i (exp_avg, exp_avg_sq: as many
// elements as segments[i].param) are visited in pieces: visit() makes each piece resident, calls
// the function on it, and keeps what the function wrote when the access writes.
//   none  tensors of the partition actor, one piece per segment.
//   cpu   (ZeRO-Offload) blocks of the process's host memory pool (the offload actor's, pinned
//   where
//         CUDA exists), one piece per segment; the step runs on the partition actor's own threads.
//   nvme  (ZeRO-Infinity) one swap file per partition (storage/swap_file.hpp) under --offload-path,
//         in pieces of at most kPieceElements per moment. Pieces are read kReadAhead ahead of the
//         one being computed and written back behind it by the file's I/O thread; resident are
//         kBuffers piece buffers from the host pool, whatever the partition's size.
// AdamW is elementwise, so a step over pieces gives bitwise the same numbers as over whole
// segments. Not thread-safe: the partition actor's thread uses it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/zero_store.hpp"
#include "engine/buffer_recycler.hpp"
#include "storage/host_pool.hpp"

namespace troupe {

struct OptimizerOffload {
  std::string device = "none";     // none | cpu | nvme
  std::string path;                // nvme: directory of the swap files
  std::shared_ptr<HostPool> pool;  // cpu, nvme: the process's pool (the offload actor's)
  int rank = 0;                    // names the swap file
  int64_t piece_elements = 0;      // nvme: elements per piece (0: MomentStore::kPieceElements)
  // Where the moments' snapshot copies come from (in-memory snapshots: buffers reused from one
  // snapshot to the next); null: fresh memory each time.
  std::shared_ptr<BufferRecycler> snapshot_buffers;
};

struct MomentPiece {
  size_t segment = 0;
  int64_t begin = 0, end = 0;  // elements of the segment
  Tensor exp_avg, exp_avg_sq;  // 1-D, end - begin elements, resident during the call
};

enum class MomentAccess { read, write, read_write };

class MomentStore {
 public:
  static constexpr int64_t kPieceElements = int64_t{1} << 19;  // 2 MiB per moment in fp32
  static constexpr int kBuffers = 4;
  static constexpr int kReadAhead = 2;

  // element_counts[i]: elements of segment i. device cuda (offload none only): in GPU memory (the
  // thread's DeviceScope).
  static Result<std::unique_ptr<MomentStore>> create(const OptimizerOffload& offload,
                                                     const std::vector<int64_t>& element_counts,
                                                     DType dtype, Device device = Device::cpu);
  virtual ~MomentStore() = default;

  // Every piece in segment order. read: fn only reads; write: fn fills the pieces (nothing is read
  // first); read_write: the step.
  virtual Status visit(MomentAccess access, const std::function<void(const MomentPiece&)>& fn) = 0;
  // Bytes of moments held in memory (nvme: the piece buffers) and in files.
  virtual int64_t resident_bytes() const = 0;
  virtual int64_t file_bytes() const { return 0; }
  virtual std::string describe() const = 0;
};

}  // namespace troupe
