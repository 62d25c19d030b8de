#include "storage/h5_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <filesystem>
#include <system_error>

#if __has_include(<zlib.h>)
#include <zlib.h>
#define TROUPE_HAVE_ZLIB 1
#endif

#include "storage/write_pacing.hpp"

namespace troupe::h5 {

// Checksums are defined over little-endian bytes and computed over host memory.
static_assert(std::endian::native == std::endian::little,
              "checkpoint checksums assume a little-endian host");

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    close();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

bool Handle::close() {
  if (id_ < 0) return true;
  const herr_t r = closer_(id_);
  id_ = H5I_INVALID_HID;
  return r >= 0;
}

ErrorScope::ErrorScope() {
  H5Eget_auto2(H5E_DEFAULT, &old_func_, &old_data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

ErrorScope::~ErrorScope() {
  H5Eset_auto2(H5E_DEFAULT, old_func_, old_data_);
}

namespace {

herr_t collect_error(unsigned /*n*/, const H5E_error2_t* err, void* client) {
  auto* lines = static_cast<std::vector<std::string>*>(client);
  std::string line = err->desc ? err->desc : "";
  if (line.empty()) {
    char msg[256] = {0};
    if (H5Eget_msg(err->min_num, nullptr, msg, sizeof msg) > 0) line = msg;
  }
  if (!line.empty() && std::find(lines->begin(), lines->end(), line) == lines->end())
    lines->push_back(line);
  return 0;
}

Handle plist(hid_t cls) {
  return Handle(H5Pcreate(cls), H5Pclose);
}

Handle scalar_space() {
  return Handle(H5Screate(H5S_SCALAR), H5Sclose);
}

// Opens an existing attribute after checking its presence, so that a missing one reads clearly.
Result<Handle> open_attr(hid_t obj, const std::string& name) {
  const htri_t e = H5Aexists(obj, name.c_str());
  if (e < 0)
    return error("cannot look up attribute '" + name + "'",
                 "the file may be damaged; restore it from a copy");
  if (e == 0)
    return Status::error("attribute '" + name +
                         "' is missing -- the file was not written by troupe or is incomplete; "
                         "re-save it with troupe");
  Handle a(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!a.valid())
    return error("cannot open attribute '" + name + "'",
                 "the file may be damaged; restore it from a copy");
  return a;
}

// Creates (replacing any existing one) a scalar attribute of file type `type`.
Result<Handle> create_attr(hid_t obj, const std::string& name, hid_t type) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Handle space = scalar_space();
  Handle a(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid()) return error("cannot create attribute '" + name + "'", "check free disk space");
  return a;
}

// Reads one numeric scalar attribute of class `cls` (or integer, for float reads) into `mem_type`.
Status read_numeric_attr(hid_t obj, const std::string& name, bool accept_float, hid_t mem_type,
                         void* out) {
  Result<Handle> a = open_attr(obj, name);
  if (!a) return a.status();
  Handle type(H5Aget_type(a->get()), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_INTEGER && !(accept_float && cls == H5T_FLOAT))
    return Status::error(
        "attribute '" + name +
        "' is not a number -- the file was not written by troupe; re-save it with troupe");
  Handle space(H5Aget_space(a->get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1)
    return Status::error(
        "attribute '" + name +
        "' is not a scalar -- the file was not written by troupe; re-save it with troupe");
  if (H5Aread(a->get(), mem_type, out) < 0)
    return error("cannot read attribute '" + name + "'",
                 "the file may be damaged; restore it from a copy");
  return Status::ok();
}

#ifndef TROUPE_HAVE_ZLIB
std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}
#endif

}  // namespace

std::string take_error_stack() {
  std::vector<std::string> lines;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &lines);
  H5Eclear2(H5E_DEFAULT);
  if (lines.empty()) return "";
  std::string out = "HDF5: ";
  for (size_t i = 0; i < lines.size(); ++i) out += (i ? "; " : "") + lines[i];
  return out;
}

Status error(const std::string& what, const std::string& fix) {
  const std::string stack = take_error_stack();
  return Status::error(what + (stack.empty() ? "" : " (" + stack + ")") + " -- " + fix);
}

Result<Handle> create_file(const std::string& path) {
  // SEMI: closing the file fails while objects in it are still open, instead of silently deferring
  // the close (and its final flush) past the point where we fsync and rename.
  Handle fapl = plist(H5P_FILE_ACCESS);
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_SEMI);
  Handle f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!f.valid())
    return error("cannot create HDF5 file " + path,
                 "check that its directory exists, is writable and has free space");
  return f;
}

Result<Handle> open_file(const std::string& path, const std::string& fix) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return Status::error(path + " does not exist or is not a regular file -- " + fix);
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 == 0)
    return Status::error(
        path +
        " is not an HDF5 file (no HDF5 signature: damaged, truncated or another format) -- " + fix);
  if (is_h5 < 0) return error("cannot read " + path, "check that it is readable");
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.valid()) return error("cannot open HDF5 file " + path + ": it is damaged", fix);
  return f;
}

