#include "storage/hf_export.hpp"

#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <functional>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "storage/durable.hpp"
#include "storage/h5_file.hpp"
#include "storage/hf_names.hpp"
#include "storage/safetensors.hpp"
#include "storage/tokenizer.hpp"
#include "storage/json_input.hpp"
#include "storage/shard_file.hpp"

namespace troupe {
namespace {

// ------------------------------------------------------------------------------------------------
// Hugging Face export

struct HfConfig {
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_positions = 0, vocab_size = 0;
  double layer_norm_epsilon = 1e-5;
  double init_method_std = 0.02;
  // The run's dropout (the config's model.hidden_dropout / attention_dropout), else HF's default.
  double hidden_dropout = 0.1, attention_dropout = 0.1;
  std::string tokenizer_type, vocab_file, merge_file, tokenizer_model;  // the run's, from its config
  int64_t seq_length = 0;  // the run's model.seq_length (0: not recorded)
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
  auto number = [&](const nlohmann::json& o, const char* key, double* out) {
    if (o.contains(key) && o[key].is_number()) *out = o[key].get<double>();
  };
  number(model, "init_method_std", &c.init_method_std);
  if (model.contains("seq_length") && model["seq_length"].is_number_integer())
    c.seq_length = model["seq_length"].get<int64_t>();
  for (const nlohmann::json* o : {&j, &model}) {
    if (!o->is_object()) continue;
    number(*o, "hidden_dropout", &c.hidden_dropout);
    number(*o, "attention_dropout", &c.attention_dropout);
  }
  auto text = [&](const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  c.tokenizer_type = text("tokenizer_type");
  c.vocab_file = text("vocab_file");
  c.merge_file = text("merge_file");
  c.tokenizer_model = text("tokenizer_model");
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
  std::set<std::string> expected = {"lm_head.weight"};  // optional: tied to wte when absent
  for (const HfTensor& t : gpt2_hf_tensors(c.n_layer, c.vocab_size, c.n_positions, c.n_embd)) {
    expected.insert(t.name);
    auto it = model.find(t.name);
    if (it == model.end()) {
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

// GPT2LMHeadModel's tensors in HF orientation, in its order; lm_head.weight last when `lm_head`
// (a copy of wte unless the checkpoint holds one of its own).
Result<std::vector<std::pair<std::string, Tensor>>> hf_state(ShardSetReader& reader, const HfConfig& c,
                                                             bool has_lm_head, bool lm_head) {
  std::vector<HfTensor> names = gpt2_hf_tensors(c.n_layer, c.vocab_size, c.n_positions, c.n_embd);
  if (lm_head) {
    HfTensor head;
    head.name = "lm_head.weight";
    head.troupe_shape = head.hf_shape = Shape{c.vocab_size, c.n_embd};
    names.push_back(std::move(head));
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (const HfTensor& t : names) {
    const std::string source = t.name == "lm_head.weight" && !has_lm_head ? "transformer.wte.weight" : t.name;
    Tensor x = Tensor::empty(t.troupe_shape);
    TROUPE_RETURN_IF_ERROR(reader.read(ShardSection::model, source, t.troupe_shape, {{0, x.numel()}}, x));
    if (is_conv1d_weight(t.name)) {
      Tensor y = Tensor::empty(t.hf_shape);  // (in, out)
      transpose(x.data<float>(), t.troupe_shape[0], t.troupe_shape[1], y.data<float>());
      x = y;
    }
    out.emplace_back(t.name, x);
  }
  return out;
}

Status write_hf_file(ShardSetReader& reader, const std::string& out_path, const HfConfig& c,
                     bool has_lm_head, const CheckpointMeta& meta, const std::string& src_file) {
  Result<h5::MemoryFile> f = h5::MemoryFile::create(out_path);
  if (!f) return f.status();
  const hid_t root = f->get();
  auto state = hf_state(reader, c, has_lm_head, /*lm_head=*/true);
  if (!state) return state.status();
  for (const auto& [name, x] : *state)
    TROUPE_RETURN_IF_ERROR(h5::write_f32_dataset(root, name, x.shape(), x.data<float>())
                               .with_context("dataset '" + name + "': "));
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

// The end-of-document id of the run's tokenizer (bos and eos of GPT-2's config).
int64_t eos_token_id(const HfConfig& c) {
  if (c.tokenizer_type == "ByteLevelTokenizer") return 256;
  return c.vocab_size >= 50257 ? 50256 : c.vocab_size - 1;
}

nlohmann::json hf_config_json(const HfConfig& c, int64_t eos, bool tied, const CheckpointMeta& meta,
                              const std::string& source) {
  return {{"activation_function", "gelu_new"},  // troupe's GELU is the tanh form
          {"architectures", {"GPT2LMHeadModel"}},
          {"attn_pdrop", c.attention_dropout},
          {"bos_token_id", eos},
          {"embd_pdrop", c.hidden_dropout},
          {"eos_token_id", eos},
          {"initializer_range", c.init_method_std},
          {"layer_norm_epsilon", c.layer_norm_epsilon},
          {"model_type", "gpt2"},
          {"n_ctx", c.n_positions},
          {"n_embd", c.n_embd},
          {"n_head", c.n_head},
          {"n_inner", nullptr},
          {"n_layer", c.n_layer},
          {"n_positions", c.n_positions},
          {"resid_pdrop", c.hidden_dropout},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", tied},
          {"torch_dtype", "float32"},
          {"transformers_version", "4.44.0"},  // the version whose save_pretrained layout this follows
          {"use_cache", true},
          {"vocab_size", c.vocab_size},
          {"troupe",
           {{"tokenizer_type", c.tokenizer_type.empty() ? "GPT2BPETokenizer" : c.tokenizer_type},
            {"source_checkpoint", source},
            {"iteration", meta.iteration}}}};
}

struct FolderFile {
  std::string name, text;
};

using HfState = std::vector<std::pair<std::string, Tensor>>;

// A file of the run's tokenizer, copied into the folder as `name`.
Status copy_tokenizer_file(const std::string& flag, const std::string& path, const std::string& name,
                           std::vector<FolderFile>& small) {
  Result<std::string> text = read_small_file(path, size_t{64} << 20);
  if (!text)
    return Status::bad_input("the run's " + flag + " " + path + " cannot be copied: " + text.status().message() +
                             " -- put the file back (or export from where it is)");
  small.push_back({name, std::move(text).value()});
  return Status::ok();
}

// The run's tokenizer travels with the weights (docs/CHECKPOINT.md, "Hugging Face folders"): GPT-2's
// BPE as vocab.json and merges.txt; a SentencePiece model as tokenizer.model with the
// tokenizer_config.json of Hugging Face's LlamaTokenizer (its special pieces; a BOS added for
// Llama2Tokenizer, none for GPTSentencePieceTokenizer); a tokenizer.json with the tokenizer_config.json
// and special_tokens_map.json it was read with. eos: the tokenizer's end-of-document id. A byte-level
// run has no Hugging Face tokenizer (config.json records its type).
Status add_tokenizer_files(const HfConfig& c, std::vector<FolderFile>& small, int64_t& eos) {
  const std::string& type = c.tokenizer_type;
  const bool sentencepiece = type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer";
  if ((type == "GPT2BPETokenizer" && (c.vocab_file.empty() || c.merge_file.empty())) ||
      ((sentencepiece || type == "HuggingFaceTokenizer") && c.tokenizer_model.empty()) ||
      (!sentencepiece && type != "GPT2BPETokenizer" && type != "HuggingFaceTokenizer"))
    return Status::ok();
  auto tok = make_tokenizer(type, c.vocab_file, c.merge_file, c.tokenizer_model);
  if (!tok) return tok.status().with_context("the run's tokenizer files cannot be exported: ").as_bad_input();
  eos = (*tok)->eod();
  namespace fs = std::filesystem;
  if (type == "GPT2BPETokenizer") {
    TROUPE_RETURN_IF_ERROR(copy_tokenizer_file("--vocab-file", c.vocab_file, "vocab.json", small));
    TROUPE_RETURN_IF_ERROR(copy_tokenizer_file("--merge-file", c.merge_file, "merges.txt", small));
    const nlohmann::json tokenizer = {{"add_prefix_space", false},      {"bos_token", "<|endoftext|>"},
                                      {"eos_token", "<|endoftext|>"},   {"unk_token", "<|endoftext|>"},
                                      {"model_max_length", c.n_positions}, {"tokenizer_class", "GPT2Tokenizer"},
                                      {"clean_up_tokenization_spaces", true}};
    small.push_back({"tokenizer_config.json", tokenizer.dump(2) + "\n"});
  } else if (sentencepiece) {
    auto sp = sentencepiece_specials(c.tokenizer_model);
    if (!sp) return sp.status().with_context("the run's tokenizer files cannot be exported: ").as_bad_input();
    TROUPE_RETURN_IF_ERROR(copy_tokenizer_file("--tokenizer-model", c.tokenizer_model, "tokenizer.model", small));
    auto token = [](const std::string& piece) { return piece.empty() ? nlohmann::json(nullptr) : nlohmann::json(piece); };
    nlohmann::json specials = {{"bos_token", token(sp->bos)}, {"eos_token", token(sp->eos)}, {"unk_token", token(sp->unk)}};
    if (!sp->pad.empty()) specials["pad_token"] = sp->pad;
    nlohmann::json config = specials;
    config["tokenizer_class"] = "LlamaTokenizer";
    config["add_bos_token"] = type == "Llama2Tokenizer";  // Megatron's Llama2Tokenizer adds it, GPT's does not
    config["add_eos_token"] = false;
    config["legacy"] = true;  // encode as the SentencePiece model itself does
    config["model_max_length"] = c.n_positions;
    config["clean_up_tokenization_spaces"] = false;
    config["sp_model_kwargs"] = nlohmann::json::object();
    small.push_back({"tokenizer_config.json", config.dump(2) + "\n"});
    small.push_back({"special_tokens_map.json", specials.dump(2) + "\n"});
  } else {  // HuggingFaceTokenizer: the folder (or tokenizer.json) it was read from
    std::error_code ec;
    const fs::path from = fs::is_directory(c.tokenizer_model, ec) ? fs::path(c.tokenizer_model)
                                                                    : fs::path(c.tokenizer_model).parent_path();
    const std::string json = fs::is_directory(c.tokenizer_model, ec) ? (from / "tokenizer.json").string()
                                                                       : c.tokenizer_model;
    TROUPE_RETURN_IF_ERROR(copy_tokenizer_file("--tokenizer-model", json, "tokenizer.json", small));
    for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"})
      if (fs::is_regular_file(from / name, ec))
        TROUPE_RETURN_IF_ERROR(copy_tokenizer_file("--tokenizer-model", (from / name).string(), name, small));
  }
  return Status::ok();
}

// Writes the folder: config.json (make_config of the tokenizer's end-of-document id), the weights
// (make_state), generation_config.json and the run's tokenizer files (add_tokenizer_files).
Status write_hf_folder(const std::string& dir, const HfConfig& c,
                       const std::function<nlohmann::json(int64_t eos)>& make_config,
                       const std::function<Result<HfState>()>& make_state) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    return Status::bad_input(dir + " exists and is not a folder -- --format hf writes a folder (the HDF5 state dict "
                                   "is --format hf-h5); choose another --output");
  // Everything that can be refused is read first: nothing is written for a refused export.
  std::vector<FolderFile> small;
  int64_t eos = eos_token_id(c);
  TROUPE_RETURN_IF_ERROR(add_tokenizer_files(c, small, eos));
  small.push_back({"config.json", make_config(eos).dump(2) + "\n"});
  const nlohmann::json generation = {{"bos_token_id", eos}, {"eos_token_id", eos}, {"transformers_version", "4.44.0"}};
  small.push_back({"generation_config.json", generation.dump(2) + "\n"});
  auto state = make_state();
  if (!state) return state.status();

  TROUPE_RETURN_IF_ERROR(make_directories(dir));
  std::vector<SafetensorsInput> tensors;
  for (const auto& [name, x] : *state) tensors.push_back({name, x.shape(), x.data<float>()});
  TROUPE_RETURN_IF_ERROR(write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}}));
  for (const FolderFile& f : small)
    TROUPE_RETURN_IF_ERROR(write_text_atomically((fs::path(dir) / f.name).string(), f.text));
  return Status::ok();
}

// ------------------------------------------------------------------------------------------------
// LLaMA, Mixtral and BLOOM folders

// The "troupe" block of config.json: what the HF config cannot say, so that an import restores the
// run's model exactly.
nlohmann::json troupe_block(const HfConfig& c, const HfArch& a, const CheckpointMeta& meta, const std::string& source) {
  nlohmann::json t = {{"tokenizer_type", c.tokenizer_type.empty() ? "GPT2BPETokenizer" : c.tokenizer_type},
                      {"source_checkpoint", source},
                      {"iteration", meta.iteration},
                      {"seq_length", c.seq_length > 0 ? c.seq_length : a.positions},
                      {"max_position_embeddings", a.positions}};
  if (a.family == HfFamily::llama || a.family == HfFamily::mixtral) t["rotary_interleaved"] = a.rotary_interleaved;
  if (a.family == HfFamily::mixtral)  // the router's training-only settings MixtralConfig has no key for
    t["moe"] = {{"load_balancing", a.load_balancing},
                {"z_loss_coeff", a.z_loss_coeff},
                {"input_jitter_eps", a.input_jitter_eps}};
  return t;
}

// MixtralConfig: LlamaConfig's sizes without its bias switches (Mixtral has none), the sparse MoE
// block's keys, no sliding window (troupe's attention is fully causal).
nlohmann::json mixtral_config_json(const HfConfig& c, const HfArch& a, int64_t eos, const CheckpointMeta& meta,
                                   const std::string& source) {
  return {{"architectures", {"MixtralForCausalLM"}},
          {"attention_dropout", c.attention_dropout},
          {"bos_token_id", eos},
          {"eos_token_id", eos},
          {"head_dim", a.head_dim},
          {"hidden_act", "silu"},
          {"hidden_size", a.hidden},
          {"initializer_range", c.init_method_std},
          {"intermediate_size", a.ffn},
          {"max_position_embeddings", a.positions},
          {"model_type", "mixtral"},
          {"num_attention_heads", a.heads},
          {"num_experts_per_tok", a.topk},
          {"num_hidden_layers", a.layers},
          {"num_key_value_heads", a.groups},
          {"num_local_experts", a.experts},
          {"output_router_logits", false},
          {"rms_norm_eps", a.eps},
          {"rope_scaling", nullptr},
          {"rope_theta", a.rope_theta},
          {"router_aux_loss_coef", a.aux_loss_coef},
          {"router_jitter_noise", 0.0},  // HF's jitter scales the experts' input too: troupe's is in "troupe"
          {"sliding_window", nullptr},
          {"tie_word_embeddings", a.tied},
          {"torch_dtype", "float32"},
          // head_dim differs from hidden / heads only with --kv-channels: such a model needs a
          // transformers whose MixtralConfig reads head_dim (older ones assume hidden / heads).
          {"transformers_version", "4.45.0"},
          {"use_cache", true},
          {"vocab_size", a.vocab},
          {"troupe", troupe_block(c, a, meta, source)}};
}

nlohmann::json family_config_json(const HfConfig& c, const HfArch& a, int64_t eos, const CheckpointMeta& meta,
                                  const std::string& source) {
  if (a.family == HfFamily::mixtral) return mixtral_config_json(c, a, eos, meta, source);
  if (a.family == HfFamily::llama)
    return {{"architectures", {"LlamaForCausalLM"}},
            {"attention_bias", a.bias},
            {"attention_dropout", c.attention_dropout},
            {"bos_token_id", eos},
            {"eos_token_id", eos},
            {"head_dim", a.head_dim},
            {"hidden_act", "silu"},
            {"hidden_size", a.hidden},
            {"initializer_range", c.init_method_std},
            {"intermediate_size", a.ffn},
            {"max_position_embeddings", a.positions},
            {"mlp_bias", a.bias},
            {"model_type", "llama"},
            {"num_attention_heads", a.heads},
            {"num_hidden_layers", a.layers},
            {"num_key_value_heads", a.groups},
            {"pretraining_tp", 1},
            {"rms_norm_eps", a.eps},
            {"rope_scaling", nullptr},
            {"rope_theta", a.rope_theta},
            {"tie_word_embeddings", a.tied},
            {"torch_dtype", "float32"},
            {"transformers_version", "4.45.0"},  // the first whose LlamaConfig reads head_dim
            {"use_cache", true},
            {"vocab_size", a.vocab},
            {"troupe", troupe_block(c, a, meta, source)}};
  return {{"apply_residual_connection_post_layernorm", false},
          {"architectures", {"BloomForCausalLM"}},
          {"attention_dropout", c.attention_dropout},
          {"bos_token_id", eos},
          {"eos_token_id", eos},
          {"hidden_dropout", c.hidden_dropout},
          {"hidden_size", a.hidden},
          {"initializer_range", c.init_method_std},
          {"layer_norm_epsilon", a.eps},
          {"model_type", "bloom"},
          {"n_head", a.heads},
          {"n_layer", a.layers},
          {"pretraining_tp", 1},
          {"slow_but_exact", false},
          {"tie_word_embeddings", a.tied},
          {"torch_dtype", "float32"},
          {"transformers_version", "4.44.0"},
          {"use_cache", true},
          {"vocab_size", a.vocab},
          {"troupe", troupe_block(c, a, meta, source)}};
}

// Checks the checkpoint's model tensors against the family's (every problem at once) and returns the
// troupe parameters the HF tensors are made of, by name, with their shapes.
Status check_family_tensors(const std::map<std::string, Shape>& model, const std::vector<HfTensor>& hf,
                            const HfArch& a, const std::string& where) {
  std::map<std::string, Shape> wanted;
  for (const HfTensor& t : hf) wanted.emplace(t.troupe_name, t.troupe_shape);
  std::vector<std::string> problems;
  for (const auto& [name, shape] : wanted) {
    auto it = model.find(name);
    if (it == model.end())
      problems.push_back("tensor 'model/" + name + "' is missing");
    else if (!(it->second == shape))
      problems.push_back("tensor 'model/" + name + "' has shape " + it->second.str() + ", the run's config makes it " +
                         shape.str());
  }
  for (const auto& [name, shape] : model)
    if (!wanted.count(name))
      problems.push_back("tensor 'model/" + name + "' has no " + hf_architecture(a.family) + " counterpart");
  if (problems.empty()) return Status::ok();
  std::string m = where + "the checkpoint does not hold the " + hf_architecture(a.family) + " its config describes:";
  for (const std::string& p : problems) m += "\n  " + p;
  return Status::bad_input(m + "\n(export a complete checkpoint of that run; its config and tensors must agree)");
}

Result<HfState> family_state(ShardSetReader& reader, const std::vector<HfTensor>& hf) {
  std::map<std::string, Tensor> troupe;  // whole troupe parameters, read once (c_attn feeds three HF tensors)
  HfState out;
  for (const HfTensor& t : hf) {
    auto it = troupe.find(t.troupe_name);
    if (it == troupe.end()) {
      Tensor x = Tensor::empty(t.troupe_shape);
      TROUPE_RETURN_IF_ERROR(reader.read(ShardSection::model, t.troupe_name, t.troupe_shape, {{0, x.numel()}}, x));
      it = troupe.emplace(t.troupe_name, x).first;
    }
    Tensor y = Tensor::empty(t.hf_shape);
    rows_to_hf(t, it->second.data<float>(), y.data<float>());
    out.emplace_back(t.name, y);
  }
  return out;
}

// The checkpoint's GPT-2: its reader, sizes and config; errors name the checkpoint.
struct Source {
  std::unique_ptr<ShardSetReader> reader;
  HfConfig config;
  bool has_lm_head = false;
};
Result<Source> open_source(const Checkpoint& checkpoint) {
  Source s;
  auto reader = checkpoint.reader();
  if (!reader) return reader.status();
  s.reader = std::move(reader).value();
  std::vector<CheckpointTensorInfo> tensors;
  for (const auto& [name, shape] : s.reader->tensors(ShardSection::model)) tensors.push_back({"model/" + name, shape});
  const std::string where = "exporting checkpoint " + checkpoint.location() + ": ";
  Result<HfConfig> sizes = gpt2_sizes(tensors, where, &s.has_lm_head);
  if (!sizes) return sizes.status();
  Result<HfConfig> config = hf_config(checkpoint.meta().config_json, *sizes, where);
  if (!config) return config.status();
  s.config = *config;
  return s;
}

}  // namespace

Status export_hf(const Checkpoint& checkpoint, const std::string& output_file) {
  auto s = open_source(checkpoint);
  if (!s) return s.status();
  h5::ErrorScope quiet;
  Status st = write_hf_file(*s->reader, output_file, s->config, s->has_lm_head, checkpoint.meta(), checkpoint.location());
  return st.with_context("exporting to " + output_file + ": ");
}

Status export_hf_folder(const Checkpoint& checkpoint, const std::string& output_dir) {
  auto s = open_source(checkpoint);
  if (!s) return s.status();
  const HfConfig& c = s->config;
  const bool tied = !s->has_lm_head;
  const CheckpointMeta& meta = checkpoint.meta();
  const std::string source = checkpoint.location();
  ShardSetReader& reader = *s->reader;
  Status st = write_hf_folder(
      output_dir, c, [&](int64_t eos) { return hf_config_json(c, eos, tied, meta, source); },
      [&] { return hf_state(reader, c, !tied, /*lm_head=*/!tied); });
  return st.with_context("exporting to " + output_dir + ": ");
}

Status export_hf_folder(const Checkpoint& checkpoint, const std::string& output_dir, const HfArch& arch) {
  if (arch.family == HfFamily::gpt2) return export_hf_folder(checkpoint, output_dir);
  auto reader = checkpoint.reader();
  if (!reader) return reader.status();
  const std::string where = "exporting checkpoint " + checkpoint.location() + ": ";
  std::map<std::string, Shape> model;
  for (const auto& [name, shape] : (*reader)->tensors(ShardSection::model)) model[name] = shape;
  const std::vector<HfTensor> hf = hf_family_tensors(arch);
  TROUPE_RETURN_IF_ERROR(check_family_tensors(model, hf, arch, where));
  HfConfig sizes;
  sizes.n_layer = arch.layers;
  sizes.n_embd = arch.hidden;
  sizes.n_positions = arch.positions;
  sizes.vocab_size = arch.vocab;
  Result<HfConfig> config = hf_config(checkpoint.meta().config_json, sizes, where);
  if (!config) return config.status();
  const HfConfig& c = *config;
  const CheckpointMeta& meta = checkpoint.meta();
  const std::string source = checkpoint.location();
  ShardSetReader& r = **reader;
  Status st = write_hf_folder(
      output_dir, c, [&](int64_t eos) { return family_config_json(c, arch, eos, meta, source); },
      [&] { return family_state(r, hf); });
  return st.with_context("exporting to " + output_dir + ": ");
}

}  // namespace troupe
