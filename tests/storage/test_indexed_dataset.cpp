// MMIDIDX indexed datasets: byte layout, write/read round trip, and damaged files giving errors.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "storage/indexed_dataset.hpp"
#include "tests/test_util.hpp"

namespace fs = std::filesystem;
using troupe::IndexDType;
using troupe::IndexedDataset;
using troupe::IndexedDatasetBuilder;

namespace {

struct Doc {
  std::vector<std::vector<int32_t>> sequences;
};

// Documents with odd sizes (an empty sequence included), tokens below `max_token`.
std::vector<Doc> make_docs(int32_t max_token, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Doc> docs(7);
  for (size_t d = 0; d < docs.size(); ++d) {
    int nseq = 1 + static_cast<int>(d % 3);
    for (int s = 0; s < nseq; ++s) {
      size_t len = (d == 2 && s == 1) ? 0 : 1 + rng() % 37;
      std::vector<int32_t> seq(len);
      for (auto& t : seq) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(max_token));
      docs[d].sequences.push_back(seq);
    }
  }
  return docs;
}

void write(const std::string& prefix, IndexDType dtype, const std::vector<Doc>& docs) {
  auto b = IndexedDatasetBuilder::create(prefix, dtype);
  REQUIRE(b.is_ok());
  for (const Doc& doc : docs) {
    for (const auto& seq : doc.sequences) REQUIRE((*b)->add_item(seq).is_ok());
    (*b)->end_document();
  }
  REQUIRE((*b)->finalize().is_ok());
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

template <class T>
T at(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

}  // namespace

TEST_CASE("indexed dataset: .idx byte layout is Megatron's", "[indexed_dataset]") {
  troupe::test::TempDir dir;
  const std::string prefix = dir.str("ds");
  write(prefix, IndexDType::u16, {{{{1, 2, 3}}}, {{{4}, {5, 6}}}});
  std::string idx = read_all(prefix + ".idx");
  REQUIRE(idx.size() == 34 + 3 * 12 + 3 * 8);
  CHECK(std::memcmp(idx.data(), "MMIDIDX\0\0", 9) == 0);
  CHECK(at<uint64_t>(idx, 9) == 1);   // version
  CHECK(at<uint8_t>(idx, 17) == 8);   // uint16
  CHECK(at<uint64_t>(idx, 18) == 3);  // sequences
  CHECK(at<uint64_t>(idx, 26) == 3);  // doc_idx entries
  CHECK(at<int32_t>(idx, 34) == 3);
  CHECK(at<int32_t>(idx, 38) == 1);
  CHECK(at<int32_t>(idx, 42) == 2);
  CHECK(at<int64_t>(idx, 46) == 0);
  CHECK(at<int64_t>(idx, 54) == 6);
  CHECK(at<int64_t>(idx, 62) == 8);
  CHECK(at<int64_t>(idx, 70) == 0);
  CHECK(at<int64_t>(idx, 78) == 1);
  CHECK(at<int64_t>(idx, 86) == 3);
  std::string bin = read_all(prefix + ".bin");
  REQUIRE(bin.size() == 12);
  for (int i = 0; i < 6; ++i) CHECK(at<uint16_t>(bin, 2 * i) == i + 1);
  // Only the two outputs remain: no temporaries.
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 2);
}

