#include "troupe/train_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>

#include "storage/json_input.hpp"

namespace troupe {
namespace {

using nlohmann::json;

// The JSON written into checkpoints: {"format", "version", "model": {...}, "parallel": {...},
// <every other TrainConfig field>}.
constexpr const char* kFormat = "troupe.train_config";
constexpr int kVersion = 9;  // 2 added the "parallel" object (version 1 files read as 1x1x1), 3 "runtime",
                              // 4 "schedule" (older files: an iteration-based schedule), data_path as
                              // an array and the per-split data paths, 5 the model's dropout
                              // probabilities (older files: 0, since troupe trained without dropout)
                              // and the batch-size ramp-up (older files: none), 6 the architecture
                              // family (older files: GPT-2's), 7 the "precision" object (older
                              // files: fp32, which troupe trained in), 8 mixture of experts: the
                              // "moe" object in "model" and the expert sizes in "parallel" (older
                              // files: a dense model, expert sizes 1 and 0), 9 long sequences: the
                              // context-parallel and Ulysses sizes in "parallel" (older files: 1)

// One list of fields serves both directions, so a field cannot be written and forgotten when read.
template <class Model, class Visitor>
void visit_model_fields(Model& m, Visitor&& v) {
  v("num_layers", m.num_layers);
  v("hidden_size", m.hidden_size);
  v("num_attention_heads", m.num_attention_heads);
  v("seq_length", m.seq_length);
  v("max_position_embeddings", m.max_position_embeddings);
  v("vocab_size", m.vocab_size);
  v("make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  v("layernorm_epsilon", m.layernorm_epsilon);
  v("init_method_std", m.init_method_std);
}

// Version 5: dropout, in the "model" object (absent from older files: 0).
template <class Model, class Visitor>
void visit_dropout_fields(Model& m, Visitor&& v) {
  v("hidden_dropout", m.hidden_dropout);
  v("attention_dropout", m.attention_dropout);
}

// Version 6: the architecture family, in the "model" object (absent from older files: GPT-2's
// values, GptConfig's defaults). The enums are written as Megatron's spellings.
template <class Model, class Visitor>
void visit_family_fields(Model& m, Visitor&& v) {
  v("normalization", m.normalization);
  v("position_embedding_type", m.position_embedding);
  v("activation", m.activation);
  v("add_bias_linear", m.add_bias_linear);
  v("untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights);
  v("embed_layernorm", m.embed_layernorm);
  v("num_query_groups", m.num_query_groups);
  v("kv_channels", m.kv_channels);
  v("ffn_hidden_size", m.ffn_hidden);
  v("rotary_percent", m.rotary_percent);
  v("rotary_base", m.rotary_base);
  v("rotary_interleaved", m.rotary_interleaved);
}

// Version 8: mixture of experts (include/troupe/model_config.hpp, MoeConfig), the "moe" object inside
// "model" (absent from older files: no experts). The enums are written as their spellings.
template <class Moe, class Visitor>
void visit_moe_fields(Moe& m, Visitor&& v) {
  v("num_experts", m.num_experts);
  v("layer_freq", m.layer_freq);
  v("layer_pattern", m.layer_pattern);
  v("router", m.router);
  v("topk", m.topk);
  v("ffn_hidden_size", m.ffn_hidden);
  v("drop_tokens", m.drop_tokens);
  v("capacity_factor", m.capacity_factor);
  v("eval_capacity_factor", m.eval_capacity_factor);
  v("min_capacity", m.min_capacity);
  v("drop_policy", m.drop_policy);
  v("pad_to_capacity", m.pad_to_capacity);
  v("random_token_selection", m.random_token_selection);
  v("second_expert_sampling", m.second_expert_sampling);
  v("load_balancing", m.load_balancing);
  v("pre_softmax", m.pre_softmax);
  v("z_loss_coeff", m.z_loss_coeff);
  v("input_jitter_eps", m.input_jitter_eps);
  v("aux_loss_coeff", m.aux_loss_coeff);
  v("residual", m.residual);
  v("shared_expert_ffn_hidden_size", m.shared_expert_ffn);
}

// Version 8: the expert-parallel sizes, in the "parallel" object (absent from older files: 1 and 0).
template <class Config, class Visitor>
void visit_expert_parallel_fields(Config& c, Visitor&& v) {
  v("expert_model_parallel_size", c.expert_model_parallel_size);
  v("expert_tensor_parallel_size", c.expert_tensor_parallel_size);
}

// Version 9: long sequences, in the "parallel" object (absent from older files: 1, p2p, 1).
template <class Config, class Visitor>
void visit_long_sequence_fields(Config& c, Visitor&& v) {
  v("context_parallel_size", c.context_parallel_size);
  v("cp_comm_type", c.cp_comm_type);
  v("ds_sequence_parallel_size", c.ds_sequence_parallel_size);
}

// Version 7: mixed precision (include/troupe/precision.hpp), the "precision" object (absent from older
// files: fp32 and the Megatron defaults, PrecisionConfig's).
template <class Config, class Visitor>
void visit_precision_fields(Config& c, Visitor&& v) {
  auto& p = c.precision;
  v("dtype", p.dtype);
  v("recipe", p.recipe);
  v("loss_scale", p.loss_scale);
  v("initial_loss_scale", p.initial_loss_scale);
  v("min_loss_scale", p.min_loss_scale);
  v("loss_scale_window", p.loss_scale_window);
  v("hysteresis", p.hysteresis);
  v("consecutive_hysteresis", p.consecutive_hysteresis);
  v("accumulate_allreduce_grads_in_fp32", p.accumulate_allreduce_grads_in_fp32);
  v("attention_softmax_in_fp32", p.attention_softmax_in_fp32);
  v("bf16_immediate_grad_update", p.bf16_immediate_grad_update);
  v("bf16_check_grad_overflow", p.bf16_check_grad_overflow);
  v("communication_data_type", p.communication_data_type);
}

// A field's JSON value: itself, or an enum's spelling.
template <class T>
json json_value(const T& v) {
  if constexpr (std::is_enum_v<T>) return to_string(v);
  else return v;
}

template <class Config, class Visitor>
void visit_parallel_fields(Config& c, Visitor&& v) {
  v("tensor_model_parallel_size", c.tensor_model_parallel_size);
  v("pipeline_model_parallel_size", c.pipeline_model_parallel_size);
  v("data_parallel_size", c.data_parallel_size);
  v("zero_stage", c.zero_stage);
  v("pipeline_schedule", c.pipeline_schedule);
  v("num_layers_per_virtual_pipeline_stage", c.num_layers_per_virtual_pipeline_stage);
  v("recompute_granularity", c.recompute_granularity);
  v("sequence_parallel", c.sequence_parallel);
  v("timeline", c.timeline);
}

// Version 3: optimizer offload and restarts (absent from older files: no offload, no restarts).
template <class Config, class Visitor>
void visit_runtime_fields(Config& c, Visitor&& v) {
  v("offload_optimizer", c.offload_optimizer);
  v("offload_path", c.offload_path);
  v("max_restarts", c.max_restarts);
  v("distributed_timeout_minutes", c.distributed_timeout_minutes);
}

// Version 4: Megatron's sample- and token-based runs and schedules (absent from older files: none).
template <class Config, class Visitor>
void visit_schedule_fields(Config& c, Visitor&& v) {
  v("train_samples", c.train_samples);
  v("lr_warmup_samples", c.lr_warmup_samples);
  v("lr_decay_samples", c.lr_decay_samples);
  v("lr_warmup_fraction", c.lr_warmup_fraction);
  v("train_tokens", c.train_tokens);
  v("lr_warmup_tokens", c.lr_warmup_tokens);
  v("lr_decay_tokens", c.lr_decay_tokens);
}

// Version 5: the batch-size ramp-up, in the "schedule" object (absent from older files: none).
template <class Config, class Visitor>
void visit_rampup_fields(Config& c, Visitor&& v) {
  v("rampup_start_batch", c.rampup_start_batch);
  v("rampup_batch_increment", c.rampup_batch_increment);
  v("rampup_samples", c.rampup_samples);
}

// Version 4: the per-split data paths (absent from older files: none).
template <class Config, class Visitor>
void visit_data_fields(Config& c, Visitor&& v) {
  v("train_data_path", c.train_data_path);
  v("valid_data_path", c.valid_data_path);
  v("test_data_path", c.test_data_path);
}

// The model families' tokenizers: --tokenizer-model. Absent from files written before them (read as
// "": their tokenizers needed no model file); present in every file written since, whatever the
// version, so it is read when there.
template <class Config, class Visitor>
void visit_tokenizer_fields(Config& c, Visitor&& v) {
  v("tokenizer_model", c.tokenizer_model);
}

// --device: absent from files written before it (read as "cpu"), read when there.
template <class Config, class Visitor>
void visit_device_fields(Config& c, Visitor&& v) {
  v("device", c.device);
}

template <class Config, class Visitor>
void visit_train_fields(Config& c, Visitor&& v) {
  v("micro_batch_size", c.micro_batch_size);
  v("global_batch_size", c.global_batch_size);
  v("lr", c.lr);
  v("min_lr", c.min_lr);
  v("lr_decay_style", c.lr_decay_style);
  v("lr_warmup_iters", c.lr_warmup_iters);
  v("lr_warmup_style", c.lr_warmup_style);
  v("lr_warmup_init", c.lr_warmup_init);
  v("lr_decay_iters", c.lr_decay_iters);
  v("weight_decay", c.weight_decay);
  v("adam_beta1", c.adam_beta1);
  v("adam_beta2", c.adam_beta2);
  v("adam_eps", c.adam_eps);
  v("clip_grad", c.clip_grad);
  v("train_iters", c.train_iters);
  v("seed", c.seed);
  v("data_path", c.data_path);
  v("tokenizer_type", c.tokenizer_type);
  v("vocab_file", c.vocab_file);
  v("merge_file", c.merge_file);
  v("no_shuffle", c.no_shuffle);
  v("mock_data", c.mock_data);
  v("split", c.split);
  v("save", c.save);
  v("save_interval", c.save_interval);
  v("exit_interval", c.exit_interval);
  v("load", c.load);
  v("eval_interval", c.eval_interval);
  v("eval_iters", c.eval_iters);
  v("log_interval", c.log_interval);
  v("metrics_file", c.metrics_file);
  v("num_threads", c.num_threads);
  v("deepspeed_config", c.deepspeed_config);
}

Status type_error(const std::string& path, const char* expected, const json& got) {
  return Status::bad_input("train config JSON: key \"" + path + "\" must be " + expected + ", got " +
                       json_excerpt(got) +
                       " -- write the config again with `troupe train` or fix the value");
}

Status range_error(const std::string& path, const Status& st) {
  return Status::bad_input("train config JSON: key \"" + path + "\" " + st.message() +
                       " -- write the config again with `troupe train` or fix the value");
}

// The values each numeric key may hold (the key path as in the file). Keys not listed: integers in
// [0, the field type's maximum] (every integer setting is a size, count or interval), numbers in
// [0, the largest double] (so is every real-valued one). These are ranges of meaning, not of
// memory: validation decides what a machine can train.
struct Range {
  double min, max;
};
constexpr double kInt32Max = 2147483647.0;
const Range* range_of(const std::string& path) {
  static const std::map<std::string, Range> ranges = {
      {"model.num_layers", {1, kInt32Max}},
      {"model.hidden_size", {1, kInt32Max}},
      {"model.num_attention_heads", {1, kInt32Max}},
      {"model.seq_length", {1, kInt32Max}},
      {"model.max_position_embeddings", {1, kInt32Max}},
      {"model.vocab_size", {0, kInt32Max}},  // token ids are int32; 0 before a tokenizer set it
      {"model.make_vocab_size_divisible_by", {1, kInt32Max}},
      {"model.hidden_dropout", {0, 1}},  // validation refuses 1 itself, with the flag's name
      {"model.attention_dropout", {0, 1}},
      {"model.rotary_percent", {0, 1}},  // validation refuses 0 itself, with the flag's name
      {"parallel.tensor_model_parallel_size", {1, kInt32Max}},
      {"parallel.pipeline_model_parallel_size", {1, kInt32Max}},
      {"parallel.data_parallel_size", {0, kInt32Max}},
      {"parallel.zero_stage", {0, 3}},
      {"parallel.num_layers_per_virtual_pipeline_stage", {0, kInt32Max}},
      {"parallel.expert_model_parallel_size", {1, kInt32Max}},
      {"parallel.context_parallel_size", {1, kInt32Max}},
      {"parallel.ds_sequence_parallel_size", {1, kInt32Max}},
      // Unused without dropping (Megatron-LM's negative factor means dropless): any number.
      {"model.moe.capacity_factor", {std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max()}},
      {"model.moe.eval_capacity_factor", {std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max()}},
      {"runtime.max_restarts", {0, kInt32Max}},
      {"micro_batch_size", {1, kInt32Max}},
      {"global_batch_size", {1, kInt32Max}},
      {"num_threads", {0, kInt32Max}},
      {"eval_interval", {1, 9.2e18}},
      {"log_interval", {1, 9.2e18}},
      {"adam_beta1", {0, 1}},
      {"adam_beta2", {0, 1}},
      {"schedule.lr_warmup_fraction", {-1, 1}},
      {"schedule.lr_warmup_tokens", {-1, 9.2e18}},
      // A loss scale is positive (the smallest positive double up); window and hysteresis count >= 1.
      {"precision.initial_loss_scale", {4.9406564584124654e-324, std::numeric_limits<double>::max()}},
      {"precision.min_loss_scale", {4.9406564584124654e-324, std::numeric_limits<double>::max()}},
      {"precision.loss_scale_window", {1, 9.2e18}},
      {"precision.hysteresis", {1, 9.2e18}},
  };
  const auto it = ranges.find(path);
  return it == ranges.end() ? nullptr : &it->second;
}

// Reads one value of the field's type; integers must fit the field and the key's range.
template <class Int>
Status read_integer(const json& value, const std::string& path, Int* out) {
  int64_t min = 0;
  int64_t max = static_cast<int64_t>(std::numeric_limits<Int>::max());
  if (const Range* r = range_of(path)) {
    min = static_cast<int64_t>(r->min);
    max = std::min<int64_t>(max, static_cast<int64_t>(r->max));
  }
  int64_t v = 0;
  if (Status st = json_to_integer(value, min, max, &v); !st) return range_error(path, st);
  *out = static_cast<Int>(v);
  return Status::ok();
}

Status read_value(const json& value, const std::string& path, int* out) {
  return read_integer(value, path, out);
}
Status read_value(const json& value, const std::string& path, int64_t* out) {
  return read_integer(value, path, out);
}
Status read_value(const json& value, const std::string& path, uint64_t* out) {
  if (Status st = json_to_unsigned(value, std::numeric_limits<uint64_t>::max(), out); !st)
    return range_error(path, st);
  return Status::ok();
}
Status read_value(const json& value, const std::string& path, double* out) {
  const Range* r = range_of(path);
  const double min = r ? r->min : 0.0, max = r ? r->max : std::numeric_limits<double>::max();
  if (Status st = json_to_number(value, min, max, out); !st) return range_error(path, st);
  return Status::ok();
}
// An enum by its spelling (to_string / parse of include/troupe/model_config.hpp).
template <class Enum, std::enable_if_t<std::is_enum_v<Enum>, int> = 0>
Status read_value(const json& value, const std::string& path, Enum* out) {
  if (!value.is_string() || !parse(value.get<std::string>(), *out)) {
    const char* expected = std::is_same_v<Enum, Normalization> ? "\"LayerNorm\" or \"RMSNorm\""
                           : std::is_same_v<Enum, PrecisionDType>           ? "\"fp32\", \"bf16\" or \"fp16\""
                           : std::is_same_v<Enum, PrecisionRecipe> ? "\"megatron\" or \"deepspeed\""
                           : std::is_same_v<Enum, MoeRouter>       ? "\"deepspeed\" or \"megatron\""
                           : std::is_same_v<Enum, MoeLoadBalancing> ? "\"aux_loss\", \"seq_aux_loss\" or \"none\""
                           : std::is_same_v<Enum, MoeDropPolicy>    ? "\"probs\" or \"position\""
                           : std::is_same_v<Enum, PositionEmbedding>
                               ? "\"learned_absolute\", \"rope\", \"alibi\" or \"none\""
                               : "\"gelu\" or \"swiglu\"";
    return type_error(path, expected, value);
  }
  return Status::ok();
}
Status read_value(const json& value, const std::string& path, bool* out) {
  if (!value.is_boolean()) return type_error(path, "true or false", value);
  *out = value.get<bool>();
  return Status::ok();
}
Status read_value(const json& value, const std::string& path, std::string* out) {
  if (!value.is_string()) return type_error(path, "a string", value);
  *out = value.get<std::string>();
  return Status::ok();
}
// An array of strings; a string (data_path before version 4) is its one item ("" none).
Status read_value(const json& value, const std::string& path, std::vector<std::string>* out) {
  out->clear();
  if (value.is_string()) {
    if (!value.get_ref<const std::string&>().empty()) out->push_back(value.get<std::string>());
    return Status::ok();
  }
  if (!value.is_array()) return type_error(path, "an array of strings", value);
  for (const json& item : value) {
    if (!item.is_string()) return type_error(path, "an array of strings", value);
    out->push_back(item.get<std::string>());
  }
  return Status::ok();
}

// An array of integers in [0, the int maximum] (MoE's expert counts and layer pattern).
Status read_value(const json& value, const std::string& path, std::vector<int>* out) {
  out->clear();
  if (!value.is_array()) return type_error(path, "an array of integers", value);
  for (const json& item : value) {
    int64_t v = 0;
    if (Status st = json_to_integer(item, 0, std::numeric_limits<int>::max(), &v); !st) return range_error(path, st);
    out->push_back(static_cast<int>(v));
  }
  return Status::ok();
}

// Reads every visited field of `object` (at `prefix`), then rejects keys nobody read: a key this
// build does not know means the file came from another version or was mistyped.
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string prefix)
      : object_(object), prefix_(std::move(prefix)) {}

  template <class T>
  void operator()(const char* key, T& field) {
    if (!status_.is_ok()) return;
    seen_.insert(key);
    const auto it = object_.find(key);
    if (it == object_.end()) {
      status_ = Status::bad_input("train config JSON: missing key \"" + prefix_ + key +
                              "\" -- the file was written by another troupe version or edited; "
                              "write it again with `troupe train`");
      return;
    }
    status_ = read_value(*it, prefix_ + key, &field);
  }

  Status finish(std::initializer_list<const char*> also_known = {}) {
    if (!status_.is_ok()) return status_;
    for (const char* key : also_known) seen_.insert(key);
    for (const auto& item : object_.items()) {
      if (!seen_.count(item.key()))
        return Status::bad_input("train config JSON: unknown key \"" + prefix_ + item.key() +
                             "\" -- this troupe version does not know it; remove it or use the "
                             "troupe version that wrote the file");
    }
    return Status::ok();
  }

 private:
  const json& object_;
  std::string prefix_;
  std::set<std::string> seen_;
  Status status_;
};

}  // namespace

std::string TrainConfig::to_json() const {
  json model_json = json::object();
  visit_model_fields(model, [&](const char* key, const auto& value) { model_json[key] = value; });
  visit_dropout_fields(model, [&](const char* key, const auto& value) { model_json[key] = value; });
  visit_family_fields(model, [&](const char* key, const auto& value) { model_json[key] = json_value(value); });
  json moe_json = json::object();
  visit_moe_fields(model.moe, [&](const char* key, const auto& value) { moe_json[key] = json_value(value); });
  model_json["moe"] = std::move(moe_json);
  json j = json::object();
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["model"] = std::move(model_json);
  json parallel_json = json::object();
  visit_parallel_fields(*this,
                        [&](const char* key, const auto& value) { parallel_json[key] = value; });
  visit_expert_parallel_fields(*this, [&](const char* key, const auto& value) { parallel_json[key] = value; });
  visit_long_sequence_fields(*this, [&](const char* key, const auto& value) { parallel_json[key] = value; });
  j["parallel"] = std::move(parallel_json);
  json runtime_json = json::object();
  visit_runtime_fields(*this, [&](const char* key, const auto& value) { runtime_json[key] = value; });
  j["runtime"] = std::move(runtime_json);
  json schedule_json = json::object();
  visit_schedule_fields(*this, [&](const char* key, const auto& value) { schedule_json[key] = value; });
  visit_rampup_fields(*this, [&](const char* key, const auto& value) { schedule_json[key] = value; });
  j["schedule"] = std::move(schedule_json);
  json precision_json = json::object();
  visit_precision_fields(*this, [&](const char* key, const auto& value) { precision_json[key] = json_value(value); });
  j["precision"] = std::move(precision_json);
  visit_train_fields(*this, [&](const char* key, const auto& value) { j[key] = value; });
  visit_data_fields(*this, [&](const char* key, const auto& value) { j[key] = value; });
  visit_tokenizer_fields(*this, [&](const char* key, const auto& value) { j[key] = value; });
  visit_device_fields(*this, [&](const char* key, const auto& value) { j[key] = value; });
  return j.dump(2);
}

Result<TrainConfig> TrainConfig::from_json(const std::string& text) {
  auto parsed = parse_json(text, "train config JSON");
  if (!parsed)
    return Status::bad_input(
        parsed.status().message() +
        " -- the file is damaged; restore it or write it again with `troupe train`");
  const json& j = parsed.value();
  if (!j.is_object()) return type_error("(top level)", "an object", j);

  const auto format = j.find("format");
  if (format == j.end() || !format->is_string() || format->get<std::string>() != kFormat)
    return Status::bad_input(std::string("train config JSON: key \"format\" must be \"") + kFormat +
                         "\" -- this is not a troupe training config");
  const auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() < 1 ||
      version->get<int64_t>() > kVersion)
    return Status::bad_input("train config JSON: key \"version\" must be 1 to " +
                         std::to_string(kVersion) + ", got " +
                         (version == j.end() ? std::string("nothing") : version->dump()) +
                         " -- use the troupe version that wrote the file");

