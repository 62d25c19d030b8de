#include "storage/sharded_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/check.hpp"
#include "storage/durable.hpp"

namespace troupe {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kMetadata = "metadata.json";
constexpr const char* kLatest = "latest_checkpointed_iteration.txt";
}  // namespace

std::string iteration_dir(const std::string& dir, int64_t iteration) {
  return (fs::path(dir) / fmt::format("iter_{:07d}", iteration)).string();
}

std::string shard_file_path(const std::string& dir, int64_t iteration, int rank) {
  return (fs::path(iteration_dir(dir, iteration)) / fmt::format("shard_{:05d}.h5", rank)).string();
}

std::vector<std::string> shard_file_names(int ranks) {
  std::vector<std::string> out;
  for (int r = 0; r < ranks; ++r) out.push_back(fs::path(shard_file_path(".", 0, r)).filename().string());
  return out;
}

Status prepare_iteration_dir(const std::string& dir, int64_t iteration) {
  std::error_code ec;
  fs::create_directories(iteration_dir(dir, iteration), ec);
  if (ec)
    return Status::error("cannot create " + iteration_dir(dir, iteration) + ": " + ec.message() +
                         " -- check that " + dir + " is writable");
  return Status::ok();
}

bool is_sharded_checkpoint(const std::string& dir, int64_t iteration) {
  std::error_code ec;
  const fs::path it = iteration_dir(dir, iteration);
  if (fs::exists(it / kMetadata, ec)) return true;
  if (!fs::is_directory(it, ec)) return false;
  for (const auto& e : fs::directory_iterator(it, ec))
    if (e.path().filename().string().rfind("shard_", 0) == 0) return true;
  return false;
}

Status commit_sharded_checkpoint(const std::string& dir, const CheckpointMeta& meta, const std::string& layout_json,
                                 const std::vector<std::string>& shard_names) {
  const std::string where = "saving checkpoint " + iteration_dir(dir, meta.iteration) + ": ";
  json layout, run = json::object();
  try {
    layout = json::parse(layout_json);
    if (!meta.run_json.empty()) run = json::parse(meta.run_json);
  } catch (const json::exception& e) {
    return Status::error(where + "bad layout or run description: " + e.what());
  }
  const json m = {{"format", "troupe-checkpoint"},
                  {"format_version", 2},
                  {"iteration", meta.iteration},
                  {"consumed_samples", meta.consumed_samples},
                  {"optimizer_step", meta.optimizer_step},
                  {"config", meta.config_json},
                  {"rng", meta.rng_json},
                  {"layout", layout},
                  {"run", run},
                  {"shards", shard_names}};
  const std::string it = iteration_dir(dir, meta.iteration);
  // Every shard was renamed into place by its writer; their directory entries become durable here.
  TROUPE_RETURN_IF_ERROR(fsync_path(it, true).with_context(where));
  TROUPE_RETURN_IF_ERROR(write_text_atomically((fs::path(it) / kMetadata).string(), m.dump(2) + "\n").with_context(where));
  TROUPE_RETURN_IF_ERROR(fsync_path(dir, true).with_context(where));
  return write_text_atomically((fs::path(dir) / kLatest).string(), std::to_string(meta.iteration) + "\n")
      .with_context(where);
}

namespace {

Result<json> read_metadata(const std::string& dir, int64_t iteration) {
  const std::string path = (fs::path(iteration_dir(dir, iteration)) / kMetadata).string();
  std::ifstream in(path);
  if (!in)
    return Status::error("checkpoint " + iteration_dir(dir, iteration) +
                         " has shard files but no metadata.json: the save did not finish -- load the "
                         "previous iteration (the latest pointer still names it unless it was edited)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    json m = json::parse(text.str());
    if (m.value("format", "") != "troupe-checkpoint" || m.value("format_version", 0) != 2)
      return Status::error(path + " is not a troupe version-2 checkpoint description -- restore it from a copy");
    return m;
  } catch (const json::exception& e) {
    return Status::error(path + " is damaged (" + e.what() + ") -- restore it from a copy or load an earlier iteration");
  }
}

}  // namespace

