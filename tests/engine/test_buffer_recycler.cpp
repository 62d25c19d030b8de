// Snapshot buffers (engine/buffer_recycler.hpp): a buffer comes back when its last view goes and is
// handed out again for the same size (from any thread), never while a view of it lives; other sizes
// get their own; buffers still out when the recycler goes are freed when they come back. A snapshot's
// shard file is kept, and handed out place by place only once its iteration is gone; the next
// snapshot's file is then that file, rewritten where it lies, and is kept again.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <filesystem>
#include <random>
#include <thread>

#include "engine/buffer_recycler.hpp"
#include "storage/shard_file.hpp"
#include "tests/test_util.hpp"

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

namespace {

// A snapshot of pieces of the sizes given (floats), taken from the recycler and filled with values
// drawn from `rng`; `values` gets them.
ShardContents snapshot(BufferRecycler& r, const std::vector<int64_t>& sizes, std::mt19937_64& rng,
                       std::vector<std::vector<float>>& values) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  ShardContents c;
  values.clear();
  for (size_t i = 0; i < sizes.size(); ++i) {
    TensorPiece p;
    p.name = "w" + std::to_string(i);
    p.global_shape = Shape{sizes[i]};
    p.runs = {{0, sizes[i]}};
    p.values = r.take(Shape{sizes[i]}, DType::f32);
    std::vector<float> v(static_cast<size_t>(sizes[i]));
    for (float& x : v) x = u(rng);
    std::memcpy(p.values.raw(), v.data(), v.size() * sizeof(float));
    c.sections[i % 2 ? ShardSection::exp_avg : ShardSection::model].push_back(std::move(p));
    values.push_back(std::move(v));
  }
  return c;
}

// The offload writer's part: file_holding, the write, after_write; the pieces go afterwards.
ShardWriteStats write(BufferRecycler& r, const std::string& path, ShardContents& c) {
  const std::optional<ShardFileReuse> reuse = r.file_holding(c);
  ShardWriteStats stats;
  const Status st = write_shard_file(path, 0, c, &stats, reuse ? &*reuse : nullptr);
  INFO(st.message());
  REQUIRE(st.is_ok());
  r.after_write(path, true, stats, reuse);
  c = ShardContents();
  return stats;
}

void check_file(const std::string& path, const std::vector<std::vector<float>>& values) {
  auto reader = ShardSetReader::open({path});
  INFO(reader.status().message());
  REQUIRE(reader.is_ok());
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t n = static_cast<int64_t>(values[i].size());
    Tensor out = Tensor::empty({n});
    REQUIRE((*reader)->read(i % 2 ? ShardSection::exp_avg : ShardSection::model, "w" + std::to_string(i), Shape{n},
                            {{0, n}}, out));
    CHECK(std::memcmp(out.raw(), values[i].data(), values[i].size() * sizeof(float)) == 0);
  }
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) (void)e, ++n;
  return n;
}

}  // namespace

TEST_CASE("buffer recycler: a snapshot's file, once its iteration is gone, becomes the next snapshot's in place",
          "[buffer_recycler]") {
  test::TempDir dir;
  const std::string iter[] = {dir.str("iter_0000001/shard_00000.h5"), dir.str("iter_0000002/shard_00000.h5"),
                              dir.str("iter_0000003/shard_00000.h5"), dir.str("iter_0000004/shard_00000.h5")};
  // Odd sizes, several alike, one below the 64 KiB line (always on the heap).
  const std::vector<int64_t> sizes = {30001, 30001, 777, 65537, 30001};
  std::mt19937_64 rng(3);
  std::vector<std::vector<float>> values;
  auto r = std::make_unique<BufferRecycler>();

  // Links left by processes killed before they could remove them: this shard's (whatever their
  // process) and a gone process's go when the first file is kept; a live process's of another shard
  // stays.
  std::filesystem::create_directories(dir.str(".recycle"));
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale_mine = dir.str(".recycle/shard_00000.h5." + std::to_string(::getppid()) + ".3");
  const std::string stale_dead = dir.str(".recycle/shard_00007.h5." + std::to_string(dead) + ".0");
  const std::string live_other = dir.str(".recycle/shard_00007.h5." + std::to_string(::getppid()) + ".1");
  for (const std::string& p : {stale_mine, stale_dead, live_other}) std::ofstream(p) << "x";

  // Snapshots 1 and 2: heap buffers, written anew, each file kept (a link beside the iterations).
  ShardContents c = snapshot(*r, sizes, rng, values);
  CHECK_FALSE(write(*r, iter[0], c).in_place);
  check_file(iter[0], values);
  CHECK_FALSE(std::filesystem::exists(stale_mine));
  CHECK_FALSE(std::filesystem::exists(stale_dead));
  CHECK(std::filesystem::exists(live_other));
  std::filesystem::remove(live_other);
  CHECK(entries(dir.str(".recycle")) == 1);
  c = snapshot(*r, sizes, rng, values);
  CHECK(r->from_files() == 0);  // iteration 1 is still a snapshot: its file is not handed out
  CHECK_FALSE(write(*r, iter[1], c).in_place);
  CHECK(entries(dir.str(".recycle")) == 2);

  // Iteration 1 dropped: its file's places serve snapshot 3, which becomes that file.
  std::filesystem::remove_all(dir.str("iter_0000001"));
  c = snapshot(*r, sizes, rng, values);
  CHECK(r->from_files() == 4);  // the four large pieces
  CHECK(r->shelved_bytes() == 0);  // the heap buffers are let go once a file serves
  ShardWriteStats third = write(*r, iter[2], c);
  CHECK(third.in_place);
  CHECK(third.pieces_in_place == 4);
  check_file(iter[2], values);
  const std::vector<std::vector<float>> third_values = values;
  CHECK(std::filesystem::hard_link_count(iter[2]) == 2);  // the snapshot's name and the recycler's

  // While iterations 2 and 3 are snapshots, no file is handed out; once 2 goes, its file serves 4.
  c = snapshot(*r, sizes, rng, values);
  CHECK(r->from_files() == 4);
  c = ShardContents();
  std::filesystem::remove_all(dir.str("iter_0000002"));
  c = snapshot(*r, sizes, rng, values);
  CHECK(r->from_files() == 8);
  CHECK(write(*r, iter[3], c).in_place);
  check_file(iter[3], values);
  check_file(iter[2], third_values);  // iteration 3's file untouched by snapshot 4

  // The recycler's names go with it; the snapshots stay.
  r.reset();
  CHECK(entries(dir.str(".recycle")) == 0);
  CHECK(std::filesystem::hard_link_count(iter[3]) == 1);
}

}  // namespace troupe