Result<Handle> create_group(hid_t loc, const std::string& name) {
  Handle g(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!g.valid()) return error("cannot create group '" + name + "'", "check free disk space");
  return g;
}

Result<Handle> open_group(hid_t loc, const std::string& name) {
  if (!exists(loc, name))
    return Status::error("group '" + name +
                         "' is missing -- the file is incomplete or not written by troupe");
  Handle g(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.valid())
    return error("cannot open group '" + name + "'",
                 "the file may be damaged; restore it from a copy");
  return g;
}

bool exists(hid_t loc, const std::string& name) {
  const bool found = H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0;
  H5Eclear2(H5E_DEFAULT);
  return found;
}

Result<std::vector<std::string>> list_links(hid_t group) {
  std::vector<std::string> names;
  auto visit = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &idx, visit, &names) < 0)
    return error("cannot list a group", "the file may be damaged; restore it from a copy");
  std::sort(names.begin(), names.end());
  return names;
}

Status write_attr(hid_t obj, const std::string& name, int64_t value) {
  Result<Handle> a = create_attr(obj, name, H5T_STD_I64LE);
  if (!a) return a.status();
  if (H5Awrite(a->get(), H5T_NATIVE_INT64, &value) < 0)
    return error("cannot write attribute '" + name + "'", "check free disk space");
  return Status::ok();
}

Status write_attr(hid_t obj, const std::string& name, double value) {
  Result<Handle> a = create_attr(obj, name, H5T_IEEE_F64LE);
  if (!a) return a.status();
  if (H5Awrite(a->get(), H5T_NATIVE_DOUBLE, &value) < 0)
    return error("cannot write attribute '" + name + "'", "check free disk space");
  return Status::ok();
}

Status write_attr(hid_t obj, const std::string& name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Result<Handle> a = create_attr(obj, name, type.get());
  if (!a) return a.status();
  const char* p = value.c_str();
  if (H5Awrite(a->get(), type.get(), &p) < 0)
    return error("cannot write attribute '" + name + "'", "check free disk space");
  return Status::ok();
}

Result<int64_t> read_attr_i64(hid_t obj, const std::string& name) {
  int64_t v = 0;
  TROUPE_RETURN_IF_ERROR(read_numeric_attr(obj, name, false, H5T_NATIVE_INT64, &v));
  return v;
}

Result<double> read_attr_f64(hid_t obj, const std::string& name) {
  double v = 0;
  TROUPE_RETURN_IF_ERROR(read_numeric_attr(obj, name, true, H5T_NATIVE_DOUBLE, &v));
  return v;
}

