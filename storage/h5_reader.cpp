#include "storage/h5_reader.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

namespace troupe::h5read {

namespace {

constexpr uint64_t kUndefined = ~uint64_t{0};
constexpr uint8_t kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
constexpr const char* kFix =
    " -- the file is damaged or was not written by troupe; restore it from a copy";

Status damaged(const std::string& what) {
  return Status::bad_input("damaged HDF5 structure (" + what + ")" + kFix);
}
Status unsupported(const std::string& what) {
  return Status::bad_input("unsupported HDF5 content (" + what +
                           "): troupe reads only the HDF5 layout it writes" + kFix);
}

// Little-endian fields of a byte block, every access bounds-checked: a read past the end marks the
// cursor failed and returns 0, so parsers check ok() once after a group of reads.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }
  size_t left() const { return ok_ ? n_ - pos_ : 0; }
  uint64_t uint(int bytes) {
    if (!need(static_cast<size_t>(bytes))) return 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{p_[pos_ + static_cast<size_t>(i)]} << (8 * i);
    pos_ += static_cast<size_t>(bytes);
    return v;
  }
  uint8_t u8() { return static_cast<uint8_t>(uint(1)); }
  uint16_t u16() { return static_cast<uint16_t>(uint(2)); }
  uint32_t u32() { return static_cast<uint32_t>(uint(4)); }
  uint64_t u64() { return uint(8); }
  const uint8_t* take(size_t n) {
    if (!need(n)) return nullptr;
    const uint8_t* r = p_ + pos_;
    pos_ += n;
    return r;
  }
  void skip(size_t n) { (void)take(n); }

 private:
  bool need(size_t n) {
    if (!ok_ || n > n_ - pos_) ok_ = false;
    return ok_;
  }
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  bool ok_ = true;
};

size_t pad8(size_t n) {
  return (n + 7) & ~size_t{7};
}

bool has_signature(Cursor& c, const char* sig) {
  const uint8_t* p = c.take(4);
  return p != nullptr && std::memcmp(p, sig, 4) == 0;
}

// ---- datatypes, dataspaces, layouts
// ---------------------------------------------------------------

struct TypeInfo {
  ElementType type = ElementType::other;
  uint32_t size = 0;  // bytes per element as stored
  bool vlen_string = false;
  bool space_padded = false;  // fixed-length string padded with spaces
};

bool is_byte_type(const uint8_t* p, size_t n) {  // the base type of a variable-length string
  Cursor c(p, n);
  const uint8_t cls = c.u8() & 0x0f;
  c.skip(3);
  const uint32_t size = c.u32();
  return c.ok() && (cls == 0 || cls == 3) && size == 1;
}

Result<TypeInfo> parse_datatype(const uint8_t* p, size_t n) {
  Cursor c(p, n);
  const uint8_t b0 = c.u8();
  const uint32_t bits = static_cast<uint32_t>(c.uint(3));
  TypeInfo t;
  t.size = c.u32();
  if (!c.ok()) return damaged("a datatype message is cut short");
  const uint8_t cls = b0 & 0x0f, version = b0 >> 4;
  if (version < 1 || version > 4) return damaged(fmt::format("datatype version {}", version));
  if (cls == 0) {  // fixed-point
    const uint16_t offset = c.u16(), precision = c.u16();
    if (!c.ok()) return damaged("a fixed-point datatype is cut short");
    const bool little = (bits & 1) == 0, is_signed = (bits & 8) != 0;
    if (little && is_signed && t.size == 8 && offset == 0 && precision == 64)
      t.type = ElementType::i64;
  } else if (cls == 1) {  // IEEE floating point
    const uint16_t offset = c.u16(), precision = c.u16();
    const uint8_t exp_loc = c.u8(), exp_size = c.u8(), mant_loc = c.u8(), mant_size = c.u8();
    const uint32_t bias = c.u32();
    if (!c.ok()) return damaged("a floating-point datatype is cut short");
    const bool little = (bits & 0x41) == 0, normalized = ((bits >> 4) & 3) == 2;
    const unsigned sign = (bits >> 8) & 0xff;
    if (little && normalized && offset == 0 && mant_loc == 0) {
      if (t.size == 4 && precision == 32 && exp_loc == 23 && exp_size == 8 && mant_size == 23 &&
          bias == 127 && sign == 31)
        t.type = ElementType::f32;
      if (t.size == 8 && precision == 64 && exp_loc == 52 && exp_size == 11 && mant_size == 52 &&
          bias == 1023 && sign == 63)
        t.type = ElementType::f64;
    }
  } else if (cls == 3) {  // fixed-length string
    if (t.size >= 1) t.type = ElementType::string;
    t.space_padded = (bits & 0x0f) == 2;
  } else if (cls == 9) {  // variable-length: a string when its type bits say so
    if ((bits & 0x0f) == 1 && t.size == 16 && is_byte_type(p + c.pos(), c.left())) {
      t.type = ElementType::string;
      t.vlen_string = true;
    }
  }
  return t;
}

struct SpaceInfo {
  bool scalar = false;
  bool null = false;
  std::vector<int64_t> dims;
};

Result<SpaceInfo> parse_dataspace(const uint8_t* p, size_t n) {
  Cursor c(p, n);
  const uint8_t version = c.u8(), rank = c.u8(), flags = c.u8();
  SpaceInfo s;
  if (version == 1) {
    c.skip(5);
    if (flags & 2) return unsupported("a dataspace with a permutation");
    s.scalar = rank == 0;
  } else if (version == 2) {
    const uint8_t type = c.u8();
    if (type > 2 || (type != 1 && rank != 0))
      return damaged(fmt::format("dataspace type {}", type));
    s.scalar = type == 0;
    s.null = type == 2;
  } else {
    return damaged(fmt::format("dataspace version {}", version));
  }
  if (rank > 32) return damaged(fmt::format("a dataspace of rank {}", rank));
  for (int i = 0; i < rank; ++i) {
    const uint64_t d = c.u64();
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return damaged("a dataspace dimension overflows");
    s.dims.push_back(static_cast<int64_t>(d));
  }
  if (!c.ok()) return damaged("a dataspace message is cut short");
  return s;
}

// Elements of a dataspace; false when the product does not fit int64.
bool count_elements(const SpaceInfo& s, int64_t* out) {
  if (s.null) return *out = 0, true;
  int64_t n = 1;
  for (int64_t d : s.dims) {
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return false;
    n *= d;
  }
  *out = n;
  return true;
}

}  // namespace

