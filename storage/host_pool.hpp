// The offload actor's host memory (docs/ARCHITECTURE.md: one pool per process): page-aligned, zeroed
// blocks handed out as tensors, pinned (page-locked for device copies) where a CUDA device is
// present, and counted, so a job can report what its offloaded state occupies. Thread-safe: every
// optimizer partition of the process allocates from the same pool.
#pragma once
#include <atomic>
#include <cstdint>

#include "kernels/tensor.hpp"

namespace troupe {

class HostPool {
 public:
  // A zeroed tensor in its own page-aligned block; the block is unpinned and freed when the last
  // tensor viewing it goes (it may outlive the pool).
  Tensor allocate(const Shape& shape, DType dtype);
  // Page-aligned raw memory of `bytes` (rounded up to pages), freed by the deleter of the returned
  // pointer; counted like allocate's blocks.
  std::shared_ptr<void> allocate_bytes(int64_t bytes);

  int64_t bytes_in_use() const { return in_use_->load(); }
  int64_t peak_bytes() const { return peak_->load(); }
  // Whether the blocks are page-locked (a CUDA device is visible); pageable otherwise.
  bool pinned() const { return pinned_->load(); }

 private:
  // Shared with the blocks' deleters, which may run after the pool is gone.
  std::shared_ptr<std::atomic<int64_t>> in_use_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::atomic<int64_t>> peak_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::atomic<bool>> pinned_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace troupe
