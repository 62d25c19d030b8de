#include "storage/sharded_checkpoint.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <sstream>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "troupe/check.hpp"
#include "storage/durable.hpp"
#include "storage/json_input.hpp"

namespace troupe {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kMetadata = "metadata.json";
constexpr const char* kLatest = "latest_checkpointed_iteration.txt";
constexpr int kMetadataVersion = 3;

// The names troupe writes: "shard_" and at least five digits, ".h5". Anything else (a path, "..")
// in metadata.json is refused, so a crafted file can only name files beside it.
bool is_shard_name(const std::string& name) {
  if (name.size() < 14 || name.size() > 40 || name.rfind("shard_", 0) != 0 ||
      name.compare(name.size() - 3, 3, ".h5") != 0)
    return false;
  return std::all_of(name.begin() + 6, name.end() - 3, [](char c) { return c >= '0' && c <= '9'; });
}

bool is_iteration_name(const std::string& name) {
  return name.size() == 12 && name.rfind("iter_", 0) == 0 &&
         std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}
}  // namespace

std::string iteration_dir(const std::string& dir, int64_t iteration) {
  return (fs::path(dir) / fmt::format("iter_{:07d}", iteration)).string();
}

std::string memory_snapshot_dir(const std::string& base, const std::string& key) {
  std::string dir = base;
  if (dir.empty()) {
    std::error_code ec;
    dir = std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : std::filesystem::temp_directory_path(ec).string();
  }
  return (std::filesystem::path(dir) / ("troupe-memory-" + key)).string();
}

namespace {

// Field 22 of /proc/PID/stat (the start time in clock ticks since boot), or -1 when there is no such
// process. The command name (field 2) may hold spaces and parentheses: fields are counted after the
// last ')'.
int64_t process_start_ticks(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (!in.good() && stat.empty()) return -1;
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(rest >> field)) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(field.c_str(), &end, 10);
  return end != nullptr && *end == '\0' ? v : -1;
}

}  // namespace

Status write_snapshot_owner(const std::string& dir, int pid) {
  const int64_t start = process_start_ticks(pid);
  std::ofstream out(fs::path(dir) / "owner", std::ios::trunc);
  out << pid << " " << start << "\n";
  out.close();
  if (!out) return Status::error("cannot write " + (fs::path(dir) / "owner").string());
  return Status::ok();
}

std::optional<SnapshotOwner> parse_snapshot_owner(std::string_view text) {
  if (text.size() > kMaxOwnerBytes || text.empty() || text.back() != '\n') return std::nullopt;
  text.remove_suffix(1);
  const size_t space = text.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  auto number = [](std::string_view t, bool negative_one_ok) -> std::optional<int64_t> {
    if (negative_one_ok && t == "-1") return -1;
    if (t.empty() || t.size() > 18 || (t.size() > 1 && t[0] == '0')) return std::nullopt;
    int64_t v = 0;
    for (char c : t) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  const auto pid = number(text.substr(0, space), false);
  const auto start = number(text.substr(space + 1), true);
  if (!pid || !start || *pid < 1 || *pid > (int64_t{1} << 22)) return std::nullopt;
  return SnapshotOwner{static_cast<int>(*pid), *start};
}

std::vector<std::string> sweep_abandoned_snapshot_folders(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  const fs::path base = fs::path(dir).parent_path();
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("troupe-memory-", 0) != 0 || e.path() == fs::path(dir)) continue;
    struct stat st {};
    // A real folder of this user (never a link, never another user's: /dev/shm is everyone's).
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;
    std::ifstream in(e.path() / "owner", std::ios::binary);
    std::string text(kMaxOwnerBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
    const auto owner = parse_snapshot_owner(text);
    if (!owner) continue;  // no owner recorded: not ours to judge
    const int64_t now = process_start_ticks(owner->pid);
    if (now >= 0 && now == owner->start) continue;  // its owner lives
    fs::remove_all(e.path(), ec);
    if (!ec) removed.push_back(e.path().string());
  }
  return removed;
}

std::string shard_file_path(const std::string& dir, int64_t iteration, int rank) {
  return (fs::path(iteration_dir(dir, iteration)) / fmt::format("shard_{:05d}.h5", rank)).string();
}

std::vector<std::string> shard_file_names(int ranks) {
  std::vector<std::string> out;
  for (int r = 0; r < ranks; ++r)
    out.push_back(fs::path(shard_file_path(".", 0, r)).filename().string());
  return out;
}