const char* element_type_name(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return "32-bit float";
    case ElementType::f64:
      return "64-bit float";
    case ElementType::i64:
      return "64-bit integer";
    case ElementType::string:
      return "string";
    case ElementType::other:
      return "a type troupe does not write";
  }
  return "?";
}

// ---- sources
// ----------------------------------------------------------------------------------------

namespace {

class FileSource final : public ByteSource {
 public:
  FileSource(int fd, uint64_t size, std::string identity)
      : fd_(fd), size_(size), identity_(std::move(identity)) {}
  ~FileSource() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  std::string identity() const override { return identity_; }
  Status read(uint64_t offset, void* out, size_t n) const override {
    if (offset > size_ || n > size_ - offset)
      return damaged(fmt::format("{} bytes at byte {} lie beyond the end of the file ({} bytes)", n,
                                 offset, size_));
    auto* dst = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        return Status::error(std::string("cannot read the file: ") + std::strerror(errno) +
                             " -- check the disk");
      if (got == 0)
        return Status::bad_input(
            "the file became shorter while it was read -- do not change checkpoints while they "
            "load");
      dst += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
    return Status::ok();
  }

 private:
  int fd_;
  uint64_t size_;
  std::string identity_;
};

class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  Status read(uint64_t offset, void* out, size_t n) const override {
    if (offset > bytes_.size() || n > bytes_.size() - offset)
      return damaged(fmt::format("{} bytes at byte {} lie beyond the end of the file ({} bytes)", n,
                                 offset, bytes_.size()));
    if (n > 0) std::memcpy(out, bytes_.data() + offset, n);
    return Status::ok();
  }

