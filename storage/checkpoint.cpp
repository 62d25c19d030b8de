#include "storage/checkpoint.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <string_view>

#include "storage/checkpoint_v1.hpp"
#include "storage/durable.hpp"
#include "storage/shard_file.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLatestFile = "latest_checkpointed_iteration.txt";

void check_tensor(const NamedTensor& t) {
  const Tensor& x = t.tensor;
  TROUPE_CHECK(x.defined() && x.device() == Device::cpu && x.dtype() == DType::f32,
               "checkpoint tensor '" + t.name + "' must be a defined host f32 tensor");
  bool fits = x.rank() == t.global_shape.rank();
  for (int i = 0; fits && i < x.rank(); ++i)
    fits = i == 0 ? x.dim(0) >= t.global_shape[0] : x.dim(i) == t.global_shape[i];
  TROUPE_CHECK(fits, "checkpoint tensor '" + t.name + "' of shape " + x.shape().str() +
                         " does not cover its global shape " + t.global_shape.str() +
                         " (only extra leading rows are allowed)");
}

std::vector<int64_t> saved_iterations(const std::string& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t it = 0;
    if (name.size() != 12 || name.rfind("iter_", 0) != 0) continue;
    auto [end, err] = std::from_chars(name.data() + 5, name.data() + name.size(), it);
    if (err == std::errc() && end == name.data() + name.size() &&
        (fs::exists(e.path() / "model_optim_rng.h5", ec) || fs::exists(e.path() / "metadata.json", ec)))
      out.push_back(it);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status missing_checkpoint(const std::string& dir, int64_t iteration, const std::string& file) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::error("checkpoint directory " + dir +
                         " does not exist -- pass the directory given to --save");
  const std::vector<int64_t> its = saved_iterations(dir);
  std::string have = dir + " holds no saved iteration";
  if (!its.empty()) {
    have = dir + " holds iteration" + (its.size() > 1 ? "s" : "");
    for (size_t i = 0; i < its.size(); ++i) have += (i ? ", " : " ") + std::to_string(its[i]);
  }
  return Status::error(
      fmt::format("checkpoint {} of iteration {} does not exist: {} -- pass a saved iteration "
                  "(--iteration) or correct {}",
                  file, iteration, have, (fs::path(dir) / kLatestFile).string()));
}

// Orders names with their digit runs compared as numbers: "h.2." before "h.10.".
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && digit(a[ie])) ++ie;
      while (je < b.size() && digit(b[je])) ++je;
      const std::string_view x = std::string_view(a).substr(i, ie - i),
                             y = std::string_view(b).substr(j, je - j);
      const auto xs = x.find_first_not_of('0'), ys = y.find_first_not_of('0');
      const std::string_view xt = xs == x.npos ? "" : x.substr(xs),
                             yt = ys == y.npos ? "" : y.substr(ys);
      if (xt.size() != yt.size()) return xt.size() < yt.size();
      if (xt != yt) return xt < yt;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j || (a.size() - i == b.size() - j && a < b);
}

// Text from a file, fit for a message: control and non-ASCII bytes become '?'.
std::string printable(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return s;
}
}  // namespace

Result<int64_t> latest_iteration(const std::string& dir) {
  const std::string path = (fs::path(dir) / kLatestFile).string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::bad_input("checkpoint directory " + dir +
                             " does not exist -- pass the directory given to --save");
  if (!fs::exists(path, ec))
    return Status::bad_input("no checkpoint in " + dir + ": " + path +
                             " does not exist -- save one first (--save " + dir +
                             "), or pass the directory that holds one");
  Result<std::string> read = read_small_file(path, 4096);
  if (!read) return read.status().with_context("the latest pointer: ");
  std::string text = read.value();
  const auto first = text.find_first_not_of(" \t\r\n");
  const auto last = text.find_last_not_of(" \t\r\n");
  text = first == std::string::npos ? "" : text.substr(first, last - first + 1);
  int64_t it = -1;
  auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), it);
  if (text.empty() || err != std::errc() || end != text.data() + text.size() || it < 0)
    return Status::bad_input(
        path + " holds '" + printable(text.substr(0, 40)) +
        "', not an iteration number -- write the "
        "iteration of a saved iter_NNNNNNN directory into it (e.g. `echo 10 > " +
        path + "`)");
  return it;
}

Result<Checkpoint> Checkpoint::open(const std::string& dir, int64_t iteration) {
  Checkpoint c;
  c.dir_ = dir;
  c.sharded_ = is_sharded_checkpoint(dir, iteration);
  if (c.sharded_) {  // versions 2, 3
    c.location_ = iteration_dir(dir, iteration);
    auto meta = read_sharded_meta(dir, iteration);
    if (!meta) return meta.status();
    c.meta_ = std::move(meta).value();
    return c;
  }
  c.location_ = checkpoint_file(dir, iteration);  // version 1
  std::error_code ec;
  if (!fs::exists(c.location_, ec)) return missing_checkpoint(dir, iteration, c.location_);
  auto meta = read_v1_meta(c.location_, iteration);
  if (!meta) return meta.status();
  c.meta_ = std::move(meta).value();
  return c;
}

