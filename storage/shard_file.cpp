#include "storage/shard_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>

#include "troupe/check.hpp"
#include "storage/durable.hpp"
#include "storage/h5_file.hpp"
#include "storage/sharded_checkpoint.hpp"
#include "storage/write_pacing.hpp"

namespace troupe {

namespace {

constexpr const char* kShardFormat = "troupe-checkpoint-shard";
constexpr const char* kV1Format = "troupe-checkpoint";
constexpr int64_t kShardVersion = 3;
constexpr const char* kRunsSuffix = ".runs";
constexpr const char* kGlobalShapeAttr = "global_shape";
constexpr const char* kDamagedFix = " -- restore the checkpoint from a copy or load an earlier one";

const ShardSection kSections[] = {ShardSection::model, ShardSection::exp_avg,
                                  ShardSection::exp_avg_sq};

// ---- the integrity header (bytes 0..511, an HDF5 user block)
// -----------------------------------------
//   0  8  "TRPSHARD"          16  u64 length of the whole file
//   8  4  header version 1    24  u32 CRC-32 of bytes 512 .. length-1
//  12  4  header bytes 512    28  u32 CRC-32 of bytes 0..511 with this field zero
//  32 ..  a line of text for whoever opens the file in an editor, then zeros
constexpr size_t kHeaderBytes = 512;
constexpr char kMagic[8] = {'T', 'R', 'P', 'S', 'H', 'A', 'R', 'D'};
constexpr const char* kHeaderNote =
    "troupe checkpoint shard, format version 3 (docs/CHECKPOINT.md): HDF5 data from byte 512; "
    "these first "
    "512 bytes are an HDF5 user block (h5py and h5dump skip it) holding the file's length and "
    "CRC-32.\n";

void put_u32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
void put_u64(uint8_t* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint32_t header_crc(const uint8_t* header) {
  uint8_t copy[kHeaderBytes];
  std::memcpy(copy, header, kHeaderBytes);
  put_u32(copy + 28, 0);
  return h5::crc32(copy, kHeaderBytes);
}

void fill_header(uint8_t* header, uint64_t bytes, uint32_t payload_crc) {
  std::memset(header, 0, kHeaderBytes);
  std::memcpy(header, kMagic, sizeof kMagic);
  put_u32(header + 8, 1);
  put_u32(header + 12, kHeaderBytes);
  put_u64(header + 16, bytes);
  put_u32(header + 24, payload_crc);
  std::memcpy(header + 32, kHeaderNote, std::strlen(kHeaderNote));
  put_u32(header + 28, header_crc(header));
}

// nullopt: no header (no magic). An error: a header that is damaged or does not fit the file.
Result<std::optional<ShardDigest>> parse_header(const h5read::ByteSource& source) {
  if (source.size() < sizeof kMagic) return std::optional<ShardDigest>();
  uint8_t header[kHeaderBytes] = {0};
  TROUPE_RETURN_IF_ERROR(source.read(0, header, sizeof kMagic));
  if (std::memcmp(header, kMagic, sizeof kMagic) != 0) return std::optional<ShardDigest>();
  if (source.size() < kHeaderBytes)
    return Status::bad_input(
        fmt::format("the file is truncated ({} bytes, shorter than its header)", source.size()) +
        kDamagedFix);
  TROUPE_RETURN_IF_ERROR(source.read(0, header, kHeaderBytes));
  if (header_crc(header) != get_u32(header + 28) || get_u32(header + 8) != 1 ||
      get_u32(header + 12) != kHeaderBytes)
    return Status::bad_input("its integrity header is damaged (checksum mismatch)" +
                             std::string(kDamagedFix));
  ShardDigest d{get_u64(header + 16), get_u32(header + 24)};
  if (d.bytes != source.size())
    return Status::bad_input(
        fmt::format("the file has {} bytes but its header records {}: it is truncated or "
                    "extended",
                    source.size(), d.bytes) +
        kDamagedFix);
  return std::optional<ShardDigest>(d);
}

// Files whose whole-file checksum matched, by identity (device, inode, size, times): the ranks of a
// process all open the same shards, and each is read once for its checksum.
std::mutex g_verified_mu;
std::set<std::string> g_verified;

Status verify_payload(const h5read::ByteSource& source, const ShardDigest& digest) {
  const std::string id = source.identity();
  if (!id.empty()) {
    std::lock_guard<std::mutex> lock(g_verified_mu);
    if (g_verified.count(id)) return Status::ok();
  }
  std::vector<uint8_t> block(std::min<uint64_t>(kPacedBlockBytes, digest.bytes));
  uint32_t crc = 0;
  for (uint64_t at = kHeaderBytes; at < digest.bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), digest.bytes - at));
    TROUPE_RETURN_IF_ERROR(source.read(at, block.data(), n));
    crc = h5::crc32_update(crc, block.data(), n);
    at += n;
  }
  if (crc != digest.crc32)
    return Status::bad_input(
        fmt::format("the file's checksum does not match (stored crc32 {:#010x}, computed "
                    "{:#010x}): it is corrupted",
                    digest.crc32, crc) +
        kDamagedFix);
  if (!id.empty()) {
    std::lock_guard<std::mutex> lock(g_verified_mu);
    g_verified.insert(id);
  }
  return Status::ok();
}