Result<std::string> read_attr_string(hid_t obj, const std::string& name) {
  Result<Handle> a = open_attr(obj, name);
  if (!a) return a.status();
  Handle type(H5Aget_type(a->get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING)
    return Status::error(
        "attribute '" + name +
        "' is not a string -- the file was not written by troupe; re-save it with troupe");
  const std::string fail_fix = "the file may be damaged; restore it from a copy";
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* p = nullptr;
    if (H5Aread(a->get(), mem.get(), &p) < 0)
      return error("cannot read attribute '" + name + "'", fail_fix);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  const size_t size = H5Tget_size(type.get());
  std::string buf(size + 1, '\0');
  if (H5Aread(a->get(), type.get(), buf.data()) < 0)
    return error("cannot read attribute '" + name + "'", fail_fix);
  buf.resize(buf.find('\0'));
  return buf;
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
#ifdef TROUPE_HAVE_ZLIB
  uLong c = crc;
  while (bytes > 0) {  // zlib takes 32-bit lengths
    const size_t n = std::min<size_t>(bytes, size_t{1} << 30);
    c = ::crc32(c, p, static_cast<uInt>(n));
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(c);
#else
  static const std::array<uint32_t, 256> table = crc_table();
  uint32_t c = crc ^ 0xFFFFFFFFu;
  for (size_t i = 0; i < bytes; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
#endif
}

uint32_t crc32(const void* data, size_t bytes) { return crc32_update(0, data, bytes); }



Result<Shape> dataset_shape(hid_t loc, const std::string& name) {
  Handle ds(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid())
    return error("cannot open the dataset", "the file may be damaged; restore it from a copy");
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  const H5S_class_t cls = H5Sget_simple_extent_type(space.get());
  if (cls == H5S_SCALAR) return Shape{};
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (cls != H5S_SIMPLE || rank < 0 || rank > Shape::kMaxRank)
    return Status::error("the dataset has an unsupported dataspace (rank " + std::to_string(rank) +
                         ") -- troupe tensors have rank 0 to " + std::to_string(Shape::kMaxRank));
  std::array<hsize_t, Shape::kMaxRank> dims{};
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return Shape(dims.begin(), dims.begin() + rank);
}

namespace {

// One writer and one reader for both element types: float (tensors) and int64 (index tables).
template <class T>
Status write_dataset(hid_t loc, const std::string& name, const Shape& shape, const T* data, hid_t file_type,
                     hid_t mem_type) {
  std::array<hsize_t, Shape::kMaxRank> dims{};
  for (int i = 0; i < shape.rank(); ++i) dims[i] = static_cast<hsize_t>(shape[i]);
  Handle space(shape.rank() == 0 ? H5Screate(H5S_SCALAR)
                                 : H5Screate_simple(shape.rank(), dims.data(), nullptr),
               H5Sclose);
  // Contiguous and unfiltered: one sequential write, and readable at a known offset
  // (H5Dget_offset).
  Handle dcpl = plist(H5P_DATASET_CREATE);
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  Handle ds(H5Dcreate2(loc, name.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(),
                       H5P_DEFAULT),
            H5Dclose);
  if (!ds.valid()) return error("cannot create the dataset", "check free disk space");
  const size_t bytes = static_cast<size_t>(shape.numel()) * sizeof(T);
  const std::function<void(double)>* pacer = WritePacing::current();
  if (pacer == nullptr || shape.rank() != 1 || bytes <= kPacedBlockBytes) {
    const auto t0 = std::chrono::steady_clock::now();
    if (bytes > 0 && H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
      return error("cannot write the dataset", "check free disk space");
    const Status st = write_attr(ds.get(), kChecksumAttr, static_cast<int64_t>(crc32(data, bytes)));
    if (pacer != nullptr) (*pacer)(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return st;
  }
  // Paced: block by block (hyperslabs of the one dimension), the checksum along.
  const hsize_t n = static_cast<hsize_t>(shape[0]), block = kPacedBlockBytes / sizeof(T);
  uint32_t crc = 0;
  for (hsize_t start = 0; start < n; start += block) {
    const auto t0 = std::chrono::steady_clock::now();
    const hsize_t count = std::min(block, n - start);
    Handle file_space(H5Dget_space(ds.get()), H5Sclose);
    Handle mem_space(H5Screate_simple(1, &count, nullptr), H5Sclose);
    if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) < 0 ||
        H5Dwrite(ds.get(), mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, data + start) < 0)
      return error("cannot write the dataset", "check free disk space");
    crc = crc32_update(crc, data + start, static_cast<size_t>(count) * sizeof(T));
    (*pacer)(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return write_attr(ds.get(), kChecksumAttr, static_cast<int64_t>(crc));
}

template <class T>
Status read_dataset(hid_t loc, const std::string& name, const Shape& shape, T* out, H5T_class_t cls, hid_t mem_type,
                    const char* what) {
  Result<Shape> stored = dataset_shape(loc, name);
  if (!stored) return stored.status();
  if (!(*stored == shape))
    return Status::error("the dataset has shape " + stored->str() + ", expected " + shape.str() +
                         " -- read it with the shape it was written with");
  Handle ds(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  Handle type(H5Dget_type(ds.get()), H5Tclose);
  if (H5Tget_class(type.get()) != cls || H5Tget_size(type.get()) != sizeof(T))
    return Status::error(std::string("the dataset is not ") + what + " -- re-save it with troupe");
  const size_t bytes = static_cast<size_t>(shape.numel()) * sizeof(T);
  if (bytes > 0 && H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    return error("cannot read the dataset", "the file is damaged; restore it from a copy");
  Result<int64_t> stored_crc = read_attr_i64(ds.get(), kChecksumAttr);
  if (!stored_crc) return stored_crc.status();
  const uint32_t crc = crc32(out, bytes);
  if (*stored_crc != static_cast<int64_t>(crc))
    return Status::error(
        fmt::format("checksum mismatch (stored crc32 {:#010x}, computed {:#010x}): the data "
                    "is corrupted -- restore the file from a copy or use an earlier one",
                    *stored_crc, crc));
  return Status::ok();
}

}  // namespace

Status write_f32_dataset(hid_t loc, const std::string& name, const Shape& shape, const float* data) {
  return write_dataset(loc, name, shape, data, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
}

Status read_f32_dataset(hid_t loc, const std::string& name, const Shape& shape, float* out) {
  return read_dataset(loc, name, shape, out, H5T_FLOAT, H5T_NATIVE_FLOAT,
                      "32-bit float (troupe stores every tensor as f32)");
}

Status write_i64_dataset(hid_t loc, const std::string& name, const Shape& shape, const int64_t* data) {
  return write_dataset(loc, name, shape, data, H5T_STD_I64LE, H5T_NATIVE_INT64);
}

Status read_i64_dataset(hid_t loc, const std::string& name, const Shape& shape, int64_t* out) {
  return read_dataset(loc, name, shape, out, H5T_INTEGER, H5T_NATIVE_INT64, "64-bit integer");
}

}  // namespace troupe::h5
