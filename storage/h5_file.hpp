// Small RAII layer over HDF5's C API, private to storage/: owned handles, scalar attributes, and
// f32 datasets carrying a CRC-32 of their bytes. Every function returns a Status whose message says
// what failed (with HDF5's own error description) and how to fix it; messages do not name the file
// or the dataset path, so callers prefix that context (Status::with_context).
//
// Errors: wrap each public storage entry point in an h5::ErrorScope so HDF5 does not print its
// error stack to stderr. HDF5 here is built thread-safe: calls are serialised by one global lock
// and the error stack is per thread, so these helpers may be used from any thread, one object per
// thread.
#pragma once
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/status.hpp"
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

// Files. create_file truncates an existing file; its handle's close() must be checked (it flushes).
Result<Handle> create_file(const std::string& path);
// Read-only open. A missing file, a file that is not HDF5 and a damaged file give distinct
// messages, each ending with `fix`.
Result<Handle> open_file(const std::string& path,
                         const std::string& fix = "restore it from a copy or regenerate it");

Result<Handle> create_group(hid_t loc, const std::string& name);
Result<Handle> open_group(hid_t loc, const std::string& name);
// True when `name` (one link, no '/') exists under loc; false also when HDF5 fails.
bool exists(hid_t loc, const std::string& name);
// Link names directly under a group, sorted by name.
Result<std::vector<std::string>> list_links(hid_t group);

// Scalar attributes. Strings are variable-length UTF-8 (h5py reads them as str); reading also
// accepts fixed-length strings. Integers are stored as int64, doubles as float64.
Status write_attr(hid_t obj, const std::string& name, int64_t value);
Status write_attr(hid_t obj, const std::string& name, double value);
Status write_attr(hid_t obj, const std::string& name, const std::string& value);
Result<int64_t> read_attr_i64(hid_t obj, const std::string& name);
Result<double> read_attr_f64(hid_t obj, const std::string& name);
Result<std::string> read_attr_string(hid_t obj, const std::string& name);

// CRC-32 (IEEE 802.3 polynomial, the one of zlib, gzip and Python's zlib.crc32). crc32_update
// continues a CRC over more bytes: crc32(ab) == crc32_update(crc32(a), b).
uint32_t crc32(const void* data, size_t bytes);
uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);


// Name of the per-dataset checksum attribute: int64 holding the CRC-32 of the dataset's bytes
// (little-endian f32, row-major).
inline constexpr const char* kChecksumAttr = "crc32";

// Writes shape.numel() floats from `data` (contiguous, row-major: e.g. the leading rows of a larger
// tensor) as a contiguous, uncompressed little-endian f32 dataset with its kChecksumAttr.
Status write_f32_dataset(hid_t loc, const std::string& name, const Shape& shape, const float* data);
// The dataset's shape; an error when it is not a simple dataspace of rank <= Shape::kMaxRank.
Result<Shape> dataset_shape(hid_t loc, const std::string& name);
// Reads the dataset into `out` (shape.numel() floats) after checking that it is a 32-bit float
// dataset of exactly `shape`, then verifies the checksum. On error `out` may hold partial or
// corrupt data.
Status read_f32_dataset(hid_t loc, const std::string& name, const Shape& shape, float* out);

// The same for int64 data (index tables): a contiguous little-endian i64 dataset with its checksum
// (CRC-32 of its little-endian bytes), and its checked read.
Status write_i64_dataset(hid_t loc, const std::string& name, const Shape& shape, const int64_t* data);
Status read_i64_dataset(hid_t loc, const std::string& name, const Shape& shape, int64_t* out);

}  // namespace troupe::h5