std::string shape_text(const Shape& s) {  // "[4, 6]"; "[]" for a scalar
  std::string out = "[";
  for (int i = 0; i < s.rank(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// "[d0, d1, ...]" with at most Shape::kMaxRank non-negative dimensions whose product fits int64.
Result<Shape> parse_shape(const std::string& text) {
  const std::string shown = text.substr(0, 80);
  if (text.size() < 2 || text.size() > 200 || text.front() != '[' || text.back() != ']')
    return Status::bad_input("global_shape '" + shown + "' is not of the form [d0, d1, ...]");
  std::vector<int64_t> dims;
  const char* p = text.data() + 1;
  const char* end = text.data() + text.size() - 1;
  int64_t numel = 1;
  while (p < end) {
    while (p < end && *p == ' ') ++p;
    int64_t v = -1;
    auto [next, err] = std::from_chars(p, end, v);
    if (err != std::errc() || v < 0)
      return Status::bad_input("global_shape '" + shown + "' holds a bad dimension");
    if (v != 0 && numel > std::numeric_limits<int64_t>::max() / v)
      return Status::bad_input("global_shape '" + shown +
                               "' has more elements than fit in 64 bits");
    numel *= v;
    dims.push_back(v);
    p = next;
    while (p < end && *p == ' ') ++p;
    if (p < end && *p++ != ',')
      return Status::bad_input("global_shape '" + shown + "' holds a bad separator");
    if (dims.size() > static_cast<size_t>(Shape::kMaxRank))
      return Status::bad_input("global_shape '" + shown +
                               "' has more dimensions than troupe supports");
  }
  return Shape(dims.begin(), dims.end());
}

// Opens (or creates) the group of a section, "optimizer/exp_avg" being two levels.
Result<h5::Handle> section_group(hid_t file, ShardSection section) {
  const std::string path = shard_section_path(section);
  const size_t slash = path.find('/');
  if (slash == std::string::npos) return h5::create_group(file, path);
  const std::string outer = path.substr(0, slash), inner = path.substr(slash + 1);
  Result<h5::Handle> parent =
      !h5::exists(file, outer) ? h5::create_group(file, outer) : h5::open_group(file, outer);
  if (!parent) return parent.status();
  return h5::create_group(parent->get(), inner);
}

int64_t run_total(const std::vector<GlobalRun>& runs) {
  int64_t n = 0;
  for (const GlobalRun& r : runs) n += r.length;
  return n;
}

// Pieces of at least this many bytes get file space reserved for them and are written from their own
// memory: their bytes are copied once (into the file) and their checksum is computed once (the whole
// file's is combined from it). Smaller ones go through libhdf5 with the index tables.
constexpr uint64_t kReservedPieceBytes = uint64_t{64} << 10;

// A piece's values and where they go in the file.
struct ReservedPiece {
  uint64_t offset = 0;
  ConstBytes values;
  uint32_t crc = 0;
};

// The shard file's HDF5 structure (its first 512 bytes, the header, zeros) and the pieces to write
// at the places reserved for them.
struct ShardLayout {
  h5::MemoryFile::Image image;
  std::vector<ReservedPiece> reserved;  // ascending offsets
};

// The CRC-32 of `bytes`, paced as the writes are (a background writer's checksums are its work too).
uint32_t paced_crc32(const void* data, size_t bytes) {
  const std::function<void(double)>* pacer = WritePacing::current();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t crc = 0;
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(kPacedBlockBytes, bytes - done);
    const double t0 = thread_cpu_seconds();
    crc = h5::crc32_update(crc, p + done, n);
    done += n;
    if (pacer != nullptr) (*pacer)(thread_cpu_seconds() - t0);
  }
  return crc;
}

Status write_global_shape(hid_t group, const TensorPiece& p) {
  h5::Handle ds(H5Dopen2(group, p.name.c_str(), H5P_DEFAULT), H5Dclose);
  return h5::write_attr(ds.get(), kGlobalShapeAttr, shape_text(p.global_shape));
}

// Everything libhdf5 writes (groups, attributes, index tables, small pieces) is written before any
// large piece's space is taken, from blocks sized to hold what comes after too, so that it all lies
// below the reserved space and the in-memory image holds none of the large pieces' bytes (not even
// zeros). Where HDF5 places something above them anyway the image is longer, never wrong.
// Where `p` lies in `reuse`'s mapping, as a file offset.
std::optional<uint64_t> offset_in(const ShardFileReuse& reuse, const void* p) {
  const auto* at = static_cast<const uint8_t*>(p);
  if (!std::less_equal<const uint8_t*>()(reuse.base, at) || !std::less<const uint8_t*>()(at, reuse.base + reuse.bytes))
    return std::nullopt;
  return static_cast<uint64_t>(at - reuse.base);
}

// The place of `reuse` whose bytes `values` are exactly, if any.
std::optional<uint64_t> exact_place(const ShardFileReuse& reuse, const Tensor& values) {
  const std::optional<uint64_t> at = offset_in(reuse, values.raw());
  if (!at) return std::nullopt;
  const uint64_t bytes = static_cast<uint64_t>(values.numel()) * sizeof(float);
  for (const ShardRegion& r : reuse.regions)
    if (r.offset == *at && r.bytes == bytes) return at;
  return std::nullopt;
}

// With `reuse`, the large pieces' datasets are created in the order of their places in that file
// (where their values lie, or a free place of their size): file space is taken in that order, so
// pieces of the sizes that file's had get the same places.
Result<ShardLayout> build_shard_layout(const std::string& path, int rank,
                                       const ShardContents& contents, const ShardFileReuse* reuse) {
  h5::ErrorScope quiet;
  uint64_t pieces = 0, small_bytes = 0;
  bool any_reserved = false;
  for (const auto& [section, list] : contents.sections)
    for (const TensorPiece& p : list) {
      const int64_t n = run_total(p.runs);
      TROUPE_CHECK(p.values.defined() && p.values.dtype() == DType::f32 && p.values.numel() == n,
                   "shard piece '" + p.name + "': values must be host f32 covering its runs");
      for (const GlobalRun& r : p.runs)
        TROUPE_CHECK(r.length > 0 && r.start >= 0 && r.start + r.length <= p.global_shape.numel(),
                     "shard piece '" + p.name + "': a run lies outside the global shape");
      const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(float);
      ++pieces;
      small_bytes += 16 * p.runs.size() + (bytes >= kReservedPieceBytes ? 0 : bytes);
      any_reserved = any_reserved || bytes >= kReservedPieceBytes;
    }
  h5::MemoryFileOptions options;
  options.user_block = kHeaderBytes;
  if (any_reserved) {
    // About 1 KiB of object headers, links and heap per dataset (two per piece), 64 bytes of
    // strings per piece (global_shape), and room to spare: what is not used stays a hole of zeros.
    options.metadata_block = (uint64_t{64} << 10) + 2048 * pieces;
    options.small_data_block = (uint64_t{64} << 10) + small_bytes + 64 * pieces;
    options.align_from = kReservedPieceBytes;  // pieces aligned (copied into where they lie)
  }
  Result<h5::MemoryFile> file = h5::MemoryFile::create(path, options);
  if (!file) return file.status();
  const hid_t root = file->get();
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "format", std::string(kShardFormat)));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "format_version", kShardVersion));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "rank", static_cast<int64_t>(rank)));
  std::vector<std::pair<h5::Handle, const std::vector<TensorPiece>*>> groups;
  for (const auto& [section, list] : contents.sections) {
    if (list.empty()) continue;
    Result<h5::Handle> group = section_group(root, section);
    if (!group) return group.status();
    groups.emplace_back(std::move(group.value()), &list);
  }
  // The index tables and the small pieces.
  for (const auto& [group, list] : groups)
    for (const TensorPiece& p : *list) {
      const std::string what = "tensor " + p.name + ": ";
      const int64_t n = p.values.numel();
      if (static_cast<uint64_t>(n) * sizeof(float) < kReservedPieceBytes) {
        TROUPE_RETURN_IF_ERROR(
            h5::write_f32_dataset(group.get(), p.name, Shape{n}, p.values.data<float>())
                .with_context(what));
        TROUPE_RETURN_IF_ERROR(write_global_shape(group.get(), p).with_context(what));
      }
      std::vector<int64_t> table;
      table.reserve(2 * p.runs.size());
      for (const GlobalRun& r : p.runs) {
        table.push_back(r.start);
        table.push_back(r.length);
      }
      TROUPE_RETURN_IF_ERROR(h5::write_i64_dataset(group.get(), p.name + kRunsSuffix,
                                                   Shape{static_cast<int64_t>(p.runs.size()), 2},
                                                   table.data())
                                 .with_context(what));
    }
  // The large pieces' space, their checksums and shapes.
  std::vector<std::pair<hid_t, const TensorPiece*>> large;
  for (const auto& [group, list] : groups)
    for (const TensorPiece& p : *list)
      if (static_cast<uint64_t>(p.values.numel()) * sizeof(float) >= kReservedPieceBytes)
        large.emplace_back(group.get(), &p);
  if (reuse != nullptr) {
    // Each piece's place in `reuse`: the place its values fill, or a free place of its size.
    std::vector<uint64_t> place(large.size(), std::numeric_limits<uint64_t>::max());
    std::set<uint64_t> taken;
    for (size_t i = 0; i < large.size(); ++i)
      if (std::optional<uint64_t> at = exact_place(*reuse, large[i].second->values)) {
        place[i] = *at;
        taken.insert(*at);
      }
    for (size_t i = 0; i < large.size(); ++i) {
      if (place[i] != std::numeric_limits<uint64_t>::max()) continue;
      const uint64_t bytes = static_cast<uint64_t>(large[i].second->values.numel()) * sizeof(float);
      for (const ShardRegion& r : reuse->regions)
        if (r.bytes == bytes && taken.insert(r.offset).second) {
          place[i] = r.offset;
          break;
        }
    }
    std::vector<size_t> order(large.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return place[a] < place[b]; });
    std::vector<std::pair<hid_t, const TensorPiece*>> sorted;
    for (size_t i : order) sorted.push_back(large[i]);
    large = std::move(sorted);
  }
  ShardLayout layout;
  for (const auto& [group, piece] : large) {
    const TensorPiece& p = *piece;
    const int64_t n = p.values.numel();
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    const std::string what = "tensor " + p.name + ": ";
    ReservedPiece r;
    r.values = {p.values.data<float>(), bytes};
    r.crc = paced_crc32(r.values.data, bytes);
    Result<uint64_t> offset = h5::reserve_f32_dataset(group, p.name, Shape{n}, r.crc);
    if (!offset) return offset.status().with_context(what);
    r.offset = *offset;
    TROUPE_RETURN_IF_ERROR(write_global_shape(group, p).with_context(what));
    layout.reserved.push_back(r);
  }
  groups.clear();
  Result<h5::MemoryFile::Image> image = file->finish();
  if (!image) return image.status();
  layout.image = std::move(image.value());
  std::sort(layout.reserved.begin(), layout.reserved.end(),
            [](const ReservedPiece& a, const ReservedPiece& b) { return a.offset < b.offset; });
  return layout;
}