  TrainConfig c;
  const auto model_it = j.find("model");
  if (model_it == j.end())
    return Status::bad_input(
        "train config JSON: missing key \"model\" -- write the config again with "
        "`troupe train`");
  if (!model_it->is_object()) return type_error("model", "an object", *model_it);
  ObjectReader model_reader(*model_it, "model.");
  visit_model_fields(c.model, model_reader);
  if (version->get<int64_t>() >= 5) {
    visit_dropout_fields(c.model, model_reader);
  } else {
    c.model.hidden_dropout = 0;
    c.model.attention_dropout = 0;
  }
  if (version->get<int64_t>() >= 6) visit_family_fields(c.model, model_reader);
  if (version->get<int64_t>() >= 8) {
    const auto moe_it = model_it->find("moe");
    if (moe_it == model_it->end())
      return Status::bad_input(
          "train config JSON: missing key \"model.moe\" -- the file was written by another troupe version or edited; "
          "write it again with `troupe train`");
    if (!moe_it->is_object()) return type_error("model.moe", "an object", *moe_it);
    ObjectReader moe_reader(*moe_it, "model.moe.");
    visit_moe_fields(c.model.moe, moe_reader);
    TROUPE_RETURN_IF_ERROR(moe_reader.finish());
    TROUPE_RETURN_IF_ERROR(model_reader.finish({"moe"}));
  } else {
    TROUPE_RETURN_IF_ERROR(model_reader.finish());
  }