Status prepare_iteration_dir(const std::string& dir, int64_t iteration) {
  // Creates nothing (the first shard written creates the folders): a save that fails or never
  // writes leaves no empty folder behind. A folder that cannot be written is named here, early.
  fs::path existing = fs::absolute(dir);
  std::error_code ec;
  while (!fs::exists(existing, ec) && existing.has_parent_path() &&
         existing != existing.parent_path())
    existing = existing.parent_path();
  const std::string where = "saving checkpoint " + iteration_dir(dir, iteration) + ": ";
  if (!fs::is_directory(existing, ec))
    return Status::bad_input(where + existing.string() +
                             " is not a folder -- pass a folder to --save");
  if (::access(existing.c_str(), W_OK) != 0)
    return Status::error(where + "cannot write into " + existing.string() + ": " +
                         std::strerror(errno) + " -- make it writable or save to another folder");
  return Status::ok();
}

void discard_unfinished_save(const std::string& iteration_directory) {
  std::error_code ec;
  const fs::path it(iteration_directory);
  if (!is_iteration_name(it.filename().string()) || fs::exists(it / kMetadata, ec) || ec) return;
  for (const auto& e : fs::directory_iterator(it, ec)) {
    const std::string name = e.path().filename().string();
    const std::string base = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0
                                 ? name.substr(0, name.size() - 4)
                                 : name;
    if (is_shard_name(base) || base == kMetadata) ::unlink(e.path().c_str());
  }
  ::rmdir(it.c_str());  // fails, harmlessly, when anything else is in it
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

Status commit_sharded_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                                 const std::string& layout_json,
                                 const std::vector<std::string>& shard_names) {
  std::vector<ShardDigest> digests;
  for (const std::string& name : shard_names) {
    const std::string path = (fs::path(iteration_dir(dir, meta.iteration)) / name).string();
    auto digest = read_shard_digest(path);
    if (digest && !digest->has_value())
      digest = Status::error(path + " has no integrity header -- report this");
    if (!digest) {
      auto latest = latest_iteration(dir);
      if (!latest || latest.value() != meta.iteration) discard_unfinished_save(iteration_dir(dir, meta.iteration));
      return digest.status().with_context("saving checkpoint " + iteration_dir(dir, meta.iteration) + ": ");
    }
    digests.push_back(**digest);
  }
  return commit_sharded_checkpoint(dir, meta, layout_json, shard_names, digests);
}

Status commit_sharded_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                                 const std::string& layout_json,
                                 const std::vector<std::string>& shard_names,
                                 const std::vector<ShardDigest>& digests,
                                 const std::vector<std::vector<int>>& reads) {
  TROUPE_CHECK(digests.size() == shard_names.size(), "commit_sharded_checkpoint: one digest per shard");
  TROUPE_CHECK(reads.empty() || reads.size() == shard_names.size(), "commit_sharded_checkpoint: reads for every shard");
  const std::string it = iteration_dir(dir, meta.iteration);
  const std::string where = "saving checkpoint " + it + ": ";
  json layout, run = json::object();
  try {
    layout = json::parse(layout_json);
    if (!meta.run_json.empty()) run = json::parse(meta.run_json);
  } catch (const json::exception& e) {
    return Status::error(where + "bad layout or run description: " + e.what());
  }
  auto fail = [&](const Status& st) {
    // Unless the pointer already moved to this iteration (only its directory's fsync failed), the
    // save can never complete: its files go, and a full disk gets its space back.
    auto latest = latest_iteration(dir);
    if (!latest || latest.value() != meta.iteration) {
      ::unlink((fs::path(it) / kMetadata).c_str());
      discard_unfinished_save(it);
    }
    return st.with_context(where);
  };
  json shards = json::array();
  for (size_t i = 0; i < shard_names.size(); ++i) {
    shards.push_back({{"file", shard_names[i]}, {"bytes", digests[i].bytes}, {"crc32", digests[i].crc32}});
    if (!reads.empty()) shards.back()["reads"] = reads[i];
  }
  const json m = {{"format", "troupe-checkpoint"},
                  {"format_version", kMetadataVersion},
                  {"iteration", meta.iteration},
                  {"consumed_samples", meta.consumed_samples},
                  {"optimizer_step", meta.optimizer_step},
                  {"config", meta.config_json},
                  {"rng", meta.rng_json},
                  {"layout", layout},
                  {"run", run},
                  {"shards", shards}};
  // Every shard was renamed into place by its writer; their directory entries become durable here.
  // (A checkpoint without shards, of a model without tensors, creates its folder here.)
  if (Status st = make_directories(it); !st) return fail(st);
  if (Status st = fsync_path(it, true); !st) return fail(st);
  if (Status st = write_text_atomically((fs::path(it) / kMetadata).string(), m.dump(2) + "\n"); !st)
    return fail(st);
  if (Status st = fsync_path(dir, true); !st) return fail(st);
  if (Status st = write_text_atomically((fs::path(dir) / kLatest).string(),
                                        std::to_string(meta.iteration) + "\n");
      !st)
    return fail(st);
  return Status::ok();
}