uint32_t zeros_crc32(uint32_t crc, uint64_t bytes) {
  static const std::vector<uint8_t> zeros(size_t{64} << 10, 0);
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(zeros.size(), bytes - done));
    crc = h5::crc32_update(crc, zeros.data(), n);
    done += n;
  }
  return crc;
}

Status write_shard(const std::string& path, int rank, const ShardContents& contents, ShardWriteStats* stats,
                   const ShardFileReuse* reuse) {
  const std::string where = "writing the checkpoint shard " + path + ": ";
  // A piece that lies in `reuse` but not exactly on one of its places (a view into a larger copy
  // that took a place of another size) is copied out first: the bytes around it will be rewritten.
  ShardContents staged;
  const ShardContents* source = &contents;
  if (reuse != nullptr)
    for (const auto& [section, pieces] : contents.sections)
      for (size_t i = 0; i < pieces.size(); ++i) {
        const Tensor& v = pieces[i].values;
        if (!offset_in(*reuse, v.raw()) || exact_place(*reuse, v)) continue;
        if (source != &staged) staged = contents, source = &staged;  // tensor handles: values not copied
        Tensor copy = Tensor::empty(v.shape(), v.dtype());
        copy.copy_from(v);
        staged.sections[section][i].values = std::move(copy);
      }
  Result<ShardLayout> layout = build_shard_layout(path, rank, *source, reuse);
  if (!layout) return layout.status().with_context(where);
  const h5::MemoryFile::Image& image = layout->image;
  // In place when every large piece that lies in `reuse` lies where this layout puts it (the
  // layout's places do not overlap, so the others are written where no piece's values lie).
  bool in_place = reuse != nullptr && !layout->reserved.empty();
  int64_t pieces_in_place = 0;
  std::vector<bool> kept(layout->reserved.size(), false);
  for (size_t i = 0; in_place && i < layout->reserved.size(); ++i) {
    const ReservedPiece& r = layout->reserved[i];
    const std::optional<uint64_t> at = offset_in(*reuse, r.values.data);
    in_place = r.offset + r.values.size <= reuse->bytes && (!at || *at == r.offset);
    kept[i] = at.has_value();
    pieces_in_place += at ? 1 : 0;
  }
  // (Every piece in `reuse` is on its place now, and the layout's places do not overlap: the pieces
  // written, from elsewhere, go where no piece's values lie.)
  in_place = in_place && pieces_in_place > 0;
  // The file after its header, in order: the image's bytes, zeros where the image ends below a
  // reserved piece, the pieces. The checksum of it all combines the pieces' own.
  std::vector<FileStretch> body;
  uint32_t crc = 0;
  uint64_t at = kHeaderBytes;
  auto file_bytes_to = [&](uint64_t end) {
    if (at < image.size && at < end) {
      const uint64_t n = std::min<uint64_t>(end, image.size) - at;
      body.push_back({FileStretch::Kind::bytes, image.data.get() + at, static_cast<size_t>(n)});
      crc = h5::crc32_update(crc, image.data.get() + at, static_cast<size_t>(n));
      at += n;
    }
    if (at < end) {
      body.push_back({FileStretch::Kind::zeros, nullptr, static_cast<size_t>(end - at)});
      crc = zeros_crc32(crc, end - at);
      at = end;
    }
  };
  for (size_t i = 0; i < layout->reserved.size(); ++i) {
    const ReservedPiece& r = layout->reserved[i];
    if (r.offset < at || r.offset + r.values.size > image.length)
      return Status::error(where + "libhdf5 placed a tensor's values where the file holds other "
                                   "data -- report this");
    file_bytes_to(r.offset);
    body.push_back({in_place && kept[i] ? FileStretch::Kind::in_place : FileStretch::Kind::bytes, r.values.data,
                    r.values.size});
    crc = h5::crc32_combine(crc, r.crc, r.values.size);
    at += r.values.size;
  }
  file_bytes_to(image.length);
  auto header = [&] {
    std::string h(kHeaderBytes, '\0');
    fill_header(reinterpret_cast<uint8_t*>(h.data()), image.length, crc);
    return h;
  };
  Status st = make_directories(parent_dir(path));
  if (st)
    st = in_place ? rewrite_file_with_head(path, reuse->path, kHeaderBytes, body, header)
                  : write_file_with_head(path, kHeaderBytes, body, header);
  if (!st) {
    discard_unfinished_save(parent_dir(path));
    return st.with_context(where);
  }
  if (stats != nullptr) {
    stats->file_bytes = image.length;
    stats->image_bytes = image.size;
    stats->reserved.clear();
    for (const ReservedPiece& r : layout->reserved) stats->reserved.push_back({r.offset, r.values.size});
    stats->in_place = in_place;
    stats->pieces_in_place = in_place ? pieces_in_place : 0;
  }
  return Status::ok();
}

}  // namespace

