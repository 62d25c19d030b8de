// A bounded reader for the part of the HDF5 format that troupe writes, so that no checkpoint byte
// from outside ever reaches libhdf5's parser (HDF5 1.10 crashes, loops or allocates gigabytes on
// crafted files: docs/CHECKPOINT.md, "What readers verify"). libhdf5 still writes every file, so
// h5py and h5dump read them as before.
//
// What it reads (the layout libhdf5 1.10 writes with its default, earliest-format settings):
// superblock version 0 or 1 with 8-byte offsets and lengths, at byte 0 or after a user block of
// 512, 1024, ... bytes; version-1 object headers with continuation chunks; old-style groups (symbol
// table message, version-1 B-tree of group nodes, symbol table nodes, local heap); datasets with a
// version-1 or -2 dataspace of rank <= 32, a little-endian IEEE f32 / f64 or signed i64 datatype
// and a contiguous version-3 layout, no filters and no external storage; scalar attributes of those
// numeric types or strings, fixed-length or variable-length (the global heap). Anything else is an
// error saying the file was not written by troupe.
//
// Bounds: every address and length is checked against the file's size before it is used, every
// allocation is sized by such a checked length (never more than the file holds, and at most
// Limits::max_block for one structure), walks visit each node once, the counts of header chunks,
// messages and links are capped, and the bytes read for structures (not data) over the File's
// life are at most Limits::read_factor times the file's size (plus 1 MiB): structures that point
// at each other over and over are refused rather than re-read. So a reader of an N-byte file
// allocates O(N) at most and does O(N log N) work, whatever the bytes.
//
// Thread safety: a File is read-only after open and may be used from several threads at once when
// its ByteSource allows (both sources here do).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::h5read {

// The bytes of one file. read() fails (never reads short) when [offset, offset + n) is not inside
// [0, size()).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  virtual Status read(uint64_t offset, void* out, size_t n) const = 0;
  // Names these exact bytes while they do not change (a file's device, inode, size and times), so a
  // check of them can be remembered; "" when they cannot be named (memory).
  virtual std::string identity() const { return ""; }
};

// A regular file read with pread; the file stays open while the source lives. The size is taken at
// open: a file that shrinks later reads as damaged.
Result<std::shared_ptr<ByteSource>> open_file_source(const std::string& path);
// Bytes in memory (tests and fuzz targets).
std::shared_ptr<ByteSource> memory_source(std::string bytes);

enum class ElementType : uint8_t { f32, f64, i64, string, other };
const char* element_type_name(ElementType t);

struct Attribute {
  ElementType type = ElementType::other;  // f64, i64 or string (anything else is refused at open)
  int64_t i = 0;
  double f = 0;
  std::string s;
};

// One object: a group (has_group) or a dataset (has_dataset), with its attributes.
struct Object {
  uint64_t header = 0;  // address of its object header (relative to the file's base)
  bool has_group = false;
  uint64_t btree = 0, heap = 0;  // group: its symbol table
  bool has_dataset = false;
  ElementType type = ElementType::other;
  bool scalar = false;        // a scalar dataspace (dims empty, one element)
  std::vector<int64_t> dims;  // simple dataspace
  int64_t numel = 0;          // checked: fits int64 and numel * element size == data_bytes
  uint64_t data_offset = 0;   // absolute byte offset of the contiguous data in the file
  uint64_t data_bytes = 0;
  std::map<std::string, Attribute> attributes;
};

struct Limits {
  uint64_t max_block = uint64_t{64} << 20;  // one header chunk, heap or string
  int max_chunks = 256;                     // header chunks per object
  int max_messages = 4096;                  // header messages per object
  size_t max_links = size_t{1} << 20;       // links in one group
  uint64_t read_factor = 8;                 // structure bytes read, per byte of the file
};

class File {
 public:
  // Finds and checks the superblock. The size recorded there must fit the source (a truncated file
  // is named as such).
  static Result<std::unique_ptr<File>> open(std::shared_ptr<const ByteSource> source,
                                            const Limits& limits = {});

  uint64_t base() const { return base_; }
  const Object& root() const { return root_; }
  // The object at `path` below the root ("model", "optimizer/exp_avg", "model/x.runs"); an error
  // when a component is missing ("... is missing") or is not a group.
  Result<Object> at_path(const std::string& path) const;
  // The links of a group: name -> object header address, sorted by name.
  Result<std::map<std::string, uint64_t>> links(const Object& group) const;
  Result<Object> object(uint64_t header_address) const;
  // Reads a dataset's bytes (data_bytes of them) into out.
  Status read_data(const Object& dataset, void* out) const;

 private:
  File(std::shared_ptr<const ByteSource> source, const Limits& limits)
      : source_(std::move(source)), limits_(limits) {}
  Result<std::vector<uint8_t>> block(uint64_t address, uint64_t bytes, bool relative = true) const;
  Result<std::string> heap_string(uint64_t collection, uint32_t index, uint32_t length) const;
  Result<std::map<std::string, uint64_t>> list_group(const Object& group) const;
  Result<std::string> local_heap_name(const std::vector<uint8_t>& heap, uint64_t offset) const;
  Status parse_attribute(const uint8_t* p, size_t n, Object& out) const;

  std::shared_ptr<const ByteSource> source_;
  Limits limits_;
  uint64_t base_ = 0;
  uint64_t end_ = 0;  // the end-of-file address from the superblock (from the file's start)
  uint16_t leaf_k_ = 4, internal_k_ = 16;  // group node sizes from the superblock
  Object root_;
  // Global heap collections read so far (vlen strings), bounded in total by the file's size.
  mutable std::mutex mu_;
  mutable std::map<uint64_t, std::shared_ptr<const std::vector<uint8_t>>> collections_;
  mutable uint64_t structure_bytes_read_ = 0;  // under mu_
  // Groups listed so far, by B-tree address (their size is bounded by the structures read).
  mutable std::map<uint64_t, std::shared_ptr<const std::map<std::string, uint64_t>>> listed_;
};

}  // namespace troupe::h5read