  if (version->get<int64_t>() >= 2) {
    const auto par_it = j.find("parallel");
    if (par_it == j.end())
      return Status::bad_input(
          "train config JSON: missing key \"parallel\" -- write the config again with `troupe "
          "train`");
    if (!par_it->is_object()) return type_error("parallel", "an object", *par_it);
    ObjectReader par_reader(*par_it, "parallel.");
    visit_parallel_fields(c, par_reader);
    if (version->get<int64_t>() >= 8) visit_expert_parallel_fields(c, par_reader);
    if (version->get<int64_t>() >= 9) visit_long_sequence_fields(c, par_reader);
    TROUPE_RETURN_IF_ERROR(par_reader.finish());
  }

  if (version->get<int64_t>() >= 3) {
    const auto rt_it = j.find("runtime");
    if (rt_it == j.end())
      return Status::bad_input(
          "train config JSON: missing key \"runtime\" -- write the config again with `troupe train`");
    if (!rt_it->is_object()) return type_error("runtime", "an object", *rt_it);
    ObjectReader rt_reader(*rt_it, "runtime.");
    visit_runtime_fields(c, rt_reader);
    TROUPE_RETURN_IF_ERROR(rt_reader.finish());
  }

  if (version->get<int64_t>() >= 4) {
    const auto sc_it = j.find("schedule");
    if (sc_it == j.end())
      return Status::bad_input(
          "train config JSON: missing key \"schedule\" -- write the config again with `troupe train`");
    if (!sc_it->is_object()) return type_error("schedule", "an object", *sc_it);
    ObjectReader sc_reader(*sc_it, "schedule.");
    visit_schedule_fields(c, sc_reader);
    if (version->get<int64_t>() >= 5) visit_rampup_fields(c, sc_reader);
    TROUPE_RETURN_IF_ERROR(sc_reader.finish());
  }