const char* shard_section_path(ShardSection s) {
  switch (s) {
    case ShardSection::model:
      return "model";
    case ShardSection::exp_avg:
      return "optimizer/exp_avg";
    case ShardSection::exp_avg_sq:
      return "optimizer/exp_avg_sq";
  }
  return "?";
}

std::vector<GlobalRun> runs_from_indices(int64_t n,
                                         const std::function<int64_t(int64_t)>& global_index) {
  std::vector<GlobalRun> runs;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = global_index(i);
    if (g < 0) continue;
    if (!runs.empty() && runs.back().start + runs.back().length == g)
      ++runs.back().length;
    else
      runs.push_back({g, 1});
  }
  return runs;
}

// ---- writing
// ---------------------------------------------------------------------------------------

Status write_shard_file(const std::string& path, int rank, const ShardContents& contents,
                        ShardWriteStats* stats, const ShardFileReuse* reuse) {
  return write_shard(path, rank, contents, stats, reuse);
}

Status write_shard_file(const std::string& path, int rank, ShardContents&& contents,
                        ShardWriteStats* stats) {
  const ShardContents owned = std::move(contents);  // its values go when the file is written
  return write_shard(path, rank, owned, stats, nullptr);
}

Result<std::optional<ShardDigest>> read_shard_digest(const std::string& path) {
  auto source = h5read::open_file_source(path);
  if (!source) return source.status().with_context("checkpoint shard " + path + ": ");
  auto d = parse_header(**source);
  if (!d) return d.status().with_context("checkpoint shard " + path + ": ");
  return d;
}

