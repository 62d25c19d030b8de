#include "storage/checkpoint.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <utility>

#include "storage/durable.hpp"
#include "storage/h5_file.hpp"
#include "storage/h5_reader.hpp"
#include "storage/json_input.hpp"
#include "storage/shard_file.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormatName = "troupe-checkpoint";
constexpr const char* kLatestFile = "latest_checkpointed_iteration.txt";
constexpr const char* kFileName = "model_optim_rng.h5";
constexpr const char* kModelGroup = "model";
constexpr const char* kExpAvgGroup = "optimizer/exp_avg";
constexpr const char* kExpAvgSqGroup = "optimizer/exp_avg_sq";

// ------------------------------------------------------------------------------------------------
// Validation of the caller's tensors

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

Status check_section(const std::vector<NamedTensor>& tensors, const std::string& section) {
  std::set<std::string> seen;
  for (const NamedTensor& t : tensors) {
    check_tensor(t);
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
    TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "format", std::string(kFormatName)));
    TROUPE_RETURN_IF_ERROR(
        h5::write_attr(root, "format_version", int64_t{kCheckpointFormatVersion}));
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

// ------------------------------------------------------------------------------------------------
// Reading

std::vector<int64_t> saved_iterations(const std::string& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t it = 0;
    if (name.size() != 12 || name.rfind("iter_", 0) != 0) continue;
    auto [end, err] = std::from_chars(name.data() + 5, name.data() + name.size(), it);
    if (err == std::errc() && end == name.data() + name.size() &&
        (fs::exists(e.path() / kFileName, ec) || fs::exists(e.path() / "metadata.json", ec)))
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

// The files a reader opens for iteration N (any version); a missing version-1 file is named with
// the iterations DIR does hold.
Result<std::vector<std::string>> files_to_read(const std::string& dir, int64_t iteration) {
  if (is_sharded_checkpoint(dir, iteration)) return sharded_checkpoint_files(dir, iteration);
  const std::string file = checkpoint_file(dir, iteration);
  std::error_code ec;
  if (!fs::exists(file, ec)) return missing_checkpoint(dir, iteration, file);
  return std::vector<std::string>{file};
}

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
  if (format->s != kFormatName)
    return Status::bad_input(where + "format is '" + format->s.substr(0, 60) + "', not '" +
                             kFormatName + "' -- point at a directory written by troupe's save");
  auto version = attr("format_version", h5read::ElementType::i64);
  if (!version) return version.status();
  if (version->i != kCheckpointFormatVersion)
    return Status::bad_input(
        fmt::format("{}format_version is {}, a single-file checkpoint has version {} -- use the "
                    "troupe release that wrote it (docs/CHECKPOINT.md lists the versions)",
                    where, version->i, kCheckpointFormatVersion));
  for (const char* name : {"iteration", "consumed_samples", "optimizer_step"})
    if (auto a = attr(name, h5read::ElementType::i64); !a) return a.status();
  for (const char* name : {"config", "rng"})
    if (auto a = attr(name, h5read::ElementType::string); !a) return a.status();
  return root;
}

Result<std::unique_ptr<ShardSetReader>> open_reader(const std::string& dir, int64_t iteration) {
  auto files = files_to_read(dir, iteration);
  if (!files) return files.status();
  return ShardSetReader::open(files.value());
}

// ------------------------------------------------------------------------------------------------
// Hugging Face export

// GPT2LMHeadModel's Conv1D weights, stored (in, out); troupe stores them (out, in).
bool is_conv1d_weight(const std::string& name) {
  for (const char* suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0)
      return true;
  }
  return false;
}

struct HfTensor {
  std::string name;  // HF key, also the troupe name of its source except for lm_head.weight
  Shape troupe_shape;
};