Result<CheckpointMetadata> parse_checkpoint_metadata(std::string_view text,
                                                     const std::string& where) {
  const std::string fix = " -- restore it from a copy or load an earlier iteration";
  if (text.size() > kMaxMetadataBytes)
    return Status::bad_input(where + " is larger than " + std::to_string(kMaxMetadataBytes >> 20) +
                             " MiB" + fix);
  auto parsed = parse_json(text, where);
  if (!parsed) return Status::bad_input(parsed.status().message() + fix);
  const json& m = parsed.value();
  if (!m.is_object()) return Status::bad_input(where + " is not a JSON object" + fix);
  auto format = m.find("format");
  auto version = m.find("format_version");
  int64_t v = 0;
  if (format == m.end() || !format->is_string() || *format != "troupe-checkpoint" ||
      version == m.end() || !json_to_integer(*version, 2, kMetadataVersion, &v))
    return Status::bad_input(
        where + " is not a troupe checkpoint description of format version 2 or 3" + fix);
  CheckpointMetadata out;
  out.meta.format_version = static_cast<int>(v);
  std::string problems;
  auto problem = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  for (auto [key, dst] : {std::pair{"iteration", &out.meta.iteration},
                          std::pair{"consumed_samples", &out.meta.consumed_samples},
                          std::pair{"optimizer_step", &out.meta.optimizer_step}}) {
    auto it = m.find(key);
    if (it == m.end()) {
      problem(std::string(key) + " is missing");
    } else if (Status st = json_to_integer(*it, 0, std::numeric_limits<int64_t>::max(), dst); !st) {
      problem(std::string(key) + " " + st.message());
    }
  }
  for (auto [key, dst] :
       {std::pair{"config", &out.meta.config_json}, std::pair{"rng", &out.meta.rng_json}}) {
    auto it = m.find(key);
    if (it == m.end() || !it->is_string())
      problem(std::string(key) + " is missing or not a string");
    else
      *dst = it->get<std::string>();
  }
  if (auto it = m.find("layout"); it != m.end()) {
    if (it->is_object())
      out.meta.layout_json = it->dump();
    else
      problem("layout is not an object");
  } else {
    out.meta.layout_json = "{}";
  }
  if (auto it = m.find("run"); it != m.end() && it->is_object() && !it->empty())
    out.meta.run_json = it->dump();
  auto shards = m.find("shards");
  std::vector<std::vector<int>> reads;
  if (shards == m.end() || !shards->is_array()) {
    problem("shards is missing or not a list");
  } else {
    std::set<std::string> seen;
    for (size_t i = 0; i < shards->size(); ++i) {
      const json& s = (*shards)[i];
      const std::string at = "shards[" + std::to_string(i) + "]";
      std::string name;
      std::optional<ShardDigest> digest;
      if (v == 2 && s.is_string()) {
        name = s.get<std::string>();
      } else if (v == 3 && s.is_object() && s.contains("file") && s["file"].is_string()) {
        name = s["file"].get<std::string>();
        int64_t bytes = 0, crc = 0;
        Status b =
            s.contains("bytes")
                ? json_to_integer(s["bytes"], 512, std::numeric_limits<int64_t>::max(), &bytes)
                : Status::error("is missing");
        Status c = s.contains("crc32") ? json_to_integer(s["crc32"], 0, 0xffffffffLL, &crc)
                                       : Status::error("is missing");
        if (!b) problem(at + ".bytes " + b.message());
        if (!c) problem(at + ".crc32 " + c.message());
        digest = ShardDigest{static_cast<uint64_t>(bytes), static_cast<uint32_t>(crc)};
        // A snapshot's: the shards its writer's rank reads when it resumes that layout.
        if (auto r = s.find("reads"); r != s.end()) {
          std::vector<int> list;
          const int64_t count = static_cast<int64_t>(shards->size());
          bool ok = r->is_array();
          for (size_t k = 0; ok && k < r->size(); ++k) {
            int64_t shard = 0;
            ok = json_to_integer((*r)[k], list.empty() ? 0 : list.back() + 1, count - 1, &shard).is_ok();
            list.push_back(static_cast<int>(shard));
          }
          if (!ok) problem(at + ".reads is not a list of ascending shard indices below " + std::to_string(count));
          reads.push_back(std::move(list));
        }
      } else {
        problem(at + (v == 2 ? " is not a file name" : " is not {\"file\", \"bytes\", \"crc32\"}"));
        continue;
      }
      if (!is_shard_name(name)) {
        problem(at + " '" + name.substr(0, 40) + "' is not a shard file name (shard_NNNNN.h5)");
      } else if (!seen.insert(name).second) {
        problem(at + " names " + name + " twice");
      }
      out.shards.push_back(name);
      out.digests.push_back(digest);
    }
    if (!reads.empty() && reads.size() != shards->size())
      problem("reads is given for " + std::to_string(reads.size()) + " of the " + std::to_string(shards->size()) +
              " shards (all or none)");
    out.reads = std::move(reads);
  }
  if (!problems.empty()) return Status::bad_input(where + ": " + problems + fix);
  return out;
}