Result<ShardDigest> verify_shard_bytes(std::string_view bytes, const std::string& name) {
  struct View final : h5read::ByteSource {
    std::string_view b;
    uint64_t size() const override { return b.size(); }
    Status read(uint64_t offset, void* out, size_t n) const override {
      if (offset > b.size() || n > b.size() - offset) return Status::bad_input("read past the end");
      std::memcpy(out, b.data() + offset, n);
      return Status::ok();
    }
  } view;
  view.b = bytes;
  auto d = parse_header(view);
  if (!d) return d.status().with_context("checkpoint shard " + name + ": ");
  if (!d->has_value()) return Status::bad_input("checkpoint shard " + name + " has no integrity header" + kDamagedFix);
  const ShardDigest digest = **d;
  if (h5::crc32(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes) != digest.crc32)
    return Status::bad_input("checkpoint shard " + name + ": its data does not match its checksum" + kDamagedFix);
  return digest;
}

// ---- reading
// ---------------------------------------------------------------------------------------

struct ShardSetReader::Impl {
  struct File {
    std::string name;
    std::unique_ptr<h5read::File> h5;
    std::shared_ptr<const h5read::ByteSource> bytes;
    std::optional<ShardDigest> unverified;  // the whole-file check still due before a read
  };
  struct Piece {
    int file = 0;
    h5read::Object dataset;  // its values: (numel) in shards, the global shape in version 1
    int64_t numel = 0;
    int64_t crc = 0;
    std::vector<float> values;  // loaded on first use, dropped after the read() that used it
    bool loaded = false;
  };
  // Disjoint, sorted by start: where each global index's value lives.
  struct Interval {
    int64_t start = 0, end = 0;
    int piece = 0;
    int64_t offset = 0;  // of `start` in the piece's values
  };
  struct Entry {
    Shape shape;
    std::vector<Piece> pieces;
    std::vector<Interval> intervals;
  };
  std::vector<File> files;
  std::map<std::pair<ShardSection, std::string>, Entry> entries;

  // The checkpoint for messages: its one file, or the folder of its files.
  std::string where() const {
    if (files.size() == 1) return files[0].name;
    return files.empty()
               ? std::string("(no files)")
               : parent_dir(files[0].name) + " (" + std::to_string(files.size()) + " files)";
  }

