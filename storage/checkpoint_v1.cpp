#include "storage/checkpoint_v1.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "storage/h5_reader.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// A version-1 file's root attributes, after checking its format and version. Parsed by the bounded
// reader (storage/h5_reader.hpp), never by libhdf5.
Result<h5read::Object> open_v1_root(const std::string& file) {
  const std::string where = "checkpoint " + file + ": ";
  auto source = h5read::open_file_source(file);
  if (!source) return source.status().with_context(where);
  auto f = h5read::File::open(source.value());
  if (!f) return f.status().with_context(where);
  const h5read::Object& root = (*f)->root();
  auto attr = [&](const char* name, h5read::ElementType type) -> Result<h5read::Attribute> {
    auto it = root.attributes.find(name);
    if (it == root.attributes.end())
      return Status::bad_input(
          where + "attribute '" + name +
          "' is missing -- the file was not written by troupe or is incomplete; re-save it "
          "with troupe");
    if (it->second.type != type)
      return Status::bad_input(where + "attribute '" + name + "' is not a " +
                               h5read::element_type_name(type) +
                               " -- the file was not written by troupe; re-save it with troupe");
    return it->second;
  };
  auto format = attr("format", h5read::ElementType::string);
  if (!format) return format.status();
  if (format->s != kV1FormatName)
    return Status::bad_input(where + "format is '" + format->s.substr(0, 60) + "', not '" +
                             kV1FormatName + "' -- point at a directory written by troupe's save");
  auto version = attr("format_version", h5read::ElementType::i64);
  if (!version) return version.status();
  if (version->i != kV1FormatVersion)
    return Status::bad_input(
        fmt::format("{}format_version is {}, a single-file checkpoint has version {} -- use the "
                    "troupe release that wrote it (docs/CHECKPOINT.md lists the versions)",
                    where, version->i, kV1FormatVersion));
  for (const char* name : {"iteration", "consumed_samples", "optimizer_step"})
    if (auto a = attr(name, h5read::ElementType::i64); !a) return a.status();
  for (const char* name : {"config", "rng"})
    if (auto a = attr(name, h5read::ElementType::string); !a) return a.status();
  return root;
}

}  // namespace

std::string checkpoint_file(const std::string& dir, int64_t iteration) {
  return (fs::path(dir) / fmt::format("iter_{:07d}", iteration) / "model_optim_rng.h5").string();
}

Result<CheckpointMeta> read_v1_meta(const std::string& file, int64_t iteration) {
  auto root = open_v1_root(file);
  if (!root) return root.status();
  const auto& a = root->attributes;
  CheckpointMeta meta;
  meta.format_version = kV1FormatVersion;
  meta.iteration = a.at("iteration").i;
  meta.consumed_samples = a.at("consumed_samples").i;
  meta.optimizer_step = a.at("optimizer_step").i;
  meta.config_json = a.at("config").s;
  meta.rng_json = a.at("rng").s;
  const std::string where = "checkpoint " + file + ": ";
  if (meta.consumed_samples < 0 || meta.optimizer_step < 0)
    return Status::bad_input(
        where + "negative consumed_samples or optimizer_step -- the file is damaged; restore it");
  if (meta.iteration != iteration)
    return Status::bad_input(fmt::format(
        "{}it records iteration {} but lies in the directory of iteration {} -- "
        "rename its directory back to {}",
        where, meta.iteration, iteration,
        fs::path(checkpoint_file(".", meta.iteration)).parent_path().filename().string()));
  return meta;
}

}  // namespace troupe
