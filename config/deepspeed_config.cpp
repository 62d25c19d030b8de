#include "config/deepspeed_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/spelling.hpp"
#include "config/deepspeed_keys.hpp"
#include "storage/json_input.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Origins = FlagOrigins;
using GivenFn = FlagGivenFn;

// a * b * c, or INT64_MAX when that overflows (the factors are >= 0).
int64_t saturating_product(int64_t a, int64_t b, int64_t c) {
  int64_t ab = 0, abc = 0;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) return INT64_MAX;
  return abc;
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

// -------------------------------------------------------------------------------------------------
// The DeepSpeed JSON file. What each key does in DeepSpeed, as verified in its source
// (deepspeed/runtime/config.py, engine.py, lr_schedules.py, ops/adam/fused_adam.py), and what
// troupe makes of it:
//
// * Batch: train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp,
//   where dp is DeepSpeed's data-parallel world size (world / (tp * pp) under Megatron-DeepSpeed's
//   mpu): here --data-parallel-size, or ranks / (tp * pp) when finalize_train_config is told the
//   ranks, else 1. DeepSpeed fills a missing one from the other two, or with one given: batch only
//   -> micro = batch / dp, gas = 1; micro only -> batch = micro * dp, gas = 1; all three must
//   agree. troupe does the same, except that --micro-batch-size can stand in for the missing micro.
// * optimizer, scheduler: ignored, with a note each. Megatron-DeepSpeed's pretrain_gpt.py builds
//   Megatron's optimizer and learning-rate scheduler from its flags and hands both to
//   deepspeed.initialize, and DeepSpeed's engine then uses the client's and builds neither block
//   (engine.py _configure_optimizer / _configure_lr_scheduler); troupe train is that program, so the
//   flags (or Megatron's defaults) decide. The keys DeepSpeed honours with a client optimizer stay:
//   batch sizes, precision, ZeRO, gradient_clipping, ...
// * gradient_clipping -> --clip-grad; steps_per_print -> --log-interval; wall_clock_breakdown:
//   DeepSpeed prints its forward/backward/step timers; troupe prints Megatron's timers at every log
//   interval, all of them (--timing-log-level 2) unless --timing-log-level is given.
// * "auto" (Hugging Face's Trainer fills it from its own arguments): the setting comes from
//   troupe's flags (or their defaults), never from DeepSpeed's default for a missing key; a note
//   says so.
// * zero_optimization (runtime/zero/config.py, unknown keys rejected there as here):
//     stage (default 0) -> --zero-stage: 1 partitions the optimizer state over the data-parallel
//       ranks, 2 also the gradients, 3 also the parameters. Results are those of stage 0.
//   Keys that only tune how DeepSpeed schedules memory and communication, never the numbers it
//   computes; troupe checks their types (DeepSpeed's: booleans, or element counts >= 0 that may be
//   written 5e8) and ignores them, because its ZeRO engine decides these things itself:
//     overlap_comm: run the gradient reduction concurrently with the backward pass.
//     contiguous_gradients: copy gradients into one contiguous buffer as they are produced, against
//       memory fragmentation.
//     reduce_scatter: average gradients with reduce / reduce-scatter instead of all-reduce.
//     allgather_partitions: gather the updated parameters with all-gather instead of a series of
//       broadcasts.
//     reduce_bucket_size, allgather_bucket_size: elements reduced / all-gathered per collective.
//     stage3_prefetch_bucket_size: elements of parameters fetched ahead of use (stage 3).
//     stage3_param_persistence_threshold: parameters smaller than this stay whole on every rank
//       (stage 3).
//     stage3_max_live_parameters: gathered parameters kept resident before release (stage 3).
//     stage3_max_reuse_distance: a parameter reused within this many parameters is not released
//       (stage 3).
//     stage3_gather_16bit_weights_on_model_save: consolidate the 16-bit weights into one state dict
//       when saving; troupe trains in fp32 and writes its own checkpoint format
//       (docs/CHECKPOINT.md) whatever this says.
//     round_robin_gradients: spread the gradient copies of CPU offload over the ranks (stage 1/2).
//   offload_optimizer: DeepSpeed moves the optimizer state to "device" ("cpu": ZeRO-Offload, host
//     memory; "nvme": ZeRO-Infinity, files under "nvme_path"; "none", the default) -> --offload-optimizer,
//     --offload-path. pin_memory, buffer_count, pipeline_read, pipeline_write and fast_init tune
//     DeepSpeed's swapper: checked and ignored (troupe's host pool is pinned where CUDA exists and its
//     swapper always reads ahead and writes back). ratio (partial offload) must be 1.
//   offload_param: DeepSpeed moves the parameters to "device". An absent or "none" device is
//     accepted; any other is an error, since parameter offload is not in this build yet.
// * fp16 / bf16: see merge_precision (the keys, DeepSpeed's defaults and which loss-scaling rules
//   follow); communication_data_type: merge_communication_type.
// * data_types (merge_data_types), compression_training (refused whenever present:
//   merge_compression), data_efficiency (accepted with every inner feature off:
//   merge_data_efficiency).
// Keys that change nothing in troupe (config/deepspeed_keys.cpp: the tuning knobs, fp16's
// loss-scale settings with fp16 off, profilers and loggers that only print) are accepted with one
// start-up note each saying why. A key DeepSpeed knows but troupe does not (or a typo) is an error:
// silently ignoring it would train something other than what the file asks for. Every problem of
// the file is reported at once (each unknown key with its nearest accepted spelling).
// -------------------------------------------------------------------------------------------------
class DeepSpeedMerger {
 public:
  // dp: the data-parallel size DeepSpeed's batch rule multiplies by (>= 1).
  DeepSpeedMerger(GivenFn given, std::string file, TrainConfig* cfg, Origins* origins, int dp)
      : given_(std::move(given)), file_(std::move(file)), cfg_(cfg), origins_(origins), dp_(dp) {}

