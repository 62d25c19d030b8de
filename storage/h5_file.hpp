// Small RAII layer over HDF5's C API for *writing*, private to storage/: owned handles, files built
// in memory, scalar attributes, and f32 / i64 datasets carrying a CRC-32 of their bytes. Reading
// never goes through libhdf5 (storage/h5_reader.hpp parses what this writes, within bounds). Every
// function returns a Status whose message says what failed (with HDF5's own error description) and
// how to fix it; messages do not name the file or the dataset path, so callers prefix that context
// (Status::with_context).
//
// Errors: wrap each public storage entry point in an h5::ErrorScope so HDF5 does not print its
// error stack to stderr. HDF5 here is built thread-safe: calls are serialised by one global lock
// and the error stack is per thread, so these helpers may be used from any thread, one object per
// thread.
#pragma once
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/status.hpp"
#include "kernels/tensor.hpp"

namespace troupe::h5 {

// Owns one HDF5 identifier and closes it with the matching H5?close on destruction. Move-only.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { close(); }
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  bool valid() const { return id_ >= 0; }
  hid_t get() const { return id_; }
  // Closes now; false when HDF5 reported a failure (for a file: its final flush failed).
  bool close();

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// While alive, HDF5 does not print errors on this thread; the previous handler is restored
// afterwards.
class ErrorScope {
 public:
  ErrorScope();
  ~ErrorScope();
  ErrorScope(const ErrorScope&) = delete;
  ErrorScope& operator=(const ErrorScope&) = delete;

 private:
  H5E_auto2_t old_func_ = nullptr;
  void* old_data_ = nullptr;
};

// This thread's HDF5 error stack as one line ("HDF5: a; b; c"), then clears it. "" when empty.
std::string take_error_stack();
// Status::error("<what> (<HDF5 stack>) -- <fix>").
Status error(const std::string& what, const std::string& fix);

// A new HDF5 file built in memory (HDF5's core driver, no backing store): libhdf5 never touches the
// disk, so a full disk or an I/O error can neither fail nor corrupt its state (HDF5 1.10 crashes at
// exit after a failed close of a file on disk). finish() closes it and hands over its bytes, which
// storage/durable.hpp writes. `name` (the path it will get) only appears in messages: nothing is
// opened under it. With user_block > 0 (a power of two >= 512) that many zero bytes precede the
// HDF5 data; HDF5 and h5py skip them.
//
// Datasets whose values the caller writes itself (reserve_f32_dataset) take file space that
// libhdf5 never writes: where everything libhdf5 does write lies below them, the image holds only
// those bytes, and the file is the image, then zeros up to each reserved range, then the caller's
// values there (storage/shard_file.cpp). `metadata_block` (bytes, 0: HDF5's default of 2 KiB) and
// `small_data_block` set the blocks HDF5 takes its metadata and small raw data (index tables, the
// strings of attributes) from, so that a block reserved before the first such dataset holds every
// later object header and string.
// `align_from` > 0: objects of at least that many bytes start at a multiple of 512 (HDF5 allows no
// more with a user block of 512; the gaps left take no later object: the smallest that comes after,
// a global heap, is 4096).
struct MemoryFileOptions {
  size_t user_block = 0;
  uint64_t metadata_block = 0;
  uint64_t small_data_block = 0;
  uint64_t align_from = 0;
};
class MemoryFile {
 public:
  static Result<MemoryFile> create(const std::string& name, size_t user_block = 0);
  static Result<MemoryFile> create(const std::string& name, const MemoryFileOptions& options);
  MemoryFile(MemoryFile&&) noexcept;
  MemoryFile& operator=(MemoryFile&&) noexcept;
  ~MemoryFile();
  hid_t get() const { return file_.get(); }

  struct Image {
    std::shared_ptr<uint8_t> data;  // the file's first `size` bytes, user block first
    size_t size = 0;
    uint64_t length = 0;  // the file's: bytes size .. length-1 were never written (zeros, or
                          // reserved datasets' values)
  };
  // Closes the file (every object in it must be closed) and returns its bytes.
  Result<Image> finish();

 private:
  struct Buffer;
  MemoryFile() = default;
  std::unique_ptr<Buffer> buffer_;  // declared first: outlives the file handle
  Handle file_;
  size_t user_block_ = 0;
};

Result<Handle> create_group(hid_t loc, const std::string& name);
Result<Handle> open_group(hid_t loc, const std::string& name);
// True when `name` (one link, no '/') exists under loc; false also when HDF5 fails.
bool exists(hid_t loc, const std::string& name);

// Scalar attributes. Strings are variable-length UTF-8 (h5py reads them as str). Integers are
// stored as int64, doubles as float64.
Status write_attr(hid_t obj, const std::string& name, int64_t value);
Status write_attr(hid_t obj, const std::string& name, double value);
Status write_attr(hid_t obj, const std::string& name, const std::string& value);
// CRC-32 (IEEE 802.3 polynomial, the one of zlib, gzip and Python's zlib.crc32). crc32_update
// continues a CRC over more bytes: crc32(ab) == crc32_update(crc32(a), b).
uint32_t crc32(const void* data, size_t bytes);
uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);
// The CRC-32 of a followed by b from crc32(a), crc32(b) and b's length (zlib's crc32_combine).
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);
// Which implementation computes it on this CPU (storage/crc32.cpp): "pclmul" (carry-less
// multiplication) or "zlib" (also where TROUPE_CRC32=portable asks for it).
const char* crc32_implementation();
// zlib's crc32_update whatever the CPU (the tests hold the other path to it).
uint32_t crc32_update_zlib(uint32_t crc, const void* data, size_t bytes);

// Name of the per-dataset checksum attribute: int64 holding the CRC-32 of the dataset's bytes
// (little-endian f32, row-major).
inline constexpr const char* kChecksumAttr = "crc32";

// Writes shape.numel() floats from `data` (contiguous, row-major: e.g. the leading rows of a larger
// tensor) as a contiguous, uncompressed little-endian f32 dataset with its kChecksumAttr.
Status write_f32_dataset(hid_t loc, const std::string& name, const Shape& shape, const float* data);
// The same for int64 data (index tables): a contiguous little-endian i64 dataset with its checksum
// (CRC-32 of its little-endian bytes).
Status write_i64_dataset(hid_t loc, const std::string& name, const Shape& shape,
                         const int64_t* data);
// A contiguous little-endian f32 dataset of shape.numel() > 0 elements whose file space is taken
// now and never written by libhdf5, with `crc` (of the values the caller will write) as its
// kChecksumAttr. Returns the file offset of its values (from the start of the file, user block
// included): the caller writes shape.numel() * 4 bytes there.
Result<uint64_t> reserve_f32_dataset(hid_t loc, const std::string& name, const Shape& shape,
                                     uint32_t crc);

}  // namespace troupe::h5