  Status load(Piece& p) {
    if (p.loaded) return Status::ok();
    File& f = files[static_cast<size_t>(p.file)];
    if (f.unverified) {
      TROUPE_RETURN_IF_ERROR(verify_payload(*f.bytes, *f.unverified));
      f.unverified.reset();
    }
    p.values.resize(static_cast<size_t>(p.numel));
    TROUPE_RETURN_IF_ERROR(f.h5->read_data(p.dataset, p.values.data()));
    const uint32_t crc = h5::crc32(p.values.data(), p.values.size() * sizeof(float));
    if (p.crc != static_cast<int64_t>(crc))
      return Status::bad_input(
          fmt::format("checksum mismatch (stored crc32 {:#010x}, computed {:#010x}): the data "
                      "is corrupted -- restore the file from a copy or use an earlier one",
                      p.crc, crc));
    p.loaded = true;
    return Status::ok();
  }
};

namespace {

// A section's group in a file, or nullopt when the file has none.
Result<std::optional<h5read::Object>> find_section(const h5read::File& f, ShardSection section) {
  const std::string path = shard_section_path(section);
  h5read::Object group = f.root();
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    const std::string part =
        path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    auto links = f.links(group);
    if (!links) return links.status();
    auto it = links->find(part);
    if (it == links->end()) return std::optional<h5read::Object>();
    auto next = f.object(it->second);
    if (!next) return next.status().with_context("group " + path + ": ");
    if (!next->has_group)
      return Status::bad_input("'" + path + "' is not a group" + std::string(kDamagedFix));
    group = std::move(next).value();
    if (slash == std::string::npos) return std::optional<h5read::Object>(std::move(group));
    start = slash + 1;
  }
}

Result<int64_t> int_attr(const h5read::Object& o, const char* name) {
  auto it = o.attributes.find(name);
  if (it == o.attributes.end())
    return Status::bad_input(std::string("attribute '") + name +
                             "' is missing -- the file was not written by troupe");
  if (it->second.type != h5read::ElementType::i64)
    return Status::bad_input(std::string("attribute '") + name + "' is not a 64-bit integer" +
                             kDamagedFix);
  return it->second.i;
}

Result<std::string> string_attr(const h5read::Object& o, const char* name) {
  auto it = o.attributes.find(name);
  if (it == o.attributes.end())
    return Status::bad_input(std::string("attribute '") + name +
                             "' is missing -- the file was not written by troupe");
  if (it->second.type != h5read::ElementType::string)
    return Status::bad_input(std::string("attribute '") + name + "' is not a string" + kDamagedFix);
  return it->second.s;
}

}  // namespace

ShardSetReader::ShardSetReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardSetReader::~ShardSetReader() = default;

Result<std::unique_ptr<ShardSetReader>> ShardSetReader::open(
    const std::vector<std::string>& paths, const ShardReadOptions& options) {
  std::vector<ShardSource> files;
  for (const std::string& path : paths) {
    auto source = h5read::open_file_source(path);
    if (!source) return source.status().with_context("checkpoint shard " + path + ": ");
    files.push_back({path, std::move(source).value()});
  }
  return open(files, options);
}