 private:
  std::string bytes_;
};

}  // namespace

Result<std::shared_ptr<ByteSource>> open_file_source(const std::string& path) {
  // O_NONBLOCK: a FIFO planted at the path must not block the open (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::bad_input(path + " does not exist");
    return Status::error("cannot open " + path + ": " + std::strerror(err) +
                         " -- check its permissions");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::bad_input(path + " is not a regular file");
  }
  const std::string identity =
      fmt::format("{}:{}:{}:{}.{}:{}.{}", st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec,
                  st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
  return std::shared_ptr<ByteSource>(
      std::make_shared<FileSource>(fd, static_cast<uint64_t>(st.st_size), identity));
}

std::shared_ptr<ByteSource> memory_source(std::string bytes) {
  return std::make_shared<MemorySource>(std::move(bytes));
}

// ---- the file
// -----------------------------------------------------------------------------------------

Result<std::vector<uint8_t>> File::block(uint64_t address, uint64_t bytes, bool relative) const {
  if (address == kUndefined) return damaged("an undefined address where a structure must be");
  if (bytes > limits_.max_block)
    return damaged(fmt::format("a structure of {} bytes at address {} (troupe's are far smaller)",
                               bytes, address));
  uint64_t at = address;
  if (relative) {
    if (address > end_ - base_)
      return damaged(fmt::format("address {} lies beyond the end of the file", address));
    at = base_ + address;
  }
  if (at > end_ || bytes > end_ - at)
    return damaged(fmt::format("{} bytes at byte {} run past the end of the file ({} bytes)", bytes,
                               at, end_));
  {
    std::lock_guard<std::mutex> lock(mu_);
    structure_bytes_read_ += bytes;
    if (structure_bytes_read_ > limits_.read_factor * end_ + (uint64_t{1} << 20))
      return damaged(
          fmt::format("its structures refer to each other so often that reading them would "
                      "take more than {} times the file's size",
                      limits_.read_factor));
  }
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  TROUPE_RETURN_IF_ERROR(source_->read(at, out.data(), out.size()));
  return out;
}

Result<std::unique_ptr<File>> File::open(std::shared_ptr<const ByteSource> source,
                                         const Limits& limits) {
  std::unique_ptr<File> f(new File(std::move(source), limits));
  const uint64_t size = f->source_->size();
  // The superblock sits at 0 or right after a user block of 512, 1024, 2048, ... bytes.
  uint64_t sb = kUndefined;
  for (uint64_t at = 0; at <= size && size - at >= 8; at = at == 0 ? 512 : at * 2) {
    uint8_t sig[8];
    TROUPE_RETURN_IF_ERROR(f->source_->read(at, sig, 8));
    if (std::memcmp(sig, kSignature, 8) == 0) {
      sb = at;
      break;
    }
    if (at > (uint64_t{1} << 40)) break;
  }
  if (sb == kUndefined)
    return Status::bad_input(
        "not an HDF5 file (no HDF5 signature: damaged, truncated or another format)" +
        std::string(kFix));
  uint8_t raw[100] = {0};
  const size_t avail = static_cast<size_t>(std::min<uint64_t>(sizeof raw, size - sb));
  TROUPE_RETURN_IF_ERROR(f->source_->read(sb, raw, avail));
  Cursor c(raw, avail);
  c.skip(8);
  const uint8_t version = c.u8();
  if (c.ok() && version >= 2)
    return unsupported(
        fmt::format("superblock version {}, written with newer HDF5 format settings", version));
  c.skip(4);
  const uint8_t offset_size = c.u8(), length_size = c.u8();
  c.skip(1);
  const uint16_t leaf_k = c.u16(), internal_k = c.u16();
  c.skip(4);
  if (version == 1) c.skip(4);
  const uint64_t base = c.u64();
  c.skip(8);  // free-space information
  const uint64_t eof = c.u64(), driver = c.u64();
  c.skip(8);  // root entry: link name offset
  const uint64_t root_header = c.u64();
  if (!c.ok()) return damaged("the superblock is cut short");
  if (offset_size != 8 || length_size != 8)
    return unsupported(
        fmt::format("{}-byte addresses and {}-byte lengths", offset_size, length_size));
  if (leaf_k == 0 || internal_k == 0) return damaged("group node sizes of zero");
  if (base != sb)
    return unsupported(fmt::format("base address {} with the superblock at byte {}", base, sb));
  if (driver != kUndefined)
    return unsupported("a file-driver information block (a multi-file HDF5 driver)");
  // The end-of-file address counts from the start of the file, user block included (what libhdf5
  // writes and checks), unlike the other addresses, which count from the base.
  if (eof > size)
    return Status::bad_input(
        fmt::format("the file is truncated: its superblock records {} bytes but it has {}", eof,
                    size) +
        kFix);
  if (eof < sb + 96) return damaged(fmt::format("an end-of-file address of {}", eof));
  f->base_ = sb;
  f->end_ = eof;
  f->leaf_k_ = leaf_k;
  f->internal_k_ = internal_k;
  auto root = f->object(root_header);
  if (!root) return root.status().with_context("the root group: ");
  if (!root->has_group) return damaged("the root object is not a group");
  f->root_ = std::move(root).value();
  return f;
}