  // Every problem of the file in one message (one alone: that message), or ok.
  Status merge() {
    json top;
    TROUPE_RETURN_IF_ERROR(read_file(&top));
    if (!top.is_object())
      return Status::bad_input("--deepspeed-config " + file_ +
                           " must hold a JSON object ({...}), got " + top.type_name() +
                           " -- write the DeepSpeed settings as one object");
    // Each part reports its problems into problems_ and stops at the first it cannot go past;
    // the other parts still run, so that one run lists everything to fix.
    (void)check_keys(
        top, "",
        {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
         "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "zero_optimization", "fp16", "bf16",
         "tensorboard", "communication_data_type", "data_types", "compression_training", "data_efficiency"});
    (void)merge_precision(top);
    (void)merge_communication_type(top);
    (void)merge_zero(top);
    (void)merge_switched_blocks(top);
    merge_tensorboard(top);
    (void)merge_wall_clock(top);
    (void)merge_batch(top);
    std::optional<double> clip;
    (void)get_number(top, "", "gradient_clipping", &clip);
    if (clip) apply("--clip-grad", &cfg_->clip_grad, *clip, "gradient_clipping");
    std::optional<int64_t> steps_per_print;
    (void)get_integer(top, "", "steps_per_print", &steps_per_print, 1);
    if (steps_per_print)
      apply("--log-interval", &cfg_->log_interval, *steps_per_print, "steps_per_print");
    (void)merge_data_types(top);
    (void)merge_compression(top);
    (void)merge_data_efficiency(top);
    ignore_client_blocks(top);
    if (problems_.empty()) return Status::ok();
    if (problems_.size() == 1) return Status::bad_input(problems_[0]);
    std::string message = fmt::format("--deepspeed-config {} has {} problems:", file_, problems_.size());
    for (const std::string& p : problems_) message += "\n  - " + p;
    return Status::bad_input(message);
  }

  const std::vector<std::string>& notes() const { return notes_; }

  // Whether the file decided the global batch size (so the derived default must not overwrite it).
  bool set_global_batch() const { return set_global_batch_; }

 private:
  static std::string path_of(const std::string& prefix, const std::string& key) {
    return prefix.empty() ? key : prefix + "." + key;
  }

  // Records a problem of the file (merge() reports them all) and returns it, for the part that
  // cannot go on.
  Status error(const std::string& path, const std::string& what, const std::string& fix) {
    problems_.push_back("--deepspeed-config " + file_ + ": \"" + path + "\" " + what + " -- " + fix);
    return Status::bad_input(problems_.back());
  }

  void note(const std::string& path, const std::string& text) {
    notes_.push_back("\"" + path + "\" in " + file_ + ": " + text);
  }

  // "auto" (Hugging Face's Trainer's placeholder): the flag's value stands; noted once per key.
  bool is_auto(const json& parent, const std::string& prefix, const char* key) {
    const auto it = parent.find(key);
    if (it == parent.end() || !it->is_string() || it->get<std::string>() != "auto") return false;
    const std::string path = path_of(prefix, key);
    if (autos_.insert(path).second)
      note(path, "\"auto\" -- troupe's flag (or its default) decides, as Hugging Face's Trainer "
                 "fills \"auto\" from its own arguments");
    return true;
  }
  bool was_auto(const std::string& path) const { return autos_.count(path) > 0; }

  Status read_file(json* out) const {
    std::error_code ec;
    if (!fs::exists(file_, ec))
      return Status::bad_input("--deepspeed-config " + file_ +
                           ": no such file -- check the path, or drop --deepspeed-config");
    if (!fs::is_regular_file(file_, ec))
      return Status::bad_input("--deepspeed-config " + file_ +
                           " is not a regular file -- pass the DeepSpeed JSON file itself");
    std::ifstream in(file_, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in.good() && !in.eof())
      return Status::bad_input("--deepspeed-config " + file_ +
                           ": cannot be read -- check its permissions");

    // DeepSpeed rejects a key repeated in one object (dict_raise_error_on_duplicate_keys); so do
    // we. A syntax error, a number out of a double's range (1e400) or a nesting too deep is
    // reported by the parser with the byte or key path.
    JsonParseOptions options;
    options.reject_duplicate_keys = true;
    auto parsed = parse_json(text.str(), "--deepspeed-config " + file_, options);
    if (!parsed)
      return Status::bad_input(parsed.status().message() +
                           " -- fix the file there (each key once, numbers within range)");
    *out = std::move(parsed).value();
    return Status::ok();
  }

  // Every key of `object` must be accepted here, or harmless (config/deepspeed_keys.hpp: noted and
  // its value checked), or a switched-off block; each other key is a problem naming the nearest
  // accepted spelling. Returns ok: the caller goes on with the keys it knows.
  Status check_keys(const json& object, const std::string& prefix, const std::vector<std::string>& accepted) {
    std::vector<std::string> known = accepted;
    for (const DsHarmlessKey& h : deepspeed_harmless_keys())
      if (h.block == prefix) known.push_back(h.key);
    if (prefix.empty())
      for (const DsSwitchedBlock& b : deepspeed_switched_blocks()) known.push_back(b.key);
    for (const auto& item : object.items()) {
      if (std::find(accepted.begin(), accepted.end(), item.key()) != accepted.end()) continue;
      if (prefix.empty() && is_switched_block(item.key())) continue;  // merge_switched_blocks
      if (const DsHarmlessKey* h = harmless(prefix, item.key())) {
        check_harmless(*h, item.value());
        continue;
      }
      const std::vector<std::string> near = nearest_spellings(item.key(), known, 1, 1);
      const std::string where = prefix.empty() ? std::string("at the top level") : "in \"" + prefix + "\"";
      if (!near.empty()) {
        (void)error(path_of(prefix, item.key()), "is not a key troupe understands " + where,
                    "did you mean \"" + near[0] + "\"? (docs/COMPAT.md lists the DeepSpeed keys troupe reads)");
      } else {
        (void)error(path_of(prefix, item.key()),
                    "is not a key troupe understands; accepted keys " + where + ": " + join_keys(known),
                    "remove it (troupe implements only these DeepSpeed settings) or fix its spelling");
      }
    }
    return Status::ok();
  }

  static const DsHarmlessKey* harmless(const std::string& block, const std::string& key) {
    for (const DsHarmlessKey& h : deepspeed_harmless_keys())
      if (h.block == block && h.key == key) return &h;
    return nullptr;
  }
  static bool is_switched_block(const std::string& key) {
    for (const DsSwitchedBlock& b : deepspeed_switched_blocks())
      if (b.key == key) return true;
    return false;
  }

  // A refusal text of config/deepspeed_keys.cpp, "why -- fix", as error()'s two parts.
  Status refuse(const std::string& path, const std::string& value_text, const std::string& why_refused,
                const std::string& default_fix) {
    const size_t cut = why_refused.find(" -- ");
    return error(path, value_text + ": " + why_refused.substr(0, cut),
                 cut == std::string::npos ? default_fix : why_refused.substr(cut + 4));
  }

