#include "storage/indexed_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "storage/temp_file.hpp"

namespace troupe {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, N, D

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // unaligned-safe; little-endian host assumed (see header)
  return v;
}

std::string rerun_fix(const std::string& prefix) {
  return "re-run troupe preprocess to rewrite " + prefix +
         ".{bin,idx}, or pass the prefix of a complete "
         "dataset";
}

struct Mapping {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

Result<Mapping> map_file(const std::string& path) {
  // O_NONBLOCK: a FIFO planted at the path must not block the open; it is refused below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return Status::bad_input(path + ": cannot open (" + std::strerror(errno) +
                         ") -- check the data prefix, or " +
                         "create the dataset with troupe preprocess");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::bad_input(path + ": cannot stat (" + std::strerror(err) + ") -- check the file");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::bad_input(path + ": not a regular file -- pass the prefix of a dataset written by " +
                         "troupe preprocess");
  }
  Mapping m;
  m.bytes = static_cast<size_t>(st.st_size);
  if (m.bytes > 0) {
    void* p = ::mmap(nullptr, m.bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Status::error(path + ": cannot mmap (" + std::strerror(err) +
                           ") -- check the file and memory limits");
    }
    m.data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid
  return m;
}

bool is_integer(IndexDType t) {
  return t != IndexDType::f32 && t != IndexDType::f64;
}

// Range of values a token dtype holds, for the writer's check.
bool fits(IndexDType t, int32_t v) {
  switch (t) {
    case IndexDType::u8:
      return v >= 0 && v <= 255;
    case IndexDType::i8:
      return v >= -128 && v <= 127;
    case IndexDType::i16:
      return v >= -32768 && v <= 32767;
    case IndexDType::u16:
      return v >= 0 && v <= 65535;
    default:
      return true;
  }
}

// Flushes, gives the finished temporary the mode the output should have (it was created 0600),
// and syncs it to disk.
Status finish_file(std::FILE* f, const std::string& path) {
  if (std::fflush(f) != 0 || ::fchmod(::fileno(f), default_file_mode()) != 0 ||
      ::fsync(::fileno(f)) != 0) {
    return Status::error(path + ": write failed (" + std::strerror(errno) +
                         ") -- check free disk space");
  }
  return Status::ok();
}

// A temporary for `path` (storage/temp_file.hpp: O_EXCL | O_NOFOLLOW, 0600, a random name) as a
// buffered stream.
Result<std::FILE*> open_temporary(const std::string& path, std::string* tmp_path) {
  auto tmp = create_temp_file(path);
  if (!tmp) {
    return Status::error(tmp.status().message() +
                         " (check that the --output-prefix directory exists and is writable)");
  }
  *tmp_path = tmp->path;
  std::FILE* f = ::fdopen(tmp->fd, "wb");
  if (!f) {
    const int err = errno;
    ::close(tmp->fd);
    return Status::error(tmp->path + ": cannot open (" + std::strerror(err) + ")");
  }
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  return f;
}

}  // namespace

size_t index_dtype_size(IndexDType t) {
  switch (t) {
    case IndexDType::u8:
    case IndexDType::i8:
      return 1;
    case IndexDType::i16:
    case IndexDType::u16:
      return 2;
    case IndexDType::i32:
    case IndexDType::f32:
      return 4;
    case IndexDType::i64:
    case IndexDType::f64:
      return 8;
  }
  TROUPE_CHECK(false, "unknown IndexDType");
  return 0;
}

const char* index_dtype_name(IndexDType t) {
  switch (t) {
    case IndexDType::u8:
      return "uint8";
    case IndexDType::i8:
      return "int8";
    case IndexDType::i16:
      return "int16";
    case IndexDType::i32:
      return "int32";
    case IndexDType::i64:
      return "int64";
    case IndexDType::f64:
      return "float64";
    case IndexDType::f32:
      return "float32";
    case IndexDType::u16:
      return "uint16";
  }
  return "unknown";
}

IndexDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDType::u16 : IndexDType::i32;
}

// ---- reader ----

