// The caching device allocator's rules (kernels/caching_allocator.hpp) on host memory standing in
// for a device: a fake DeviceMemory that hands out aligned host blocks up to a capacity and whose
// events complete when the test says so. Everything the CUDA backend adds is cudaMalloc / cudaFree
// and cudaEvent calls under the same logic.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/caching_allocator.hpp"
#include "kernels/device_info.hpp"
#include "kernels/device_memory.hpp"
#include "tests/test_util.hpp"

using namespace troupe;

namespace {

struct FakeDevice : DeviceMemory {
  struct State {
    size_t capacity = 0, in_use = 0;
    std::map<char*, size_t> live;  // device allocations
    uint64_t next_event = 1;
    std::set<uint64_t> events, done;
    int64_t allocate_calls = 0;
  };
  State* s;
  explicit FakeDevice(State* state) : s(state) {}
  void* allocate(size_t bytes) override {
    ++s->allocate_calls;
    if (s->in_use + bytes > s->capacity) return nullptr;
    void* p = std::aligned_alloc(CachingAllocator::kAlignment, bytes);
    REQUIRE(p != nullptr);
    s->in_use += bytes;
    s->live[static_cast<char*>(p)] = bytes;
    return p;
  }
  void release(void* p) override {
    auto it = s->live.find(static_cast<char*>(p));
    REQUIRE(it != s->live.end());  // only what allocate() gave, once
    s->in_use -= it->second;
    s->live.erase(it);
    std::free(p);
  }
  uint64_t record_event(uint64_t) override {
    const uint64_t e = s->next_event++;
    s->events.insert(e);
    return e;
  }
  bool event_done(uint64_t e) override {
    REQUIRE(s->events.count(e) == 1);
    return s->done.count(e) == 1;
  }
  void destroy_event(uint64_t e) override { REQUIRE(s->events.erase(e) == 1); }
  size_t capacity() const override { return s->capacity; }
};

constexpr size_t MiB = size_t{1} << 20;

struct Fixture {
  FakeDevice::State state;
  std::unique_ptr<CachingAllocator> alloc;
  explicit Fixture(size_t capacity = 1024 * MiB) {
    state.capacity = capacity;
    alloc = std::make_unique<CachingAllocator>(std::make_unique<FakeDevice>(&state));
  }
  char* get(size_t bytes, uint64_t stream = 0) {
    auto r = alloc->allocate(bytes, stream);
    REQUIRE(r.is_ok());
    return static_cast<char*>(r.value());
  }
  // The device allocation holding [p, p + n).
  bool inside_a_segment(const char* p, size_t n) const {
    auto it = state.live.upper_bound(const_cast<char*>(p));
    if (it == state.live.begin()) return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second;
  }
};

}  // namespace