namespace {

Result<CheckpointMetadata> read_metadata(const std::string& dir, int64_t iteration) {
  const std::string path = (fs::path(iteration_dir(dir, iteration)) / kMetadata).string();
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec)))
    return Status::bad_input(
        "checkpoint " + iteration_dir(dir, iteration) +
        " has shard files but no metadata.json: the save did not finish -- load the "
        "previous iteration (the latest pointer still names it unless it was edited)");
  Result<std::string> text = read_small_file(path, kMaxMetadataBytes);
  if (!text)
    return text.status().with_context("checkpoint " + iteration_dir(dir, iteration) + ": ");
  return parse_checkpoint_metadata(text.value(), path);
}

}  // namespace

Result<std::string> read_checkpoint_metadata_text(const std::string& dir, int64_t iteration) {
  const std::string path = (fs::path(iteration_dir(dir, iteration)) / kMetadata).string();
  Result<std::string> text = read_small_file(path, kMaxMetadataBytes);
  if (!text) return text.status().with_context("checkpoint " + iteration_dir(dir, iteration) + ": ");
  auto m = parse_checkpoint_metadata(text.value(), path);
  if (!m) return m.status();
  if (m->meta.iteration != iteration)
    return Status::bad_input(path + " records iteration " + std::to_string(m->meta.iteration) +
                             " -- rename the directory back");
  return text;
}

Status install_checkpoint_metadata(const std::string& dir, int64_t iteration, const std::string& metadata_text) {
  const std::string it = iteration_dir(dir, iteration);
  const std::string path = (fs::path(it) / kMetadata).string();
  auto m = parse_checkpoint_metadata(metadata_text, "the metadata.json copied into " + it);
  if (!m) return m.status();
  if (m->meta.iteration != iteration)
    return Status::bad_input("the metadata.json copied into " + it + " records iteration " +
                             std::to_string(m->meta.iteration) + " -- report this");
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    TROUPE_RETURN_IF_ERROR(make_directories(it));
    TROUPE_RETURN_IF_ERROR(write_text_atomically(path, metadata_text));
  }
  TROUPE_RETURN_IF_ERROR(write_text_atomically((fs::path(dir) / kLatest).string(), std::to_string(iteration) + "\n"));
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_iteration_name(name) && std::stoll(name.substr(5)) > iteration) fs::remove_all(e.path(), ec);
  }
  return Status::ok();
}

std::vector<HeldIteration> held_iterations(const std::string& dir) {
  std::vector<HeldIteration> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_iteration_name(name)) continue;
    const int64_t iteration = std::stoll(name.substr(5));
    auto text = read_checkpoint_metadata_text(dir, iteration);
    if (!text) continue;
    auto m = parse_checkpoint_metadata(text.value(), name);
    if (!m) continue;
    HeldIteration h;
    h.iteration = iteration;
    h.shards = static_cast<int>(m->shards.size());
    try {
      const json run = json::parse(m->meta.run_json.empty() ? std::string("{}") : m->meta.run_json);
      if (run.is_object() && run.contains("id") && run["id"].is_string()) h.run_id = run["id"].get<std::string>();
    } catch (const json::exception&) {
    }
    for (size_t i = 0; i < m->shards.size(); ++i) {
      if (m->shards[i] != fmt::format("shard_{:05d}.h5", i) || !m->digests[i]) continue;
      auto have = read_shard_digest((e.path() / m->shards[i]).string());
      if (have && have->has_value() && **have == *m->digests[i]) h.present.push_back(static_cast<int>(i));
    }
    out.push_back(std::move(h));
  }
  std::sort(out.begin(), out.end(), [](const HeldIteration& a, const HeldIteration& b) { return a.iteration < b.iteration; });
  return out;
}