  // A harmless key: its value as DeepSpeed types it, then a note (or, for a value that would
  // change the results, a problem).
  void check_harmless(const DsHarmlessKey& h, const json& v) {
    const std::string path = path_of(h.block, h.key);
    const bool is_auto_value = v.is_string() && v.get<std::string>() == "auto";
    const bool whole = v.is_number() && v.get<double>() >= 0 && std::floor(v.get<double>()) == v.get<double>();
    switch (h.value) {
      case DsValue::boolean:
        if (!v.is_boolean()) return (void)error(path, "must be true or false, got " + json_excerpt(v), "write true or false (no quotes)");
        break;
      case DsValue::count:
        if (!whole && !is_auto_value)
          return (void)error(path, "must be a number of elements, got " + json_excerpt(v), "write a whole number >= 0, e.g. 5e8");
        break;
      case DsValue::number:
        if (!v.is_number() && !is_auto_value) return (void)error(path, "must be a number, got " + json_excerpt(v), "write a number");
        break;
      case DsValue::string:
        if (!v.is_string() && !v.is_null()) return (void)error(path, "must be a string, got " + json_excerpt(v), "write it in quotes");
        if (v.is_string() && h.key.find("data_type") != std::string::npos && lower(v.get<std::string>()) != "fp32" &&
            lower(v.get<std::string>()) != "float32" && !is_auto_value)
          return (void)error(path, "is " + json_excerpt(v) + ", but troupe computes and communicates in float32",
                             "set \"fp32\" or remove it");
        break;
      case DsValue::object:
        if (!v.is_object()) return (void)error(path, "must be an object, got " + json_excerpt(v), "write it as {...}");
        break;
      case DsValue::false_only:
        if (!v.is_boolean()) return (void)error(path, "must be true or false, got " + json_excerpt(v), "write true or false (no quotes)");
        if (v.get<bool>()) return (void)refuse(path, "is true", h.why_refused, "remove it");
        note(path, "false: no effect");
        return;
      case DsValue::minus_one_only:
        if (!v.is_number() || v.get<double>() != -1)
          return (void)refuse(path, "is " + json_excerpt(v), h.why_refused, "remove it");
        note(path, "-1: no effect");
        return;
    }
    note(path, "no effect -- " + h.why);
  }

  // The blocks harmless while switched off (config/deepspeed_keys.hpp).
  Status merge_switched_blocks(const json& top) {
    for (const DsSwitchedBlock& b : deepspeed_switched_blocks()) {
      const auto it = top.find(b.key);
      if (it == top.end()) continue;
      if (!it->is_object()) {
        (void)error(b.key, "must be an object, got " + json_excerpt(*it), "write it as {...}");
        continue;
      }
      const auto enabled = it->find("enabled");
      if (enabled != it->end() && !enabled->is_boolean()) {
        (void)error(b.key + ".enabled", "must be true or false, got " + json_excerpt(*enabled),
                    "write true or false (no quotes)");
        continue;
      }
      if (enabled != it->end() && enabled->get<bool>()) {
        (void)refuse(b.key + ".enabled", "is true", b.why_refused, "set it to false");
        continue;
      }
      note(b.key, "switched off: no effect");
    }
    return Status::ok();
  }

  // DeepSpeed's TensorBoard monitor (deepspeed/monitor/tensorboard.py): events in
  // output_path/job_name (defaults "" and "DeepSpeedJobName"), troupe's --tensorboard-dir.
  void merge_tensorboard(const json& top) {
    const json* block = nullptr;
    (void)get_object(top, "", "tensorboard", &block);
    if (!block) return;
    (void)check_keys(*block, "tensorboard", {"enabled", "output_path", "job_name"});
    std::optional<bool> enabled;
    (void)get_bool(*block, "tensorboard", "enabled", &enabled);
    if (!enabled.value_or(false)) {
      note("tensorboard", "switched off: no effect");
      return;
    }
    std::optional<std::string> output_path, job_name;
    (void)get_string(*block, "tensorboard", "output_path", &output_path);
    (void)get_string(*block, "tensorboard", "job_name", &job_name);
    const std::string dir =
        (fs::path(output_path.value_or("")) / job_name.value_or("DeepSpeedJobName")).string();
    apply("--tensorboard-dir", &cfg_->tensorboard.dir, dir, "tensorboard.output_path/job_name");
  }

  // wall_clock_breakdown: Megatron's timers at every log interval, every level of them unless
  // --timing-log-level says otherwise.
  Status merge_wall_clock(const json& top) {
    std::optional<bool> breakdown;
    TROUPE_RETURN_IF_ERROR(get_bool(top, "", "wall_clock_breakdown", &breakdown));
    if (breakdown && *breakdown) apply("--timing-log-level", &cfg_->timing_log_level, 2, "wall_clock_breakdown");
    return Status::ok();
  }

  // The getters leave *out empty when the key is absent or "auto" (is_auto), and also when its value
  // is of the wrong kind, which they record as a problem and then return ok: the part goes on
  // without it, so that the file's other problems are found too.
  Status get_object(const json& parent, const std::string& prefix, const char* key,
                    const json** out) {
    *out = nullptr;
    const auto it = parent.find(key);
    if (it == parent.end()) return Status::ok();
    if (!it->is_object()) {
      (void)error(path_of(prefix, key), std::string("must be an object, got ") + json_excerpt(*it),
                  "write it as {...}");
      return Status::ok();
    }
    *out = &*it;
    return Status::ok();
  }

  // Any number (JSON numbers are finite once parsed); validation checks the settings' ranges and
  // names the key through the origins.
  Status get_number(const json& parent, const std::string& prefix, const char* key,
                    std::optional<double>* out) {
    const auto it = parent.find(key);
    if (it == parent.end() || is_auto(parent, prefix, key)) return Status::ok();
    if (!it->is_number()) {
      (void)error(path_of(prefix, key), "must be a number, got " + json_excerpt(*it), "write a number");
      return Status::ok();
    }
    *out = it->get<double>();
    return Status::ok();
  }