Result<Object> File::object(uint64_t header) const {
  auto prefix = block(header, 16);
  if (!prefix) return prefix.status();
  Cursor pc(prefix->data(), prefix->size());
  const uint8_t version = pc.u8();
  if (version != 1) {
    if (version == 'O')
      return unsupported("a version-2 object header, written with newer HDF5 format settings");
    return damaged(fmt::format("object header at address {} has version {}", header, version));
  }
  pc.skip(7);
  const uint32_t first_size = pc.u32();
  Object o;
  o.header = header;
  bool have_space = false, have_type = false, have_layout = false, filters = false,
       external = false;
  bool new_style_links = false, dense_attributes = false;
  SpaceInfo space;
  TypeInfo type;
  uint64_t layout_address = kUndefined, layout_size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> chunks = {{header + 16, first_size}};
  std::set<uint64_t> seen = {header + 16};
  int messages = 0;
  const std::string where = fmt::format("object header at address {}", header);
  for (size_t k = 0; k < chunks.size(); ++k) {
    auto chunk = block(chunks[k].first, chunks[k].second);
    if (!chunk) return chunk.status();
    Cursor c(chunk->data(), chunk->size());
    while (c.left() >= 8) {
      const uint16_t type_id = c.u16(), size = c.u16();
      const uint8_t flags = c.u8();
      c.skip(3);
      const uint8_t* body = c.take(size);
      if (body == nullptr) return damaged(where + ": a message runs past its chunk");
      if (++messages > limits_.max_messages) return damaged(where + ": too many messages");
      const bool shared = (flags & 2) != 0;
      switch (type_id) {
        case 0x0001: {  // dataspace
          if (have_space || shared) return unsupported(where + ": a repeated or shared dataspace");
          auto s = parse_dataspace(body, size);
          if (!s) return s.status();
          space = std::move(s).value();
          have_space = true;
          break;
        }
        case 0x0003: {  // datatype
          if (have_type || shared) return unsupported(where + ": a repeated or shared datatype");
          auto t = parse_datatype(body, size);
          if (!t) return t.status();
          type = t.value();
          have_type = true;
          break;
        }
        case 0x0008: {  // data layout
          Cursor l(body, size);
          const uint8_t lv = l.u8(), cls = l.u8();
          if (!l.ok() || lv != 3)
            return unsupported(where + fmt::format(": data layout version {}", lv));
          if (cls != 1)
            return unsupported(where + ": chunked or compact data (troupe writes contiguous data)");
          layout_address = l.u64();
          layout_size = l.u64();
          if (!l.ok()) return damaged(where + ": the layout message is cut short");
          have_layout = true;
          break;
        }
        case 0x0007:
          external = true;
          break;
        case 0x000B:
          filters = true;
          break;
        case 0x0002:
        case 0x0006:
          new_style_links = true;
          break;
        case 0x0015:
          dense_attributes = true;
          break;
        case 0x000C:
          if (shared) return unsupported(where + ": a shared attribute");
          TROUPE_RETURN_IF_ERROR(parse_attribute(body, size, o));
          break;
        case 0x0010: {  // continuation
          Cursor cc(body, size);
          const uint64_t address = cc.u64(), length = cc.u64();
          if (!cc.ok()) return damaged(where + ": a continuation message is cut short");
          if (static_cast<int>(chunks.size()) >= limits_.max_chunks)
            return damaged(where + ": too many chunks");
          if (seen.insert(address).second) chunks.emplace_back(address, length);
          break;
        }
        case 0x0011: {  // symbol table: an old-style group
          Cursor sc(body, size);
          o.btree = sc.u64();
          o.heap = sc.u64();
          if (!sc.ok()) return damaged(where + ": a symbol table message is cut short");
          o.has_group = true;
          break;
        }
        default:
          break;  // modification times, fill values, NIL padding...
      }
    }
  }
  if (new_style_links && !o.has_group) return unsupported(where + ": a new-style group");
  if (dense_attributes) return unsupported(where + ": attributes in dense storage");
  if (!(have_space && have_type && have_layout))
    return o;  // not a dataset (a group or another object)
  if (filters) return unsupported(where + ": a filtered (compressed) dataset");
  if (external) return unsupported(where + ": a dataset stored in external files");
  o.has_dataset = true;
  o.type = type.type;
  o.scalar = space.scalar;
  o.dims = space.dims;
  if (!count_elements(space, &o.numel))
    return damaged(where + ": the dataset's element count overflows");
  const uint64_t elem = type.size == 0 ? 1 : type.size;
  if (static_cast<uint64_t>(o.numel) > std::numeric_limits<uint64_t>::max() / elem)
    return damaged(where + ": the dataset's size overflows");
  const uint64_t bytes = static_cast<uint64_t>(o.numel) * elem;
  if (layout_address == kUndefined) {
    if (bytes != 0)
      return damaged(where + ": a dataset of " + std::to_string(o.numel) +
                     " elements holds no data");
    return o;
  }
  if (layout_size != bytes)
    return damaged(where +
                   fmt::format(": {} elements of {} bytes need {} bytes but the layout has {}",
                               o.numel, elem, bytes, layout_size));
  if (layout_address > end_ - base_ || bytes > end_ - base_ - layout_address)
    return damaged(where +
                   fmt::format(": {} bytes of data at address {} run past the end of the file",
                               bytes, layout_address));
  o.data_offset = base_ + layout_address;
  o.data_bytes = bytes;
  return o;
}

