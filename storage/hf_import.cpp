#include "storage/hf_import.hpp"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "storage/durable.hpp"
#include "storage/hf_names.hpp"
#include "storage/json_input.hpp"
#include "storage/safetensors.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFix = "troupe imports Hugging Face GPT-2 models (GPT2LMHeadModel) only";

Status refused(const std::string& where, const std::vector<std::string>& problems, const std::string& fix) {
  std::string m = where + "cannot be imported:";
  for (const std::string& p : problems) m += "\n  " + p;
  return Status::bad_input(m + "\n(" + fix + ")");
}

// An integer key of GPT2Config with HF's default when absent.
void read_size(const json& j, const char* key, int64_t* out, std::vector<std::string>& problems) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if (!json_to_integer(*it, 1, std::numeric_limits<int32_t>::max(), out))
    problems.push_back(fmt::format("{} is {}, not an integer in [1, 2147483647]", key, json_excerpt(*it)));
}

// A boolean option of GPT2Config that troupe's model has only one way: `want` (HF's default).
void require_bool(const json& j, const char* key, bool want, const char* why, std::vector<std::string>& problems) {
  auto it = j.find(key);
  if (it == j.end() || (it->is_boolean() && it->get<bool>() == want)) return;
  problems.push_back(fmt::format("{} is {}: {}", key, json_excerpt(*it), why));
}

// A tensor of the folder: which file holds it and its entry there.
struct Located {
  size_t file = 0;
  SafetensorsTensor entry;
};

// The troupe name of a key: GPT2Model's keys (the Hub's gpt2 files) lack "transformer.".
std::string troupe_name(const std::string& key) {
  for (const char* bare : {"wte.", "wpe.", "ln_f.", "h."})
    if (key.rfind(bare, 0) == 0) return "transformer." + key;
  return key;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Buffers some files carry that are no parameters: GPT-2's attention masks, Llama's inverse
// frequencies of older transformers versions.
bool is_buffer(const std::string& key, HfFamily family) {
  if (family == HfFamily::gpt2) return ends_with(key, ".attn.bias") || ends_with(key, ".attn.masked_bias");
  return (family == HfFamily::llama || family == HfFamily::mixtral) && ends_with(key, ".self_attn.rotary_emb.inv_freq");
}

void add_tokenizer_files(const fs::path& d, HfModel& model) {
  std::error_code ec;
  if (fs::is_regular_file(d / "vocab.json", ec) && fs::is_regular_file(d / "merges.txt", ec)) {
    model.vocab_file = fs::absolute(d / "vocab.json", ec).string();
    model.merge_file = fs::absolute(d / "merges.txt", ec).string();
  }
}


// Bounds on the sizes of a config.json: every tensor's element count stays far inside int64 (the
// safetensors reader then checks the file holds them), and the sizes fit troupe's int fields.
constexpr int64_t kMaxWidth = int64_t{1} << 24;     // hidden size, head dim, positions
constexpr int64_t kMaxAttention = int64_t{1} << 26; // heads * head dim
constexpr int64_t kMaxFfn = int64_t{1} << 28;
constexpr int64_t kMaxLayers = int64_t{1} << 20;
constexpr int64_t kMaxVocab = std::numeric_limits<int32_t>::max();

// A size key with the class's default `out` when absent (or null, where `null_ok`); [1, max].
void read_bounded(const json& j, const char* key, int64_t max, int64_t* out, std::vector<std::string>& problems,
                  bool null_ok = false) {
  auto it = j.find(key);
  if (it == j.end() || (null_ok && it->is_null())) return;
  if (!json_to_integer(*it, 1, max, out))
    problems.push_back(fmt::format("{} is {}, not an integer in [1, {}]", key, json_excerpt(*it), max));
}

void read_flag(const json& j, const char* key, bool* out, std::vector<std::string>& problems) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if (!it->is_boolean())
    problems.push_back(std::string(key) + " is " + json_excerpt(*it) + ", not true or false");
  else
    *out = it->get<bool>();
}

void read_positive(const json& j, const char* key, double max, double* out, std::vector<std::string>& problems) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if (!json_to_number(*it, std::numeric_limits<double>::min(), max, out))
    problems.push_back(fmt::format("{} is {}, not a number in (0, {}]", key, json_excerpt(*it), max));
}