Result<std::unique_ptr<ShardSetReader>> ShardSetReader::open(
    const std::vector<ShardSource>& sources, const ShardReadOptions& options) {
  auto impl = std::make_unique<Impl>();
  // Pieces with their runs, before the intervals are built.
  std::map<std::pair<ShardSection, std::string>, std::vector<std::vector<GlobalRun>>> runs_of;
  for (const ShardSource& source : sources) {
    const std::string where = "checkpoint file " + source.name + ": ";
    auto digest = parse_header(*source.bytes);
    if (!digest) return digest.status().with_context(where);
    if (digest->has_value() && options.verify_whole_file && options.verify_at_open)
      TROUPE_RETURN_IF_ERROR(verify_payload(*source.bytes, **digest).with_context(where));
    auto file = h5read::File::open(source.bytes);
    if (!file) return file.status().with_context(where);
    const h5read::Object& root = (*file)->root();
    auto format = string_attr(root, "format");
    auto version = int_attr(root, "format_version");
    // A version-1 checkpoint file (one process, 1x1x1) reads as one piece per tensor covering it
    // all.
    const bool v1 = format && *format == kV1Format && version && *version == 1;
    const bool shard =
        format && *format == kShardFormat && version && (*version == 2 || *version == 3);
    if (!v1 && !shard)
      return Status::bad_input(
          where +
          "not a troupe checkpoint shard of format version 2 or 3 -- point --load at "
          "a checkpoint directory written by troupe");
    if (digest->has_value() != (shard && *version == 3))
      return Status::bad_input(
          where +
          (digest->has_value()
               ? "an integrity header on a file of format version " + std::to_string(*version)
               : std::string("a version-3 shard without its integrity "
                             "header")) +
          kDamagedFix);
    const int index = static_cast<int>(impl->files.size());
    for (ShardSection section : kSections) {
      auto group = find_section(**file, section);
      if (!group) return group.status().with_context(where);
      if (!group->has_value()) continue;
      auto links = (*file)->links(**group);
      if (!links) return links.status().with_context(where + shard_section_path(section) + ": ");
      for (const auto& [name, address] : *links) {
        if (name.size() > std::strlen(kRunsSuffix) &&
            name.compare(name.size() - std::strlen(kRunsSuffix), std::string::npos, kRunsSuffix) ==
                0)
          continue;
        const std::string what =
            where + "tensor " + shard_section_path(section) + "/" + name + ": ";
        auto ds = (*file)->object(address);
        if (!ds) return ds.status().with_context(what);
        if (!ds->has_dataset || ds->type != h5read::ElementType::f32)
          return Status::bad_input(
              what + "not a 32-bit float dataset (troupe stores every tensor as f32)" +
              kDamagedFix);
        auto crc = int_attr(*ds, h5::kChecksumAttr);
        if (!crc) return crc.status().with_context(what);
        Impl::Piece piece;
        piece.file = index;
        piece.numel = ds->numel;
        piece.crc = *crc;
        Shape global;
        std::vector<GlobalRun> runs;
        if (v1) {
          if (ds->dims.size() > static_cast<size_t>(Shape::kMaxRank))
            return Status::bad_input(what + "more dimensions than troupe supports" + kDamagedFix);
          global = Shape(ds->dims.begin(), ds->dims.end());
          if (ds->numel > 0) runs.push_back({0, ds->numel});
        } else {
          if (ds->dims.size() != 1)
            return Status::bad_input(what + "values must be 1-D" + kDamagedFix);
          auto shape_attr = string_attr(*ds, kGlobalShapeAttr);
          if (!shape_attr) return shape_attr.status().with_context(what);
          auto parsed = parse_shape(*shape_attr);
          if (!parsed) return parsed.status().with_context(what);
          global = parsed.value();
          auto table_at = links->find(name + kRunsSuffix);
          if (table_at == links->end())
            return Status::bad_input(what + "its run table is missing" + kDamagedFix);
          auto table_ds = (*file)->object(table_at->second);
          if (!table_ds) return table_ds.status().with_context(what + "run table: ");
          if (!table_ds->has_dataset || table_ds->type != h5read::ElementType::i64 ||
              table_ds->dims.size() != 2 || table_ds->dims[1] != 2)
            return Status::bad_input(
                what + "its run table is not a (k, 2) table of 64-bit integers" + kDamagedFix);
          // Runs hold at least one element each, so a table longer than the values is damaged; this
          // also bounds the table by what the file holds.
          if (table_ds->dims[0] > std::max<int64_t>(ds->numel, 0))
            return Status::bad_input(what + "its run table has more runs than it has values" +
                                     kDamagedFix);
          auto table_crc = int_attr(*table_ds, h5::kChecksumAttr);
          if (!table_crc) return table_crc.status().with_context(what + "run table: ");
          std::vector<int64_t> table(static_cast<size_t>(table_ds->numel));
          TROUPE_RETURN_IF_ERROR((*file)->read_data(*table_ds, table.data()).with_context(what));
          const uint32_t computed = h5::crc32(table.data(), table.size() * sizeof(int64_t));
          if (*table_crc != static_cast<int64_t>(computed))
            return Status::bad_input(
                what +
                fmt::format("checksum mismatch in its run table (stored crc32 {:#010x}, "
                            "computed {:#010x})",
                            *table_crc, computed) +
                kDamagedFix);
          const int64_t global_numel = global.numel();
          int64_t total = 0;
          for (size_t i = 0; i + 1 < table.size(); i += 2) {
            const GlobalRun r{table[i], table[i + 1]};
            if (r.length <= 0 || r.start < 0 || r.start > global_numel ||
                r.length > global_numel - r.start)
              return Status::bad_input(what + "a run lies outside the global shape " + *shape_attr +
                                       kDamagedFix);
            if (r.length > ds->numel - total) {  // more elements than values (and no overflow)
              total = -1;
              break;
            }
            runs.push_back(r);
            total += r.length;
          }
          if (total != ds->numel)
            return Status::bad_input(what + "its runs do not cover exactly the " +
                                     std::to_string(ds->numel) + " values it holds" + kDamagedFix);
        }
        auto& entry = impl->entries[{section, name}];
        if (entry.pieces.empty()) {
          entry.shape = global;
        } else if (!(entry.shape == global)) {
          return Status::bad_input(
              what + "global shape " + shape_text(global) + " differs from " +
              shape_text(entry.shape) +
              " in another file -- the checkpoint mixes files of different models");
        }
        piece.dataset = std::move(ds).value();
        entry.pieces.push_back(std::move(piece));
        runs_of[{section, name}].push_back(std::move(runs));
      }
    }
    std::optional<ShardDigest> due;
    if (digest->has_value() && options.verify_whole_file && !options.verify_at_open) due = **digest;
    impl->files.push_back({source.name, std::move(file).value(), source.bytes, due});
  }
  // Disjoint intervals: replicas (identical by contract) overlap; the piece listed first keeps its
  // part. The intervals must cover every element: a gap means a missing or foreign file, and a
  // global shape can claim no more elements than the files hold.
  for (auto& [key, entry] : impl->entries) {
    std::vector<Impl::Interval> all;
    const auto& piece_runs = runs_of[key];
    for (size_t p = 0; p < piece_runs.size(); ++p) {
      int64_t offset = 0;
      for (const GlobalRun& r : piece_runs[p]) {
        all.push_back({r.start, r.start + r.length, static_cast<int>(p), offset});
        offset += r.length;
      }
    }
    std::stable_sort(all.begin(), all.end(),
                     [](const auto& a, const auto& b) { return a.start < b.start; });
    int64_t covered = 0;
    for (Impl::Interval iv : all) {
      if (iv.end <= covered) continue;
      if (iv.start > covered) break;
      iv.offset += covered - iv.start;
      iv.start = covered;
      entry.intervals.push_back(iv);
      covered = iv.end;
    }
    if (options.allow_gaps) {  // every piece's part: covered or not, read() checks
      covered = 0;
      entry.intervals.clear();
      for (Impl::Interval iv : all) {
        if (iv.end <= covered) continue;
        if (iv.start < covered) {
          iv.offset += covered - iv.start;
          iv.start = covered;
        }
        entry.intervals.push_back(iv);
        covered = iv.end;
      }
      continue;
    }
    const int64_t numel = entry.shape.numel();
    if (covered < numel)
      return Status::bad_input(fmt::format(
          "tensor {}/{}: element {} of {} is in no shard file of {} -- a shard of the "
          "checkpoint is missing; restore it or load an earlier checkpoint",
          shard_section_path(key.first), key.second, covered, entry.shape.str(), impl->where()));
  }
  return std::unique_ptr<ShardSetReader>(new ShardSetReader(std::move(impl)));
}