  // An integer in [min, max]; every integer DeepSpeed setting troupe maps lands in an int flag.
  Status get_integer(const json& parent, const std::string& prefix, const char* key,
                     std::optional<int64_t>* out, int64_t min = INT_MIN,
                     int64_t max = INT_MAX) {
    const auto it = parent.find(key);
    if (it == parent.end() || is_auto(parent, prefix, key)) return Status::ok();
    int64_t v = 0;
    if (Status st = json_to_integer(*it, min, max, &v); !st) {
      // 0 or negative (nlohmann stores 0 as unsigned, every negative integer as signed)
      if (min == 1 &&
          (it->is_number_unsigned() ? it->get<uint64_t>() == 0 : it->is_number_integer()))
        (void)error(path_of(prefix, key),
                    "must be positive, got " + json_excerpt(*it) +
                        " (allowed: " + range_text(min, max) + ")",
                    "write a positive integer");
      else
        (void)error(path_of(prefix, key), st.message(),
                    "write a whole number in that range, without a decimal point");
      return Status::ok();
    }
    *out = v;
    return Status::ok();
  }

  Status get_positive_integer(const json& parent, const std::string& prefix, const char* key,
                              std::optional<int64_t>* out) {
    return get_integer(parent, prefix, key, out, 1, INT_MAX);
  }

  Status get_bool(const json& parent, const std::string& prefix, const char* key,
                  std::optional<bool>* out) {
    const auto it = parent.find(key);
    if (it == parent.end() || is_auto(parent, prefix, key)) return Status::ok();
    if (!it->is_boolean()) {
      (void)error(path_of(prefix, key), "must be true or false, got " + json_excerpt(*it),
                  "write true or false (no quotes)");
      return Status::ok();
    }
    *out = it->get<bool>();
    return Status::ok();
  }

  Status get_string(const json& parent, const std::string& prefix, const char* key,
                    std::optional<std::string>* out) {
    const auto it = parent.find(key);
    if (it == parent.end() || is_auto(parent, prefix, key)) return Status::ok();
    if (!it->is_string()) {
      (void)error(path_of(prefix, key), "must be a string, got " + json_excerpt(*it),
                  "write it in quotes");
      return Status::ok();
    }
    *out = it->get<std::string>();
    return Status::ok();
  }

  // Sets a field from the file unless its flag was given on the command line.
  template <class T, class V>
  void apply(const char* flag, T* field, V value, const std::string& key) {
    if (given_(flag)) return;
    *field = static_cast<T>(value);
    (*origins_)[flag] = "\"" + key + "\" in " + file_;
  }