// architectures, when present, must name `want` (or the bare model class `bare`).
void check_architectures(const json& j, const char* want, const char* bare, std::vector<std::string>& problems) {
  auto a = j.find("architectures");
  if (a == j.end() || a->is_null()) return;
  bool ok = a->is_array() && !a->empty();
  for (const json& name : a->is_array() ? *a : json::array())
    ok = ok && name.is_string() && (name.get<std::string>() == want || name.get<std::string>() == bare);
  if (!ok) problems.push_back("architectures is " + json_excerpt(*a) + ", not [\"" + want + "\"]");
}

// A tokenizer type troupe's export may record.
bool known_tokenizer_type(const std::string& type) {
  return type == "GPT2BPETokenizer" || type == "ByteLevelTokenizer" || type == "HuggingFaceTokenizer" ||
         type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer";
}

// "troupe": {...} of troupe's own exports: the tokenizer type and what the HF config cannot hold.
void read_troupe_block(const json& j, HfGpt2Config& c, std::vector<std::string>& problems) {
  auto t = j.find("troupe");
  if (t == j.end() || !t->is_object()) return;
  auto type = t->find("tokenizer_type");
  if (type != t->end() && type->is_string() && known_tokenizer_type(type->get<std::string>()))
    c.tokenizer_type = type->get<std::string>();
  read_bounded(*t, "seq_length", kMaxWidth, &c.seq_length, problems);
  if (c.arch.family == HfFamily::bloom) read_bounded(*t, "max_position_embeddings", kMaxWidth, &c.n_positions, problems);
  if (c.arch.family == HfFamily::llama || c.arch.family == HfFamily::mixtral)
    read_flag(*t, "rotary_interleaved", &c.arch.rotary_interleaved, problems);
}

void read_token_ids(const json& j, HfGpt2Config& c, std::vector<std::string>& problems) {
  for (auto [key, out] : {std::pair{"bos_token_id", &c.bos_token_id}, std::pair{"eos_token_id", &c.eos_token_id}})
    if (auto id = j.find(key); id != j.end() && !id->is_null() &&
                                !json_to_integer(*id, 0, std::numeric_limits<int32_t>::max(), out))
      problems.push_back(std::string(key) + " is " + json_excerpt(*id) + ", not a token id");
}

constexpr const char* kFamilyFix =
    "troupe imports GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM and BloomForCausalLM folders with the "
    "options its model has";

constexpr int64_t kMaxExperts = int64_t{1} << 20;

// MixtralConfig's sparse MoE block: experts, top-k and the aux-loss coefficient; HF's router jitter
// (which scales the experts' input too) and a sliding window troupe's attention does not have are
// refused. Reads troupe's own record of the router's training-only settings.
void read_mixtral_moe(const json& j, HfArch& a, std::vector<std::string>& problems) {
  a.experts = 8;
  a.topk = 2;
  a.aux_loss_coef = 0.001;
  read_bounded(j, "num_local_experts", kMaxExperts, &a.experts, problems);
  read_bounded(j, "num_experts_per_tok", kMaxExperts, &a.topk, problems);
  if (a.topk > a.experts)
    problems.push_back(fmt::format("num_experts_per_tok {} exceeds num_local_experts {}", a.topk, a.experts));
  if (auto c = j.find("router_aux_loss_coef");
      c != j.end() && !json_to_number(*c, 0.0, std::numeric_limits<double>::max(), &a.aux_loss_coef))
    problems.push_back("router_aux_loss_coef is " + json_excerpt(*c) + ", not a number >= 0");
  if (auto n = j.find("router_jitter_noise"); n != j.end() && !(n->is_number() && n->get<double>() == 0.0))
    problems.push_back("router_jitter_noise is " + json_excerpt(*n) +
                       ": troupe's router jitter (--moe-input-jitter-eps) scales the router's input only, HF's the "
                       "experts' too; set it to 0.0 (it acts in training only)");
  int64_t window = 0;
  if (auto w = j.find("sliding_window"); w != j.end() && !w->is_null() &&
                                         (!json_to_integer(*w, 1, std::numeric_limits<int64_t>::max(), &window) ||
                                          window < a.positions))
    problems.push_back("sliding_window is " + json_excerpt(*w) +
                       ": troupe's attention sees every earlier position (null, or at least max_position_embeddings " +
                       std::to_string(a.positions) + ", means that)");
  auto t = j.find("troupe");
  if (t == j.end() || !t->is_object() || !t->contains("moe") || !(*t)["moe"].is_object()) return;
  const json& moe = (*t)["moe"];
  if (auto lb = moe.find("load_balancing"); lb != moe.end()) {
    const std::string v = lb->is_string() ? lb->get<std::string>() : "";
    if (v == "aux_loss" || v == "seq_aux_loss" || v == "none")
      a.load_balancing = v;
    else
      problems.push_back("troupe.moe.load_balancing is " + json_excerpt(*lb) +
                         ", not \"aux_loss\", \"seq_aux_loss\" or \"none\"");
  }
  if (auto z = moe.find("z_loss_coeff");
      z != moe.end() && !json_to_number(*z, 0.0, std::numeric_limits<double>::max(), &a.z_loss_coeff))
    problems.push_back("troupe.moe.z_loss_coeff is " + json_excerpt(*z) + ", not a number >= 0");
  if (auto eps = moe.find("input_jitter_eps");
      eps != moe.end() && !(json_to_number(*eps, 0.0, 1.0, &a.input_jitter_eps) && a.input_jitter_eps < 1))
    problems.push_back("troupe.moe.input_jitter_eps is " + json_excerpt(*eps) + ", not a number in [0, 1)");
}