Status File::parse_attribute(const uint8_t* p, size_t n, Object& out) const {
  Cursor c(p, n);
  const uint8_t version = c.u8(), flags = c.u8();
  const uint16_t name_size = c.u16(), type_size = c.u16(), space_size = c.u16();
  if (version == 3) c.skip(1);  // character set of the name
  if (!c.ok() || version < 1 || version > 3)
    return damaged(fmt::format("attribute message version {}", version));
  if (version > 1 && (flags & 3))
    return unsupported("an attribute with a shared datatype or dataspace");
  const bool padded = version == 1;
  const uint8_t* name = c.take(padded ? pad8(name_size) : name_size);
  const uint8_t* type_bytes = c.take(padded ? pad8(type_size) : type_size);
  const uint8_t* space_bytes = c.take(padded ? pad8(space_size) : space_size);
  if (!c.ok() || name_size == 0 || name[name_size - 1] != 0)
    return damaged("an attribute message is cut short");
  const std::string attr_name(reinterpret_cast<const char*>(name));
  auto type = parse_datatype(type_bytes, type_size);
  if (!type) return type.status();
  auto space = parse_dataspace(space_bytes, space_size);
  if (!space) return space.status();
  Attribute a;
  int64_t count = 0;
  // Only scalars of the types troupe writes are decoded; any other attribute (h5py may add some) is
  // kept as `other` and never read.
  if (count_elements(*space, &count) && count == 1 && type->type != ElementType::other) {
    const uint8_t* data = c.take(type->size);
    if (data == nullptr)
      return damaged("attribute '" + attr_name + "' holds less data than its type needs");
    Cursor d(data, type->size);
    a.type = type->type;
    if (a.type == ElementType::i64) {
      a.i = static_cast<int64_t>(d.u64());
    } else if (a.type == ElementType::f64) {
      const uint64_t bits = d.u64();
      std::memcpy(&a.f, &bits, sizeof bits);
    } else if (type->vlen_string) {
      const uint32_t length = d.u32();
      const uint64_t collection = d.u64();
      const uint32_t index = d.u32();
      if (length > 0) {
        auto s = heap_string(collection, index, length);
        if (!s) return s.status().with_context("attribute '" + attr_name + "': ");
        a.s = std::move(s).value();
      }
    } else {
      a.s.assign(reinterpret_cast<const char*>(data), type->size);
      const size_t nul = a.s.find('\0');
      if (nul != std::string::npos) a.s.resize(nul);
      if (type->space_padded)
        while (!a.s.empty() && a.s.back() == ' ') a.s.pop_back();
    }
  }
  if (!out.attributes.emplace(attr_name, std::move(a)).second)
    return damaged("attribute '" + attr_name + "' appears twice");
  return Status::ok();
}