namespace {

// Shard i of a checkpoint's metadata: its path, which must exist and carry the header metadata.json
// records.
Result<std::string> checked_shard_path(const std::string& dir, int64_t iteration, const CheckpointMetadata& m,
                                       size_t i) {
  const std::string path = (fs::path(iteration_dir(dir, iteration)) / m.shards[i]).string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::bad_input("checkpoint " + iteration_dir(dir, iteration) +
                             " is missing its shard " + path +
                             " -- restore it from a copy or load an earlier iteration");
  if (const std::optional<ShardDigest>& want = m.digests[i]) {
    auto have = read_shard_digest(path);
    if (!have) return have.status();
    if (!have->has_value() || !(**have == *want))
      return Status::bad_input(fmt::format(
          "checkpoint shard {} does not match metadata.json ({}; metadata.json records {} bytes, "
          "crc32 {:#010x}): "
          "it is damaged or comes from another save -- restore it from a copy or load an earlier "
          "iteration",
          path,
          have->has_value() ? fmt::format("its header records {} bytes, crc32 {:#010x}",
                                          (**have).bytes, (**have).crc32)
                            : std::string("it has no integrity header"),
          want->bytes, want->crc32));
  }
  return path;
}

}  // namespace

Result<std::vector<std::string>> sharded_checkpoint_files(const std::string& dir, int64_t iteration) {
  auto m = read_metadata(dir, iteration);
  if (!m) return m.status();
  std::vector<std::string> out;
  for (size_t i = 0; i < m->shards.size(); ++i) {
    auto path = checked_shard_path(dir, iteration, m.value(), i);
    if (!path) return path.status();
    out.push_back(std::move(path).value());
  }
  return out;
}

Result<std::optional<std::vector<std::string>>> shards_read_by(const std::string& dir, int64_t iteration, int rank,
                                                               int world) {
  auto m = read_metadata(dir, iteration);
  if (!m) return m.status();
  if (world < 1 || rank < 0 || rank >= world || m->reads.size() != static_cast<size_t>(world))
    return std::optional<std::vector<std::string>>();
  std::vector<std::string> out;
  for (int s : m->reads[static_cast<size_t>(rank)]) {
    auto path = checked_shard_path(dir, iteration, m.value(), static_cast<size_t>(s));
    if (!path) return path.status();
    out.push_back(std::move(path).value());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

namespace {

const std::vector<NamedTensor>& section_of(const CheckpointContents& c, ShardSection s) {
  return s == ShardSection::model     ? c.params
         : s == ShardSection::exp_avg ? c.exp_avg
                                      : c.exp_avg_sq;
}

// The global tensor's elements: the leading global_shape.numel() of the tensor (a padded vocabulary
// has rows beyond the global shape, never saved).
Tensor global_part(const NamedTensor& t) {
  const int64_t n = t.global_shape.numel();
  TROUPE_CHECK(t.tensor.numel() >= n,
               "checkpoint tensor " + t.name + " is smaller than its global shape");
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

Status read_whole_tensors(ShardSetReader& reader, const CheckpointContents& into,
                          bool load_optimizer) {
  for (ShardSection s : {ShardSection::model, ShardSection::exp_avg, ShardSection::exp_avg_sq}) {
    if (s != ShardSection::model && !load_optimizer) break;
    for (const NamedTensor& t : section_of(into, s))
      TROUPE_RETURN_IF_ERROR(
          reader.read(s, t.name, t.global_shape, {{0, t.global_shape.numel()}}, global_part(t)));
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

void drop_older_iterations(const std::string& dir, int64_t iteration) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_iteration_name(name) && std::stoll(name.substr(5)) < iteration) fs::remove_all(e.path(), ec);
  }
}

uint64_t directory_bytes(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  return n;
}

Result<CheckpointMeta> read_sharded_meta(const std::string& dir, int64_t iteration) {
  auto m = read_metadata(dir, iteration);
  if (!m) return m.status();
  if (m->meta.iteration != iteration)
    return Status::bad_input("metadata.json of " + iteration_dir(dir, iteration) +
                             " records iteration " + std::to_string(m->meta.iteration) +
                             " -- rename the directory back");
  return m->meta;
}

}  // namespace troupe