TEST_CASE("caching allocator: random allocations never overlap, stay aligned and are accounted", "[allocator]") {
  Fixture f;
  std::mt19937_64 rng(20261203);
  const std::vector<size_t> sizes = {0, 1, 511, 512, 513, 4097, 65537, 300001, MiB - 1, MiB, MiB + 1,
                                     3 * MiB + 7, 9 * MiB + 513, 10 * MiB, 10 * MiB + 1, 23 * MiB + 11};
  struct Live {
    char* p;
    size_t bytes;
    uint8_t tag;
  };
  std::vector<Live> live;
  auto check_invariants = [&] {
    int64_t allocated = 0;
    std::vector<std::pair<char*, size_t>> spans;
    for (const Live& l : live) {
      const size_t r = CachingAllocator::round_size(l.bytes);
      allocated += static_cast<int64_t>(r);
      spans.push_back({l.p, r});
      REQUIRE(reinterpret_cast<uintptr_t>(l.p) % CachingAllocator::kAlignment == 0);
      REQUIRE(f.inside_a_segment(l.p, r));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) REQUIRE(spans[i - 1].first + spans[i - 1].second <= spans[i].first);
    const CachingAllocatorStats st = f.alloc->stats();
    // A block keeps slack it was not worth splitting off, so allocated may exceed the rounded sizes.
    REQUIRE(st.allocated_bytes >= allocated);
    REQUIRE(st.reserved_bytes == static_cast<int64_t>(f.state.in_use));
    REQUIRE(st.segments == static_cast<int64_t>(f.state.live.size()));
    REQUIRE(st.allocated_bytes <= st.reserved_bytes);
  };
  for (int op = 0; op < 3000; ++op) {
    const bool do_alloc = live.empty() || (live.size() < 60 && rng() % 100 < 55);
    if (do_alloc) {
      const size_t bytes = sizes[rng() % sizes.size()];
      const uint64_t stream = rng() % 3;
      char* p = f.get(bytes, stream);
      const auto tag = static_cast<uint8_t>(rng());
      std::memset(p, tag, bytes);
      live.push_back({p, bytes, tag});
    } else {
      const size_t i = rng() % live.size();
      // Nobody wrote into this block while it was handed out (an overlap would have).
      for (size_t k = 0; k < live[i].bytes; k += 997) REQUIRE(static_cast<uint8_t>(live[i].p[k]) == live[i].tag);
      if (live[i].bytes > 0) REQUIRE(static_cast<uint8_t>(live[i].p[live[i].bytes - 1]) == live[i].tag);
      f.alloc->free(live[i].p);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (op % 37 == 0) check_invariants();
    if (op % 500 == 499) f.alloc->empty_cache();
  }
  check_invariants();
  const CachingAllocatorStats mid = f.alloc->stats();
  CHECK(mid.cache_hits > 1000);  // most requests were served without the device
  CHECK(mid.device_allocations < 300);
  for (const Live& l : live) f.alloc->free(l.p);
  CHECK(f.alloc->stats().allocated_bytes == 0);
  f.alloc->empty_cache();  // every segment is wholly free again: merged, and given back
  CHECK(f.alloc->stats().reserved_bytes == 0);
  CHECK(f.state.live.empty());
}

TEST_CASE("caching allocator: a freed block is reused on its stream, not on another", "[allocator]") {
  Fixture f;
  char* a = f.get(1000, 1);
  f.alloc->free(a);
  CHECK(f.get(1000, 1) == a);
  CHECK(f.alloc->stats().device_allocations == 1);
  CHECK(f.alloc->stats().cache_hits == 1);
  f.alloc->free(a);
  char* b = f.get(1000, 2);  // stream 2 gets a segment of its own
  CHECK(b != a);
  CHECK(f.alloc->stats().device_allocations == 2);
  CHECK(CachingAllocator::round_size(0) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
}

TEST_CASE("caching allocator: blocks split, merge back, and whole segments go back to the device", "[allocator]") {
  Fixture f;
  char* a = f.get(256 * 1024);
  char* b = f.get(256 * 1024);
  char* c = f.get(256 * 1024);
  CHECK(b == a + 256 * 1024);  // one 2 MiB small segment, split in address order
  CHECK(c == b + 256 * 1024);
  CHECK(f.alloc->stats().device_allocations == 1);
  CHECK(f.alloc->stats().reserved_bytes == static_cast<int64_t>(CachingAllocator::kSmallSegment));
  f.alloc->free(b);
  f.alloc->free(a);  // a and b merge into one free 512 KiB block
  CHECK(f.get(512 * 1024) == a);
  f.alloc->empty_cache();  // the segment is still in use: nothing goes back
  CHECK(f.state.live.size() == 1);
  f.alloc->free(a);
  f.alloc->free(c);
  f.alloc->empty_cache();
  CHECK(f.state.live.empty());
  CHECK(f.alloc->stats().device_frees == 1);
}

TEST_CASE("caching allocator: segment sizes by request size", "[allocator]") {
  CHECK(CachingAllocator::segment_size(512) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB + 512) == 20 * MiB);
  CHECK(CachingAllocator::segment_size(10 * MiB) == 20 * MiB);
  CHECK(CachingAllocator::segment_size(10 * MiB + 512) == 12 * MiB);
  Fixture f;
  char* a = f.get(8 * MiB);
  char* b = f.get(8 * MiB);  // both in one 20 MiB segment
  CHECK(b == a + 8 * MiB);
  CHECK(f.alloc->stats().device_allocations == 1);
  char* c = f.get(8 * MiB);  // 4 MiB left there: a new segment
  CHECK(f.alloc->stats().device_allocations == 2);
  char* small = f.get(4096);  // small requests never come from a large segment's free 4 MiB
  CHECK(f.alloc->stats().device_allocations == 3);
  for (char* p : {a, b, c, small}) f.alloc->free(p);
}

TEST_CASE("caching allocator: a block used on another stream waits for that stream's work", "[allocator]") {
  Fixture f;
  char* a = f.get(4096, 1);
  f.alloc->record_stream(a, 2);
  f.alloc->record_stream(a, 1);  // its own stream: no event needed
  f.alloc->free(a);
  REQUIRE(f.state.events.size() == 1);  // one event, on stream 2
  CHECK(f.alloc->stats().pending_frees == 1);
  char* b = f.get(4096, 1);  // the work on stream 2 may still read a: not reused
  CHECK(b != a);
  f.state.done.insert(*f.state.events.begin());
  f.alloc->free(b);
  char* c = f.get(4096, 1);  // event done: a is back in the cache (the lowest address of its size)
  CHECK(c == a);
  CHECK(f.alloc->stats().pending_frees == 0);
  CHECK(f.state.events.empty());  // the event was destroyed
  f.alloc->free(c);
}

TEST_CASE("caching allocator: out of memory empties the cache, retries, then names the problem", "[allocator]") {
  Fixture f(24 * MiB);
  char* a = f.get(5 * MiB);  // a 20 MiB segment
  f.alloc->free(a);            // cached, not given back
  REQUIRE(f.state.in_use == 20 * MiB);
  char* b = f.get(21 * MiB);  // a 22 MiB segment: fits only once the cache is given back
  CHECK(f.alloc->stats().oom_retries == 1);
  CHECK(f.state.in_use == 22 * MiB);
  auto too_big = f.alloc->allocate(9 * MiB);  // 20 MiB segment: no room even after the retry
  REQUIRE_FALSE(too_big.is_ok());
  const std::string& m = too_big.status().message();
  INFO(m);
  CHECK(m.find("out of device memory") != std::string::npos);
  CHECK(m.find("9.0 MiB") != std::string::npos);
  CHECK(m.find("--micro-batch-size") != std::string::npos);
  CHECK(m.find("device capacity 24.0 MiB") != std::string::npos);
  // The failure changed nothing: what is in use stays usable, small requests still fit (the 21 MiB
  // block keeps its segment's last MiB: not worth a split in the large pool).
  char* s = f.get(1000);
  CHECK(f.state.in_use == 24 * MiB);
  CHECK(f.alloc->stats().allocated_bytes == static_cast<int64_t>(22 * MiB + 1024));
  f.alloc->free(b);
  f.alloc->free(s);
}

TEST_CASE("device memory: without a usable GPU every call is an error naming why", "[allocator]") {
  if (query_devices().cuda_devices > 0) return;  // the [gpu] case below covers a machine with one
  auto t = device_empty(Shape{7, 3}, DType::f32);
  REQUIRE_FALSE(t.is_ok());
  INFO(t.status().message());
  CHECK((t.status().message().find("CUDA") != std::string::npos));
  CHECK_FALSE(device_allocator_stats(0).is_ok());
}

TEST_CASE("device memory: tensors on the GPU round-trip host data and reuse cached blocks", "[gpu][allocator]") {
  if (query_devices().cuda_devices < 1) TROUPE_SKIP("no usable CUDA device");
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3, 3);
  for (int64_t n : {1, 7, 513, 100003, 3000017}) {
    INFO("elements " << n);
    Tensor host = Tensor::empty(Shape{n}, DType::f32);
    for (int64_t i = 0; i < n; ++i) host.data<float>()[i] = u(rng);
    auto dev = device_empty(Shape{n}, DType::f32);
    REQUIRE(dev.is_ok());
    CHECK(dev.value().device() == Device::cuda);
    REQUIRE(copy_tensor(dev.value(), host).is_ok());
    Tensor back = Tensor::zeros(Shape{n}, DType::f32);
    REQUIRE(copy_tensor(back, dev.value()).is_ok());
    CHECK(std::memcmp(back.raw(), host.raw(), host.nbytes()) == 0);
  }
  auto before = device_allocator_stats(0);
  REQUIRE(before.is_ok());
  CHECK(before.value().allocated_bytes == 0);  // every tensor above returned its block
  { auto again = device_empty(Shape{100003}, DType::f32); REQUIRE(again.is_ok()); }
  auto after = device_allocator_stats(0);
  REQUIRE(after.is_ok());
  CHECK(after.value().cache_hits > before.value().cache_hits);
  CHECK(after.value().device_allocations == before.value().device_allocations);
  CHECK_FALSE(device_empty(Shape{4}, DType::f32, 1000).is_ok());
  REQUIRE(device_empty_cache(0).is_ok());
  CHECK(device_allocator_stats(0).value().reserved_bytes == 0);
}