  // fp16 / bf16 (deepspeed/runtime/config.py: get_fp16_enabled, get_bfloat16_enabled, get_loss_scale,
  // get_initial_dynamic_scale, get_dynamic_loss_scale_args; the defaults in runtime/constants.py
  // FP16_*_DEFAULT and BFLOAT16_*_DEFAULT). An enabled block makes the run 16-bit with DeepSpeed's
  // loss-scaling rules (PrecisionConfig::recipe deepspeed, include/troupe/precision.hpp), each
  // setting under the flag given on the command line. A switched-off block's keys change nothing
  // (noted, their types checked). Both enabled, or the block beside the other type's flag: a problem.
  Status merge_precision(const json& top) {
    static const std::vector<std::string> fp16_keys = {
        "enabled",        "loss_scale",     "initial_scale_power", "loss_scale_window",
        "hysteresis",     "consecutive_hysteresis", "min_loss_scale", "auto_cast",
        "fp16_master_weights_and_grads"};
    static const std::vector<std::string> bf16_keys = {"enabled", "immediate_grad_update", "check_grad_overflow"};
    static const std::set<std::string> bool_keys = {"enabled", "consecutive_hysteresis", "auto_cast",
                                                    "fp16_master_weights_and_grads", "immediate_grad_update",
                                                    "check_grad_overflow"};
    const json* blocks[2] = {nullptr, nullptr};
    std::optional<bool> on[2];
    const char* names[2] = {"fp16", "bf16"};
    for (int i = 0; i < 2; ++i) {
      TROUPE_RETURN_IF_ERROR(get_object(top, "", names[i], &blocks[i]));
      if (!blocks[i]) continue;
      TROUPE_RETURN_IF_ERROR(check_keys(*blocks[i], names[i], i == 0 ? fp16_keys : bf16_keys));
      TROUPE_RETURN_IF_ERROR(get_bool(*blocks[i], names[i], "enabled", &on[i]));
    }
    const bool fp16 = on[0].value_or(false), bf16 = on[1].value_or(false);
    // A switched-off block: its settings are checked as DeepSpeed types them, and noted.
    for (int i = 0; i < 2; ++i) {
      if (!blocks[i] || on[i].value_or(false)) continue;
      for (const auto& item : blocks[i]->items()) {
        const std::string& k = item.key();
        if (k == "enabled") continue;
        if (std::find(fp16_keys.begin(), fp16_keys.end(), k) == fp16_keys.end() &&
            std::find(bf16_keys.begin(), bf16_keys.end(), k) == bf16_keys.end())
          continue;  // check_keys reported it
        const size_t before = problems_.size();
        if (bool_keys.count(k)) {
          std::optional<bool> ignored;
          (void)get_bool(*blocks[i], names[i], k.c_str(), &ignored);
        } else {
          std::optional<double> ignored;
          (void)get_number(*blocks[i], names[i], k.c_str(), &ignored);
        }
        if (problems_.size() == before)
          note(path_of(names[i], k), std::string("no effect -- \"") + names[i] + "\" is not enabled");
      }
    }
    if (fp16 && bf16)
      return error("fp16.enabled", "and \"bf16.enabled\" are both true",
                   "enable one of them: a run computes in one 16-bit type (DeepSpeed refuses both too)");
    if (!fp16 && !bf16) return Status::ok();
    const std::string key = fp16 ? "fp16" : "bf16";
    const char* flag = fp16 ? "--fp16" : "--bf16";
    const char* other = fp16 ? "--bf16" : "--fp16";
    if (given_(other))
      return error(key + ".enabled", std::string("is true, but ") + other + " is given: the file asks for " + key +
                                         ", the command line for " + (fp16 ? "bf16" : "fp16"),
                   std::string("drop ") + other + " or set \"" + key + ".enabled\": false");
    PrecisionConfig& p = cfg_->precision;
    p.recipe = PrecisionRecipe::deepspeed;
    p.dtype = fp16 ? PrecisionDType::fp16 : PrecisionDType::bf16;
    if (!given_(flag)) (*origins_)[flag] = "\"" + key + ".enabled\" in " + file_;
    const json& block = *blocks[fp16 ? 0 : 1];
    if (bf16) {
      std::optional<bool> immediate, check;
      TROUPE_RETURN_IF_ERROR(get_bool(block, key, "immediate_grad_update", &immediate));
      TROUPE_RETURN_IF_ERROR(get_bool(block, key, "check_grad_overflow", &check));
      p.bf16_immediate_grad_update = immediate.value_or(false);
      p.bf16_check_grad_overflow = check.value_or(false);
      return Status::ok();
    }
    std::optional<bool> auto_cast, master16, consecutive;
    TROUPE_RETURN_IF_ERROR(get_bool(block, key, "auto_cast", &auto_cast));
    TROUPE_RETURN_IF_ERROR(get_bool(block, key, "fp16_master_weights_and_grads", &master16));
    if (auto_cast.value_or(false))
      (void)error("fp16.auto_cast", "is true: DeepSpeed then casts the module's inputs to fp16 itself",
                  "set it to false or remove it: troupe's 16-bit engine casts its own activations");
    if (master16.value_or(false))
      (void)error("fp16.fp16_master_weights_and_grads",
                  "is true: DeepSpeed then keeps the master weights and gradients in fp16 (with CPU offload)",
                  "set it to false or remove it: troupe's master weights and checkpoints are fp32");
    // DeepSpeed applies its FP16_*_DEFAULT values only when the block names one of the dynamic
    // settings; otherwise its ZeRO loss scaler keeps its own defaults (include/troupe/precision.hpp).
    bool named_any = false;
    for (const char* k : {"initial_scale_power", "loss_scale_window", "min_loss_scale", "hysteresis",
                          "consecutive_hysteresis"})
      named_any = named_any || block.contains(k);
    const PrecisionConfig d = deepspeed_fp16_defaults(named_any);
    const std::string why_default =
        named_any ? " (DeepSpeed's default)" : " (DeepSpeed's ZeRO loss scaler's default: the block names no dynamic setting)";
    auto origin = [&](const char* k, bool present) { return key + "." + k + (present ? "" : why_default); };
    std::optional<double> loss_scale, power, min_scale;
    std::optional<int64_t> window, hysteresis;
    TROUPE_RETURN_IF_ERROR(get_number(block, key, "loss_scale", &loss_scale));
    TROUPE_RETURN_IF_ERROR(get_number(block, key, "initial_scale_power", &power));
    TROUPE_RETURN_IF_ERROR(get_number(block, key, "min_loss_scale", &min_scale));
    TROUPE_RETURN_IF_ERROR(get_positive_integer(block, key, "loss_scale_window", &window));
    TROUPE_RETURN_IF_ERROR(get_positive_integer(block, key, "hysteresis", &hysteresis));
    TROUPE_RETURN_IF_ERROR(get_bool(block, key, "consecutive_hysteresis", &consecutive));
    if (power && !(*power >= -1074 && *power <= 1023))
      return error("fp16.initial_scale_power", fmt::format("is {}: 2 to that power is not a positive double", *power),
                   "give the exponent of the initial scale, e.g. 16 for 65536");
    if (!was_auto("fp16.loss_scale"))
      apply("--loss-scale", &p.loss_scale, loss_scale.value_or(d.loss_scale), origin("loss_scale", loss_scale.has_value()));
    if (!was_auto("fp16.initial_scale_power"))
      apply("--initial-loss-scale", &p.initial_loss_scale, power ? std::pow(2.0, *power) : d.initial_loss_scale,
            origin("initial_scale_power", power.has_value()));  // DeepSpeed's 2 ** power
    if (!was_auto("fp16.min_loss_scale"))
      apply("--min-loss-scale", &p.min_loss_scale, min_scale.value_or(d.min_loss_scale),
            origin("min_loss_scale", min_scale.has_value()));
    if (!was_auto("fp16.loss_scale_window"))
      apply("--loss-scale-window", &p.loss_scale_window, window.value_or(d.loss_scale_window),
            origin("loss_scale_window", window.has_value()));
    if (!was_auto("fp16.hysteresis"))
      apply("--hysteresis", &p.hysteresis, hysteresis.value_or(d.hysteresis), origin("hysteresis", hysteresis.has_value()));
    p.consecutive_hysteresis = consecutive.value_or(d.consecutive_hysteresis);
    return Status::ok();
  }

  // "communication_data_type" (runtime/config.py get_communication_data_type; engine.py
  // communication_data_type): the type of the gradient all-reduce, "fp16", "bf16" or "fp32"
  // (lower-cased; default: the model's type). Kept with a 16-bit block (PrecisionConfig::
  // grad_reduce_dtype); a float32 run communicates in float32, so only "fp32" is harmless there.
  Status merge_communication_type(const json& top) {
    const auto it = top.find("communication_data_type");
    if (it == top.end() || it->is_null() || is_auto(top, "", "communication_data_type")) return Status::ok();
    if (!it->is_string())
      return error("communication_data_type", "must be a string, got " + json_excerpt(*it), "write it in quotes");
    const std::string v = lower(it->get<std::string>());
    if (v != "fp16" && v != "bf16" && v != "fp32")
      return error("communication_data_type", "is " + json_excerpt(*it) + "; DeepSpeed knows fp16, bf16 and fp32",
                   "set one of them or remove it");
    if (cfg_->precision.recipe != PrecisionRecipe::deepspeed) {
      if (v != "fp32")
        return error("communication_data_type",
                     "is " + json_excerpt(*it) + ", but this run computes and communicates in float32 (no fp16 or "
                     "bf16 block is enabled)",
                     "set \"fp32\", remove it, or enable the \"fp16\" / \"bf16\" block");
      note("communication_data_type", "\"fp32\": no effect -- a float32 run communicates in float32");
      return Status::ok();
    }
    cfg_->precision.communication_data_type = v;
    return Status::ok();
  }