  if (version->get<int64_t>() >= 7) {
    const auto pr_it = j.find("precision");
    if (pr_it == j.end())
      return Status::bad_input(
          "train config JSON: missing key \"precision\" -- write the config again with `troupe train`");
    if (!pr_it->is_object()) return type_error("precision", "an object", *pr_it);
    ObjectReader pr_reader(*pr_it, "precision.");
    visit_precision_fields(c, pr_reader);
    TROUPE_RETURN_IF_ERROR(pr_reader.finish());
    PrecisionDType ignored = PrecisionDType::fp32;
    if (!c.precision.communication_data_type.empty() && !parse(c.precision.communication_data_type, ignored))
      return type_error("precision.communication_data_type", "\"\", \"fp32\", \"bf16\" or \"fp16\"",
                        *pr_it->find("communication_data_type"));
  }

  ObjectReader reader(j, "");
  visit_train_fields(c, reader);
  if (version->get<int64_t>() >= 4) visit_data_fields(c, reader);
  if (j.contains("tokenizer_model")) visit_tokenizer_fields(c, reader);
  if (j.contains("device")) visit_device_fields(c, reader);
  // Objects of later versions in an older file are unknown, not silently ignored.
  const int64_t v = version->get<int64_t>();
  if (v >= 7)
    TROUPE_RETURN_IF_ERROR(
        reader.finish({"format", "version", "model", "parallel", "runtime", "schedule", "precision"}));
  else if (v >= 4)
    TROUPE_RETURN_IF_ERROR(reader.finish({"format", "version", "model", "parallel", "runtime", "schedule"}));
  else if (v >= 3)
    TROUPE_RETURN_IF_ERROR(reader.finish({"format", "version", "model", "parallel", "runtime"}));
  else if (v == 2)
    TROUPE_RETURN_IF_ERROR(reader.finish({"format", "version", "model", "parallel"}));
  else
    TROUPE_RETURN_IF_ERROR(reader.finish({"format", "version", "model"}));
  return c;
}

