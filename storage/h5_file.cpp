#include "storage/h5_file.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>

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

// Creates (replacing any existing one) a scalar attribute of file type `type`.
Result<Handle> create_attr(hid_t obj, const std::string& name, hid_t type) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  Handle space = scalar_space();
  Handle a(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid()) return error("cannot create attribute '" + name + "'", "check free disk space");
  return a;
}


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

// The core driver's memory comes from these callbacks, so the finished image can be taken over
// without a copy: at close HDF5 "frees" it, and the buffer keeps it.
// The core driver's memory comes from these callbacks, so the finished image can be taken over
// without a copy: at close HDF5 "frees" it, and the buffer keeps it. It is an anonymous mapping
// grown with mremap: no copy as it grows, and bytes HDF5 reserves but never writes are zeros (as a
// file's holes are), never leftovers of this process's memory, without a memset pass.
struct MemoryFile::Buffer {
  void* data = nullptr;
  size_t size = 0;    // what HDF5 asked for
  size_t mapped = 0;  // what is mapped (page-rounded, grown ahead)
  bool closed = false;
  ~Buffer() { unmap(data, mapped); }

  static size_t pages(size_t n) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return std::max(page, (n + page - 1) / page * page);
  }
  static void unmap(void* p, size_t n) {
    if (p != nullptr) ::munmap(p, n);
  }
  static void* allocate(size_t size, H5FD_file_image_op_t, void* udata) {
    auto* b = static_cast<Buffer*>(udata);
    unmap(b->data, b->mapped);
    b->data = nullptr, b->size = b->mapped = 0;
    void* p =
        ::mmap(nullptr, pages(size), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    b->data = p, b->size = size, b->mapped = pages(size);
    return p;
  }
  static void* copy(void* dst, const void* src, size_t size, H5FD_file_image_op_t, void*) {
    return std::memcpy(dst, src, size);
  }
  static void* resize(void* ptr, size_t size, H5FD_file_image_op_t op, void* udata) {
    auto* b = static_cast<Buffer*>(udata);
    if (ptr == nullptr) return allocate(size, op, udata);
    if (ptr != b->data) return nullptr;  // HDF5 only resizes the buffer it got from us
    if (size > b->mapped) {
      // Ahead by half again: the driver grows the file a block at a time.
      const size_t want = pages(std::max(size, b->mapped + b->mapped / 2));
      void* p = ::mremap(b->data, b->mapped, want, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) return nullptr;
      b->data = p, b->mapped = want;
    }
    b->size = size;
    return b->data;
  }
  static herr_t release(void* ptr, H5FD_file_image_op_t op, void* udata) {
    auto* b = static_cast<Buffer*>(udata);
    if (ptr != b->data) return -1;
    if (op == H5FD_FILE_IMAGE_OP_FILE_CLOSE) {
      b->closed = true;  // kept: the file's bytes
      return 0;
    }
    unmap(b->data, b->mapped);
    b->data = nullptr, b->size = b->mapped = 0;
    return 0;
  }
  static void* same(void* udata) { return udata; }
  static herr_t keep(void*) { return 0; }
};

MemoryFile::MemoryFile(MemoryFile&& o) noexcept = default;
MemoryFile& MemoryFile::operator=(MemoryFile&& o) noexcept = default;

MemoryFile::~MemoryFile() {
  // A file HDF5 could not close still points at the buffer (libhdf5 closes it again at exit): leak
  // the buffer rather than leave HDF5 a dangling pointer.
  if (file_.valid() && !file_.close()) (void)buffer_.release();
}

Result<MemoryFile> MemoryFile::create(const std::string& name, size_t user_block) {
  return create(name, MemoryFileOptions{user_block, 0, 0});
}

