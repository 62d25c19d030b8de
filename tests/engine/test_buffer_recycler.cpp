// Snapshot buffers (engine/buffer_recycler.hpp): a buffer comes back when its last view goes and is
// handed out again for the same size (from any thread), never while a view of it lives; other sizes
// get their own; buffers still out when the recycler goes are freed when they come back.
#include <catch2/catch.hpp>

#include <thread>

#include "engine/buffer_recycler.hpp"

namespace troupe {

TEST_CASE("buffer recycler: same size reused after release, never while viewed", "[buffer_recycler]") {
  BufferRecycler r;
  Tensor a = r.take({1000}, DType::f32);
  const void* first = a.raw();
  Tensor view = a.rows(10, 20);  // a view keeps the buffer out
  a = Tensor();
  Tensor b = r.take({1000}, DType::f32);
  CHECK(b.raw() != first);
  CHECK(r.reused() == 0);
  view = Tensor();
  CHECK(r.shelved_bytes() == 4000);
  Tensor c = r.take({1000}, DType::f32);
  CHECK(c.raw() == first);
  CHECK(r.reused() == 1);
  CHECK(r.shelved_bytes() == 0);
  Tensor d = r.take({999}, DType::f32);  // another size: fresh
  CHECK(d.raw() != first);
  CHECK(d.raw() != b.raw());
  // Released on another thread (the offload writer's): back on the shelf all the same.
  std::thread([moved = std::move(b)]() mutable { moved = Tensor(); }).join();
  CHECK(r.shelved_bytes() == 4000);
  // Written and read like any tensor.
  for (int64_t i = 0; i < 1000; ++i) c.data<float>()[i] = static_cast<float>(i);
  CHECK(c.data<float>()[999] == 999.0f);
}

TEST_CASE("buffer recycler: buffers outlive the recycler", "[buffer_recycler]") {
  Tensor kept;
  {
    BufferRecycler r;
    kept = r.take({64, 3}, DType::bf16);
    Tensor gone = r.take({64, 3}, DType::bf16);
  }
  static_cast<uint16_t*>(kept.raw())[5] = 7;  // still valid memory
  CHECK(static_cast<uint16_t*>(kept.raw())[5] == 7);
  kept = Tensor();  // freed now (ASan and the fuzz build would see a leak or a double free)
}

}  // namespace troupe