// LlamaConfig, or MixtralConfig (LLaMA's keys, no biases, a sparse MoE block in every layer), with the
// class's defaults where a key is absent.
Result<HfGpt2Config> parse_llama_config(const json& j, const std::string& where, HfFamily family) {
  HfGpt2Config c;
  HfArch& a = c.arch;
  a.family = family;
  const bool mixtral = family == HfFamily::mixtral;
  std::vector<std::string> problems;
  if (mixtral)
    check_architectures(j, "MixtralForCausalLM", "MixtralModel", problems);
  else
    check_architectures(j, "LlamaForCausalLM", "LlamaModel", problems);
  int64_t hidden = 4096, ffn = mixtral ? 14336 : 11008, layers = 32, heads = 32;
  int64_t positions = mixtral ? 4096 * 32 : 2048, vocab = 32000;
  read_bounded(j, "hidden_size", kMaxWidth, &hidden, problems);
  read_bounded(j, "intermediate_size", kMaxFfn, &ffn, problems);
  read_bounded(j, "num_hidden_layers", kMaxLayers, &layers, problems);
  read_bounded(j, "num_attention_heads", kMaxWidth, &heads, problems);
  read_bounded(j, "max_position_embeddings", kMaxWidth, &positions, problems);
  read_bounded(j, "vocab_size", kMaxVocab, &vocab, problems);
  int64_t groups = mixtral ? 8 : heads, head_dim = hidden / std::max<int64_t>(heads, 1);
  read_bounded(j, "num_key_value_heads", kMaxWidth, &groups, problems, /*null_ok=*/true);
  read_bounded(j, "head_dim", kMaxWidth, &head_dim, problems, /*null_ok=*/true);
  if (heads % groups != 0)
    problems.push_back(fmt::format("num_key_value_heads {} does not divide num_attention_heads {}", groups, heads));
  if (heads * head_dim > kMaxAttention)
    problems.push_back(fmt::format("num_attention_heads * head_dim = {} exceeds troupe's bound {}", heads * head_dim,
                                   kMaxAttention));
  if (head_dim % 2 != 0 || head_dim == 0)
    problems.push_back(fmt::format("head_dim {} is odd (or 0): Llama's rotary embedding rotates pairs of dimensions",
                                   head_dim));
  if (!j.contains("head_dim") && hidden % heads != 0)
    problems.push_back(fmt::format("num_attention_heads {} does not divide hidden_size {} (and no head_dim is given)",
                                   heads, hidden));
  a.eps = mixtral ? 1e-5 : 1e-6;
  a.rope_theta = mixtral ? 1e6 : 10000;
  read_positive(j, "rms_norm_eps", 1.0, &a.eps, problems);
  read_positive(j, "rope_theta", 1e30, &a.rope_theta, problems);
  bool attention_bias = false, mlp_bias = false;
  if (!mixtral) {  // MixtralForCausalLM has no biases, whatever its config says
    read_flag(j, "attention_bias", &attention_bias, problems);
    read_flag(j, "mlp_bias", &mlp_bias, problems);
  }
  if (attention_bias != mlp_bias)
    problems.push_back(fmt::format("attention_bias is {} but mlp_bias is {}: troupe's linears have biases all or none "
                                   "(--disable-bias-linear)",
                                   attention_bias, mlp_bias));
  a.bias = attention_bias;
  a.tied = false;  // LlamaConfig's and MixtralConfig's default
  read_flag(j, "tie_word_embeddings", &a.tied, problems);
  if (auto act = j.find("hidden_act"); act != j.end() && !(act->is_string() && act->get<std::string>() == "silu"))
    problems.push_back("hidden_act is " + json_excerpt(*act) + ": troupe's " +
                       (mixtral ? "Mixtral experts are" : "LLaMA MLP is") + " SwiGLU (silu)");
  if (auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null())
    problems.push_back("rope_scaling is " + json_excerpt(*rs) + ": troupe's rotary embedding has no scaling");
  if (auto pr = j.find("partial_rotary_factor"); pr != j.end() && !(pr->is_number() && pr->get<double>() == 1.0))
    problems.push_back("partial_rotary_factor is " + json_excerpt(*pr) + ": LlamaForCausalLM rotates whole heads");
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  read_token_ids(j, c, problems);
  a.layers = layers;
  a.hidden = hidden;
  a.heads = heads;
  a.groups = groups;
  a.head_dim = head_dim;
  a.ffn = ffn;
  a.vocab = vocab;
  a.positions = positions;
  if (mixtral) read_mixtral_moe(j, a, problems);
  read_troupe_block(j, c, problems);
  if (!problems.empty()) return refused(where, problems, kFamilyFix);
  c.n_layer = layers;
  c.n_embd = hidden;
  c.n_head = heads;
  c.n_positions = positions;
  c.vocab_size = vocab;
  c.layer_norm_epsilon = a.eps;
  return c;
}