Result<std::shared_ptr<IndexedDataset>> IndexedDataset::open(const std::string& prefix) {
  std::shared_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  const std::string ipath = idx_path(prefix), bpath = bin_path(prefix);
  auto idx = map_file(ipath);
  if (!idx) return idx.status();
  ds->idx_ = idx->data;
  ds->idx_bytes_ = idx->bytes;
  auto bin = map_file(bpath);
  if (!bin) return bin.status();
  ds->bin_ = bin->data;
  ds->bin_bytes_ = bin->bytes;
  const std::string fix = rerun_fix(prefix);

  const uint8_t* p = ds->idx_;
  if (ds->idx_bytes_ < kHeaderBytes) {
    return Status::bad_input(ipath + ": " + std::to_string(ds->idx_bytes_) +
                         " bytes, shorter than the " + std::to_string(kHeaderBytes) +
                         "-byte MMIDIDX header (truncated) -- " + fix);
  }
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    return Status::bad_input(ipath +
                         ": not a Megatron MMIDIDX index (bad magic; other indexed-dataset "
                         "formats such as --dataset-impl lazy/cached are not supported) -- " +
                         fix);
  }
  auto version = load<uint64_t>(p + 9);
  if (version != kVersion) {
    return Status::bad_input(ipath + ": MMIDIDX version " + std::to_string(version) +
                         ", troupe reads version 1 -- " + fix);
  }
  uint8_t code = p[17];
  if (code < 1 || code > 8) {
    return Status::bad_input(ipath + ": unknown dtype code " + std::to_string(code) + " -- " + fix);
  }
  ds->dtype_ = static_cast<IndexDType>(code);
  if (!is_integer(ds->dtype_)) {
    return Status::bad_input(ipath + ": dtype " + index_dtype_name(ds->dtype_) +
                         " cannot hold token ids -- " + fix);
  }
  auto n = load<uint64_t>(p + 18), d = load<uint64_t>(p + 26);
  // Compare in a wide type so absurd counts (a corrupt header) cannot overflow.
  const unsigned __int128 need =
      (unsigned __int128)kHeaderBytes + (unsigned __int128)n * 12 + (unsigned __int128)d * 8;
  if (need != ds->idx_bytes_) {
    return Status::bad_input(ipath + ": " + std::to_string(ds->idx_bytes_) +
                         " bytes, but its header counts " + std::to_string(n) + " sequences and " +
                         std::to_string(d) + " doc_idx entries, which " + "take " +
                         (need > (1ull << 62) ? std::string("far more")
                                              : std::to_string(static_cast<uint64_t>(need))) +
                         " bytes (" + (need > ds->idx_bytes_ ? "truncated" : "trailing garbage") +
                         ") -- " + fix);
  }
  if (d < 1) return Status::bad_input(ipath + ": doc_idx is empty (it must start with 0) -- " + fix);
  ds->num_sequences_ = static_cast<int64_t>(n);
  ds->num_doc_idx_ = static_cast<int64_t>(d);

  // Sequences back to back from 0; count tokens.
  // Sizes are summed only while they fit in .bin, so a corrupt size cannot overflow the sum.
  const auto item = static_cast<int64_t>(index_dtype_size(ds->dtype_));
  const auto bin_tokens = static_cast<int64_t>(ds->bin_bytes_ / static_cast<size_t>(item));
  int64_t offset = 0;
  for (int64_t i = 0; i < ds->num_sequences_; ++i) {
    int32_t size = ds->size(i);
    int64_t ptr = ds->pointer(i);
    if (size < 0 || ptr != offset * item) {
      return Status::bad_input(ipath + ": sequence " + std::to_string(i) + " has size " +
                           std::to_string(size) + " at byte " + std::to_string(ptr) +
                           ", expected byte " + std::to_string(offset * item) +
                           " (sequences must lie back to back in .bin) -- " + fix);
    }
    if (size > bin_tokens - offset) {
      return Status::bad_input(bpath + ": " + std::to_string(ds->bin_bytes_) + " bytes, but " + ipath +
                           " describes more (sequence " + std::to_string(i) + " of " +
                           std::to_string(size) + " tokens ends past the end; .bin truncated, or " +
                           "the two files do not belong together) -- " + fix);
    }
    offset += size;
  }
  ds->total_tokens_ = offset;
  if (static_cast<uint64_t>(offset * item) != ds->bin_bytes_) {
    return Status::bad_input(
        bpath + ": " + std::to_string(ds->bin_bytes_) + " bytes, but " + ipath + " describes " +
        std::to_string(offset) + " " + index_dtype_name(ds->dtype_) +
        " tokens = " + std::to_string(offset * item) + " bytes (" +
        (static_cast<uint64_t>(offset * item) > ds->bin_bytes_ ? ".bin truncated"
                                                               : ".bin longer than indexed") +
        "; the two files do not belong together) -- " + fix);
  }
  int64_t prev = 0;
  for (int64_t i = 0; i < ds->num_doc_idx_; ++i) {
    int64_t v = ds->doc_idx(i);
    bool ok = (i == 0 ? v == 0 : v >= prev) && v <= ds->num_sequences_ &&
              (i + 1 < ds->num_doc_idx_ || v == ds->num_sequences_);
    if (!ok) {
      return Status::bad_input(
          ipath + ": doc_idx[" + std::to_string(i) + "] = " + std::to_string(v) +
          " breaks the rule (starts at 0, non-decreasing, ends at the sequence count " +
          std::to_string(ds->num_sequences_) + ") -- " + fix);
    }
    prev = v;
  }
  return ds;
}