Result<std::string> File::heap_string(uint64_t collection, uint32_t index, uint32_t length) const {
  std::shared_ptr<const std::vector<uint8_t>> bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = collections_.find(collection); it != collections_.end()) bytes = it->second;
  }
  if (!bytes) {
    auto head = block(collection, 16);
    if (!head) return head.status();
    Cursor h(head->data(), head->size());
    const bool signature = has_signature(h, "GCOL");
    const uint8_t version = h.u8();
    h.skip(3);
    const uint64_t size = h.u64();
    if (!signature || version != 1 || size < 16)
      return damaged("a string's global heap collection");
    auto all = block(collection, size);
    if (!all) return all.status();
    bytes = std::make_shared<const std::vector<uint8_t>>(std::move(all).value());
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t cached = 0;
    for (const auto& [address, v] : collections_) cached += v->size();
    if (cached + bytes->size() <= end_)
      collections_.emplace(collection, bytes);  // never more than the file
  }
  Cursor c(bytes->data(), bytes->size());
  c.skip(16);
  while (c.left() >= 16) {
    const uint16_t id = c.u16();
    c.skip(6);
    const uint64_t size = c.u64();
    if (id == 0) break;  // free space: the end of the objects
    if (size > c.left()) return damaged("a global heap object runs past its collection");
    const uint8_t* data = c.take(static_cast<size_t>(size));
    if (id == index) {
      if (length > size) return damaged("a string is longer than its global heap object");
      return std::string(reinterpret_cast<const char*>(data), length);
    }
    c.skip(std::min(pad8(static_cast<size_t>(size)) - static_cast<size_t>(size), c.left()));
  }
  return damaged("a string is missing from its global heap collection");
}

Result<std::string> File::local_heap_name(const std::vector<uint8_t>& heap, uint64_t offset) const {
  if (offset >= heap.size()) return damaged("a link name lies outside its group's heap");
  const auto* begin = heap.data() + offset;
  const void* nul = std::memchr(begin, 0, heap.size() - static_cast<size_t>(offset));
  if (nul == nullptr) return damaged("a link name is not terminated");
  std::string name(reinterpret_cast<const char*>(begin), static_cast<const uint8_t*>(nul) - begin);
  if (name.empty()) return damaged("an empty link name");
  return name;
}

Result<std::map<std::string, uint64_t>> File::links(const Object& group) const {
  if (!group.has_group) return damaged("links of an object that is not a group");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = listed_.find(group.btree); it != listed_.end() && it->second) return *it->second;
  }
  auto listed = list_group(group);
  if (!listed) return listed.status();
  std::lock_guard<std::mutex> lock(mu_);
  listed_[group.btree] = std::make_shared<const std::map<std::string, uint64_t>>(listed.value());
  return listed;
}