// GPT2LMHeadModel's state-dict keys in its order, with the troupe shape of each source tensor.
std::vector<HfTensor> hf_tensors(int64_t layers, int64_t V, int64_t P, int64_t C) {
  std::vector<HfTensor> out = {{"transformer.wte.weight", {V, C}},
                               {"transformer.wpe.weight", {P, C}}};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    out.push_back({h + "ln_1.weight", {C}});
    out.push_back({h + "ln_1.bias", {C}});
    out.push_back({h + "attn.c_attn.weight", {3 * C, C}});
    out.push_back({h + "attn.c_attn.bias", {3 * C}});
    out.push_back({h + "attn.c_proj.weight", {C, C}});
    out.push_back({h + "attn.c_proj.bias", {C}});
    out.push_back({h + "ln_2.weight", {C}});
    out.push_back({h + "ln_2.bias", {C}});
    out.push_back({h + "mlp.c_fc.weight", {4 * C, C}});
    out.push_back({h + "mlp.c_fc.bias", {4 * C}});
    out.push_back({h + "mlp.c_proj.weight", {C, 4 * C}});
    out.push_back({h + "mlp.c_proj.bias", {C}});
  }
  out.push_back({"transformer.ln_f.weight", {C}});
  out.push_back({"transformer.ln_f.bias", {C}});
  out.push_back({"lm_head.weight", {V, C}});
  return out;
}

// (rows, cols) -> (cols, rows), in cache-sized tiles.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(r0 + kTile, rows); ++r)
        for (int64_t c = c0; c < std::min(c0 + kTile, cols); ++c)
          dst[c * rows + r] = src[r * cols + c];
}

struct HfConfig {
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_positions = 0, vocab_size = 0;
  double layer_norm_epsilon = 1e-5;
};

// The HF config from the checkpoint's config JSON ("model" keys), checked against the tensor shapes
// (which alone decide when a key is absent). Without num_attention_heads, GPT-2's head size 64 is
// assumed.
Result<HfConfig> hf_config(const std::string& config_json, const HfConfig& from_shapes,
                           const std::string& where) {
  HfConfig c = from_shapes;
  Result<nlohmann::json> parsed = parse_json(config_json, "the config");
  const nlohmann::json j = parsed ? parsed.value() : nlohmann::json();
  const nlohmann::json model = j.is_object() && j.contains("model") && j["model"].is_object()
                                   ? j["model"]
                                   : nlohmann::json::object();
  auto agree = [&](const char* key, int64_t shape_value, const char* what) -> Status {
    if (!model.contains(key)) return Status::ok();
    if (!model[key].is_number_integer() || model[key].get<int64_t>() != shape_value)
      return Status::error(
          fmt::format("{}its config says model.{} = {} but {} is {} -- the checkpoint is "
                      "inconsistent; re-save it from a training run",
                      where, key, model[key].dump(), what, shape_value));
    return Status::ok();
  };
  TROUPE_RETURN_IF_ERROR(agree("num_layers", c.n_layer, "the number of transformer.h.* layers"));
  TROUPE_RETURN_IF_ERROR(agree("hidden_size", c.n_embd, "the width of transformer.wte.weight"));
  TROUPE_RETURN_IF_ERROR(
      agree("max_position_embeddings", c.n_positions, "the row count of transformer.wpe.weight"));
  TROUPE_RETURN_IF_ERROR(
      agree("vocab_size", c.vocab_size, "the row count of transformer.wte.weight"));
  c.n_head = c.n_embd % 64 == 0 ? c.n_embd / 64 : 1;
  if (model.contains("num_attention_heads")) {
    const nlohmann::json& h = model["num_attention_heads"];
    if (!h.is_number_integer() || h.get<int64_t>() <= 0 || c.n_embd % h.get<int64_t>() != 0)
      return Status::error(where + "its config's model.num_attention_heads = " + h.dump() +
                           " does not divide the hidden size " + std::to_string(c.n_embd) +
                           " -- the checkpoint is inconsistent; re-save it from a training run");
    c.n_head = h.get<int64_t>();
  }
  if (model.contains("layernorm_epsilon") && model["layernorm_epsilon"].is_number())
    c.layer_norm_epsilon = model["layernorm_epsilon"].get<double>();
  return c;
}

