// Megatron's memory-mapped indexed dataset ("MMIDIDX", what tools/preprocess_data.py writes with
// --dataset-impl mmap), byte-compatible both ways. A dataset is two files, PREFIX.idx and
// PREFIX.bin; the layout is specified in docs/DATA.md:
//
//   .idx  offset 0   9 bytes  magic "MMIDIDX\0\0"
//               9    uint64   version = 1
//              17    uint8    dtype code (IndexDType)
//              18    uint64   N = number of sequences
//              26    uint64   D = number of doc_idx entries (documents + 1)
//              34    int32    sizes[N]            tokens per sequence
//          34+4N     int64    pointers[N]         byte offset of each sequence in .bin
//         34+12N     int64    doc_idx[D]          0, then the sequence count after each document
//   .bin  every sequence's tokens back to back, little-endian, in the dtype.
//
// All integers are little-endian (troupe supports little-endian hosts only). The arrays in .idx are
// not aligned; the reader copies values out with memcpy.
//
// The stream: the concatenation of all sequences in order. troupe reads tokens by stream offset;
// the reader requires the sequences to lie back to back from offset 0 (as Megatron writes them).
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py DType).
enum class IndexDType : uint8_t {
  u8 = 1,
  i8 = 2,
  i16 = 3,
  i32 = 4,
  i64 = 5,
  f64 = 6,
  f32 = 7,
  u16 = 8
};

size_t index_dtype_size(IndexDType t);
const char* index_dtype_name(IndexDType t);  // numpy's names: "uint16", "int32", ...
// Megatron's rule: uint16 when the vocabulary has fewer than 65500 ids, else int32.
IndexDType token_dtype_for_vocab(int64_t vocab_size);

inline std::string idx_path(const std::string& prefix) {
  return prefix + ".idx";
}
inline std::string bin_path(const std::string& prefix) {
  return prefix + ".bin";
}

struct TokenOutside {
  int64_t stream_offset = 0;  // position in the token stream
  int64_t value = 0;          // the id as stored
  int64_t sequence = 0;       // the sequence holding it
};

// Reader. Immutable after open and thread-safe; the mappings live as long as the object.
class IndexedDataset {
 public:
  // Maps PREFIX.idx and PREFIX.bin and validates them: regular files, magic, version, an integer
  // dtype code, the .idx length against its counts, doc_idx (starts at 0, non-decreasing, ends at
  // N), and that the sequences lie back to back and exactly fill .bin. Nothing is allocated from a
  // count before it is checked against the file's length, and every later access stays inside the
  // mappings. Errors name the file, what is inconsistent and the fix. (A file truncated by another
  // process while mapped raises SIGBUS on access, as with any mmap reader; troupe never writes a
  // dataset in place, it renames complete files over it.)
  static Result<std::shared_ptr<IndexedDataset>> open(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  IndexDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_idx_ - 1; }
  int64_t total_tokens() const { return total_tokens_; }

  // Element accessors over the .idx arrays (bounds are checked).
  int32_t size(int64_t sequence) const;     // tokens in the sequence
  int64_t pointer(int64_t sequence) const;  // byte offset in .bin
  int64_t doc_idx(int64_t i) const;         // i in [0, num_documents()]
  // Copies of the arrays (O(N) memory; for tests and tools).
  std::vector<int32_t> sizes() const;
  std::vector<int64_t> pointers() const;
  std::vector<int64_t> doc_indices() const;

  // Token offset in the stream where sequence `sequence` / document `doc` starts; the argument
  // equal to the count (num_sequences() / num_documents()) gives total_tokens().
  int64_t sequence_token_offset(int64_t sequence) const;
  int64_t document_token_offset(int64_t doc) const;

  // Copies stream tokens [stream_offset, stream_offset + count) into out, converted to int32; an
  // int64 value outside int32's range comes out as -1 (never narrowed to another id). Precondition
  // (checked): the range lies inside [0, total_tokens()].
  void read_tokens(int64_t stream_offset, int64_t count, int32_t* out) const;

  // The first token of the stream outside [0, vocab_size), read at the dtype's full width (an int64
  // 2^32 + 7 is 2^32 + 7 here), or nullopt when every token is a valid id. One pass over .bin.
  std::optional<TokenOutside> first_token_outside(int64_t vocab_size) const;
  // The sequence holding stream token `stream_offset` (in [0, total_tokens())).
  int64_t sequence_at(int64_t stream_offset) const;

 private:
  IndexedDataset() = default;

  std::string prefix_;
  IndexDType dtype_ = IndexDType::u16;
  int64_t num_sequences_ = 0;
  int64_t num_doc_idx_ = 0;
  int64_t total_tokens_ = 0;
  const uint8_t* idx_ = nullptr;  // the .idx mapping
  size_t idx_bytes_ = 0;
  const uint8_t* bin_ = nullptr;  // the .bin mapping (null when empty)
  size_t bin_bytes_ = 0;
};

// Writer. Tokens go to a temporary .bin as they come; finish() writes the temporary .idx; commit()
// renames both into place. The temporaries are PREFIX.{bin,idx}.tmp.<random>, created with O_EXCL |
// O_NOFOLLOW and mode 0600 (storage/temp_file.hpp: a planted symlink is never followed); finish()
// gives them the umask's mode an output file would have. A builder destroyed before commit()
// removes its temporaries, so a failure leaves no partial output (and leaves any earlier dataset
// under the prefix untouched). Not thread-safe: one thread drives a builder.
class IndexedDatasetBuilder {
 public:
  static Result<std::unique_ptr<IndexedDatasetBuilder>> create(const std::string& prefix,
                                                               IndexDType dtype);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // Appends one sequence. Fails if a token does not fit the dtype or the write fails.
  Status add_item(std::span<const int32_t> tokens);
  // Closes the current document (appends the sequence count to doc_idx).
  void end_document();
  // Writes and fsyncs both temporaries. No more items may be added afterwards.
  Status finish();
  // Renames the temporaries to PREFIX.bin / PREFIX.idx (finish() first).
  Status commit();
  // finish() then commit().
  Status finalize();

  int64_t num_sequences() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_idx_.size()) - 1; }
  int64_t total_tokens() const { return total_tokens_; }

 private:
  IndexedDatasetBuilder() = default;

  std::string prefix_;
  IndexDType dtype_ = IndexDType::u16;
  std::FILE* bin_ = nullptr;
  std::string tmp_bin_, tmp_idx_;  // the temporaries' names ("" before they exist)
  std::vector<int32_t> sizes_;
  std::vector<int64_t> doc_idx_{0};
  int64_t total_tokens_ = 0;
  std::vector<uint8_t> buffer_;  // one item converted to the dtype
  bool finished_ = false;
  bool committed_ = false;
};

}  // namespace troupe