  Status merge_zero(const json& top) {
    const json* block = nullptr;
    TROUPE_RETURN_IF_ERROR(get_object(top, "", "zero_optimization", &block));
    if (!block) return Status::ok();
    const std::string z = "zero_optimization";
    // The tuning keys are config/deepspeed_keys.cpp's (check_keys notes them).
    TROUPE_RETURN_IF_ERROR(check_keys(*block, z, {"stage", "offload_optimizer", "offload_param", "cpu_offload"}));
    TROUPE_RETURN_IF_ERROR(merge_offload_optimizer(*block));
    TROUPE_RETURN_IF_ERROR(
        check_offload(*block, "offload_param", "the parameters", "parameter offload"));
    // DeepSpeed's older spelling of offload_optimizer {"device": "cpu"}.
    std::optional<bool> cpu_offload;
    TROUPE_RETURN_IF_ERROR(get_bool(*block, z, "cpu_offload", &cpu_offload));
    if (cpu_offload && *cpu_offload && !block->contains("offload_optimizer"))
      apply("--offload-optimizer", &cfg_->offload_optimizer, std::string("cpu"), "zero_optimization.cpu_offload");

    std::optional<int64_t> stage;
    TROUPE_RETURN_IF_ERROR(get_integer(*block, z, "stage", &stage, INT64_MIN, INT64_MAX));
    if (!stage) return Status::ok();
    if (*stage < 0 || *stage > 3)
      return error("zero_optimization.stage",
                   "is " + std::to_string(*stage) + "; ZeRO stages are 0 to 3",
                   "set 0 (off), 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters)");
    apply("--zero-stage", &cfg_->zero_stage, *stage, "zero_optimization.stage");
    return Status::ok();
  }

  // zero_optimization.offload_optimizer (DeepSpeed's DeepSpeedZeroOffloadOptimizerConfig): device
  // and nvme_path set --offload-optimizer / --offload-path; the tuning keys are checked and left to
  // troupe's own engine; a partial offload (ratio < 1) is not available.
  Status merge_offload_optimizer(const json& zero) {
    const json* block = nullptr;
    const std::string z = "zero_optimization";
    const std::string path = path_of(z, "offload_optimizer");
    TROUPE_RETURN_IF_ERROR(get_object(zero, z, "offload_optimizer", &block));
    if (!block) return Status::ok();
    TROUPE_RETURN_IF_ERROR(check_keys(*block, path,
                                      {"device", "nvme_path", "pin_memory", "buffer_count", "pipeline_read",
                                       "pipeline_write", "fast_init", "ratio"}));
    for (const char* key : {"pin_memory", "pipeline_read", "pipeline_write", "fast_init"}) {
      std::optional<bool> ignored;
      TROUPE_RETURN_IF_ERROR(get_bool(*block, path, key, &ignored));
    }
    std::optional<int64_t> buffers;
    TROUPE_RETURN_IF_ERROR(get_integer(*block, path, "buffer_count", &buffers, 1));
    std::optional<double> ratio;
    TROUPE_RETURN_IF_ERROR(get_number(*block, path, "ratio", &ratio));
    if (ratio && !(*ratio >= 0 && *ratio <= 1))
      return error(path_of(path, "ratio"), fmt::format("is {}; DeepSpeed takes a share from 0 to 1", *ratio),
                   "remove \"ratio\" (or set 1.0): the whole optimizer state is offloaded");
    if (ratio && *ratio != 1.0)
      return error(path_of(path, "ratio"),
                   fmt::format("is {}: a partial optimizer offload (DeepSpeed's ZeRO-3 keeps the first {:.0f}% of the "
                               "optimizer's sub-groups on the GPU and offloads the rest) is not in troupe",
                               *ratio, 100 * (1 - *ratio)),
                   "remove \"ratio\" (or set 1.0): the whole optimizer state is offloaded");
    std::optional<std::string> device, nvme_path;
    TROUPE_RETURN_IF_ERROR(get_string(*block, path, "device", &device));
    TROUPE_RETURN_IF_ERROR(get_string(*block, path, "nvme_path", &nvme_path));
    if (device) {
      if (*device != "none" && *device != "cpu" && *device != "nvme")
        return error(path_of(path, "device"), "is \"" + *device + "\"", "use \"cpu\", \"nvme\" or \"none\"");
      apply("--offload-optimizer", &cfg_->offload_optimizer, *device, path_of(path, "device"));
    }
    // DeepSpeed reads nvme_path only with device nvme.
    if (nvme_path && cfg_->offload_optimizer == "nvme")
      apply("--offload-path", &cfg_->offload_path, *nvme_path, path_of(path, "nvme_path"));
    return Status::ok();
  }

  // DeepSpeed's offload blocks: a device other than "none" asks for something this build lacks.
  Status check_offload(const json& zero, const char* key, const char* what,
                       const char* feature) {
    const json* block = nullptr;
    const std::string z = "zero_optimization";
    TROUPE_RETURN_IF_ERROR(get_object(zero, z, key, &block));
    if (!block) return Status::ok();
    std::optional<std::string> device;
    TROUPE_RETURN_IF_ERROR(get_string(*block, path_of(z, key), "device", &device));
    if (!device || *device == "none") return Status::ok();  // DeepSpeed's default: no offload
    return error(path_of(z, key),
                 "asks to offload " + std::string(what) + " to \"" + *device + "\", but " +
                     feature + " is not in this build of troupe yet",
                 "remove the \"" + std::string(key) +
                     "\" block from \"zero_optimization\" (or set its "
                     "\"device\" to \"none\"); everything then stays in memory");
  }