IndexedDataset::~IndexedDataset() {
  if (idx_) ::munmap(const_cast<uint8_t*>(idx_), idx_bytes_);
  if (bin_) ::munmap(const_cast<uint8_t*>(bin_), bin_bytes_);
}

int32_t IndexedDataset::size(int64_t sequence) const {
  TROUPE_CHECK(sequence >= 0 && sequence < num_sequences_, "sequence index out of range");
  return load<int32_t>(idx_ + kHeaderBytes + 4 * sequence);
}

int64_t IndexedDataset::pointer(int64_t sequence) const {
  TROUPE_CHECK(sequence >= 0 && sequence < num_sequences_, "sequence index out of range");
  return load<int64_t>(idx_ + kHeaderBytes + 4 * num_sequences_ + 8 * sequence);
}

int64_t IndexedDataset::doc_idx(int64_t i) const {
  TROUPE_CHECK(i >= 0 && i < num_doc_idx_, "doc_idx index out of range");
  return load<int64_t>(idx_ + kHeaderBytes + 12 * num_sequences_ + 8 * i);
}

std::vector<int32_t> IndexedDataset::sizes() const {
  std::vector<int32_t> v(num_sequences_);
  for (int64_t i = 0; i < num_sequences_; ++i) v[i] = size(i);
  return v;
}

std::vector<int64_t> IndexedDataset::pointers() const {
  std::vector<int64_t> v(num_sequences_);
  for (int64_t i = 0; i < num_sequences_; ++i) v[i] = pointer(i);
  return v;
}

std::vector<int64_t> IndexedDataset::doc_indices() const {
  std::vector<int64_t> v(num_doc_idx_);
  for (int64_t i = 0; i < num_doc_idx_; ++i) v[i] = doc_idx(i);
  return v;
}

int64_t IndexedDataset::sequence_token_offset(int64_t sequence) const {
  if (sequence == num_sequences_) return total_tokens_;
  return pointer(sequence) / static_cast<int64_t>(index_dtype_size(dtype_));
}

int64_t IndexedDataset::document_token_offset(int64_t doc) const {
  TROUPE_CHECK(doc >= 0 && doc <= num_documents(), "document index out of range");
  return sequence_token_offset(doc_idx(doc));
}

void IndexedDataset::read_tokens(int64_t stream_offset, int64_t count, int32_t* out) const {
  TROUPE_CHECK(stream_offset >= 0 && count >= 0 && stream_offset + count <= total_tokens_,
               "read_tokens range outside the dataset's token stream");
  const uint8_t* src = bin_ + stream_offset * static_cast<int64_t>(index_dtype_size(dtype_));
  switch (dtype_) {
    case IndexDType::u16:
      for (int64_t i = 0; i < count; ++i) out[i] = load<uint16_t>(src + 2 * i);
      break;
    case IndexDType::i32:
      if (count > 0) std::memcpy(out, src, static_cast<size_t>(count) * 4);
      break;
    case IndexDType::u8:
      for (int64_t i = 0; i < count; ++i) out[i] = src[i];
      break;
    case IndexDType::i8:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int8_t>(src[i]);
      break;
    case IndexDType::i16:
      for (int64_t i = 0; i < count; ++i) out[i] = load<int16_t>(src + 2 * i);
      break;
    case IndexDType::i64:
      // Never narrow: an id that does not fit int32 (2^32 + 7) comes out as -1, which no vocabulary
      // holds, so a caller's range check refuses it instead of reading 7.
      for (int64_t i = 0; i < count; ++i) {
        const auto v = load<int64_t>(src + 8 * i);
        out[i] = v >= INT32_MIN && v <= INT32_MAX ? static_cast<int32_t>(v) : -1;
      }
      break;
    case IndexDType::f32:
    case IndexDType::f64:
      TROUPE_CHECK(false, "float datasets are rejected by open()");
  }
}