// BloomConfig (its defaults where a key is absent). BLOOM has no position limit: troupe's export
// records one; else kBloomSeqLength.
Result<HfGpt2Config> parse_bloom_config(const json& j, const std::string& where) {
  HfGpt2Config c;
  HfArch& a = c.arch;
  a.family = HfFamily::bloom;
  std::vector<std::string> problems;
  check_architectures(j, "BloomForCausalLM", "BloomModel", problems);
  int64_t hidden = 64, layers = 2, heads = 8, vocab = 250880;
  read_bounded(j, "n_embed", kMaxWidth, &hidden, problems);  // BloomConfig's older spelling
  read_bounded(j, "hidden_size", kMaxWidth, &hidden, problems);
  read_bounded(j, "n_layer", kMaxLayers, &layers, problems);
  read_bounded(j, "num_hidden_layers", kMaxLayers, &layers, problems);
  read_bounded(j, "n_head", kMaxWidth, &heads, problems);
  read_bounded(j, "num_attention_heads", kMaxWidth, &heads, problems);
  read_bounded(j, "vocab_size", kMaxVocab, &vocab, problems);
  if (hidden % heads != 0) problems.push_back(fmt::format("n_head {} does not divide hidden_size {}", heads, hidden));
  read_positive(j, "layer_norm_epsilon", 1.0, &a.eps, problems);
  read_flag(j, "tie_word_embeddings", &a.tied, problems);
  require_bool(j, "apply_residual_connection_post_layernorm", false,
               "troupe's residual stream adds the block input, not the LayerNorm output", problems);
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  read_token_ids(j, c, problems);
  c.n_positions = kBloomSeqLength;
  read_troupe_block(j, c, problems);
  a.layers = layers;
  a.hidden = hidden;
  a.heads = heads;
  a.groups = heads;
  a.head_dim = hidden / std::max<int64_t>(heads, 1);
  a.ffn = 4 * hidden;
  a.vocab = vocab;
  a.positions = c.n_positions;
  if (!problems.empty()) return refused(where, problems, kFamilyFix);
  c.n_layer = layers;
  c.n_embd = hidden;
  c.n_head = heads;
  c.vocab_size = vocab;
  c.layer_norm_epsilon = a.eps;
  return c;
}