  Status merge_batch(const json& top) {
    std::optional<int64_t> batch, micro, gas;
    TROUPE_RETURN_IF_ERROR(get_positive_integer(top, "", "train_batch_size", &batch));
    TROUPE_RETURN_IF_ERROR(get_positive_integer(top, "", "train_micro_batch_size_per_gpu", &micro));
    TROUPE_RETURN_IF_ERROR(get_positive_integer(top, "", "gradient_accumulation_steps", &gas));
    const int64_t dp = dp_;
    const std::string dp_fix = dp > 1 ? fmt::format(" (data-parallel size {})", dp) : std::string();
    if (batch && micro && gas && *batch != saturating_product(*micro, *gas, dp))
      return error(
          "train_batch_size",
          fmt::format("is {}, but train_micro_batch_size_per_gpu * gradient_accumulation_steps "
                      "* data-parallel size is {} * {} * {} = {}",
                      *batch, *micro, *gas, dp,
                      saturating_product(*micro, *gas, dp) == INT64_MAX
                          ? std::string("more than 2^63")
                          : std::to_string(saturating_product(*micro, *gas, dp))),
          "make the three agree, or give only two of them and let the third follow");
    if (batch && gas && !micro && *batch % (*gas * dp) != 0)
      return error("train_batch_size",
                   dp > 1 ? fmt::format("{} is not divisible by gradient_accumulation_steps {} x "
                                        "data-parallel size {} = {}",
                                        *batch, *gas, dp, *gas * dp)
                          : fmt::format("{} is not divisible by gradient_accumulation_steps {}",
                                        *batch, *gas),
                   "make train_batch_size a multiple of gradient_accumulation_steps" + dp_fix);
    if (batch && !gas && !micro && *batch % dp != 0)
      return error("train_batch_size",
                   fmt::format("{} is not divisible by the data-parallel size {}", *batch, dp),
                   "make train_batch_size a multiple of the data-parallel size");

    if (micro) {
      apply("--micro-batch-size", &cfg_->micro_batch_size, *micro,
            "train_micro_batch_size_per_gpu");
    } else if (batch && gas) {
      apply("--micro-batch-size", &cfg_->micro_batch_size, *batch / (*gas * dp),
            "train_batch_size / gradient_accumulation_steps" +
                std::string(dp > 1 ? " / data-parallel size" : ""));
    } else if (batch) {  // DeepSpeed: train_batch_size alone means micro = batch / dp, gas = 1
      apply("--micro-batch-size", &cfg_->micro_batch_size, *batch / dp,
            dp > 1 ? "train_batch_size / data-parallel size" : "train_batch_size");
    }
    if (given_("--global-batch-size")) return Status::ok();
    if (batch) {
      apply("--global-batch-size", &cfg_->global_batch_size, *batch, "train_batch_size");
      set_global_batch_ = true;
    } else if (gas) {
      const int64_t global = saturating_product(cfg_->micro_batch_size, *gas, dp);
      if (global > INT_MAX)
        return error(
            "gradient_accumulation_steps",
            fmt::format("{} times the micro batch size {}{} overflows the global batch size", *gas,
                        cfg_->micro_batch_size,
                        dp > 1 ? fmt::format(" times the data-parallel size {}", dp) : ""),
            "use fewer accumulation steps");
      apply("--global-batch-size", &cfg_->global_batch_size, global, "gradient_accumulation_steps");
      set_global_batch_ = true;
    }
    return Status::ok();
  }

  // "optimizer" and "scheduler": Megatron-DeepSpeed's pretrain_gpt.py builds Megatron's optimizer
  // (get_megatron_optimizer: Adam from --lr, --adam-beta1/2, --adam-eps, --weight-decay) and its
  // learning-rate scheduler (get_optimizer_param_scheduler: --lr-decay-style, --lr-warmup-*, ...) and
  // passes both to deepspeed.initialize (megatron/training.py setup_model_and_optimizer), so
  // DeepSpeed's engine uses them and never builds the file's (engine.py _configure_optimizer and
  // _configure_lr_scheduler take the client's when given; its check that rejects
  // "optimizer.params.max_grad_norm" runs only for an optimizer it builds). troupe train is that
  // program: the flags (or Megatron's defaults) decide, and a note names each ignored block. The
  // blocks are still checked to be objects, as DeepSpeed's config parser reads them.
  void ignore_client_blocks(const json& top) {
    const std::pair<const char*, const char*> blocks[] = {
        {"optimizer",
         "Megatron-DeepSpeed passes its own optimizer to deepspeed.initialize (Megatron's Adam from --lr, "
         "--adam-beta1, "
         "--adam-beta2, --adam-eps, --weight-decay), so DeepSpeed never builds this one; troupe trains with those "
         "flags "
         "(or Megatron's defaults) as pretrain_gpt.py does"},
        {"scheduler",
         "Megatron-DeepSpeed passes its own learning-rate scheduler to deepspeed.initialize (--lr-decay-style, "
         "--lr-warmup-iters, --lr-decay-iters, --min-lr, ...), so DeepSpeed never builds this one; troupe follows "
         "those "
         "flags as pretrain_gpt.py does"}};
    for (const auto& [key, why] : blocks) {
      const json* block = nullptr;
      (void)get_object(top, "", key, &block);
      if (!block) continue;
      std::string keys;
      if (const auto params = block->find("params"); params != block->end() && params->is_object())
        for (const auto& item : params->items()) keys += (keys.empty() ? "" : ", ") + item.key();
      note(key, std::string("ignored") + (keys.empty() ? "" : " (with its params " + keys + ")") + " -- " + why);
    }
  }

  // "data_types" (runtime/config.py, engine.py get_data_types / _do_optimizer_sanity_check /
  // _mixed_precision_dtypes): grad_accum_dtype, the type gradients accumulate in (default: the
  // model's); param_dtype, which must be the model's (DeepSpeed asserts it); buffer_dtype, the type
  // module buffers are cast to (default: left as loaded). troupe accumulates every gradient in fp32
  // and has no buffers to cast (its rotary tables are computed in fp32).
  Status merge_data_types(const json& top) {
    const json* block = nullptr;
    TROUPE_RETURN_IF_ERROR(get_object(top, "", "data_types", &block));
    if (!block) return Status::ok();
    const std::string d = "data_types";
    TROUPE_RETURN_IF_ERROR(check_keys(*block, d, {"grad_accum_dtype", "param_dtype", "buffer_dtype"}));
    const PrecisionDType model =
        cfg_->precision.recipe == PrecisionRecipe::deepspeed ? cfg_->precision.dtype : PrecisionDType::fp32;
    const std::string model_name = model == PrecisionDType::bf16   ? "bf16"
                                   : model == PrecisionDType::fp16 ? "fp16"
                                                                   : "fp32";
    for (const char* key : {"grad_accum_dtype", "param_dtype", "buffer_dtype"}) {
      const auto it = block->find(key);
      if (it == block->end() || it->is_null()) continue;
      const std::string path = path_of(d, key);
      if (!it->is_string()) {
        (void)error(path, "must be a string, got " + json_excerpt(*it), "write \"fp32\", \"bf16\" or \"fp16\"");
        continue;
      }
      std::string v = lower(it->get<std::string>());
      if (v == "float32") v = "fp32";
      if (v == "bfloat16") v = "bf16";
      if (v == "float16" || v == "half") v = "fp16";
      if (v != "fp32" && v != "bf16" && v != "fp16") {
        (void)error(path, "is " + json_excerpt(*it) + "; DeepSpeed knows fp32, bf16 and fp16",
                    "set one of them or remove it");
        continue;
      }
      const std::string k = key;
      if (k == "grad_accum_dtype") {
        if (v != "fp32")
          (void)error(path,
                      "is \"" + v + "\": DeepSpeed would accumulate the gradients in " + v +
                          ", troupe accumulates every gradient in fp32",
                      "set \"fp32\" or remove it");
        else
          note(path, "\"fp32\": no effect -- troupe accumulates the gradients in fp32");
      } else if (k == "param_dtype") {
        if (v != model_name)
          (void)error(path,
                      "is \"" + v + "\", but the model trains in " + model_name +
                          " (DeepSpeed asserts param_dtype matches the enabled fp16 / bf16 block)",
                      "set \"" + model_name + "\" or remove it");
        else
          note(path, "\"" + v + "\": no effect -- the model's own type");
      } else {
        if (v != "fp32")
          (void)error(path,
                      "is \"" + v + "\": DeepSpeed would cast the model's buffers (such as rotary tables) to " + v +
                          ", troupe keeps them in fp32",
                      "set \"fp32\" or remove it");
        else
          note(path, "\"fp32\": no effect -- troupe's buffers are fp32");
      }
    }
    return Status::ok();
  }

