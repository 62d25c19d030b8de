// The caching device allocator's logic, independent of the device: a device's memory is taken from
// the driver in segments and handed out as blocks; a freed block goes back to a cache, not to the
// driver, so a training step's thousands of short-lived activations cost no cudaMalloc / cudaFree
// (both synchronise the device) after the first step. The CUDA backend
// (kernels/cuda/device_allocator.cu) puts cudaMalloc / cudaFree and CUDA events under it; the tests
// put host memory and events they complete by hand (tests/kernels/test_caching_allocator.cpp), so
// everything here is tested without a GPU.
//
// Rules (the design PyTorch's CUDA caching allocator documents; written here from that description):
//   - Sizes round up to 512 bytes; every block starts 512-byte aligned within its segment.
//   - Two pools: small requests (<= 1 MiB) come from 2 MiB segments, large ones from segments of
//     20 MiB (requests up to 10 MiB) or of their own size rounded up to 2 MiB.
//   - Best fit: the smallest free block of the pool, of the same stream, at least as large; a block
//     with room left over is split (small pool: when >= 512 bytes remain; large: when > 1 MiB).
//   - A freed block merges with its free neighbours in the segment.
//   - Streams: a block belongs to the stream it was allocated on and is reused only there, where
//     work is ordered. record_stream(ptr, s) marks a use on another stream; freeing such a block
//     records an event on each of those streams and the block returns to the cache only once all
//     of them completed (checked at the next allocation).
//   - Out of memory: when the driver refuses a segment, cached free segments are given back
//     (empty_cache) and the request retried once; then allocate() returns an error naming the
//     request, the bytes in use and cached, and the device's limit.
// Thread-safe: one mutex per allocator (rank actors on the same device share it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

// What the allocator needs from a device. Streams and events are opaque handles (a cudaStream_t /
// cudaEvent_t cast to an integer; 0 is the default stream).
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual void* allocate(size_t bytes) = 0;  // nullptr when the device has no room
  virtual void release(void* p) = 0;
  virtual uint64_t record_event(uint64_t stream) = 0;  // an event after the stream's queued work
  virtual bool event_done(uint64_t event) = 0;
  virtual void destroy_event(uint64_t event) = 0;
  virtual size_t capacity() const = 0;  // the device's memory, for messages (0: unknown)
};

struct CachingAllocatorStats {
  int64_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  int64_t reserved_bytes = 0;        // in segments taken from the device
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t segments = 0;
  int64_t device_allocations = 0;    // segments ever taken (DeviceMemory::allocate calls that succeeded)
  int64_t device_frees = 0;          // segments given back
  int64_t cache_hits = 0;            // allocations served from the cache
  int64_t oom_retries = 0;           // allocations that emptied the cache and tried again
  int64_t pending_frees = 0;         // blocks waiting for other streams' events
};

class CachingAllocator {
 public:
  static constexpr size_t kAlignment = 512;
  static constexpr size_t kSmallSize = size_t{1} << 20;         // small-pool requests: up to 1 MiB
  static constexpr size_t kSmallSegment = size_t{2} << 20;      // their segments: 2 MiB
  static constexpr size_t kMediumSize = size_t{10} << 20;       // large requests up to this ...
  static constexpr size_t kLargeSegment = size_t{20} << 20;     // ... share 20 MiB segments
  static constexpr size_t kRoundLarge = size_t{2} << 20;        // larger ones round to 2 MiB

  explicit CachingAllocator(std::unique_ptr<DeviceMemory> device);
  ~CachingAllocator();  // gives every segment back (blocks still handed out are a bug of the caller)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (0 gives a valid 512-byte block) for work on `stream`.
  Result<void*> allocate(size_t bytes, uint64_t stream = 0);
  // Returns a block from allocate(); an unknown pointer is a TROUPE_CHECK failure (a double free).
  void free(void* p);
  // The block at p (from allocate) is used by work on `stream` too: its reuse waits for that work.
  void record_stream(void* p, uint64_t stream);
  // Gives every wholly free segment back to the device.
  void empty_cache();
  CachingAllocatorStats stats() const;
  // The rounded size a request of `bytes` takes (tests, the memory plan).
  static size_t round_size(size_t bytes);
  // The size of the segment a request of `rounded` bytes takes when nothing cached fits.
  static size_t segment_size(size_t rounded);

 private:
  struct Block;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BySize>;

  Pool& pool_for(size_t rounded) { return rounded <= kSmallSize ? small_ : large_; }
  Block* take_cached(Pool& pool, size_t rounded, uint64_t stream);
  Block* new_segment(size_t rounded, uint64_t stream);
  void split(Block* b, size_t rounded);
  void release_block(Block* b);  // to the cache, merged
  void process_events();
  void release_free_segments();

  std::unique_ptr<DeviceMemory> device_;
  mutable std::mutex mutex_;
  Pool small_, large_;
  std::unordered_map<void*, Block*> used_;  // handed-out blocks by address
  struct PendingFree {
    Block* block;
    std::vector<uint64_t> events;
  };
  std::vector<PendingFree> pending_;
  std::vector<Block*> segments_;  // the first block of every segment
  CachingAllocatorStats stats_;
};

}  // namespace troupe