TrainConfig::LrLengths TrainConfig::lr_lengths() const {
  // Megatron-LM's get_optimizer_param_scheduler (megatron/training/training.py): the scheduler
  // counts samples; an iteration-based run's lengths are its iterations times the global batch.
  LrLengths l;
  const double batch = global_batch_size;
  if (train_samples > 0) {
    l.decay_samples = static_cast<double>(lr_decay_samples > 0 ? lr_decay_samples : train_samples);
    l.warmup_samples = lr_warmup_fraction >= 0 ? lr_warmup_fraction * l.decay_samples
                                               : static_cast<double>(lr_warmup_samples);
  } else {
    l.decay_samples = static_cast<double>(lr_decay_iters > 0 ? lr_decay_iters : train_iters) * batch;
    l.warmup_samples = lr_warmup_fraction >= 0 ? lr_warmup_fraction * l.decay_samples
                                               : static_cast<double>(lr_warmup_iters) * batch;
  }
  // Megatron-DeepSpeed's OptimizerParamScheduler (megatron/optimizer_param_scheduler.py).
  if (lr_warmup_tokens >= 0) l.warmup_tokens = static_cast<double>(lr_warmup_tokens);
  if (lr_decay_tokens > 0) l.decay_tokens = static_cast<double>(lr_decay_tokens);
  return l;
}