TEST_CASE("indexed dataset: write/read round trip in uint16 and int32", "[indexed_dataset]") {
  for (auto [dtype, max_token] :
       {std::pair{IndexDType::u16, 65535}, std::pair{IndexDType::i32, 1 << 30}}) {
    troupe::test::TempDir dir;
    const std::string prefix = dir.str("ds");
    auto docs = make_docs(max_token, 11);
    write(prefix, dtype, docs);
    auto ds = IndexedDataset::open(prefix);
    REQUIRE(ds.is_ok());
    const IndexedDataset& d = **ds;
    CHECK(d.dtype() == dtype);
    CHECK(d.num_documents() == static_cast<int64_t>(docs.size()));

    std::vector<int32_t> stream;
    std::vector<int32_t> sizes;
    std::vector<int64_t> doc_idx{0}, doc_offsets{0};
    for (const Doc& doc : docs) {
      for (const auto& seq : doc.sequences) {
        stream.insert(stream.end(), seq.begin(), seq.end());
        sizes.push_back(static_cast<int32_t>(seq.size()));
      }
      doc_idx.push_back(static_cast<int64_t>(sizes.size()));
      doc_offsets.push_back(static_cast<int64_t>(stream.size()));
    }
    CHECK(d.num_sequences() == static_cast<int64_t>(sizes.size()));
    CHECK(d.sizes() == sizes);
    CHECK(d.doc_indices() == doc_idx);
    CHECK(d.total_tokens() == static_cast<int64_t>(stream.size()));
    std::vector<int64_t> pointers;
    int64_t p = 0;
    for (int32_t s : sizes) {
      pointers.push_back(p);
      p += s * static_cast<int64_t>(troupe::index_dtype_size(dtype));
    }
    CHECK(d.pointers() == pointers);
    for (size_t i = 0; i < doc_offsets.size(); ++i)
      CHECK(d.document_token_offset(static_cast<int64_t>(i)) == doc_offsets[i]);

    // Every range, across sequence boundaries.
    std::vector<int32_t> all(stream.size());
    d.read_tokens(0, d.total_tokens(), all.data());
    CHECK(all == stream);
    std::vector<int32_t> part(13);
    for (int64_t off = 0; off + 13 <= d.total_tokens(); off += 5) {
      d.read_tokens(off, 13, part.data());
      CHECK(std::equal(part.begin(), part.end(), stream.begin() + off));
    }
  }
}

TEST_CASE("indexed dataset: empty dataset and out-of-range tokens", "[indexed_dataset]") {
  troupe::test::TempDir dir;
  write(dir.str("empty"), IndexDType::u16, {});
  auto ds = IndexedDataset::open(dir.str("empty"));
  REQUIRE(ds.is_ok());
  CHECK((*ds)->num_documents() == 0);
  CHECK((*ds)->total_tokens() == 0);
  CHECK((*ds)->document_token_offset(0) == 0);

  auto b = IndexedDatasetBuilder::create(dir.str("big"), IndexDType::u16);
  REQUIRE(b.is_ok());
  std::vector<int32_t> too_big{1, 70000};
  troupe::Status st = (*b)->add_item(too_big);
  REQUIRE_FALSE(st.is_ok());
  CHECK_THAT(st.message(), Catch::Contains("70000") && Catch::Contains("uint16"));
  CHECK(troupe::token_dtype_for_vocab(50257) == IndexDType::u16);
  CHECK(troupe::token_dtype_for_vocab(65500) == IndexDType::i32);
}

TEST_CASE("indexed dataset: an unfinished builder leaves nothing behind", "[indexed_dataset]") {
  troupe::test::TempDir dir;
  write(dir.str("ds"), IndexDType::u16, {{{{1, 2, 3}}}});
  const std::string before = read_all(dir.str("ds.bin"));
  {
    auto b = IndexedDatasetBuilder::create(dir.str("ds"), IndexDType::u16);
    REQUIRE(b.is_ok());
    std::vector<int32_t> seq{9, 9};
    REQUIRE((*b)->add_item(seq).is_ok());
    (*b)->end_document();
    REQUIRE((*b)->finish().is_ok());  // written, never committed
  }
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 2);
  CHECK(read_all(dir.str("ds.bin")) == before);
}