  // "compression_training" (deepspeed/compression/): Megatron-DeepSpeed switches compression on by the
  // block's mere presence (megatron/training.py: args.compression_training = True, then
  // init_compression replaces the model's layers by compression-aware ones and redundancy_clean
  // runs at the end); the block has no top-level "enabled". Each technique has its own
  // shared_parameters.enabled (layer_reduction: its own enabled). Refused whenever present.
  Status merge_compression(const json& top) {
    const auto it = top.find("compression_training");
    if (it == top.end()) return Status::ok();
    if (!it->is_object())
      return error("compression_training", "must be an object, got " + json_excerpt(*it), "write it as {...}");
    const std::pair<const char*, const char*> techniques[] = {
        {"weight_quantization", "quantisation-aware training of the weights"},
        {"activation_quantization", "quantised activations"},
        {"sparse_pruning", "sparse pruning"},
        {"row_pruning", "row pruning"},
        {"head_pruning", "attention-head pruning"},
        {"channel_pruning", "channel pruning"},
        {"layer_reduction", "layer reduction (a student with fewer layers)"}};
    std::string on;
    for (const auto& [key, what] : techniques) {
      const auto t = it->find(key);
      if (t == it->end() || !t->is_object()) continue;
      const json* switch_holder = &*t;
      if (std::string(key) != "layer_reduction") {
        const auto shared = t->find("shared_parameters");
        if (shared == t->end() || !shared->is_object()) continue;
        switch_holder = &*shared;
      }
      const auto enabled = switch_holder->find("enabled");
      if (enabled != switch_holder->end() && enabled->is_boolean() && enabled->get<bool>())
        on += (on.empty() ? "" : ", ") + std::string(key) + " (" + what + ")";
    }
    return error(
        "compression_training",
        "is present: Megatron-DeepSpeed then trains with DeepSpeed's compression, replacing the model's layers "
        "by compression-aware ones (" +
            (on.empty() ? std::string("no technique enabled in it, but the layers are still replaced") : on) +
            "), which is not in troupe",
        "remove the block to train the uncompressed model");
  }

  // "data_efficiency" (runtime/data_pipeline/config.py): its data sampling (DeepSpeed's sampler,
  // curriculum learning by metrics, dynamic batching) and data routing (random-LTD) each have an
  // "enabled"; Megatron-DeepSpeed uses them only with --data-efficiency-curriculum-learning and
  // --random-ltd (refused), and the engine reads the inner switches. With every inner feature off
  // the block changes nothing, whatever its top-level "enabled" says.
  Status merge_data_efficiency(const json& top) {
    const auto it = top.find("data_efficiency");
    if (it == top.end()) return Status::ok();
    if (!it->is_object())
      return error("data_efficiency", "must be an object, got " + json_excerpt(*it), "write it as {...}");
    const char* const features[][3] = {
        {"data_sampling", "enabled", "DeepSpeed's data sampler (it draws the samples itself)"},
        {"data_sampling", "curriculum_learning",
         "curriculum learning by data metrics (samples admitted by difficulty)"},
        {"data_sampling", "dynamic_batching", "dynamic batching (batches sized by tokens)"},
        {"data_routing", "enabled", "data routing (tokens skipping layers)"},
        {"data_routing", "random_ltd", "random layer-token drop (random-LTD)"}};
    bool any = false;
    for (const auto& f : features) {
      const std::string outer = f[0], inner = f[1];
      const auto o = it->find(outer);
      if (o == it->end() || !o->is_object()) continue;
      const json* holder = &*o;
      std::string path = "data_efficiency." + outer + ".enabled";
      if (inner != "enabled") {
        const auto i = o->find(inner);
        if (i == o->end() || !i->is_object()) continue;
        holder = &*i;
        path = "data_efficiency." + outer + "." + inner + ".enabled";
      }
      const auto enabled = holder->find("enabled");
      if (enabled == holder->end()) continue;
      if (!enabled->is_boolean()) {
        (void)error(path, "must be true or false, got " + json_excerpt(*enabled), "write true or false (no quotes)");
        any = true;
        continue;
      }
      if (enabled->get<bool>()) {
        (void)error(path, std::string("is true: ") + f[2] + " is not in troupe",
                    "set it to false (or remove the data_efficiency block)");
        any = true;
      }
    }
    if (!any) note("data_efficiency", "every feature switched off (data_sampling, data_routing): no effect");
    return Status::ok();
  }

  GivenFn given_;
  std::string file_;
  TrainConfig* cfg_;
  Origins* origins_;
  int dp_;
  std::vector<std::string> problems_;  // every problem found, in the order found
  std::vector<std::string> notes_;     // the start-up notes: harmless keys, "auto" values
  std::set<std::string> autos_;        // key paths whose value is "auto"
  bool set_global_batch_ = false;
};

}  // namespace

Status merge_deepspeed_config(const std::string& file, int dp, const FlagGivenFn& given,
                              TrainConfig* cfg, FlagOrigins* origins, bool* set_global_batch,
                              std::vector<std::string>* notes) {
  DeepSpeedMerger merger(given, file, cfg, origins, dp);
  TROUPE_RETURN_IF_ERROR(merger.merge());
  *set_global_batch = merger.set_global_batch();
  if (notes != nullptr) notes->insert(notes->end(), merger.notes().begin(), merger.notes().end());
  return Status::ok();
}

}  // namespace troupe