namespace {

// The first of `count` values of type T at `src` outside [0, vocab_size), as its index; -1 if none.
template <class T>
int64_t first_outside(const uint8_t* src, int64_t count, int64_t vocab_size) {
  for (int64_t i = 0; i < count; ++i) {
    const auto v = static_cast<int64_t>(load<T>(src + sizeof(T) * i));
    if (v < 0 || v >= vocab_size) return i;
  }
  return -1;
}

}  // namespace

std::optional<TokenOutside> IndexedDataset::first_token_outside(int64_t vocab_size) const {
  const int64_t n = total_tokens_;
  int64_t at = -1;
  switch (dtype_) {
    case IndexDType::u8:
      at = vocab_size >= 256 ? -1 : first_outside<uint8_t>(bin_, n, vocab_size);
      break;
    case IndexDType::u16:
      at = vocab_size >= 65536 ? -1 : first_outside<uint16_t>(bin_, n, vocab_size);
      break;
    case IndexDType::i8:
      at = first_outside<int8_t>(bin_, n, vocab_size);
      break;
    case IndexDType::i16:
      at = first_outside<int16_t>(bin_, n, vocab_size);
      break;
    case IndexDType::i32:
      at = first_outside<int32_t>(bin_, n, vocab_size);
      break;
    case IndexDType::i64:
      at = first_outside<int64_t>(bin_, n, vocab_size);
      break;
    case IndexDType::f32:
    case IndexDType::f64:
      TROUPE_CHECK(false, "float datasets are rejected by open()");
  }
  if (at < 0) return std::nullopt;
  TokenOutside t;
  t.stream_offset = at;
  const auto item = static_cast<int64_t>(index_dtype_size(dtype_));
  const uint8_t* p = bin_ + at * item;
  switch (dtype_) {
    case IndexDType::u8:
      t.value = *p;
      break;
    case IndexDType::i8:
      t.value = static_cast<int8_t>(*p);
      break;
    case IndexDType::u16:
      t.value = load<uint16_t>(p);
      break;
    case IndexDType::i16:
      t.value = load<int16_t>(p);
      break;
    case IndexDType::i32:
      t.value = load<int32_t>(p);
      break;
    default:
      t.value = load<int64_t>(p);
      break;
  }
  t.sequence = sequence_at(at);
  return t;
}

int64_t IndexedDataset::sequence_at(int64_t stream_offset) const {
  TROUPE_CHECK(stream_offset >= 0 && stream_offset < total_tokens_,
               "sequence_at: offset outside the token stream");
  // The last sequence starting at or before the offset (empty sequences share a start).
  int64_t lo = 0, hi = num_sequences_ - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (sequence_token_offset(mid) <= stream_offset) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// ---- writer ----

Result<std::unique_ptr<IndexedDatasetBuilder>> IndexedDatasetBuilder::create(
    const std::string& prefix, IndexDType dtype) {
  if (!is_integer(dtype)) {
    return Status::error(std::string("dataset dtype ") + index_dtype_name(dtype) +
                         " cannot hold token ids -- use uint16 or int32");
  }
  std::unique_ptr<IndexedDatasetBuilder> b(new IndexedDatasetBuilder());
  b->prefix_ = prefix;
  b->dtype_ = dtype;
  auto bin = open_temporary(bin_path(prefix), &b->tmp_bin_);
  if (!bin) return bin.status();
  b->bin_ = bin.value();
  return b;
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_) std::fclose(bin_);
  if (!committed_) {
    for (const std::string* tmp : {&tmp_bin_, &tmp_idx_})
      if (!tmp->empty()) ::unlink(tmp->c_str());
  }
}

