// engine/buffer_recycler.hpp.
#include "engine/buffer_recycler.hpp"

#include <cstdlib>
#include <new>

namespace troupe {

struct BufferRecycler::Shelf {
  std::mutex mutex;
  std::multimap<int64_t, void*> free;  // bytes -> block
  int64_t bytes = 0, reused = 0;
  bool open = true;
};

BufferRecycler::BufferRecycler() : shelf_(std::make_shared<Shelf>()) {}

BufferRecycler::~BufferRecycler() {
  std::lock_guard<std::mutex> lock(shelf_->mutex);
  shelf_->open = false;
  for (auto& [bytes, block] : shelf_->free) std::free(block);
  shelf_->free.clear();
  shelf_->bytes = 0;
}

Tensor BufferRecycler::take(const Shape& shape, DType dtype) {
  const int64_t bytes = std::max<int64_t>(1, shape.numel() * static_cast<int64_t>(dtype_size(dtype)));
  void* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(shelf_->mutex);
    if (auto it = shelf_->free.find(bytes); it != shelf_->free.end()) {
      block = it->second;
      shelf_->free.erase(it);
      shelf_->bytes -= bytes;
      ++shelf_->reused;
    }
  }
  if (block == nullptr) {
    block = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64));
    if (block == nullptr) throw std::bad_alloc();
  }
  // Back on the shelf when the last view goes (from whichever thread: the offload writer's), or
  // freed when the recycler is gone.
  std::shared_ptr<void> owner(block, [shelf = shelf_, bytes](void* p) {
    std::lock_guard<std::mutex> lock(shelf->mutex);
    if (!shelf->open) {
      std::free(p);
      return;
    }
    shelf->free.emplace(bytes, p);
    shelf->bytes += bytes;
  });
  return Tensor::wrap(block, shape, dtype, std::move(owner));
}

int64_t BufferRecycler::shelved_bytes() const {
  std::lock_guard<std::mutex> lock(shelf_->mutex);
  return shelf_->bytes;
}

int64_t BufferRecycler::reused() const {
  std::lock_guard<std::mutex> lock(shelf_->mutex);
  return shelf_->reused;
}

}  // namespace troupe
