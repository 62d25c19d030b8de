// Shard files of layout-free checkpoints: pieces written by one layout (row blocks, ZeRO ranges,
// replicas) read back by another (column blocks, other ranges) give the global tensors bitwise; a
// missing shard, a flipped bit, a truncated file or a wrong shape is a clear error.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <catch2/catch.hpp>
#include <hdf5.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include <fmt/format.h>

#include "storage/checkpoint_v1.hpp"
#include "storage/shard_file.hpp"
#include "storage/sharded_checkpoint.hpp"
#include "storage/write_pacing.hpp"
#include "tests/storage/v1_writer.hpp"
#include "tests/test_util.hpp"

using namespace troupe;

namespace {

constexpr int64_t R = 7, C = 10, NB = 13;  // A is (R, C), b is (NB)

struct Globals {
  std::vector<float> a, b, a_m;  // a_m: an optimizer moment of A
};

Globals make_globals() {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Globals g;
  for (int64_t i = 0; i < R * C; ++i) g.a.push_back(u(rng));
  for (int64_t i = 0; i < NB; ++i) g.b.push_back(u(rng));
  for (int64_t i = 0; i < R * C; ++i) g.a_m.push_back(u(rng));
  return g;
}

// The piece of `global` at `runs`.
TensorPiece piece(const std::string& name, const Shape& shape, const std::vector<float>& global,
                  std::vector<GlobalRun> runs) {
  TensorPiece p;
  p.name = name;
  p.global_shape = shape;
  int64_t n = 0;
  for (const auto& r : runs) n += r.length;
  p.values = Tensor::empty({n});
  float* d = p.values.data<float>();
  for (const auto& r : runs)
    for (int64_t k = 0; k < r.length; ++k) *d++ = global[static_cast<size_t>(r.start + k)];
  p.runs = std::move(runs);
  return p;
}

// Rows [r0, r1) of A: one run. Columns [c0, c1) of A: a run per row, optionally only the elements
// [lo, hi) of that slice in its own row-major order (a ZeRO range of a tensor-parallel slice).
std::vector<GlobalRun> rows(int64_t r0, int64_t r1) {
  return {{r0 * C, (r1 - r0) * C}};
}
std::vector<GlobalRun> cols(int64_t c0, int64_t c1, int64_t lo = 0, int64_t hi = -1) {
  const int64_t w = c1 - c0;
  if (hi < 0) hi = R * w;
  return runs_from_indices(hi - lo,
                           [&](int64_t i) { return ((lo + i) / w) * C + c0 + (lo + i) % w; });
}

// Layout "X": three ranks, A split by rows, b by element ranges, A's moment by rows too.
std::vector<std::string> write_layout_x(const std::filesystem::path& dir, const Globals& g) {
  const std::vector<std::pair<int64_t, int64_t>> row_blocks = {{0, 3}, {3, 5}, {5, 7}};
  const std::vector<std::pair<int64_t, int64_t>> b_ranges = {{0, 5}, {5, 9}, {9, 13}};
  std::vector<std::string> paths;
  for (int r = 0; r < 3; ++r) {
    ShardContents c;
    c.sections[ShardSection::model].push_back(
        piece("A", {R, C}, g.a, rows(row_blocks[r].first, row_blocks[r].second)));
    c.sections[ShardSection::model].push_back(
        piece("b", {NB}, g.b, {{b_ranges[r].first, b_ranges[r].second - b_ranges[r].first}}));
    c.sections[ShardSection::exp_avg].push_back(
        piece("A", {R, C}, g.a_m, rows(row_blocks[r].first, row_blocks[r].second)));
    paths.push_back((dir / ("shard_" + std::to_string(r) + ".h5")).string());
    const Status st = write_shard_file(paths.back(), r, c);
    REQUIRE(st.is_ok());
  }
  return paths;
}

// Reads `runs` of a tensor and compares with the global values.
void check_read(ShardSetReader& reader, ShardSection section, const std::string& name,
                const Shape& shape, const std::vector<float>& global,
                const std::vector<GlobalRun>& runs) {
  int64_t n = 0;
  for (const auto& r : runs) n += r.length;
  Tensor out = Tensor::empty({n});
  const Status st = reader.read(section, name, shape, runs, out);
  INFO(st.message());
  REQUIRE(st.is_ok());
  const float* d = out.data<float>();
  for (const auto& r : runs)
    for (int64_t k = 0; k < r.length; ++k)
      REQUIRE(*d++ == global[static_cast<size_t>(r.start + k)]);
}

}  // namespace