Result<std::vector<std::string>> sharded_checkpoint_files(const std::string& dir, int64_t iteration) {
  auto m = read_metadata(dir, iteration);
  if (!m) return m.status();
  std::vector<std::string> out;
  try {
    for (const auto& name : m->at("shards")) {
      const std::string path = (fs::path(iteration_dir(dir, iteration)) / name.get<std::string>()).string();
      std::error_code ec;
      if (!fs::exists(path, ec))
        return Status::error("checkpoint " + iteration_dir(dir, iteration) + " is missing its shard " + path +
                             " -- restore it from a copy or load an earlier iteration");
      out.push_back(path);
    }
  } catch (const json::exception& e) {
    return Status::error("metadata.json of " + iteration_dir(dir, iteration) + " lists no shards (" + e.what() +
                         ") -- restore it from a copy");
  }
  return out;
}

Result<std::vector<std::string>> checkpoint_files(const std::string& dir, int64_t iteration) {
  if (is_sharded_checkpoint(dir, iteration)) return sharded_checkpoint_files(dir, iteration);
  return std::vector<std::string>{checkpoint_file(dir, iteration)};
}

namespace {

const std::vector<NamedTensor>& section_of(const CheckpointContents& c, ShardSection s) {
  return s == ShardSection::model ? c.params : s == ShardSection::exp_avg ? c.exp_avg : c.exp_avg_sq;
}

// The global tensor's elements: the leading global_shape.numel() of the tensor (a padded vocabulary
// has rows beyond the global shape, never saved).
Tensor global_part(const NamedTensor& t) {
  const int64_t n = t.global_shape.numel();
  TROUPE_CHECK(t.tensor.numel() >= n, "checkpoint tensor " + t.name + " is smaller than its global shape");
  return t.tensor.view(Shape{t.tensor.numel()}).rows(0, n);
}

}  // namespace

ShardContents whole_tensor_shard(const CheckpointContents& contents) {
  ShardContents out;
  for (ShardSection s : {ShardSection::model, ShardSection::exp_avg, ShardSection::exp_avg_sq}) {
    for (const NamedTensor& t : section_of(contents, s)) {
      TensorPiece p;
      p.name = t.name;
      p.global_shape = t.global_shape;
      p.runs = {{0, t.global_shape.numel()}};
      p.values = global_part(t).clone();
      out.sections[s].push_back(std::move(p));
    }
  }
  return out;
}

Status read_whole_tensors(ShardSetReader& reader, const CheckpointContents& into, bool load_optimizer) {
  for (ShardSection s : {ShardSection::model, ShardSection::exp_avg, ShardSection::exp_avg_sq}) {
    if (s != ShardSection::model && !load_optimizer) break;
    for (const NamedTensor& t : section_of(into, s))
      TROUPE_RETURN_IF_ERROR(reader.read(s, t.name, t.global_shape, {{0, t.global_shape.numel()}}, global_part(t)));
  }
  return Status::ok();
}

std::vector<int64_t> unfinished_saves(const std::string& dir, int64_t latest) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 12 || name.rfind("iter_", 0) != 0) continue;
    char* end = nullptr;
    const long long it = std::strtoll(name.c_str() + 5, &end, 10);
    if (end == nullptr || *end != '\0' || it <= latest) continue;
    if (!fs::exists(e.path() / kMetadata, ec) && is_sharded_checkpoint(dir, it)) out.push_back(it);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<CheckpointMeta> read_sharded_meta(const std::string& dir, int64_t iteration) {
  auto m = read_metadata(dir, iteration);
  if (!m) return m.status();
  CheckpointMeta meta;
  try {
    meta.iteration = m->at("iteration").get<int64_t>();
    meta.consumed_samples = m->at("consumed_samples").get<int64_t>();
    meta.optimizer_step = m->at("optimizer_step").get<int64_t>();
    meta.config_json = m->at("config").get<std::string>();
    meta.rng_json = m->at("rng").get<std::string>();
    meta.layout_json = m->value("layout", json::object()).dump();
    if (auto run = m->find("run"); run != m->end() && run->is_object() && !run->empty()) meta.run_json = run->dump();
  } catch (const json::exception& e) {
    return Status::error("metadata.json of " + iteration_dir(dir, iteration) + " is incomplete (" + e.what() +
                         ") -- restore it from a copy");
  }
  meta.format_version = 2;
  if (meta.iteration != iteration)
    return Status::error("metadata.json of " + iteration_dir(dir, iteration) + " records iteration " +
                         std::to_string(meta.iteration) + " -- rename the directory back");
  return meta;
}

}  // namespace troupe