Status IndexedDatasetBuilder::add_item(std::span<const int32_t> tokens) {
  TROUPE_CHECK(!finished_, "add_item after finish()");
  TROUPE_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
               "one sequence is limited to 2^31-1 tokens by the format's int32 sizes");
  const size_t item = index_dtype_size(dtype_);
  buffer_.resize(tokens.size() * item);
  uint8_t* dst = buffer_.data();
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t t = tokens[i];
    if (!fits(dtype_, t)) {
      return Status::error("token id " + std::to_string(t) + " does not fit the dataset dtype " +
                           index_dtype_name(dtype_) +
                           " -- use a dtype for the tokenizer's vocabulary (int32 "
                           "for 65500 ids or more)");
    }
    switch (dtype_) {
      case IndexDType::u8:
      case IndexDType::i8:
        dst[i] = static_cast<uint8_t>(t);
        break;
      case IndexDType::u16:
      case IndexDType::i16: {
        auto v = static_cast<uint16_t>(t);
        std::memcpy(dst + 2 * i, &v, 2);
        break;
      }
      case IndexDType::i32:
        std::memcpy(dst + 4 * i, &t, 4);
        break;
      case IndexDType::i64: {
        int64_t v = t;
        std::memcpy(dst + 8 * i, &v, 8);
        break;
      }
      default:
        TROUPE_CHECK(false, "float dtypes are rejected by create()");
    }
  }
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size()) {
    return Status::error(tmp_bin_ + ": write failed (" + std::strerror(errno) +
                         ") -- check free disk space");
  }
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  total_tokens_ += static_cast<int64_t>(tokens.size());
  return Status::ok();
}

void IndexedDatasetBuilder::end_document() {
  TROUPE_CHECK(!finished_, "end_document after finish()");
  doc_idx_.push_back(static_cast<int64_t>(sizes_.size()));
}

Status IndexedDatasetBuilder::finish() {
  TROUPE_CHECK(!finished_, "finish() called twice");
  finished_ = true;
  Status st = finish_file(bin_, tmp_bin_);
  std::fclose(bin_);
  bin_ = nullptr;
  TROUPE_RETURN_IF_ERROR(st);

  auto idx = open_temporary(idx_path(prefix_), &tmp_idx_);
  if (!idx) return idx.status();
  std::FILE* f = idx.value();
  const std::string& tidx = tmp_idx_;
  const uint64_t n = sizes_.size(), d = doc_idx_.size();
  const auto dtype_code = static_cast<uint8_t>(dtype_);
  const int64_t item = static_cast<int64_t>(index_dtype_size(dtype_));
  std::vector<int64_t> pointers(n);
  int64_t offset = 0;
  for (uint64_t i = 0; i < n; ++i) {
    pointers[i] = offset;
    offset += static_cast<int64_t>(sizes_[i]) * item;
  }
  bool ok = std::fwrite(kMagic, 1, 9, f) == 9 && std::fwrite(&kVersion, 8, 1, f) == 1 &&
            std::fwrite(&dtype_code, 1, 1, f) == 1 && std::fwrite(&n, 8, 1, f) == 1 &&
            std::fwrite(&d, 8, 1, f) == 1 && (n == 0 || std::fwrite(sizes_.data(), 4, n, f) == n) &&
            (n == 0 || std::fwrite(pointers.data(), 8, n, f) == n) &&
            std::fwrite(doc_idx_.data(), 8, d, f) == d;
  if (!ok) {
    std::fclose(f);
    return Status::error(tidx + ": write failed (" + std::strerror(errno) +
                         ") -- check free disk space");
  }
  st = finish_file(f, tidx);
  std::fclose(f);
  return st;
}

Status IndexedDatasetBuilder::commit() {
  TROUPE_CHECK(finished_ && !committed_, "commit() needs finish() first, and only once");
  // rename() replaces whatever is at the final name, a symlink included, without following it.
  for (const auto& [tmp, path] :
       {std::pair{&tmp_bin_, bin_path(prefix_)}, std::pair{&tmp_idx_, idx_path(prefix_)}}) {
    if (std::rename(tmp->c_str(), path.c_str()) != 0) {
      return Status::error(path + ": cannot rename into place (" + std::strerror(errno) +
                           ") -- check that the --output-prefix directory is writable");
    }
  }
  committed_ = true;
  // Make the renames durable.
  std::filesystem::path dir = std::filesystem::path(prefix_).parent_path();
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  return Status::ok();
}

Status IndexedDatasetBuilder::finalize() {
  TROUPE_RETURN_IF_ERROR(finish());
  return commit();
}

}  // namespace troupe