Result<Checkpoint> Checkpoint::open_latest(const std::string& dir) {
  auto it = latest_iteration(dir);
  if (!it) return it.status();
  return open(dir, it.value());
}

uint64_t Checkpoint::bytes() const {
  std::error_code ec;
  if (!sharded_) {
    const auto n = fs::file_size(location_, ec);
    return ec ? 0 : n;
  }
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(location_, ec)) {
    const auto n = e.file_size(ec);
    if (!ec) total += n;
  }
  return total;
}

Result<std::vector<std::string>> Checkpoint::files() const {
  if (sharded_) return sharded_checkpoint_files(dir_, meta_.iteration);
  return std::vector<std::string>{location_};
}

Result<std::unique_ptr<ShardSetReader>> Checkpoint::reader() const { return reader(ShardReadOptions{}); }

Result<std::unique_ptr<ShardSetReader>> Checkpoint::reader(const ShardReadOptions& options) const {
  auto f = files();
  if (!f) return f.status();
  return ShardSetReader::open(f.value(), options);
}

Result<std::unique_ptr<ShardSetReader>> Checkpoint::reader_for(int rank, int world, const std::string& layout_json,
                                                               ShardReadOptions options) const {
  // The lists hold for the layout that wrote them: another one of as many ranks reads other shards.
  const auto saved = nlohmann::json::parse(meta_.layout_json, nullptr, false);
  const auto ours = nlohmann::json::parse(layout_json, nullptr, false);
  if (!sharded_ || saved.is_discarded() || ours.is_discarded() || saved != ours) return reader(options);
  auto own = shards_read_by(dir_, meta_.iteration, rank, world);
  if (!own) return own.status();
  if (!own->has_value()) return reader(options);
  options.allow_gaps = true;
  return ShardSetReader::open(**own, options);
}

Result<std::vector<CheckpointTensorInfo>> Checkpoint::tensors() const {
  auto reader = this->reader();
  if (!reader) return reader.status();
  std::vector<CheckpointTensorInfo> out;
  for (ShardSection section :
       {ShardSection::model, ShardSection::exp_avg, ShardSection::exp_avg_sq}) {
    std::vector<std::pair<std::string, Shape>> tensors;
    for (const auto& [name, shape] : (*reader)->tensors(section)) tensors.emplace_back(name, shape);
    std::sort(tensors.begin(), tensors.end(),
              [](const auto& a, const auto& b) { return natural_less(a.first, b.first); });
    for (const auto& [name, shape] : tensors)
      out.push_back({std::string(shard_section_path(section)) + "/" + name, shape});
  }
  return out;
}

Status Checkpoint::load(const CheckpointContents& into, bool load_optimizer) const {
  for (const auto* section : {&into.params, &into.exp_avg, &into.exp_avg_sq})
    for (const NamedTensor& t : *section) check_tensor(t);
  auto reader = this->reader();
  if (!reader) return reader.status();
  auto fill = [&](ShardSection section, const std::vector<NamedTensor>& tensors) -> Status {
    for (const NamedTensor& t : tensors) {
      t.tensor.zero_();
      const int64_t n = t.global_shape.numel();
      TROUPE_RETURN_IF_ERROR((*reader)->read(section, t.name, t.global_shape, {{0, n}},
                                             t.tensor.view({t.tensor.numel()}).rows(0, n)));
    }
    return Status::ok();
  };
  TROUPE_RETURN_IF_ERROR(fill(ShardSection::model, into.params));
  if (!load_optimizer || (into.exp_avg.empty() && into.exp_avg_sq.empty())) return Status::ok();
  if ((*reader)->tensors(ShardSection::exp_avg).empty() &&
      (*reader)->tensors(ShardSection::exp_avg_sq).empty())
    return Status::bad_input("checkpoint " + location_ +
                             " holds no optimizer state (it was saved without) -- load the "
                             "model only (e.g. --no-load-optim) and start the optimizer afresh");
  TROUPE_RETURN_IF_ERROR(fill(ShardSection::exp_avg, into.exp_avg));
  return fill(ShardSection::exp_avg_sq, into.exp_avg_sq);
}

Result<CheckpointMeta> read_checkpoint_meta(const std::string& dir, int64_t iteration) {
  auto c = Checkpoint::open(dir, iteration);
  if (!c) return c.status();
  return c->meta();
}

Status load_checkpoint(const std::string& dir, int64_t iteration, const CheckpointContents& into,
                       bool load_optimizer) {
  auto c = Checkpoint::open(dir, iteration);
  if (!c) return c.status();
  return c->load(into, load_optimizer);
}

Result<std::vector<CheckpointTensorInfo>> list_checkpoint_tensors(const std::string& dir, int64_t iteration) {
  auto c = Checkpoint::open(dir, iteration);
  if (!c) return c.status();
  return c->tensors();
}

}  // namespace troupe
