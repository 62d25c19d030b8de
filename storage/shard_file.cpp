#include "storage/shard_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "kernels/check.hpp"
#include "storage/durable.hpp"
#include "storage/h5_file.hpp"

namespace troupe {

namespace {

constexpr const char* kShardFormat = "troupe-checkpoint-shard";
constexpr int64_t kShardVersion = 2;
constexpr const char* kRunsSuffix = ".runs";
constexpr const char* kGlobalShapeAttr = "global_shape";

const ShardSection kSections[] = {ShardSection::model, ShardSection::exp_avg, ShardSection::exp_avg_sq};

std::string shape_text(const Shape& s) {  // "[4, 6]"; "[]" for a scalar
  std::string out = "[";
  for (int i = 0; i < s.rank(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Result<Shape> parse_shape(const std::string& text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']')
    return Status::error("global_shape '" + text + "' is not of the form [d0, d1, ...]");
  std::vector<int64_t> dims;
  std::stringstream in(text.substr(1, text.size() - 2));
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (v < 0) throw std::invalid_argument("negative");
      dims.push_back(v);
    } catch (const std::exception&) {
      return Status::error("global_shape '" + text + "' holds a bad dimension '" + item + "'");
    }
  }
  if (dims.size() > static_cast<size_t>(Shape::kMaxRank))
    return Status::error("global_shape '" + text + "' has more dimensions than troupe supports");
  return Shape(dims.begin(), dims.end());
}

// Opens (or creates) the group of a section, "optimizer/exp_avg" being two levels.
Result<h5::Handle> section_group(hid_t file, ShardSection section, bool create) {
  const std::string path = shard_section_path(section);
  const size_t slash = path.find('/');
  if (slash == std::string::npos)
    return create ? h5::create_group(file, path) : h5::open_group(file, path);
  const std::string outer = path.substr(0, slash), inner = path.substr(slash + 1);
  Result<h5::Handle> parent = (create && !h5::exists(file, outer)) ? h5::create_group(file, outer)
                                                                      : h5::open_group(file, outer);
  if (!parent) return parent.status();
  return create ? h5::create_group(parent->get(), inner) : h5::open_group(parent->get(), inner);
}

bool section_exists(hid_t file, ShardSection section) {
  const std::string path = shard_section_path(section);
  const size_t slash = path.find('/');
  if (slash == std::string::npos) return h5::exists(file, path);
  if (!h5::exists(file, path.substr(0, slash))) return false;
  auto outer = h5::open_group(file, path.substr(0, slash));
  return outer && h5::exists(outer->get(), path.substr(slash + 1));
}

int64_t run_total(const std::vector<GlobalRun>& runs) {
  int64_t n = 0;
  for (const GlobalRun& r : runs) n += r.length;
  return n;
}

}  // namespace

const char* shard_section_path(ShardSection s) {
  switch (s) {
    case ShardSection::model: return "model";
    case ShardSection::exp_avg: return "optimizer/exp_avg";
    case ShardSection::exp_avg_sq: return "optimizer/exp_avg_sq";
  }
  return "?";
}

std::vector<GlobalRun> runs_from_indices(int64_t n, const std::function<int64_t(int64_t)>& global_index) {
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

// ---- writing ---------------------------------------------------------------------------------------

Status write_shard_file(const std::string& path, int rank, const ShardContents& contents) {
  h5::ErrorScope quiet;
  const std::string tmp = path + ".tmp";
  const std::string where = "writing the checkpoint shard " + path + ": ";
  {
    Result<h5::Handle> file = h5::create_file(tmp);
    if (!file) return file.status().with_context(where);
    TROUPE_RETURN_IF_ERROR(h5::write_attr(file->get(), "format", std::string(kShardFormat)).with_context(where));
    TROUPE_RETURN_IF_ERROR(h5::write_attr(file->get(), "format_version", kShardVersion).with_context(where));
    TROUPE_RETURN_IF_ERROR(h5::write_attr(file->get(), "rank", static_cast<int64_t>(rank)).with_context(where));
    for (const auto& [section, pieces] : contents.sections) {
      if (pieces.empty()) continue;
      Result<h5::Handle> group = section_group(file->get(), section, true);
      if (!group) return group.status().with_context(where);
      for (const TensorPiece& p : pieces) {
        const int64_t n = run_total(p.runs);
        TROUPE_CHECK(p.values.defined() && p.values.dtype() == DType::f32 && p.values.numel() == n,
                     "shard piece '" + p.name + "': values must be host f32 covering its runs");
        for (const GlobalRun& r : p.runs)
          TROUPE_CHECK(r.length > 0 && r.start >= 0 && r.start + r.length <= p.global_shape.numel(),
                       "shard piece '" + p.name + "': a run lies outside the global shape");
        const std::string what = where + "tensor " + p.name + ": ";
        TROUPE_RETURN_IF_ERROR(
            h5::write_f32_dataset(group->get(), p.name, Shape{n}, p.values.data<float>()).with_context(what));
        {
          h5::Handle ds(H5Dopen2(group->get(), p.name.c_str(), H5P_DEFAULT), H5Dclose);
          TROUPE_RETURN_IF_ERROR(h5::write_attr(ds.get(), kGlobalShapeAttr, shape_text(p.global_shape)).with_context(what));
        }
        std::vector<int64_t> table;
        table.reserve(2 * p.runs.size());
        for (const GlobalRun& r : p.runs) {
          table.push_back(r.start);
          table.push_back(r.length);
        }
        TROUPE_RETURN_IF_ERROR(h5::write_i64_dataset(group->get(), p.name + kRunsSuffix,
                                                     Shape{static_cast<int64_t>(p.runs.size()), 2}, table.data())
                                   .with_context(what));
      }
    }
    if (!file->close())
      return h5::error("cannot finish " + tmp, "check free disk space").with_context(where);
  }
  return commit_file(tmp, path).with_context(where);
}

// ---- reading ---------------------------------------------------------------------------------------

struct ShardSetReader::Impl {
  struct File {
    std::string path;
    h5::Handle handle;
  };
  struct Piece {
    int file = 0;
    std::string name;
    int64_t numel = 0;
    Shape stored;               // the dataset's shape: (numel) in shards, the global shape in version 1
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

  Status load(ShardSection section, Entry& e, Piece& p) {
    if (p.loaded) return Status::ok();
    auto group = section_group(files[p.file].handle.get(), section, false);
    if (!group) return group.status();
    p.values.resize(static_cast<size_t>(p.numel));
    TROUPE_RETURN_IF_ERROR(h5::read_f32_dataset(group->get(), p.name, p.stored, p.values.data()));
    p.loaded = true;
    (void)e;
    return Status::ok();
  }
};

ShardSetReader::ShardSetReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardSetReader::~ShardSetReader() = default;

Result<std::unique_ptr<ShardSetReader>> ShardSetReader::open(const std::vector<std::string>& paths) {
  h5::ErrorScope quiet;
  auto impl = std::make_unique<Impl>();
  // Pieces with their runs, before the intervals are built.
  std::map<std::pair<ShardSection, std::string>, std::vector<std::vector<GlobalRun>>> runs_of;
  for (const std::string& path : paths) {
    const std::string where = "checkpoint shard " + path + ": ";
    Result<h5::Handle> file = h5::open_file(path, "restore the checkpoint from a copy or load an earlier one");
    if (!file) return file.status().with_context(where);
    auto format = h5::read_attr_string(file->get(), "format");
    auto version = h5::read_attr_i64(file->get(), "format_version");
    // A version-1 checkpoint file (one process, 1x1x1) reads as one piece per tensor covering it all.
    const bool v1 = format && *format == "troupe-checkpoint" && version && *version == 1;
    if (!v1 && (!format || *format != kShardFormat || !version || *version != kShardVersion))
      return Status::error(where + "not a troupe checkpoint shard of format version 2 -- point --load at a "
                                   "checkpoint directory written by troupe");
    const int index = static_cast<int>(impl->files.size());
    for (ShardSection section : kSections) {
      if (!section_exists(file->get(), section)) continue;
      auto group = section_group(file->get(), section, false);
      if (!group) return group.status().with_context(where);
      auto names = h5::list_links(group->get());
      if (!names) return names.status().with_context(where);
      for (const std::string& name : *names) {
        if (name.size() > std::strlen(kRunsSuffix) &&
            name.compare(name.size() - std::strlen(kRunsSuffix), std::string::npos, kRunsSuffix) == 0)
          continue;
        const std::string what = where + "tensor " + name + ": ";
        auto shape = h5::dataset_shape(group->get(), name);
        if (!shape) return shape.status().with_context(what);
        if (v1) {
          auto& entry = impl->entries[{section, name}];
          if (!entry.pieces.empty() && !(entry.shape == *shape))
            return Status::error(what + "its shape differs from another file's -- these files are not one checkpoint");
          entry.shape = *shape;
          Impl::Piece piece;
          piece.file = index;
          piece.name = name;
          piece.numel = shape->numel();
          piece.stored = *shape;
          entry.pieces.push_back(std::move(piece));
          runs_of[{section, name}].push_back({{0, shape->numel()}});
          continue;
        }
        if (shape->rank() != 1) return Status::error(what + "values must be 1-D -- the file is damaged");
        std::string shape_attr;
        {
          h5::Handle ds(H5Dopen2(group->get(), name.c_str(), H5P_DEFAULT), H5Dclose);
          auto a = h5::read_attr_string(ds.get(), kGlobalShapeAttr);
          if (!a) return a.status().with_context(what);
          shape_attr = *a;
        }
        auto global = parse_shape(shape_attr);
        if (!global) return global.status().with_context(what);
        auto table_shape = h5::dataset_shape(group->get(), name + kRunsSuffix);
        if (!table_shape || table_shape->rank() != 2 || (*table_shape)[1] != 2)
          return Status::error(what + "its run table is missing or malformed -- the file is damaged; restore it");
        std::vector<int64_t> table(static_cast<size_t>(table_shape->numel()));
        TROUPE_RETURN_IF_ERROR(
            h5::read_i64_dataset(group->get(), name + kRunsSuffix, *table_shape, table.data()).with_context(what));
        std::vector<GlobalRun> runs;
        int64_t total = 0;
        for (size_t i = 0; i + 1 < table.size(); i += 2) {
          const GlobalRun r{table[i], table[i + 1]};
          if (r.length <= 0 || r.start < 0 || r.start + r.length > global->numel())
            return Status::error(what + "a run lies outside the global shape " + shape_attr +
                                 " -- the file is damaged; restore it");
          runs.push_back(r);
          total += r.length;
        }
        if (total != (*shape)[0])
          return Status::error(what + "its runs cover " + std::to_string(total) + " elements but it holds " +
                               std::to_string((*shape)[0]) + " -- the file is damaged; restore it");
        auto& entry = impl->entries[{section, name}];
        if (entry.pieces.empty()) {
          entry.shape = *global;
        } else if (!(entry.shape == *global)) {
          return Status::error(what + "global shape " + shape_attr + " differs from " + shape_text(entry.shape) +
                               " in another shard -- the checkpoint mixes files of different models");
        }
        Impl::Piece piece;
        piece.file = index;
        piece.name = name;
        piece.numel = total;
        piece.stored = Shape{total};
        entry.pieces.push_back(std::move(piece));
        runs_of[{section, name}].push_back(std::move(runs));
      }
    }
    impl->files.push_back({path, std::move(file).value()});
  }
  // Disjoint intervals: replicas (identical by contract) overlap; the piece listed first keeps its part.
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
    std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
    int64_t covered = 0;
    for (Impl::Interval iv : all) {
      if (iv.end <= covered) continue;
      if (iv.start < covered) {
        iv.offset += covered - iv.start;
        iv.start = covered;
      }
      entry.intervals.push_back(iv);
      covered = iv.end;
    }
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

Status ShardSetReader::read(ShardSection section, const std::string& name, const Shape& global_shape,
                            const std::vector<GlobalRun>& runs, const Tensor& out) {
  h5::ErrorScope quiet;
  TROUPE_CHECK(out.defined() && out.dtype() == DType::f32 && out.numel() == run_total(runs),
               "ShardSetReader::read: out must be host f32 holding as many values as the runs cover");
  const std::string section_name = shard_section_path(section);
  auto it = impl_->entries.find({section, name});
  if (it == impl_->entries.end())
    return Status::error("the checkpoint has no tensor " + name + " in " + section_name +
                         " -- it was saved from another model or without optimizer state");
  Impl::Entry& e = it->second;
  if (!(e.shape == global_shape))
    return Status::error("tensor " + name + " has global shape " + shape_text(e.shape) + " in the checkpoint but " +
                         shape_text(global_shape) + " in this model -- load it into the model it was saved from");
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
      if (iv == e.intervals.end() || iv->start > pos || iv->end <= pos) {
        status = Status::error(fmt::format("tensor {} ({}): element {} of {} is in no shard file -- a shard of the "
                                           "checkpoint is missing; restore it or load an earlier checkpoint",
                                           name, section_name, pos, shape_text(global_shape)));
        break;
      }
      Impl::Piece& piece = e.pieces[static_cast<size_t>(iv->piece)];
      if (Status st = impl_->load(section, e, piece); !st) {
        status = st.with_context("checkpoint shard " + impl_->files[static_cast<size_t>(piece.file)].path + ", tensor " +
                                 name + ": ");
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