std::map<std::string, Shape> ShardSetReader::tensors(ShardSection section) const {
  std::map<std::string, Shape> out;
  for (const auto& [key, entry] : impl_->entries)
    if (key.first == section) out[key.second] = entry.shape;
  return out;
}

bool ShardSetReader::has(ShardSection section, const std::string& name) const {
  return impl_->entries.count({section, name}) > 0;
}

Status ShardSetReader::read(ShardSection section, const std::string& name,
                            const Shape& global_shape, const std::vector<GlobalRun>& runs,
                            const Tensor& out) {
  TROUPE_CHECK(
      out.defined() && out.dtype() == DType::f32 && out.numel() == run_total(runs),
      "ShardSetReader::read: out must be host f32 holding as many values as the runs cover");
  const std::string section_name = shard_section_path(section);
  auto it = impl_->entries.find({section, name});
  if (it == impl_->entries.end())
    return Status::bad_input(
        "tensor " + section_name + "/" + name + " is missing from the checkpoint " +
        impl_->where() +
        " -- it was saved from a different model (or without optimizer state); compare `troupe "
        "ckpt info` with the model flags and load with matching ones");
  Impl::Entry& e = it->second;
  if (!(e.shape == global_shape))
    return Status::bad_input(
        "tensor " + section_name + "/" + name + " has shape " + e.shape.str() +
        " in the checkpoint " + impl_->where() + " but the model expects " + global_shape.str() +
        " -- load with the model flags the checkpoint was saved with (`troupe ckpt info` shows "
        "them)");
  float* dst = out.data<float>();
  Status status;
  for (const GlobalRun& r : runs) {
    int64_t pos = r.start;
    const int64_t end = r.start + r.length;
    // The interval holding `pos`: the last one starting at or before it.
    auto iv = std::upper_bound(e.intervals.begin(), e.intervals.end(), pos,
                               [](int64_t v, const Impl::Interval& x) { return v < x.start; });
    if (iv != e.intervals.begin()) --iv;
    while (pos < end) {
      TROUPE_CHECK(pos < e.shape.numel(), "ShardSetReader::read: runs must lie inside the global shape");
      if (iv == e.intervals.end() || pos < iv->start || pos >= iv->end) {  // only with allow_gaps
        status = Status::error(fmt::format(
            "tensor {}/{}: element {} of {} is in none of the files read ({}) -- the snapshot's list of the "
            "shards each rank reads missed it; report this",
            section_name, name, pos, e.shape.str(), impl_->where()));
        break;
      }
      Impl::Piece& piece = e.pieces[static_cast<size_t>(iv->piece)];
      if (Status st = impl_->load(piece); !st) {
        status = st.with_context("checkpoint file " +
                                 impl_->files[static_cast<size_t>(piece.file)].name + ", tensor " +
                                 section_name + "/" + name + ": ");
        break;
      }
      const int64_t stop = std::min(end, iv->end);
      std::copy_n(piece.values.data() + iv->offset + (pos - iv->start), stop - pos, dst);
      dst += stop - pos;
      pos = stop;
      ++iv;
    }
    if (!status) break;
  }
  for (Impl::Piece& p : e.pieces) {  // one tensor's pieces at a time stay in memory
    p.values.clear();
    p.values.shrink_to_fit();
    p.loaded = false;
  }
  return status;
}

}  // namespace troupe