TEST_CASE("shard files: runs from a column slice with a ZeRO range", "[checkpoint][shard]") {
  // The header's example: a (4, 6) tensor, columns 3..5, then elements 5..8 of that slice.
  const auto runs =
      runs_from_indices(4, [](int64_t i) { return ((5 + i) / 3) * 6 + 3 + (5 + i) % 3; });
  REQUIRE(runs == std::vector<GlobalRun>{{11, 1}, {15, 3}});
  // Negative indices (padding) are skipped.
  REQUIRE(runs_from_indices(5, [](int64_t i) { return i < 3 ? i : -1; }) ==
          std::vector<GlobalRun>{{0, 3}});
}

TEST_CASE("shard files: written by one layout, read by another, bitwise", "[checkpoint][shard]") {
  test::TempDir dir;
  const Globals g = make_globals();
  const auto paths = write_layout_x(dir.path(), g);
  for (const auto& p : paths) REQUIRE_FALSE(std::filesystem::exists(p + ".tmp"));
  auto reader = ShardSetReader::open(paths);
  INFO(reader.status().message());
  REQUIRE(reader.is_ok());
  ShardSetReader& r = **reader;
  REQUIRE(r.tensors(ShardSection::model).size() == 2);
  REQUIRE(r.has(ShardSection::exp_avg, "A"));
  REQUIRE_FALSE(r.has(ShardSection::exp_avg_sq, "A"));
  // Layout "Y": A split by columns over 4 ranks (3, 3, 2, 2 wide), each also split by a ZeRO range.
  const std::vector<std::pair<int64_t, int64_t>> col_blocks = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
  for (const auto& [c0, c1] : col_blocks) {
    const int64_t n = R * (c1 - c0);
    check_read(r, ShardSection::model, "A", {R, C}, g.a, cols(c0, c1));
    check_read(r, ShardSection::model, "A", {R, C}, g.a, cols(c0, c1, 0, n / 2));
    check_read(r, ShardSection::model, "A", {R, C}, g.a, cols(c0, c1, n / 2, n));
    check_read(r, ShardSection::exp_avg, "A", {R, C}, g.a_m, cols(c0, c1, 1, n - 1));
  }
  check_read(r, ShardSection::model, "A", {R, C}, g.a, {{0, R * C}});  // the whole tensor
  check_read(r, ShardSection::model, "b", {NB}, g.b, {{2, 9}});        // across all three files
  check_read(r, ShardSection::model, "b", {NB}, g.b, {{12, 1}, {0, 1}, {4, 2}});
}

TEST_CASE("shard files: replicas may overlap", "[checkpoint][shard]") {
  test::TempDir dir;
  const Globals g = make_globals();
  std::vector<std::string> paths;
  for (int r = 0; r < 2;
       ++r) {  // both hold all of b (data-parallel replicas), one also A's rows 2..6
    ShardContents c;
    c.sections[ShardSection::model].push_back(piece("b", {NB}, g.b, {{0, NB}}));
    c.sections[ShardSection::model].push_back(
        piece("A", {R, C}, g.a, r == 0 ? rows(0, 4) : rows(2, 7)));
    paths.push_back((dir.path() / ("s" + std::to_string(r) + ".h5")).string());
    REQUIRE(write_shard_file(paths.back(), r, c).is_ok());
  }
  auto reader = ShardSetReader::open(paths);
  REQUIRE(reader.is_ok());
  check_read(**reader, ShardSection::model, "b", {NB}, g.b, {{0, NB}});
  check_read(**reader, ShardSection::model, "A", {R, C}, g.a, {{0, R * C}});
}