// The LLaMA/BLOOM tensors of a folder (found: by HF name) checked against config.json's sizes (every
// problem at once, with those already found) and assembled into troupe's parameters by the row map.
Status read_family_tensors(HfModel& model, const std::map<std::string, Located>& found,
                           std::vector<std::string>& problems, const std::vector<std::string>& files,
                           const std::function<Result<Tensor>(const std::string&, const Shape&)>& read,
                           const std::string& where) {
  const HfArch& a = model.config.arch;
  const std::vector<HfTensor> expected = hf_family_tensors(a);
  const std::string embedding = expected.front().name;  // embed_tokens / word_embeddings
  std::string sizes =
      a.family != HfFamily::bloom
          ? fmt::format("num_hidden_layers {}, hidden_size {}, num_attention_heads {}, num_key_value_heads {}, "
                        "head_dim {}, intermediate_size {}, vocab_size {}",
                        a.layers, a.hidden, a.heads, a.groups, a.head_dim, a.ffn, a.vocab)
          : fmt::format("n_layer {}, hidden_size {}, vocab_size {}", a.layers, a.hidden, a.vocab);
  if (a.family == HfFamily::mixtral) sizes += fmt::format(", num_local_experts {}", a.experts);
  std::set<std::string> known;
  for (const HfTensor& e : expected) {
    known.insert(e.name);
    auto it = found.find(e.name);
    if (it == found.end())
      problems.push_back("tensor '" + e.name + "' is missing" +
                         (e.name == "lm_head.weight" ? " (tie_word_embeddings is false)" : ""));
    else if (!(it->second.entry.shape == e.hf_shape))
      problems.push_back("tensor '" + e.name + "' has shape " + it->second.entry.shape.str() + " but config.json's " +
                         sizes + " make it " + e.hf_shape.str());
  }
  const bool tied_head = a.tied && found.count("lm_head.weight");  // save_pretrained omits it; must equal the embedding
  if (tied_head && !(found.at("lm_head.weight").entry.shape == Shape{a.vocab, a.hidden}))
    problems.push_back("tensor 'lm_head.weight' has shape " + found.at("lm_head.weight").entry.shape.str() + ", not " +
                       Shape{a.vocab, a.hidden}.str());
  for (const auto& [name, at] : found)
    if (!known.count(name) && !(tied_head && name == "lm_head.weight"))
      problems.push_back("tensor '" + name + "' (in " + files[at.file] + ") has no counterpart in troupe's " +
                         (a.family == HfFamily::llama ? "LLaMA" : a.family == HfFamily::mixtral ? "Mixtral" : "BLOOM"));
  if (!problems.empty()) return refused(where, problems, kFamilyFix);

  std::map<std::string, size_t> index;  // troupe name -> position in model.params
  for (const HfTensor& e : expected) {
    Result<Tensor> x = read(e.name, e.hf_shape);
    if (!x) return x.status();
    auto [it, fresh] = index.emplace(e.troupe_name, model.params.size());
    if (fresh) model.params.push_back({e.troupe_name, e.troupe_shape, Tensor::zeros(e.troupe_shape)});
    rows_from_hf(e, x->data<float>(), model.params[it->second].tensor.data<float>());
  }
  if (tied_head) {
    Result<Tensor> head = read("lm_head.weight", Shape{a.vocab, a.hidden});
    if (!head) return head.status();
    if (std::memcmp(head->data<float>(), model.params[0].tensor.data<float>(), head->nbytes()) != 0)
      return refused(where, {"lm_head.weight differs from " + embedding + " but tie_word_embeddings is true"},
                     "set tie_word_embeddings to false in config.json for an untied head, or save the folder again");
  }
  return Status::ok();
}

}  // namespace