// Checks that the checkpoint's model tensors are exactly a GPT-2's and returns its sizes.
Result<HfConfig> gpt2_sizes(const std::vector<CheckpointTensorInfo>& tensors,
                            const std::string& where, bool* has_lm_head) {
  std::map<std::string, Shape> model;
  for (const CheckpointTensorInfo& t : tensors)
    if (t.path.rfind("model/", 0) == 0) model[t.path.substr(6)] = t.shape;
  HfConfig c;
  for (const char* name : {"transformer.wte.weight", "transformer.wpe.weight"}) {
    auto it = model.find(name);
    if (it == model.end() || it->second.rank() != 2)
      return Status::error(where + "tensor 'model/" + name + "' is " +
                           (it == model.end() ? "missing" : "not a matrix") +
                           " -- the HF export takes checkpoints of GPT-2 models only");
  }
  c.vocab_size = model["transformer.wte.weight"][0];
  c.n_embd = model["transformer.wte.weight"][1];
  c.n_positions = model["transformer.wpe.weight"][0];
  for (const auto& [name, shape] : model) {
    int64_t layer = -1;
    if (name.rfind("transformer.h.", 0) != 0) continue;
    std::from_chars(name.data() + 14, name.data() + name.size(), layer);
    // A layer number beyond the tensor count cannot be part of a complete GPT-2 (checked below).
    c.n_layer = std::max(c.n_layer, std::min(layer, static_cast<int64_t>(model.size())) + 1);
  }
  if (c.n_layer == 0)
    return Status::error(
        where +
        "no transformer.h.* tensor -- the HF export takes checkpoints of GPT-2 models only");
  if (c.n_layer >
      static_cast<int64_t>(model.size()))  // a layer number no checkpoint of this size can hold
    return Status::bad_input(
        where + "tensors of layer " + std::to_string(c.n_layer - 1) +
        " but not of the layers before it -- the HF export needs a complete GPT-2");
  *has_lm_head = model.count("lm_head.weight") > 0;
  std::set<std::string> expected;
  for (const HfTensor& t : hf_tensors(c.n_layer, c.vocab_size, c.n_positions, c.n_embd)) {
    expected.insert(t.name);
    auto it = model.find(t.name);
    if (it == model.end()) {
      if (t.name == "lm_head.weight") continue;  // tied to wte
      return Status::error(where + "tensor 'model/" + t.name +
                           "' is missing -- the HF export needs every "
                           "GPT-2 tensor; export a complete checkpoint");
    }
    if (!(it->second == t.troupe_shape))
      return Status::error(where + "tensor 'model/" + t.name + "' has shape " + it->second.str() +
                           ", a GPT-2 with " + "hidden size " + std::to_string(c.n_embd) + " has " +
                           t.troupe_shape.str() +
                           " -- the HF export takes checkpoints of GPT-2 models only");
  }
  for (const auto& [name, shape] : model)
    if (!expected.count(name))
      return Status::error(where + "tensor 'model/" + name +
                           "' has no GPT2LMHeadModel counterpart -- the HF "
                           "export takes checkpoints of GPT-2 models only");
  return c;
}

Status write_hf_file(ShardSetReader& reader, const std::string& out_path, const HfConfig& c,
                     bool has_lm_head, const CheckpointMeta& meta, const std::string& src_file) {
  Result<h5::MemoryFile> f = h5::MemoryFile::create(out_path);
  if (!f) return f.status();
  const hid_t root = f->get();
  for (const HfTensor& t : hf_tensors(c.n_layer, c.vocab_size, c.n_positions, c.n_embd)) {
    const std::string source =
        t.name == "lm_head.weight" && !has_lm_head ? "transformer.wte.weight" : t.name;
    Tensor x = Tensor::empty(t.troupe_shape);
    TROUPE_RETURN_IF_ERROR(
        reader.read(ShardSection::model, source, t.troupe_shape, {{0, x.numel()}}, x));
    if (is_conv1d_weight(t.name)) {
      Tensor y = Tensor::empty(Shape{t.troupe_shape[1], t.troupe_shape[0]});  // (in, out)
      transpose(x.data<float>(), t.troupe_shape[0], t.troupe_shape[1], y.data<float>());
      x = y;
    }
    TROUPE_RETURN_IF_ERROR(h5::write_f32_dataset(root, t.name, x.shape(), x.data<float>())
                               .with_context("dataset '" + t.name + "': "));
  }
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "model_type", std::string("gpt2")));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "architectures", std::string("GPT2LMHeadModel")));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "n_layer", c.n_layer));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "n_embd", c.n_embd));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "n_head", c.n_head));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "n_positions", c.n_positions));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "vocab_size", c.vocab_size));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "layer_norm_epsilon", c.layer_norm_epsilon));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "source_checkpoint", src_file));
  TROUPE_RETURN_IF_ERROR(h5::write_attr(root, "iteration", meta.iteration));
  Result<h5::MemoryFile::Image> image = f->finish();
  if (!image) return image.status();
  return write_file_atomically(out_path, {{image->data.get(), image->size}});
}

}  // namespace

