#include "storage/hf_export.hpp"

#include <fmt/format.h>

#include <charconv>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "storage/durable.hpp"
#include "storage/h5_file.hpp"
#include "storage/json_input.hpp"
#include "storage/shard_file.hpp"

namespace troupe {
namespace {

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

Status export_hf(const Checkpoint& checkpoint, const std::string& output_file) {
  const CheckpointMeta* meta = &checkpoint.meta();
  auto reader = checkpoint.reader();
  if (!reader) return reader.status();
  std::vector<CheckpointTensorInfo> tensors;
  for (const auto& [name, shape] : (*reader)->tensors(ShardSection::model))
    tensors.push_back({"model/" + name, shape});
  const std::string& source = checkpoint.location();
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
