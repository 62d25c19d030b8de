#include "kernels/caching_allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "troupe/check.hpp"

namespace troupe {

// One block of a segment: [ptr, ptr + size). Blocks of a segment form a list in address order
// (prev / next); a block is in its pool exactly when it is free and not waiting for events.
struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;
  uint64_t stream = 0;
  bool small = false;      // in the small pool (its segment is a small one)
  bool allocated = false;  // handed out, or freed and waiting for other streams' events
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<uint64_t> uses;  // other streams that used it (record_stream)
};

bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / kMiB);
  return buf;
}

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemory> device) : device_(std::move(device)) {
  TROUPE_CHECK(device_ != nullptr, "CachingAllocator: no device");
}

CachingAllocator::~CachingAllocator() {
  for (PendingFree& p : pending_)
    for (uint64_t e : p.events) device_->destroy_event(e);
  for (Block* first : segments_) {
    device_->release(first->ptr);
    for (Block* b = first; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes < kAlignment) return kAlignment;
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded <= kMediumSize) return kLargeSegment;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

CachingAllocator::Block* CachingAllocator::take_cached(Pool& pool, size_t rounded, uint64_t stream) {
  Block key;
  key.stream = stream;
  key.size = rounded;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t rounded, uint64_t stream) {
  const size_t bytes = segment_size(rounded);
  void* p = device_->allocate(bytes);
  if (p == nullptr) return nullptr;
  auto* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = bytes;
  b->stream = stream;
  b->small = rounded <= kSmallSize;
  segments_.push_back(b);
  stats_.reserved_bytes += static_cast<int64_t>(bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.segments;
  ++stats_.device_allocations;
  return b;
}

void CachingAllocator::split(Block* b, size_t rounded) {
  const size_t rest = b->size - rounded;
  if (b->small ? rest < kAlignment : rest <= kSmallSize) return;  // the slack stays with the block
  auto* r = new Block;
  r->ptr = b->ptr + rounded;
  r->size = rest;
  r->stream = b->stream;
  r->small = b->small;
  r->prev = b;
  r->next = b->next;
  if (b->next != nullptr) b->next->prev = r;
  b->next = r;
  b->size = rounded;
  (r->small ? small_ : large_).insert(r);
}

Result<void*> CachingAllocator::allocate(size_t bytes, uint64_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  process_events();
  const size_t rounded = round_size(bytes);
  Block* b = take_cached(pool_for(rounded), rounded, stream);
  if (b != nullptr) {
    ++stats_.cache_hits;
  } else {
    b = new_segment(rounded, stream);
    if (b == nullptr) {  // give the cache back to the device and try once more
      ++stats_.oom_retries;
      release_free_segments();
      b = new_segment(rounded, stream);
    }
    if (b == nullptr) {
      const size_t cap = device_->capacity();
      return Status::error("out of device memory: a request of " + mib(static_cast<double>(bytes)) + " (a " +
                           mib(static_cast<double>(segment_size(rounded))) + " segment) did not fit; " +
                           mib(static_cast<double>(stats_.allocated_bytes)) + " in use, " +
                           mib(static_cast<double>(stats_.reserved_bytes - stats_.allocated_bytes)) +
                           " cached in segments partly in use" +
                           (cap > 0 ? ", device capacity " + mib(static_cast<double>(cap)) : std::string()) +
                           " -- lower --micro-batch-size, recompute activations (--recompute-granularity "
                           "full), raise --zero-stage, or add tensor / pipeline parallelism");
    }
  }
  split(b, rounded);
  b->allocated = true;
  used_[b->ptr] = b;
  stats_.allocated_bytes += static_cast<int64_t>(b->size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return static_cast<void*>(b->ptr);
}

void CachingAllocator::free(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = used_.find(p);
  TROUPE_CHECK(it != used_.end(), "CachingAllocator::free: not a block of this allocator (freed twice?)");
  Block* b = it->second;
  used_.erase(it);
  stats_.allocated_bytes -= static_cast<int64_t>(b->size);
  if (b->uses.empty()) {
    release_block(b);
    return;
  }
  PendingFree pf{b, {}};
  for (uint64_t s : b->uses) pf.events.push_back(device_->record_event(s));
  b->uses.clear();
  pending_.push_back(std::move(pf));
  stats_.pending_frees = static_cast<int64_t>(pending_.size());
}

void CachingAllocator::record_stream(void* p, uint64_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = used_.find(p);
  TROUPE_CHECK(it != used_.end(), "CachingAllocator::record_stream: not a block in use");
  Block* b = it->second;
  if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end())
    b->uses.push_back(stream);
}

void CachingAllocator::release_block(Block* b) {
  Pool& pool = b->small ? small_ : large_;
  b->allocated = false;
  if (b->prev != nullptr && !b->prev->allocated) {  // merge into the free block before
    Block* prev = b->prev;
    pool.erase(prev);
    prev->size += b->size;
    prev->next = b->next;
    if (b->next != nullptr) b->next->prev = prev;
    delete b;
    b = prev;
  }
  if (b->next != nullptr && !b->next->allocated) {  // absorb the free block after
    Block* next = b->next;
    pool.erase(next);
    b->size += next->size;
    b->next = next->next;
    if (next->next != nullptr) next->next->prev = b;
    delete next;
  }
  pool.insert(b);
}

void CachingAllocator::process_events() {
  auto done = [&](PendingFree& p) {
    for (uint64_t e : p.events)
      if (!device_->event_done(e)) return false;
    for (uint64_t e : p.events) device_->destroy_event(e);
    release_block(p.block);
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
  stats_.pending_frees = static_cast<int64_t>(pending_.size());
}

void CachingAllocator::release_free_segments() {
  std::vector<Block*> kept;
  for (Block* first : segments_) {
    if (first->allocated || first->next != nullptr) {  // part of it is in use (or it is split)
      kept.push_back(first);
      continue;
    }
    (first->small ? small_ : large_).erase(first);
    device_->release(first->ptr);
    stats_.reserved_bytes -= static_cast<int64_t>(first->size);
    --stats_.segments;
    ++stats_.device_frees;
    delete first;
  }
  segments_ = std::move(kept);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  process_events();
  release_free_segments();
}

CachingAllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace troupe