Result<MemoryFile> MemoryFile::create(const std::string& name, const MemoryFileOptions& options) {
  const size_t user_block = options.user_block;
  MemoryFile m;
  m.buffer_ = std::make_unique<Buffer>();
  m.user_block_ = user_block;
  Handle fapl = plist(H5P_FILE_ACCESS);
  if ((options.metadata_block > 0 && H5Pset_meta_block_size(fapl.get(), options.metadata_block) < 0) ||
      (options.small_data_block > 0 &&
       H5Pset_small_data_block_size(fapl.get(), options.small_data_block) < 0) ||
      (options.align_from > 0 && H5Pset_alignment(fapl.get(), options.align_from, 512) < 0))
    return error("cannot size the in-memory HDF5 file's blocks", "report this");
  // STRONG: closing the file closes whatever is still open in it, so a close never fails for that.
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  // Grown 64 KiB at a time (our buffer grows ahead by half again): a file whose large datasets
  // libhdf5 never writes ends its image close to the last byte it does write.
  H5Pset_fapl_core(fapl.get(), size_t{64} << 10, /*backing_store=*/0);
  H5FD_file_image_callbacks_t callbacks = {&Buffer::allocate, &Buffer::copy, &Buffer::resize,
                                           &Buffer::release,  &Buffer::same, &Buffer::keep,
                                           m.buffer_.get()};
  if (H5Pset_file_image_callbacks(fapl.get(), &callbacks) < 0)
    return error("cannot set up an in-memory HDF5 file",
                 "report this (a libhdf5 without the core driver?)");
  Handle fcpl = plist(H5P_FILE_CREATE);
  H5Pset_obj_track_times(fcpl.get(), 0);  // the root group too (create_group)
  if (user_block > 0 && H5Pset_userblock(fcpl.get(), user_block) < 0)
    return error("cannot reserve a user block", "report this");
  // The core driver still open(2)s the name it is given (O_RDWR, following symlinks), though it
  // never reads or writes it: give it a name nothing can be planted at (/proc takes no new files),
  // unique in the process as HDF5 requires.
  static std::atomic<uint64_t> counter{0};
  const std::string memory_name = "/proc/troupe-in-memory-hdf5-file-" + std::to_string(::getpid()) +
                                  "-" + std::to_string(counter.fetch_add(1));
  m.file_ = Handle(H5Fcreate(memory_name.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose);
  if (!m.file_.valid())
    return error("cannot create the in-memory HDF5 file for " + name, "check free memory");
  return m;
}

Result<MemoryFile::Image> MemoryFile::finish() {
  if (!file_.close() || !buffer_->closed || buffer_->data == nullptr)
    return error("cannot finish the in-memory HDF5 file", "check free memory");
  // The file's length is the end-of-file address in its (version 0) superblock (counted from the
  // start of the file, user block included); the buffer may be longer (the driver grows it in
  // steps).
  // Bytes past the buffer were never written: zeros, or reserved datasets' space.
  const auto* p = static_cast<const uint8_t*>(buffer_->data);
  uint64_t eof = 0;
  if (buffer_->size < user_block_ + 48 || p[user_block_ + 8] != 0)
    return Status::error("the in-memory HDF5 file has an unexpected superblock -- report this");
  std::memcpy(&eof, p + user_block_ + 40, sizeof eof);
  if (eof < user_block_ + 48)
    return Status::error(
        "the in-memory HDF5 file is shorter than its superblock -- report this");
  Image image;
  image.size = static_cast<size_t>(std::min<uint64_t>(eof, buffer_->size));
  image.length = eof;
  const size_t mapped = buffer_->mapped;
  image.data = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(buffer_->data),
                                        [mapped](uint8_t* d) { Buffer::unmap(d, mapped); });
  buffer_->data = nullptr;
  buffer_->size = buffer_->mapped = 0;
  std::memset(image.data.get(), 0, user_block_);
  return image;
}