Result<std::map<std::string, uint64_t>> File::list_group(const Object& group) const {
  auto heap_head = block(group.heap, 32);
  if (!heap_head) return heap_head.status();
  Cursor hc(heap_head->data(), heap_head->size());
  const bool heap_sig = has_signature(hc, "HEAP");
  const uint8_t heap_version = hc.u8();
  hc.skip(3);
  const uint64_t heap_size = hc.u64();
  hc.skip(8);
  const uint64_t heap_data = hc.u64();
  if (!heap_sig || heap_version != 0) return damaged("a group's local heap");
  auto heap = block(heap_data, heap_size);
  if (!heap) return heap.status();

  std::map<std::string, uint64_t> out;
  std::set<uint64_t> visited;
  struct Node {
    uint64_t address;
    int level;  // -1: the root, whatever its level
  };
  std::vector<Node> todo = {{group.btree, -1}};
  while (!todo.empty()) {
    const Node node = todo.back();
    todo.pop_back();
    if (!visited.insert(node.address).second)
      return damaged("a group's B-tree visits a node twice");
    auto head = block(node.address, 24);
    if (!head) return head.status();
    Cursor c(head->data(), head->size());
    const bool sig = has_signature(c, "TREE");
    const uint8_t type = c.u8(), level = c.u8();
    const uint16_t entries = c.u16();
    if (!sig || type != 0) return damaged("a group's B-tree node");
    // Levels fall by one towards the leaves, so the walk has no cycles and ends.
    if (node.level >= 0 && level != node.level)
      return damaged("a group's B-tree levels are inconsistent");
    if (entries > 2 * internal_k_) return damaged("a group's B-tree node has too many entries");
    auto body = block(node.address + 24, (2 * uint64_t{entries} + 1) * 8);
    if (!body) return body.status();
    for (uint16_t i = 0; i < entries; ++i) {
      Cursor e(body->data() + 8 + 16 * size_t{i}, 8);
      const uint64_t child = e.u64();
      if (level > 0) {
        todo.push_back({child, level - 1});
        continue;
      }
      if (!visited.insert(child).second) return damaged("a group's symbol node appears twice");
      auto snod = block(child, 8);
      if (!snod) return snod.status();
      Cursor s(snod->data(), snod->size());
      const bool ssig = has_signature(s, "SNOD");
      const uint8_t sversion = s.u8();
      s.skip(1);
      const uint16_t symbols = s.u16();
      if (!ssig || sversion != 1 || symbols > 2 * leaf_k_)
        return damaged("a group's symbol table node");
      auto table = block(child + 8, uint64_t{symbols} * 40);
      if (!table) return table.status();
      for (uint16_t k = 0; k < symbols; ++k) {
        Cursor t(table->data() + 40 * size_t{k}, 40);
        const uint64_t name_offset = t.u64(), header = t.u64();
        auto name = local_heap_name(*heap, name_offset);
        if (!name) return name.status();
        if (!out.emplace(std::move(name).value(), header).second)
          return damaged("a group holds one name twice");
        if (out.size() > limits_.max_links) return damaged("a group with too many links");
      }
    }
  }
  return out;
}

Result<Object> File::at_path(const std::string& path) const {
  Object o = root_;
  std::string so_far;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const std::string part =
        path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    so_far += (so_far.empty() ? "" : "/") + part;
    if (!o.has_group)
      return Status::bad_input("'" + so_far + "' lies inside an object that is not a group" + kFix);
    auto all = links(o);
    if (!all) return all.status();
    auto it = all->find(part);
    if (it == all->end())
      return Status::bad_input("'" + so_far +
                               "' is missing -- the file is incomplete or not written by troupe");
    auto next = object(it->second);
    if (!next) return next.status().with_context("'" + so_far + "': ");
    o = std::move(next).value();
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return o;
}

Status File::read_data(const Object& dataset, void* out) const {
  if (!dataset.has_dataset) return damaged("reading data of an object that is not a dataset");
  if (dataset.data_bytes == 0) return Status::ok();
  return source_->read(dataset.data_offset, out, static_cast<size_t>(dataset.data_bytes));
}

}  // namespace troupe::h5read