std::string checkpoint_file(const std::string& dir, int64_t iteration) {
  return (fs::path(dir) / fmt::format("iter_{:07d}", iteration) / kFileName).string();
}

Status save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
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
  if (Status st = write_text_atomically((fs::path(dir) / kLatestFile).string(),
                                        std::to_string(meta.iteration) + "\n");
      !st)
    return abandon(st);
  return Status::ok();
}

namespace {
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

Result<CheckpointMeta> read_checkpoint_meta(const std::string& dir, int64_t iteration) {
  if (is_sharded_checkpoint(dir, iteration))
    return read_sharded_meta(dir, iteration);  // versions 2, 3
  auto files = files_to_read(dir, iteration);
  if (!files) return files.status();
  const std::string file = files->front();
  auto root = open_v1_root(file);
  if (!root) return root.status();
  const auto& a = root->attributes;
  CheckpointMeta meta;
  meta.format_version = kCheckpointFormatVersion;
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

Status load_checkpoint(const std::string& dir, int64_t iteration, const CheckpointContents& into,
                       bool load_optimizer) {
  for (const auto* section : {&into.params, &into.exp_avg, &into.exp_avg_sq})
    for (const NamedTensor& t : *section) check_tensor(t);
  if (!is_sharded_checkpoint(dir, iteration)) {
    auto files = files_to_read(dir, iteration);
    if (!files) return files.status();
    if (auto root = open_v1_root(files->front()); !root) return root.status();
  }
  auto reader = open_reader(dir, iteration);
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
    return Status::bad_input("checkpoint " + iteration_dir(dir, iteration) +
                             " holds no optimizer state (it was saved without) -- load the "
                             "model only (e.g. --no-load-optim) and start the optimizer afresh");
  TROUPE_RETURN_IF_ERROR(fill(ShardSection::exp_avg, into.exp_avg));
  return fill(ShardSection::exp_avg_sq, into.exp_avg_sq);
}

Result<std::vector<CheckpointTensorInfo>> list_checkpoint_tensors(const std::string& dir,
                                                                  int64_t iteration) {
  auto reader = open_reader(dir, iteration);
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

Status export_hf(const std::string& dir, int64_t iteration, const std::string& output_file) {
  Result<CheckpointMeta> meta = read_checkpoint_meta(dir, iteration);
  if (!meta) return meta.status();
  auto reader = open_reader(dir, iteration);
  if (!reader) return reader.status();
  std::vector<CheckpointTensorInfo> tensors;
  for (const auto& [name, shape] : (*reader)->tensors(ShardSection::model))
    tensors.push_back({"model/" + name, shape});
  const std::string source = is_sharded_checkpoint(dir, iteration)
                                 ? iteration_dir(dir, iteration)
                                 : checkpoint_file(dir, iteration);
  const std::string where = "exporting checkpoint " + source + ": ";
  bool has_lm_head = false;
  Result<HfConfig> sizes = gpt2_sizes(tensors, where, &has_lm_head);
  if (!sizes) return sizes.status();
  Result<HfConfig> config = hf_config(meta->config_json, *sizes, where);
  if (!config) return config.status();
  h5::ErrorScope quiet;
  Status st = write_hf_file(**reader, output_file, *config, has_lm_head, *meta, source);
  return st.with_context("exporting to " + output_file + ": ");
}

}  // namespace troupe