Result<HfGpt2Config> parse_hf_config(std::string_view text, const std::string& where) {
  Result<json> parsed = parse_json(text, "");
  if (!parsed) return Status::bad_input(where + "not valid JSON: " + parsed.status().message());
  const json& j = parsed.value();
  if (!j.is_object()) return Status::bad_input(where + "not a JSON object -- pass the folder save_pretrained wrote");
  HfGpt2Config c;
  std::vector<std::string> problems;
  auto type = j.find("model_type");
  if (type != j.end() && type->is_string() && type->get<std::string>() == "llama")
    return parse_llama_config(j, where, HfFamily::llama);
  if (type != j.end() && type->is_string() && type->get<std::string>() == "mixtral")
    return parse_llama_config(j, where, HfFamily::mixtral);
  if (type != j.end() && type->is_string() && type->get<std::string>() == "bloom") return parse_bloom_config(j, where);
  if (type == j.end() || !type->is_string() || type->get<std::string>() != "gpt2")
    problems.push_back("model_type is " + (type == j.end() ? std::string("missing") : json_excerpt(*type)) +
                       ", not \"gpt2\", \"llama\", \"mixtral\" or \"bloom\" (other model families are not troupe's)");
  if (auto a = j.find("architectures"); a != j.end() && !a->is_null()) {
    bool gpt2 = a->is_array() && !a->empty();
    for (const json& name : a->is_array() ? *a : json::array())
      gpt2 = gpt2 && name.is_string() &&
             (name.get<std::string>() == "GPT2LMHeadModel" || name.get<std::string>() == "GPT2Model");
    if (!gpt2) problems.push_back("architectures is " + json_excerpt(*a) + ", not [\"GPT2LMHeadModel\"]");
  }
  read_size(j, "n_layer", &c.n_layer, problems);
  read_bounded(j, "n_embd", kMaxWidth, &c.n_embd, problems);
  read_size(j, "n_head", &c.n_head, problems);
  read_size(j, "n_positions", &c.n_positions, problems);
  read_size(j, "vocab_size", &c.vocab_size, problems);
  if (c.n_embd % c.n_head != 0)
    problems.push_back(fmt::format("n_head {} does not divide n_embd {}", c.n_head, c.n_embd));
  if (auto inner = j.find("n_inner"); inner != j.end() && !inner->is_null()) {
    int64_t n = 0;
    if (!json_to_integer(*inner, 1, std::numeric_limits<int64_t>::max(), &n) || n != 4 * c.n_embd)
      problems.push_back("n_inner is " + json_excerpt(*inner) + ": troupe's MLP is 4 * n_embd = " +
                         std::to_string(4 * c.n_embd) + " wide (null means that)");
  }
  if (auto act = j.find("activation_function"); act != j.end()) {
    const std::string a = act->is_string() ? act->get<std::string>() : "";
    if (a != "gelu_new" && a != "gelu_pytorch_tanh")
      problems.push_back("activation_function is " + json_excerpt(*act) +
                         ": troupe's GELU is the tanh form (gelu_new, gelu_pytorch_tanh)");
  }
  if (auto eps = j.find("layer_norm_epsilon"); eps != j.end())
    if (!json_to_number(*eps, std::numeric_limits<double>::min(), 1.0, &c.layer_norm_epsilon))
      problems.push_back("layer_norm_epsilon is " + json_excerpt(*eps) + ", not a number in (0, 1]");
  require_bool(j, "scale_attn_weights", true, "troupe scales attention scores by 1/sqrt(head size)", problems);
  require_bool(j, "scale_attn_by_inverse_layer_idx", false, "troupe's attention scaling does not depend on the layer",
               problems);
  require_bool(j, "add_cross_attention", false, "troupe's GPT-2 is a decoder without cross-attention", problems);
  for (auto [key, out] : {std::pair{"bos_token_id", &c.bos_token_id}, std::pair{"eos_token_id", &c.eos_token_id}})
    if (auto id = j.find(key); id != j.end() && !id->is_null() &&
                                !json_to_integer(*id, 0, std::numeric_limits<int32_t>::max(), out))
      problems.push_back(std::string(key) + " is " + json_excerpt(*id) + ", not a token id");
  if (auto t = j.find("troupe"); t != j.end() && t->is_object()) {
    auto type = t->find("tokenizer_type");
    if (type != t->end() && type->is_string() && known_tokenizer_type(type->get<std::string>()))
      c.tokenizer_type = type->get<std::string>();
  }
  if (!problems.empty()) return refused(where, problems, kFix);
  c.arch.layers = c.n_layer;
  c.arch.hidden = c.n_embd;
  c.arch.heads = c.arch.groups = c.n_head;
  c.arch.head_dim = c.n_embd / c.n_head;
  c.arch.ffn = 4 * c.n_embd;
  c.arch.vocab = c.vocab_size;
  c.arch.positions = c.n_positions;
  c.arch.eps = c.layer_norm_epsilon;
  return c;
}