TEST_CASE("shard files: a missing shard, a flipped bit, a truncated file, a wrong shape",
          "[checkpoint][shard]") {
  test::TempDir dir;
  const Globals g = make_globals();
  auto paths = write_layout_x(dir.path(), g);

  SECTION("missing shard: the uncovered element is named at open") {
    auto reader = ShardSetReader::open({paths[0], paths[2]});
    REQUIRE_FALSE(reader.is_ok());
    CHECK(reader.status().is_bad_input());
    CHECK_THAT(reader.status().message(), Catch::Contains("tensor model/A") &&
                                              Catch::Contains("element 30") &&
                                              Catch::Contains("is in no shard file"));
  }
  SECTION("flipped bit in the values: the whole-file checksum names the file before its first read") {
    // Find A's rows 3..4 (shard 1) in the file by their bytes and flip one bit.
    std::ifstream in(paths[1], std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const std::string needle(reinterpret_cast<const char*>(g.a.data() + 3 * C), 4 * sizeof(float));
    const size_t at = bytes.find(needle);
    REQUIRE(at != std::string::npos);
    bytes[at + 5] = static_cast<char>(bytes[at + 5] ^ 0x10);
    std::ofstream(paths[1], std::ios::binary | std::ios::trunc) << bytes;
    auto reader = ShardSetReader::open(paths);  // checked at open
    REQUIRE_FALSE(reader.is_ok());
    CHECK(reader.status().is_bad_input());
    CHECK_THAT(reader.status().message(), Catch::Contains(paths[1]) && Catch::Contains("checksum"));
    // Deferred (a rank's load): the damaged file is checked before the first value read from it;
    // the elements of the intact files read, and nothing of the damaged one does.
    ShardReadOptions deferred_check;
    deferred_check.verify_at_open = false;
    auto deferred = ShardSetReader::open(paths, deferred_check);
    REQUIRE(deferred.is_ok());
    check_read(**deferred, ShardSection::model, "A", {R, C}, g.a, rows(0, 3));
    Tensor whole = Tensor::empty({R * C});
    const Status at_read = (*deferred)->read(ShardSection::model, "A", {R, C}, {{0, R * C}}, whole);
    REQUIRE_FALSE(at_read.is_ok());
    CHECK(at_read.is_bad_input());
    CHECK_THAT(at_read.message(), Catch::Contains(paths[1]) && Catch::Contains("model/A") &&
                                      Catch::Contains("checksum does not match"));
    // Past the whole-file check (as a crafted file with a matching checksum would be), the piece's
    // own checksum catches it when read, naming the file and the tensor.
    std::vector<ShardSource> sources;
    for (const auto& p : paths) sources.push_back({p, h5read::open_file_source(p).value()});
    auto unchecked = ShardSetReader::open(sources, ShardReadOptions{false});
    INFO(unchecked.status().message());
    REQUIRE(unchecked.is_ok());
    Tensor out = Tensor::empty({R * C});
    const Status st = (*unchecked)->read(ShardSection::model, "A", {R, C}, {{0, R * C}}, out);
    REQUIRE_FALSE(st.is_ok());
    CHECK_THAT(st.message(), Catch::Contains(paths[1]) && Catch::Contains("model/A") &&
                                 Catch::Contains("checksum"));
    // Elements held by the intact shards still read.
    check_read(**unchecked, ShardSection::model, "A", {R, C}, g.a, rows(0, 3));
  }
  SECTION("truncated file: named at open") {
    std::filesystem::resize_file(paths[2], std::filesystem::file_size(paths[2]) / 2);
    auto reader = ShardSetReader::open(paths);
    REQUIRE_FALSE(reader.is_ok());
    CHECK_THAT(reader.status().message(), Catch::Contains(paths[2]));
  }
  SECTION("a shape that differs from the model's") {
    auto reader = ShardSetReader::open(paths);
    REQUIRE(reader.is_ok());
    Tensor out = Tensor::empty({R * C});
    const Status st = (*reader)->read(ShardSection::model, "A", {C, R}, {{0, R * C}}, out);
    REQUIRE_FALSE(st.is_ok());
    CHECK_THAT(st.message(), Catch::Contains("(7, 10)") && Catch::Contains("(10, 7)"));
  }
  SECTION("a tensor the checkpoint lacks") {
    auto reader = ShardSetReader::open(paths);
    REQUIRE(reader.is_ok());
    Tensor out = Tensor::empty({1});
    const Status st = (*reader)->read(ShardSection::exp_avg_sq, "A", {R, C}, {{0, 1}}, out);
    REQUIRE_FALSE(st.is_ok());
    CHECK_THAT(st.message(),
               Catch::Contains("optimizer/exp_avg_sq/A") && Catch::Contains("missing"));
  }
  SECTION("a file that is not a shard") {
    const std::string other = (dir.path() / "other.h5").string();
    std::ofstream(other) << "not hdf5";
    auto reader = ShardSetReader::open({paths[0], other});
    REQUIRE_FALSE(reader.is_ok());
    CHECK_THAT(reader.status().message(), Catch::Contains(other));
  }
}

TEST_CASE("shard file: a paced background write stores the same bytes, block by block",
          "[shard_file]") {
  // 1.5 Mi floats = 6 MiB: two blocks of 4 MiB (the last partial), an odd length.
  const int64_t n = (int64_t{3} << 19) + 7;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> global(static_cast<size_t>(n));
  for (float& x : global) x = u(rng);
  ShardContents c;
  c.sections[ShardSection::model].push_back(piece("big", Shape{n}, global, {{0, n}}));
  test::TempDir dir;
  const std::string plain = dir.str("plain.h5"), paced = dir.str("paced.h5");
  REQUIRE(write_shard_file(plain, 0, c));
  std::vector<double> blocks;
  {
    const WritePacing pacing([&](double seconds) { blocks.push_back(seconds); });
    REQUIRE(write_shard_file(paced, 0, c));
  }
  // Paced all along: the values (two blocks), the run table, the file's checksum and its write.
  CHECK(blocks.size() >= 5);
  CHECK(WritePacing::current() == nullptr);
  // Equal files apart from nothing: same layout, same bytes, same checksums.
  auto bytes = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(bytes(plain) == bytes(paced));
  auto reader = ShardSetReader::open({paced});
  REQUIRE(reader.is_ok());
  Tensor got = Tensor::empty({n});
  REQUIRE((*reader)->read(ShardSection::model, "big", Shape{n}, {{0, n}}, got));
  CHECK(std::memcmp(got.raw(), global.data(), global.size() * sizeof(float)) == 0);
}

TEST_CASE("shard file: large pieces go from their own memory to the places libhdf5 reserved",
          "[shard_file]") {
  // Pieces around the 64 KiB line (16383 floats stay in the HDF5 image, 16384 and more are written
  // from their own memory), odd sizes, several runs, every section; libhdf5 itself must read each
  // dataset's values back, and the HDF5 image must hold none of the large pieces' bytes.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const std::vector<int64_t> sizes = {16383, 16384, 100003, 5, 262147, 70001};
  std::vector<std::vector<float>> globals;
  ShardContents c;
  int64_t reserved = 0, total_bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    std::vector<float> g(static_cast<size_t>(n));
    for (float& x : g) x = u(rng);
    // Two runs, the second half first (the file's order is the runs', not the tensor's).
    std::vector<GlobalRun> runs = {{n / 2, n - n / 2}, {0, n / 2}};
    const ShardSection section = i % 3 == 0 ? ShardSection::model
                                 : i % 3 == 1 ? ShardSection::exp_avg
                                              : ShardSection::exp_avg_sq;
    c.sections[section].push_back(piece("t" + std::to_string(i), Shape{n}, g, runs));
    globals.push_back(std::move(g));
    reserved += n * 4 >= (64 << 10) ? 1 : 0;
    total_bytes += n * 4;
  }
  test::TempDir dir;
  const std::string path = dir.str("shard_00000.h5");
  ShardWriteStats stats;
  REQUIRE(write_shard_file(path, 0, c, &stats));
  CHECK(static_cast<int64_t>(stats.reserved.size()) == reserved);
  CHECK_FALSE(stats.in_place);
  CHECK(stats.file_bytes == std::filesystem::file_size(path));
  CHECK(stats.file_bytes > static_cast<uint64_t>(total_bytes));
  CHECK(stats.image_bytes < (uint64_t{1} << 20));  // metadata and the small pieces only
  // libhdf5's view: every dataset holds its piece's values.
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  for (const auto& [section, list] : c.sections)
    for (const TensorPiece& p : list) {
      const std::string name = std::string(shard_section_path(section)) + "/" + p.name;
      hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
      REQUIRE(ds >= 0);
      std::vector<float> got(static_cast<size_t>(p.values.numel()));
      REQUIRE(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()) >= 0);
      H5Dclose(ds);
      INFO(name);
      CHECK(std::memcmp(got.data(), p.values.raw(), got.size() * sizeof(float)) == 0);
    }
  H5Fclose(f);
  // troupe's reader (the whole file's checksum, each piece's) gives the global values back.
  auto reader = ShardSetReader::open({path});
  INFO(reader.status().message());
  REQUIRE(reader.is_ok());
  size_t i = 0;
  for (const auto& [section, list] : c.sections)
    for (const TensorPiece& p : list) {
      const int64_t k = std::stoll(p.name.substr(1));
      check_read(**reader, section, p.name, p.global_shape, globals[static_cast<size_t>(k)], p.runs);
      ++i;
    }
  CHECK(i == sizes.size());
  // A flipped bit in a large piece's values is caught by the file's checksum.
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(stats.file_bytes / 2));
    char byte = 0;
    io.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    io.seekp(static_cast<std::streamoff>(stats.file_bytes / 2));
    io.write(&byte, 1);
  }
  auto damaged = ShardSetReader::open({path});
  REQUIRE_FALSE(damaged.is_ok());
  CHECK_THAT(damaged.status().message(), Catch::Contains("checksum"));
  // Deferred, before the first value read from the file.
  ShardReadOptions deferred_check;
  deferred_check.verify_at_open = false;
  auto deferred = ShardSetReader::open({path}, deferred_check);
  REQUIRE(deferred.is_ok());
  Status first = Status::ok();
  for (const auto& [name, shape] : (*deferred)->tensors(ShardSection::model)) {
    Tensor out = Tensor::empty({shape.numel()});
    first = (*deferred)->read(ShardSection::model, name, shape, {{0, shape.numel()}}, out);
    break;
  }
  REQUIRE_FALSE(first.is_ok());
  CHECK_THAT(first.message(), Catch::Contains("checksum does not match"));
}

