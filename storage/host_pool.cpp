#include "storage/host_pool.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "troupe/check.hpp"
#include "kernels/device_info.hpp"

namespace troupe {

namespace {
constexpr int64_t kPage = 4096;
}

std::shared_ptr<void> HostPool::allocate_bytes(int64_t bytes) {
  TROUPE_CHECK(bytes >= 0, "host pool: negative size");
  const int64_t rounded = std::max<int64_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
  void* p = std::aligned_alloc(kPage, static_cast<size_t>(rounded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, static_cast<size_t>(rounded));
  const bool pinned = pin_host_memory(p, static_cast<size_t>(rounded));
  if (pinned) pinned_->store(true);
  const int64_t now = in_use_->fetch_add(rounded) + rounded;
  for (int64_t peak = peak_->load(); now > peak && !peak_->compare_exchange_weak(peak, now);) {
  }
  return std::shared_ptr<void>(p, [in_use = in_use_, rounded, pinned](void* q) {
    if (pinned) unpin_host_memory(q);
    std::free(q);
    in_use->fetch_sub(rounded);
  });
}

Tensor HostPool::allocate(const Shape& shape, DType dtype) {
  const int64_t bytes = shape.numel() * static_cast<int64_t>(dtype_size(dtype));
  std::shared_ptr<void> block = allocate_bytes(bytes);
  void* data = block.get();
  return Tensor::wrap(data, shape, dtype, std::move(block));
}

}  // namespace troupe