Result<std::map<std::string, std::string>> parse_safetensors_index(std::string_view text, const std::string& where) {
  JsonParseOptions options;
  options.reject_duplicate_keys = true;
  Result<json> parsed = parse_json(text, "", options);
  if (!parsed) return Status::bad_input(where + "not valid JSON: " + parsed.status().message());
  const json& j = parsed.value();
  auto map = j.is_object() ? j.find("weight_map") : j.end();
  if (!j.is_object() || map == j.end() || !map->is_object())
    return Status::bad_input(where + "no \"weight_map\" object -- pass the index save_pretrained wrote");
  std::vector<std::string> problems;
  if (auto meta = j.find("metadata"); meta != j.end() && !meta->is_object() && !meta->is_null())
    problems.push_back("metadata is " + json_excerpt(*meta) + ", not an object");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : map->items()) {
    const std::string f = file.is_string() ? file.get<std::string>() : "";
    // A plain name of a .safetensors file in the folder: no path, so no file outside it is read.
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f[0] == '.' ||
        f.find('\0') != std::string::npos || !ends_with(f, ".safetensors"))
      problems.push_back("tensor '" + name + "' maps to " + json_excerpt(file) +
                         ", not the name of a .safetensors file in the folder");
    else
      out[name] = f;
  }
  if (out.empty() && problems.empty()) problems.push_back("the weight map is empty");
  if (!problems.empty()) return refused(where, problems, "write the folder again with save_pretrained");
  return out;
}

bool is_hf_folder(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  return fs::is_regular_file(d / "config.json", ec) &&
         (fs::is_regular_file(d / "model.safetensors", ec) || fs::is_regular_file(d / "model.safetensors.index.json", ec));
}

