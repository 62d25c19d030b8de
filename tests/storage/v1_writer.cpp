// The version-1 writer, kept for the tests only: they make version-1 checkpoints (the format troupe
// wrote before sharded checkpoints) to check that every reader still takes them. troupe itself
// never writes version 1 (storage/checkpoint_v1.hpp).
#include "tests/storage/v1_writer.hpp"

#include <filesystem>
#include <set>

#include "storage/checkpoint_v1.hpp"
#include "storage/durable.hpp"
#include "storage/h5_file.hpp"

namespace troupe::test {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModelGroup = "model";
constexpr const char* kExpAvgGroup = "optimizer/exp_avg";
constexpr const char* kExpAvgSqGroup = "optimizer/exp_avg_sq";

Status check_section(const std::vector<NamedTensor>& tensors, const std::string& section) {
  std::set<std::string> seen;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty() || t.name == "." || t.name.find('/') != std::string::npos)
      return Status::error("tensor name '" + t.name + "' in " + section +
                           " cannot be a dataset name -- use a non-empty name without '/'");
    if (!seen.insert(t.name).second)
      return Status::error("tensor '" + t.name + "' appears twice in " + section +
                           " -- give every tensor one entry");
  }
  return Status::ok();
}

// ------------------------------------------------------------------------------------------------
// Writing

Status write_section(hid_t file, const std::string& path, const std::vector<NamedTensor>& tensors) {
  Result<h5::Handle> g = h5::create_group(file, path);
  if (!g) return g.status();
  for (const NamedTensor& t : tensors)
    TROUPE_RETURN_IF_ERROR(
        h5::write_f32_dataset(g->get(), t.name, t.global_shape, t.tensor.data<float>())
            .with_context("tensor '" + path + "/" + t.name + "': "));
  return Status::ok();
}

// The version-1 file, built in memory (storage/h5_file.hpp), then written durably.
Status write_checkpoint_file(const std::string& path, const CheckpointMeta& meta,
                             const CheckpointContents& contents) {
  Result<h5::MemoryFile::Image> image = [&]() -> Result<h5::MemoryFile::Image> {
    Result<h5::MemoryFile> f = h5::MemoryFile::create(path);
    if (!f) return f.status();
    const hid_t root = f->get();
    TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "format", std::string(kV1FormatName)));
    TROUPE_RETURN_IF_ERROR(
        h5::write_attr(root, "format_version", int64_t{kV1FormatVersion}));
    TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "iteration", meta.iteration));
    TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "consumed_samples", meta.consumed_samples));
    TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "optimizer_step", meta.optimizer_step));
    TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "config", meta.config_json));
    TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "rng", meta.rng_json));
    TROUPE_RETURN_IF_ERROR(write_section(root, kModelGroup, contents.params));
    if (!contents.exp_avg.empty() || !contents.exp_avg_sq.empty()) {
      Result<h5::Handle> opt = h5::create_group(root, "optimizer");
      if (!opt) return opt.status();
      TROUPE_RETURN_IF_ERROR(write_section(root, kExpAvgGroup, contents.exp_avg));
      TROUPE_RETURN_IF_ERROR(write_section(root, kExpAvgSqGroup, contents.exp_avg_sq));
    }
    return f->finish();
  }();
  if (!image) return image.status();
  return write_file_atomically(path, {{image->data.get(), image->size}});
}

}  // namespace

Status save_v1_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                       const CheckpointContents& contents) {
  h5::ErrorScope quiet;
  if (meta.iteration < 0)
    return Status::error("cannot save iteration " + std::to_string(meta.iteration) +
                         " -- iterations are non-negative");
  TROUPE_RETURN_IF_ERROR(check_section(contents.params, kModelGroup));
  TROUPE_RETURN_IF_ERROR(check_section(contents.exp_avg, kExpAvgGroup));
  TROUPE_RETURN_IF_ERROR(check_section(contents.exp_avg_sq, kExpAvgSqGroup));

  const std::string file = checkpoint_file(dir, meta.iteration);
  const std::string where = "saving checkpoint " + file + ": ";
  std::error_code ec;
  const bool existed = fs::exists(parent_dir(file), ec);
  TROUPE_RETURN_IF_ERROR(make_directories(parent_dir(file)).with_context(where));
  // A failed save leaves no iter_ folder of its own behind (a full disk gets its space back); one
  // that held an earlier save of this iteration is left as it is.
  auto abandon = [&](const Status& st) {
    auto latest = latest_iteration(dir);
    if (!existed && (!latest || latest.value() != meta.iteration))
      fs::remove_all(parent_dir(file), ec);
    return st.with_context(where);
  };
  // The iter_ entry itself must survive a crash once latest_checkpointed_iteration.txt names it.
  if (Status st = fsync_path(dir, true); !st) return abandon(st);
  if (Status st = write_checkpoint_file(file, meta, contents); !st) return abandon(st);
  if (Status st = write_text_atomically((fs::path(dir) / "latest_checkpointed_iteration.txt").string(),
                                        std::to_string(meta.iteration) + "\n");
      !st)
    return abandon(st);
  return Status::ok();
}

}  // namespace troupe::test
