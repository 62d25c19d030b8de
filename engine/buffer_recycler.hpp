// Host buffers for snapshots that come back when the last tensor viewing one goes, to be handed out
// again. In-memory snapshots (--save-memory-interval) copy the whole model state every few
// iterations; fresh buffers each time meant a page fault and a page cleared per 4 KiB in the
// training path, and unmapping them again after the write. The snapshots of a run repeat the same
// sizes, so a buffer of the size asked for is taken from the shelf when there is one.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "kernels/tensor.hpp"

namespace troupe {

class BufferRecycler {
 public:
  BufferRecycler();
  ~BufferRecycler();  // frees what is on the shelf; buffers still out are freed when they come back
  BufferRecycler(const BufferRecycler&) = delete;
  BufferRecycler& operator=(const BufferRecycler&) = delete;

  // A host tensor, contents unspecified (a returned buffer's old values, or fresh memory).
  Tensor take(const Shape& shape, DType dtype);
  // Bytes of the buffers on the shelf, and how many takes were served from it.
  int64_t shelved_bytes() const;
  int64_t reused() const;

 private:
  struct Shelf;
  std::shared_ptr<Shelf> shelf_;
};

}  // namespace troupe