TEST_CASE("device tensors: the thread's placement nests and is per thread", "[allocator]") {
  CHECK(current_placement().device == 0);
  CHECK(current_placement().stream == 0);
  {
    DeviceScope a(DevicePlacement{2, 17});
    CHECK(current_placement().device == 2);
    {
      DeviceScope b(DevicePlacement{1, 5});
      CHECK(current_placement().stream == 5);
      std::thread([] { CHECK(current_placement().stream == 0); }).join();
    }
    CHECK(current_placement().device == 2);
    CHECK(current_placement().stream == 17);
  }
  CHECK(current_placement().stream == 0);
}

TEST_CASE("device tensors: without a usable GPU they are a DeviceError naming why, not an abort", "[allocator]") {
  if (query_devices().cuda_devices > 0) return;  // the [gpu] case below covers a machine with one
  try {
    (void)Tensor::zeros(Shape{5, 3}, DType::f32, Device::cuda);
    FAIL("no error");
  } catch (const DeviceError& e) {
    CHECK((std::string(e.what()).find("CUDA") != std::string::npos));
  }
  // Host tensors are untouched by all this: on(cpu) is the tensor itself.
  Tensor h = Tensor::zeros(Shape{4}, DType::f32);
  CHECK(h.to_host().shares_storage(h));
}