int64_t TrainConfig::global_batch_at(int64_t consumed) const {
  if (!rampup() || consumed > rampup_samples) return global_batch_size;
  // Megatron's RampupBatchsizeNumMicroBatchesCalculator.update: steps = int(consumed /
  // (ramup_samples / num_increments)), in double as Python computes it. No increments (the start is
  // the global batch already): always the global batch.
  const int64_t increments =
      rampup_batch_increment > 0 ? (global_batch_size - rampup_start_batch) / rampup_batch_increment : 0;
  if (increments <= 0) return global_batch_size;
  const double per_increment = static_cast<double>(rampup_samples) / static_cast<double>(increments);
  const int64_t steps = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  return std::min<int64_t>(global_batch_size, rampup_start_batch + steps * rampup_batch_increment);
}

int64_t TrainConfig::samples_after(int64_t iterations) const {
  if (!rampup()) return iterations * global_batch_size;
  const int64_t increments =
      rampup_batch_increment > 0 ? (global_batch_size - rampup_start_batch) / rampup_batch_increment : 0;
  const double per_increment = increments > 0 ? static_cast<double>(rampup_samples) / static_cast<double>(increments) : 0;
  int64_t consumed = 0;
  for (int64_t k = 0; k < iterations;) {
    if (consumed > rampup_samples || increments <= 0) return consumed + (iterations - k) * int64_t{global_batch_size};
    // The batch stays b until consumed reaches the next increment's boundary (or passes the ramp):
    // take the iterations safely before it at once, then one at a time (the boundary is a double).
    const int64_t b = global_batch_at(consumed);
    const double steps = std::floor(static_cast<double>(consumed) / per_increment);
    const double boundary = std::min((steps + 1) * per_increment, static_cast<double>(rampup_samples) + 1);
    const int64_t bulk = std::max<int64_t>(
        0, std::min<int64_t>(iterations - k, static_cast<int64_t>((boundary - static_cast<double>(consumed)) / b) - 2));
    if (bulk > 0) {
      consumed += bulk * b;
      k += bulk;
    } else {
      consumed += b;
      ++k;
    }
  }
  return consumed;
}