TEST_CASE("indexed dataset: damaged files give errors, not crashes", "[indexed_dataset]") {
  troupe::test::TempDir dir;
  const std::string prefix = dir.str("ds");
  write(prefix, IndexDType::u16, make_docs(50000, 5));
  const std::string idx = read_all(prefix + ".idx"), bin = read_all(prefix + ".bin");
  REQUIRE(IndexedDataset::open(prefix).is_ok());

  auto expect_error = [&](const std::string& what, const std::string& must_contain) {
    auto ds = IndexedDataset::open(prefix);
    INFO(what);
    REQUIRE_FALSE(ds.is_ok());
    CHECK_THAT(ds.status().message(), Catch::Contains(must_contain));
    CHECK_THAT(ds.status().message(), Catch::Contains("troupe preprocess"));
    CHECK(ds.status().is_bad_input());  // exit 2: the dataset must change
    write_all(prefix + ".idx", idx);
    write_all(prefix + ".bin", bin);
  };

  write_all(prefix + ".bin", bin.substr(0, bin.size() - 1));
  expect_error("truncated .bin", ".bin");
  write_all(prefix + ".bin", bin + "xx");
  expect_error("longer .bin", "longer");
  write_all(prefix + ".idx", idx.substr(0, idx.size() - 8));
  expect_error("truncated .idx", "truncated");
  write_all(prefix + ".idx", idx.substr(0, 20));
  expect_error("header only", "header");
  std::string bad = idx;
  bad[0] = 'X';
  write_all(prefix + ".idx", bad);
  expect_error("bad magic", "magic");
  bad = idx;
  bad[9] = 2;
  write_all(prefix + ".idx", bad);
  expect_error("version", "version");
  bad = idx;
  bad[17] = 42;
  write_all(prefix + ".idx", bad);
  expect_error("dtype code", "dtype");
  bad = idx;
  bad[17] = 7;  // float32
  write_all(prefix + ".idx", bad);
  expect_error("float dtype", "float32");
  bad = idx;
  bad[18] = static_cast<char>(0xFF);  // sequence count absurd
  write_all(prefix + ".idx", bad);
  expect_error("count", "sequences");
  bad = idx;
  bad[34] = static_cast<char>(bad[34] + 1);  // first size off by one: pointers no longer line up
  write_all(prefix + ".idx", bad);
  expect_error("sizes vs pointers", "back to back");
  bad = idx;
  bad[bad.size() - 8] = static_cast<char>(bad[bad.size() - 8] - 1);  // last doc_idx entry
  write_all(prefix + ".idx", bad);
  expect_error("doc_idx", "doc_idx");

  fs::remove(prefix + ".bin");
  auto missing = IndexedDataset::open(prefix);
  REQUIRE_FALSE(missing.is_ok());
  CHECK_THAT(missing.status().message(), Catch::Contains("ds.bin"));
}

TEST_CASE("indexed dataset: every one-byte corruption of .idx is refused or read in bounds",
          "[indexed_dataset]") {
  troupe::test::TempDir dir;
  const std::string prefix = dir.str("ds");
  write(prefix, IndexDType::u16, {{{{1, 2, 3}, {4}}}, {{{5, 6}}}});
  const std::string idx = read_all(prefix + ".idx");
  int refused = 0;
  for (size_t at = 0; at < idx.size(); ++at) {
    for (const char value : {'\xff', '\x80', '\x01', '\x00'}) {
      std::string bad = idx;
      if (bad[at] == value) continue;
      bad[at] = value;
      write_all(prefix + ".idx", bad);
      auto ds = IndexedDataset::open(prefix);
      if (!ds.is_ok()) {
        ++refused;
        CHECK_THAT(ds.status().message(), Catch::Contains(" -- "));
        continue;
      }
      // Accepted: the counts agree with the files, so the whole stream reads (ASan builds check).
      std::vector<int32_t> stream(static_cast<size_t>((*ds)->total_tokens()));
      (*ds)->read_tokens(0, (*ds)->total_tokens(), stream.data());
      const auto item = static_cast<int64_t>(troupe::index_dtype_size((*ds)->dtype()));
      CHECK((*ds)->total_tokens() * item == static_cast<int64_t>(read_all(prefix + ".bin").size()));
    }
  }
  CHECK(refused > 0);
}

TEST_CASE("indexed dataset: a size field larger than .bin is refused before use",
          "[indexed_dataset]") {
  troupe::test::TempDir dir;
  const std::string prefix = dir.str("ds");
  write(prefix, IndexDType::u16, {{{{1, 2, 3}}}, {{{4, 5}}}});
  std::string idx = read_all(prefix + ".idx");
  const int32_t huge = 2147483647;
  std::memcpy(idx.data() + 34 + 4, &huge, 4);  // the last sequence's size
  write_all(prefix + ".idx", idx);
  auto ds = IndexedDataset::open(prefix);
  REQUIRE_FALSE(ds.is_ok());
  CHECK_THAT(ds.status().message(),
             Catch::Contains("sequence 1 of 2147483647 tokens ends past the end"));
}

TEST_CASE("indexed dataset: a FIFO or a directory at the path is refused, not waited on",
          "[indexed_dataset]") {
  troupe::test::TempDir dir;
  const std::string prefix = dir.str("ds");
  write(prefix, IndexDType::u16, {{{{1, 2, 3}}}});
  fs::remove(prefix + ".idx");
  REQUIRE(::mkfifo((prefix + ".idx").c_str(), 0600) == 0);  // opening it for reading would block
  auto fifo = IndexedDataset::open(prefix);
  REQUIRE_FALSE(fifo.is_ok());
  CHECK_THAT(fifo.status().message(), Catch::Contains("ds.idx: not a regular file"));
  fs::remove(prefix + ".idx");
  fs::create_directory(prefix + ".idx");
  CHECK_FALSE(IndexedDataset::open(prefix).is_ok());
}