namespace {

// Pieces of sizes around the 64 KiB line, several of one size (they may take each other's places).
ShardContents reuse_contents(std::mt19937_64& rng, std::vector<std::vector<float>>& globals) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const std::vector<int64_t> sizes = {20000, 20000, 3, 70001, 20000, 16383, 70001};
  ShardContents c;
  globals.clear();
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> g(static_cast<size_t>(sizes[i]));
    for (float& x : g) x = u(rng);
    const ShardSection section = i < 3 ? ShardSection::model : i < 5 ? ShardSection::exp_avg : ShardSection::exp_avg_sq;
    c.sections[section].push_back(piece("t" + std::to_string(i), Shape{sizes[i]}, g, {{0, sizes[i]}}));
    globals.push_back(std::move(g));
  }
  return c;
}

void check_contents(const std::string& path, const ShardContents& c, const std::vector<std::vector<float>>& globals) {
  auto reader = ShardSetReader::open({path});
  INFO(reader.status().message());
  REQUIRE(reader.is_ok());
  for (const auto& [section, list] : c.sections)
    for (const TensorPiece& p : list)
      check_read(**reader, section, p.name, p.global_shape, globals[std::stoul(p.name.substr(1))], p.runs);
}

}  // namespace

TEST_CASE("shard file: a dropped snapshot's file, copied into where the pieces go, becomes the next one in place",
          "[shard_file]") {
  std::mt19937_64 rng(23);
  std::vector<std::vector<float>> first, second;
  const ShardContents c1 = reuse_contents(rng, first);
  test::TempDir dir;
  std::filesystem::create_directories(dir.str("iter_1"));
  ShardWriteStats s1;
  REQUIRE(write_shard_file(dir.str("iter_1/shard_00000.h5"), 0, c1, &s1));
  REQUIRE(s1.reserved.size() == 5);
  // The recycler's name for it once its iteration is gone.
  const std::string spare = dir.str("spare.h5");
  std::filesystem::rename(dir.str("iter_1/shard_00000.h5"), spare);
  const int fd = ::open(spare.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  const size_t mapped = std::filesystem::file_size(spare);
  void* map = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(map != MAP_FAILED);
  auto* base = static_cast<uint8_t*>(map);

  // The next snapshot: new values, each large piece copied into a region of its size (the last free
  // one: pieces of one size swap places), the small ones on the heap.
  // one_misplaced: a piece lies inside a larger piece's place (a view into a larger copy), copied out
  // and written to a free place of its size; a piece then has no place of its own (on the heap) and
  // takes the one the view was in. too_few_places: the file's list lacks a place a piece needs, so
  // the shard is written anew.
  enum class Case { all_in_file, one_on_heap, one_misplaced, too_few_places };
  for (Case kase : {Case::all_in_file, Case::one_on_heap, Case::one_misplaced, Case::too_few_places}) {
    DYNAMIC_SECTION("case " << static_cast<int>(kase)) {
      ShardContents c2 = reuse_contents(rng, second);
      std::vector<bool> used(s1.reserved.size(), false);
      bool first_large = true;
      for (auto& [section, list] : c2.sections)
        for (TensorPiece& p : list) {
          const uint64_t bytes = static_cast<uint64_t>(p.values.numel()) * sizeof(float);
          if (bytes < (64 << 10)) continue;
          const bool odd_one = std::exchange(first_large, false);
          if (odd_one && kase == Case::one_on_heap) continue;  // stays on the heap
          size_t k = s1.reserved.size();
          uint64_t shift = 0;
          if (odd_one && kase == Case::one_misplaced) {  // inside a larger piece's place, not at its start
            while (k-- > 0)
              if (!used[k] && s1.reserved[k].bytes > bytes + 512) break;
            shift = 512;
          } else {
            while (k-- > 0)
              if (!used[k] && s1.reserved[k].bytes == bytes) break;
            if (k >= s1.reserved.size() && kase == Case::one_misplaced) continue;  // its place is taken
          }
          REQUIRE(k < s1.reserved.size());
          used[k] = true;
          Tensor in_file = Tensor::wrap(base + s1.reserved[k].offset + shift, p.values.shape(), DType::f32, nullptr);
          in_file.copy_from(p.values);
          p.values = in_file;
        }
      const std::vector<uint8_t> before(base, base + mapped);
      ShardFileReuse reuse{spare, base, mapped, s1.reserved};
      if (kase == Case::too_few_places) reuse.regions.erase(reuse.regions.begin());
      ShardWriteStats s2;
      REQUIRE(write_shard_file(dir.str("iter_2/shard_00000.h5"), 0, c2, &s2, &reuse));
      check_contents(dir.str("iter_2/shard_00000.h5"), c2, second);
      if (kase != Case::too_few_places) {
        // The spare is the new file: same places; the pieces in it not written again, the one on the
        // heap written into the free place of its size.
        CHECK(s2.in_place);
        CHECK(s2.pieces_in_place == (kase == Case::all_in_file ? 5 : kase == Case::one_on_heap ? 4 : 3));
        CHECK(s2.reserved == s1.reserved);
        CHECK_FALSE(std::filesystem::exists(spare));
        std::ifstream in(dir.str("iter_2/shard_00000.h5"), std::ios::binary);
        const std::string bytes(std::istreambuf_iterator<char>(in), {});
        REQUIRE(bytes.size() == s2.file_bytes);
        CHECK(bytes.size() <= mapped);
        CHECK(std::memcmp(bytes.data(), base, bytes.size()) == 0);  // what the mapping shows
      } else {
        // Written anew; the spare is untouched.
        CHECK_FALSE(s2.in_place);
        CHECK(std::filesystem::exists(spare));
        CHECK(std::memcmp(before.data(), base, mapped) == 0);
      }
    }
  }
  ::munmap(map, mapped);
}

TEST_CASE("shard file: its bytes do not depend on when it is written", "[shard_file]") {
  // HDF5 stamps objects with their creation time unless told not to: two writes a second apart of
  // the same contents must still give the same bytes (a paced and an unpaced save are compared
  // byte for byte above, and a checkpoint's checksum is over its bytes).
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 3.f;
  ShardContents c;
  c.sections[ShardSection::model].push_back(piece("w", Shape{1000}, values, {{0, 1000}}));
  test::TempDir dir;
  REQUIRE(write_shard_file(dir.str("a.h5"), 0, c));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  REQUIRE(write_shard_file(dir.str("b.h5"), 0, c));
  auto bytes = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(bytes(dir.str("a.h5")) == bytes(dir.str("b.h5")));
}

TEST_CASE("shard file: whole tensors round-trip through version 2 and load from version 1",
          "[shard_file]") {
  const Globals g = make_globals();
  // A padded tensor: A's storage has two rows beyond its global shape (a padded vocabulary).
  auto make = [&](bool fill) {
    CheckpointContents c;
    Tensor a = Tensor::zeros({R + 2, C}), b = Tensor::zeros({NB}), am = Tensor::zeros({R + 2, C});
    if (fill) {
      std::memcpy(a.raw(), g.a.data(), g.a.size() * sizeof(float));
      std::memcpy(b.raw(), g.b.data(), g.b.size() * sizeof(float));
      std::memcpy(am.raw(), g.a_m.data(), g.a_m.size() * sizeof(float));
      a.data<float>()[R * C] = 99.f;  // padding: never saved
    }
    c.params = {{"A", Shape{R, C}, a}, {"b", Shape{NB}, b}};
    c.exp_avg = {{"A", Shape{R, C}, am}, {"b", Shape{NB}, b}};
    c.exp_avg_sq = {{"A", Shape{R, C}, am}, {"b", Shape{NB}, b}};
    return c;
  };
  auto same = [&](const CheckpointContents& got) {
    CHECK(std::memcmp(got.params[0].tensor.raw(), g.a.data(), g.a.size() * sizeof(float)) == 0);
    CHECK(got.params[0].tensor.data<float>()[R * C] == 0.f);
    CHECK(std::memcmp(got.params[1].tensor.raw(), g.b.data(), g.b.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(got.exp_avg_sq[0].tensor.raw(), g.a_m.data(), g.a_m.size() * sizeof(float)) ==
          0);
  };
  test::TempDir dir;
  const CheckpointContents src = make(true);
  SECTION("version 2: one shard of whole tensors") {
    REQUIRE(prepare_iteration_dir(dir.str(), 3));
    REQUIRE(write_shard_file(shard_file_path(dir.str(), 3, 0), 0, whole_tensor_shard(src)));
    auto reader = ShardSetReader::open({shard_file_path(dir.str(), 3, 0)});
    REQUIRE(reader.is_ok());
    const CheckpointContents got = make(false);
    REQUIRE(read_whole_tensors(**reader, got, true));
    same(got);
  }
  SECTION("version 1: the single file of earlier troupe versions") {
    CheckpointMeta meta;
    meta.iteration = 3;
    meta.config_json = "{}";
    meta.rng_json = "{}";
    REQUIRE(test::save_v1_checkpoint(dir.str(), meta, src));
    auto files = Checkpoint::open(dir.str(), 3).value().files();
    REQUIRE(files.is_ok());
    CHECK(files.value() == std::vector<std::string>{checkpoint_file(dir.str(), 3)});
    auto reader = ShardSetReader::open(files.value());
    REQUIRE(reader.is_ok());
    const CheckpointContents got = make(false);
    REQUIRE(read_whole_tensors(**reader, got, true));
    same(got);
  }
}

// A multi-host snapshot's host folder holds the shards its ranks read (storage/shard_coverage.hpp):
// metadata.json records each shard's rank's list ("reads"), a rank opens only those files, and a
// reader over them reads what they hold and fails, naming the element, what they leave out.
TEST_CASE("shard files: a rank's own shards of a snapshot, the gaps between them refused by name",
          "[checkpoint][shard][coverage]") {
  test::TempDir tmp;
  const Globals g = make_globals();
  const std::string dir = (tmp.path() / "snap").string();
  std::filesystem::create_directories(iteration_dir(dir, 4));
  std::vector<std::string> paths;
  for (int r = 0; r < 3; ++r) paths.push_back(shard_file_path(dir, 4, r));
  const auto written = write_layout_x(iteration_dir(dir, 4), g);
  for (int r = 0; r < 3; ++r) std::filesystem::rename(written[static_cast<size_t>(r)], paths[static_cast<size_t>(r)]);
  CheckpointMeta meta;
  meta.iteration = 4;
  meta.config_json = meta.rng_json = "{}";
  std::vector<ShardDigest> digests;
  for (const auto& p : paths) digests.push_back(read_shard_digest(p).value().value());
  const std::vector<std::vector<int>> reads = {{0}, {0, 1}, {2}};
  REQUIRE(commit_sharded_checkpoint(dir, meta, "{}", shard_file_names(3), digests, reads));
  auto text = read_checkpoint_metadata_text(dir, 4);
  REQUIRE(text.is_ok());
  auto parsed = parse_checkpoint_metadata(text.value(), "metadata.json");
  REQUIRE(parsed.is_ok());
  CHECK(parsed->reads == reads);
  // Rank 1 of 3 reads shards 0 and 1; another world size, or no list, reads every file.
  auto own = shards_read_by(dir, 4, 1, 3);
  REQUIRE(own.is_ok());
  REQUIRE(own->has_value());
  CHECK(**own == std::vector<std::string>{paths[0], paths[1]});
  CHECK_FALSE(shards_read_by(dir, 4, 1, 4).value().has_value());
  // The host lacks shard 2, which rank 1 does not read.
  std::filesystem::remove(paths[2]);
  ShardReadOptions gaps;
  gaps.allow_gaps = true;
  gaps.verify_at_open = false;
  auto reader = ShardSetReader::open(**own, gaps);
  REQUIRE(reader.is_ok());
  check_read(**reader, ShardSection::model, "A", {R, C}, g.a, rows(0, 5));
  check_read(**reader, ShardSection::model, "b", {NB}, g.b, {{0, 9}});
  Tensor out = Tensor::empty({C});
  const Status gap = (*reader)->read(ShardSection::model, "A", {R, C}, rows(5, 6), out);
  REQUIRE_FALSE(gap.is_ok());
  CHECK_THAT(gap.message(), Catch::Contains("element 50 of (7, 10) is in none of the files read"));
  // Without allow_gaps the same files are refused at open, as a checkpoint missing a shard.
  auto whole = ShardSetReader::open(**own);
  REQUIRE_FALSE(whole.is_ok());
  CHECK_THAT(whole.status().message(), Catch::Contains("is in no shard file"));
  // A rank whose list names the missing shard: a clear error at open.
  auto lost = shards_read_by(dir, 4, 2, 3);
  REQUIRE_FALSE(lost.is_ok());
  CHECK_THAT(lost.status().message(), Catch::Contains("is missing its shard"));
}

TEST_CASE("shard files: metadata.json's reads are ascending shard indices, for every shard or none",
          "[checkpoint][shard][coverage][hostile]") {
  const std::string head =
      R"({"format": "troupe-checkpoint", "format_version": 3, "iteration": 1, "consumed_samples": 0,
          "optimizer_step": 1, "config": "{}", "rng": "{}", "shards": [)";
  auto shard = [](int i, const std::string& reads) {
    return fmt::format(R"({{"file": "shard_{:05d}.h5", "bytes": 600, "crc32": 1{}}})", i,
                       reads.empty() ? "" : ", \"reads\": " + reads);
  };
  auto good = parse_checkpoint_metadata(head + shard(0, "[0, 1]") + "," + shard(1, "[]") + "]}", "m.json");
  REQUIRE(good.is_ok());
  CHECK(good->reads == std::vector<std::vector<int>>{{0, 1}, {}});
  for (const auto& [reads0, reads1, why] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"[1, 0]", "[1]", "ascending shard indices below 2"},
           {"[0, 2]", "[1]", "ascending shard indices below 2"},
           {"[0, 0]", "[1]", "ascending shard indices below 2"},
           {"[-1]", "[1]", "ascending shard indices below 2"},
           {"{}", "[1]", "ascending shard indices below 2"},
           {"[0]", "", "reads is given for 1 of the 2 shards"}}) {
    INFO(reads0 << " " << reads1);
    auto bad = parse_checkpoint_metadata(head + shard(0, reads0) + "," + shard(1, reads1) + "]}", "m.json");
    REQUIRE_FALSE(bad.is_ok());
    CHECK_THAT(bad.status().message(), Catch::Contains(why));
  }
}