Result<HfModel> read_hf_folder(const std::string& dir) {
  const fs::path d(dir);
  const std::string where = "Hugging Face folder " + dir + ": ";
  std::error_code ec;
  if (!fs::is_regular_file(d / "config.json", ec))
    return Status::bad_input(where + "no config.json -- pass the folder save_pretrained wrote");
  Result<std::string> config_text = read_small_file((d / "config.json").string(), kMaxHfJsonBytes);
  if (!config_text) return config_text.status().with_context(where).as_bad_input();
  Result<HfGpt2Config> config = parse_hf_config(*config_text, (d / "config.json").string() + ": ");
  if (!config) return config.status();
  HfModel model;
  model.config = *config;

  // Which files hold the weights: the index's, or model.safetensors alone.
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;
  const fs::path index = d / "model.safetensors.index.json";
  if (fs::is_regular_file(index, ec)) {
    Result<std::string> text = read_small_file(index.string(), kMaxHfJsonBytes);
    if (!text) return text.status().with_context(where).as_bad_input();
    auto parsed = parse_safetensors_index(*text, index.string() + ": ");
    if (!parsed) return parsed.status();
    weight_map = std::move(parsed).value();
    std::set<std::string> unique;
    for (const auto& [name, file] : weight_map)
      if (unique.insert(file).second) files.push_back(file);
  } else if (fs::is_regular_file(d / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    const bool pickle = fs::exists(d / "pytorch_model.bin", ec);
    return Status::bad_input(where + "no model.safetensors (nor model.safetensors.index.json)" +
                             (pickle ? std::string(" -- it holds pytorch_model.bin, a pickle, which troupe does not "
                                                   "read: save it again with save_pretrained(safe_serialization=True)")
                                     : std::string(" -- pass the folder save_pretrained wrote")));
  }

  const HfFamily family = model.config.arch.family;
  std::vector<std::shared_ptr<h5read::ByteSource>> sources;
  std::vector<SafetensorsHeader> headers;
  std::map<std::string, Located> found;  // by troupe name
  std::vector<std::string> problems;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string path = (d / files[f]).string();
    auto src = h5read::open_file_source(path);
    if (!src) return src.status().with_context(where).as_bad_input();
    auto header = read_safetensors_header(**src, path + ": ");
    if (!header) return header.status();
    for (const SafetensorsTensor& t : header->tensors) {
      if (!weight_map.empty() && weight_map.count(t.name) && weight_map[t.name] != files[f]) continue;
      if (!weight_map.empty() && !weight_map.count(t.name)) {
        problems.push_back("tensor '" + t.name + "' of " + files[f] + " is not in the index's weight_map");
        continue;
      }
      if (is_buffer(t.name, family)) continue;
      const std::string name = family == HfFamily::gpt2 ? troupe_name(t.name) : t.name;
      if (!found.emplace(name, Located{f, t}).second)
        problems.push_back("tensor '" + name + "' appears twice (with and without \"transformer.\")");
    }
    sources.push_back(std::move(src).value());
    headers.push_back(std::move(header).value());
  }
  for (const auto& [name, file] : weight_map)
    if (!found.count(family == HfFamily::gpt2 ? troupe_name(name) : name) && !is_buffer(name, family))
      problems.push_back("tensor '" + name + "' is listed in the index for " + file + " but not in it");

  auto read = [&](const std::string& name, const Shape& hf_shape) -> Result<Tensor> {
    const Located& at = found[name];
    Tensor x = Tensor::empty(hf_shape);
    TROUPE_RETURN_IF_ERROR(
        read_safetensors_tensor(*sources[at.file], headers[at.file], at.entry, x, (d / files[at.file]).string() + ": ")
            .as_bad_input());
    return x;
  };
  if (family != HfFamily::gpt2) {
    TROUPE_RETURN_IF_ERROR(read_family_tensors(model, found, problems, files, read, where));
    add_tokenizer_files(d, model);
    return model;
  }

  const HfGpt2Config& c = model.config;
  const std::vector<HfTensor> expected = gpt2_hf_tensors(c.n_layer, c.vocab_size, c.n_positions, c.n_embd);
  std::set<std::string> known;
  for (const HfTensor& e : expected) {
    known.insert(e.name);
    auto it = found.find(e.name);
    if (it == found.end())
      problems.push_back("tensor '" + e.name + "' is missing");
    else if (!(it->second.entry.shape == e.hf_shape))
      problems.push_back("tensor '" + e.name + "' has shape " + it->second.entry.shape.str() + " but config.json's " +
                         fmt::format("n_layer {}, n_embd {}, n_positions {}, vocab_size {}", c.n_layer, c.n_embd,
                                     c.n_positions, c.vocab_size) +
                         " make it " + e.hf_shape.str());
  }
  const bool has_lm_head = found.count("lm_head.weight") > 0;
  if (has_lm_head && !(found["lm_head.weight"].entry.shape == Shape{c.vocab_size, c.n_embd}))
    problems.push_back("tensor 'lm_head.weight' has shape " + found["lm_head.weight"].entry.shape.str() + ", not " +
                       Shape{c.vocab_size, c.n_embd}.str());
  for (const auto& [name, where_found] : found)
    if (!known.count(name) && name != "lm_head.weight")
      problems.push_back("tensor '" + name + "' (in " + files[where_found.file] + ") has no counterpart in troupe's GPT-2");
  if (!problems.empty()) return refused(where, problems, kFix);
  for (const HfTensor& e : expected) {
    Result<Tensor> x = read(e.name, e.hf_shape);
    if (!x) return x.status();
    Tensor t = *x;
    if (is_conv1d_weight(e.name)) {
      t = Tensor::empty(e.troupe_shape);  // (out, in)
      transpose(x->data<float>(), e.hf_shape[0], e.hf_shape[1], t.data<float>());
    }
    model.params.push_back({e.name, e.troupe_shape, t});
  }
  if (has_lm_head) {
    Result<Tensor> head = read("lm_head.weight", Shape{c.vocab_size, c.n_embd});
    if (!head) return head.status();
    if (std::memcmp(head->data<float>(), model.params[0].tensor.data<float>(), head->nbytes()) != 0)
      return refused(where, {"lm_head.weight differs from transformer.wte.weight: troupe ties the output layer to the "
                             "token embedding (tie_word_embeddings)"},
                     kFix);
  }
  add_tokenizer_files(d, model);
  return model;
}

Status write_hf_checkpoint(const HfModel& model, const std::string& dir, const CheckpointMeta& meta) {
  CheckpointContents contents;
  contents.params = model.params;
  TROUPE_RETURN_IF_ERROR(prepare_iteration_dir(dir, meta.iteration));
  TROUPE_RETURN_IF_ERROR(write_shard_file(shard_file_path(dir, meta.iteration, 0), 0, whole_tensor_shard(contents)));
  const std::string layout =
      R"({"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "data_parallel_size": 1, )"
      R"("zero_stage": 0, "source": "Hugging Face folder"})";
  return commit_sharded_checkpoint(dir, meta, layout, shard_file_names(1));
}

}  // namespace troupe