// Objects carry no creation or modification times (HDF5 records them by default): the same
// contents make the same bytes whenever they are written.
Result<Handle> create_group(hid_t loc, const std::string& name) {
  Handle gcpl = plist(H5P_GROUP_CREATE);
  H5Pset_obj_track_times(gcpl.get(), 0);
  Handle g(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
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

namespace {

// One writer for both element types: float (tensors) and int64 (index tables).
template <class T>
Status write_dataset(hid_t loc, const std::string& name, const Shape& shape, const T* data,
                     hid_t file_type, hid_t mem_type) {
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
  H5Pset_obj_track_times(dcpl.get(), 0);  // reproducible bytes (create_group)
  Handle ds(
      H5Dcreate2(loc, name.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
      H5Dclose);
  if (!ds.valid()) return error("cannot create the dataset", "check free disk space");
  const size_t bytes = static_cast<size_t>(shape.numel()) * sizeof(T);
  const std::function<void(double)>* pacer = WritePacing::current();
  if (pacer == nullptr || shape.rank() != 1 || bytes <= kPacedBlockBytes) {
    const double t0 = thread_cpu_seconds();
    if (bytes > 0 && H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
      return error("cannot write the dataset", "check free disk space");
    const Status st = write_attr(ds.get(), kChecksumAttr, static_cast<int64_t>(crc32(data, bytes)));
    if (pacer != nullptr) (*pacer)(thread_cpu_seconds() - t0);
    return st;
  }
  // Paced: block by block (hyperslabs of the one dimension), the checksum along.
  const hsize_t n = static_cast<hsize_t>(shape[0]), block = kPacedBlockBytes / sizeof(T);
  uint32_t crc = 0;
  for (hsize_t start = 0; start < n; start += block) {
    const double t0 = thread_cpu_seconds();
    const hsize_t count = std::min(block, n - start);
    Handle file_space(H5Dget_space(ds.get()), H5Sclose);
    Handle mem_space(H5Screate_simple(1, &count, nullptr), H5Sclose);
    if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) <
            0 ||
        H5Dwrite(ds.get(), mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, data + start) <
            0)
      return error("cannot write the dataset", "check free disk space");
    crc = crc32_update(crc, data + start, static_cast<size_t>(count) * sizeof(T));
    (*pacer)(thread_cpu_seconds() - t0);
  }
  return write_attr(ds.get(), kChecksumAttr, static_cast<int64_t>(crc));
}

}  // namespace

Status write_f32_dataset(hid_t loc, const std::string& name, const Shape& shape,
                         const float* data) {
  return write_dataset(loc, name, shape, data, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
}

Status write_i64_dataset(hid_t loc, const std::string& name, const Shape& shape,
                         const int64_t* data) {
  return write_dataset(loc, name, shape, data, H5T_STD_I64LE, H5T_NATIVE_INT64);
}

Result<uint64_t> reserve_f32_dataset(hid_t loc, const std::string& name, const Shape& shape,
                                     uint32_t crc) {
  TROUPE_CHECK(shape.numel() > 0, "reserve_f32_dataset: an empty dataset has no space to reserve");
  std::array<hsize_t, Shape::kMaxRank> dims{};
  for (int i = 0; i < shape.rank(); ++i) dims[i] = static_cast<hsize_t>(shape[i]);
  Handle space(H5Screate_simple(shape.rank(), dims.data(), nullptr), H5Sclose);
  Handle dcpl = plist(H5P_DATASET_CREATE);
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);  // the space is taken now
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);    // and nothing is written to it
  H5Pset_obj_track_times(dcpl.get(), 0);
  Handle ds(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(),
                       H5P_DEFAULT),
            H5Dclose);
  if (!ds.valid()) return error("cannot create the dataset", "check free memory");
  const haddr_t offset = H5Dget_offset(ds.get());
  if (offset == HADDR_UNDEF)
    return error("the dataset has no file space after its creation", "report this");
  TROUPE_RETURN_IF_ERROR(write_attr(ds.get(), kChecksumAttr, static_cast<int64_t>(crc)));
  return static_cast<uint64_t>(offset);
}

}  // namespace troupe::h5