int64_t TrainConfig::iterations_to_run() const {
  if (train_tokens <= 0) return train_iters;
  if (rampup()) {  // Megatron-DeepSpeed stops once consumed tokens reach train_tokens
    int64_t k = 0, consumed = 0;
    while ((train_iters <= 0 || k < train_iters) && consumed * model.seq_length < train_tokens &&
           consumed <= rampup_samples) {  // validation bounds the ramp's iterations
      consumed += global_batch_at(consumed);
      ++k;
    }
    if (consumed * model.seq_length < train_tokens) {  // past the ramp: whole global batches
      const int64_t per = int64_t{global_batch_size} * model.seq_length;
      k += (train_tokens - consumed * model.seq_length + per - 1) / per;
    }
    return train_iters > 0 ? std::min(train_iters, k) : k;
  }
  // Megatron-DeepSpeed's loop runs while consumed_train_tokens < train_tokens; each iteration
  // consumes global_batch_size x seq_length tokens.
  const int64_t per = int64_t{global_batch_size} * model.seq_length;
  const int64_t by_tokens = per > 0 ? (train_tokens + per - 1) / per : train_iters;
  return train_iters > 0 ? std::min(train_iters, by_tokens) : by_tokens;
}

int TrainConfig::resolved_dp(int world_size) const {
  if (data_parallel_size > 0) return data_parallel_size;
  const int mp = tensor_model_parallel_size * pipeline_model_parallel_size * sequence_ranks();
  return world_size > 1 && mp > 0 ? std::max(1, world_size / mp) : 1;
}

}  // namespace troupe