TEST_CASE("device tensors: Tensor's own methods copy, zero and convert across host and GPU", "[gpu][allocator]") {
  if (query_devices().cuda_devices < 1) TROUPE_SKIP("no usable CUDA device");
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3, 3);
  for (int64_t n : {1, 9, 4099, 1000003}) {
    INFO("elements " << n);
    Tensor host = Tensor::empty(Shape{n}, DType::f32);
    for (int64_t i = 0; i < n; ++i) host.data<float>()[i] = u(rng);
    const Tensor dev = host.on(Device::cuda);
    CHECK(dev.device() == Device::cuda);
    const Tensor copy = dev.clone();  // device to device
    CHECK(copy.device() == Device::cuda);
    CHECK_FALSE(copy.shares_storage(dev));
    dev.zero_();
    const Tensor back = copy.to_host();
    CHECK(back.device() == Device::cpu);
    CHECK(std::memcmp(back.raw(), host.raw(), host.nbytes()) == 0);
    const Tensor zero = dev.to_host();
    for (int64_t i = 0; i < n; ++i) REQUIRE(zero.data<float>()[i] == 0.0f);
    // to(dtype) of a device tensor is a host tensor, rounded as the host's own conversion.
    const Tensor narrow = copy.to(DType::bf16);
    CHECK(narrow.device() == Device::cpu);
    CHECK(std::memcmp(narrow.raw(), host.to(DType::bf16).raw(), narrow.nbytes()) == 0);
    // Rows of a device tensor copy into rows of a host one.
    if (n > 2) {
      Tensor part = Tensor::zeros(Shape{n - 2}, DType::f32);
      part.copy_from(copy.rows(1, n - 1));
      CHECK(std::memcmp(part.raw(), host.rows(1, n - 1).raw(), part.nbytes()) == 0);
    }
  }
}