TEST_CASE("indexed dataset: int64 token ids are checked at full width, never narrowed",
          "[indexed_dataset]") {
  troupe::test::TempDir dir;
  const std::string prefix = dir.str("ds");
  write(prefix, IndexDType::i64, {{{{1, 2, 3}}}, {{{4, 7, 6}}}});
  std::string bin = read_all(prefix + ".bin");
  const int64_t wide = (int64_t{1} << 32) + 7;  // narrowed to int32 it would read as 7
  std::memcpy(bin.data() + 8 * 4, &wide, 8);
  write_all(prefix + ".bin", bin);
  auto ds = IndexedDataset::open(prefix);
  REQUIRE(ds.is_ok());
  const auto bad = (*ds)->first_token_outside(257);
  REQUIRE(bad.has_value());
  CHECK(bad->value == wide);
  CHECK(bad->stream_offset == 4);
  CHECK(bad->sequence == 1);
  std::vector<int32_t> tokens(6);
  (*ds)->read_tokens(0, 6, tokens.data());
  CHECK(tokens == std::vector<int32_t>{1, 2, 3, 4, -1, 6});
  // Negative ids and ids at the vocabulary's end are outside too; the first one is reported.
  const int64_t negative = -5;
  std::memcpy(bin.data() + 8, &negative, 8);
  write_all(prefix + ".bin", bin);
  auto again = IndexedDataset::open(prefix);
  REQUIRE(again.is_ok());
  CHECK((*again)->first_token_outside(257)->value == -5);
  CHECK((*again)->first_token_outside(257)->sequence == 0);
  write(prefix, IndexDType::u16, {{{{1, 256}}}});
  auto small = IndexedDataset::open(prefix);
  REQUIRE(small.is_ok());
  CHECK_FALSE((*small)->first_token_outside(257).has_value());
  CHECK((*small)->first_token_outside(256)->value == 256);
}

TEST_CASE("indexed dataset: temporaries are 0600 and planted symlinks are never followed",
          "[indexed_dataset]") {
  troupe::test::TempDir dir;
  const std::string prefix = dir.str("ds");
  const fs::path victim = dir.path() / "victim";
  const std::string precious = "must stay as it is";
  std::ofstream(victim) << precious;
  // Symlinks at the old predictable temporary names (PREFIX.bin.tmp.<pid>) and at the outputs.
  const std::string pid = std::to_string(::getpid());
  for (const std::string name :
       {"ds.bin.tmp." + pid, "ds.idx.tmp." + pid, std::string("ds.bin"), std::string("ds.idx")})
    fs::create_symlink(victim, dir.path() / name);

  auto b = IndexedDatasetBuilder::create(prefix, IndexDType::u16);
  REQUIRE(b.is_ok());
  std::vector<int32_t> seq{1, 2, 3};
  REQUIRE((*b)->add_item(seq).is_ok());
  (*b)->end_document();
  int temporaries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ds.bin.tmp.", 0) != 0 || e.is_symlink()) continue;
    ++temporaries;
    struct stat st {};
    REQUIRE(::lstat(e.path().c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK((st.st_mode & 07777) == 0600);
  }
  CHECK(temporaries == 1);
  REQUIRE((*b)->finalize().is_ok());

  CHECK(read_all(victim.string()) == precious);
  CHECK_FALSE(fs::is_symlink(prefix + ".bin"));  // the outputs replaced the symlinks
  CHECK_FALSE(fs::is_symlink(prefix + ".idx"));
  auto ds = IndexedDataset::open(prefix);
  REQUIRE(ds.is_ok());
  CHECK((*ds)->total_tokens() == 3);
  // The finished files have the umask's mode, as if written directly.
  const mode_t mask = ::umask(022);
  ::umask(mask);
  struct stat st {};
  REQUIRE(::stat((prefix + ".bin").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == (0666 & ~mask));
  // The old-style temporary symlinks are untouched (they were never used).
  CHECK(fs::is_symlink(dir.path() / ("ds.bin.tmp." + pid)));
}
