#include "actors/train_options.hpp"

#include <fmt/format.h>
#include <unistd.h>  // access(W_OK): whether --save could be created later

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "storage/gpt_dataset.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// For each flag whose value came from the DeepSpeed file: which key, in which file. Validation adds
// it to its message so the user fixes the file, not a flag they never passed.
using Origins = std::map<std::string, std::string>;
using GivenFn = std::function<bool(const char* flag)>;

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
// * Batch: train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * world
//   size (1 here). DeepSpeed fills a missing one from the other two, or with one given: batch only
//   -> micro = batch, gas = 1; micro only -> batch = micro, gas = 1; all three must agree. troupe
//   does the same, except that --micro-batch-size can stand in for the missing micro.
// * optimizer: "type" is compared lower-cased ("Adam"/"AdamW"). The engine builds FusedAdam with
//   the params, whose defaults are lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0: so a
//   params key left out of the block means that default, not troupe's. adam_w_mode defaults to true
//   and type AdamW forces it (effective = type == adamw or adam_w_mode); adam_w_mode false with
//   type Adam would be Adam with L2 regularisation, which troupe does not implement.
// * scheduler: the engine steps it after each optimizer step; its counter j starts at -1, where
//   the lr is warmup_min_lr. All three types use W = max(2, warmup_num_steps) (warmup_num_steps
//   must be a positive integer, default 1000) and warmup_type "log" by default:
//     WarmupLR:       lr = min + (max - min) * gamma, for j < W gamma = ln(j + 1) / ln(W) (log) or
//                     j / W (linear), then 1. warmup_min_lr default 0; warmup_max_lr default:
//                     the optimizer's lr.
//     WarmupDecayLR:  the same warm-up, then gamma = max(0, (T - j) / max(1, T - W)), T =
//                     total_num_steps (required): linear decay to 0 at T. warmup_max_lr default
//                     1e-3 (its own signature's default, not the optimizer's lr).
//     WarmupCosineLR: ratio warm-up from warmup_min_ratio (default 0) to 1 over W, then ratio =
//                     cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * min(1, (j - W + 1) /
//                     max(1, T - W)))) / 2, times the optimizer's lr. cos_min_ratio default 1e-4.
//   With iteration k = j + 1 (troupe counts steps taken), every log warm-up and the whole
//   WarmupCosineLR decay equal lr_schedule's formulas exactly (tests/actors/test_lr_schedule.cpp
//   checks it step by step), except that WarmupCosineLR runs its very first step at lr 0 where
//   troupe uses warmup_min_ratio * lr. The linear warm-up and WarmupDecayLR's decay follow
//   Megatron's convention instead, one step ahead of DeepSpeed's (DeepSpeed's linear warm-up gives
//   (k - 1) / W, and its decay reaches 0 at k = T + 1). Without a scheduler block the schedule
//   comes from the flags, as in Megatron-DeepSpeed, where Megatron's own scheduler drives the lr.
// * gradient_clipping -> --clip-grad; steps_per_print -> --log-interval; wall_clock_breakdown: only
//   timing output in DeepSpeed, accepted and ignored.
// * zero_optimization.stage (default 0): stages 1-3 partition state across data-parallel ranks.
// * fp16 / bf16 .enabled (default false).
// A key DeepSpeed knows but troupe does not (or a typo) is an error: silently ignoring it would
// train something other than what the file asks for.
// -------------------------------------------------------------------------------------------------
class DeepSpeedMerger {
 public:
  DeepSpeedMerger(GivenFn given, std::string file, TrainConfig* cfg, Origins* origins)
      : given_(std::move(given)), file_(std::move(file)), cfg_(cfg), origins_(origins) {}

  Status merge() {
    json top;
    TROUPE_RETURN_IF_ERROR(read_file(&top));
    if (!top.is_object())
      return Status::error("--deepspeed-config " + file_ +
                           " must hold a JSON object ({...}), got " + top.type_name() +
                           " -- write the DeepSpeed settings as one object");
    TROUPE_RETURN_IF_ERROR(check_keys(
        top, "",
        {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
         "optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
         "zero_optimization", "fp16", "bf16"}));
    TROUPE_RETURN_IF_ERROR(merge_precision(top, "fp16"));
    TROUPE_RETURN_IF_ERROR(merge_precision(top, "bf16"));
    TROUPE_RETURN_IF_ERROR(merge_zero(top));
    std::optional<bool> breakdown;
    TROUPE_RETURN_IF_ERROR(get_bool(top, "", "wall_clock_breakdown", &breakdown));
    TROUPE_RETURN_IF_ERROR(merge_batch(top));
    std::optional<double> clip;
    TROUPE_RETURN_IF_ERROR(get_number(top, "", "gradient_clipping", &clip));
    if (clip) apply("--clip-grad", &cfg_->clip_grad, *clip, "gradient_clipping");
    std::optional<int64_t> steps_per_print;
    TROUPE_RETURN_IF_ERROR(get_integer(top, "", "steps_per_print", &steps_per_print));
    if (steps_per_print)
      apply("--log-interval", &cfg_->log_interval, *steps_per_print, "steps_per_print");
    TROUPE_RETURN_IF_ERROR(merge_optimizer(top));
    return merge_scheduler(top);
  }

  // Whether the file decided the global batch size (so the derived default must not overwrite it).
  bool set_global_batch() const { return set_global_batch_; }

 private:
  static std::string path_of(const std::string& prefix, const std::string& key) {
    return prefix.empty() ? key : prefix + "." + key;
  }

  Status error(const std::string& path, const std::string& what, const std::string& fix) const {
    return Status::error("--deepspeed-config " + file_ + ": \"" + path + "\" " + what + " -- " +
                         fix);
  }

  Status read_file(json* out) const {
    std::error_code ec;
    if (!fs::exists(file_, ec))
      return Status::error("--deepspeed-config " + file_ +
                           ": no such file -- check the path, or drop --deepspeed-config");
    if (!fs::is_regular_file(file_, ec))
      return Status::error("--deepspeed-config " + file_ +
                           " is not a regular file -- pass the DeepSpeed JSON file itself");
    std::ifstream in(file_, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in.good() && !in.eof())
      return Status::error("--deepspeed-config " + file_ +
                           ": cannot be read -- check its permissions");

    // DeepSpeed rejects a key repeated in one object (dict_raise_error_on_duplicate_keys); so do
    // we.
    std::vector<std::set<std::string>> open_objects;
    std::string duplicate;
    json::parser_callback_t on_event = [&](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) {
        open_objects.emplace_back();
      } else if (event == json::parse_event_t::object_end) {
        open_objects.pop_back();
      } else if (event == json::parse_event_t::key && !open_objects.empty()) {
        const auto key = parsed.get<std::string>();
        if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
      }
      return true;
    };
    try {
      *out = json::parse(text.str(), on_event);
    } catch (const json::parse_error& e) {
      return Status::error("--deepspeed-config " + file_ + " is not valid JSON (byte " +
                           std::to_string(e.byte) + "): " + e.what() +
                           " -- fix the file at that position");
    }
    if (!duplicate.empty())
      return Status::error("--deepspeed-config " + file_ + ": key \"" + duplicate +
                           "\" appears twice in one object -- keep one of them");
    return Status::ok();
  }

  Status check_keys(const json& object, const std::string& prefix,
                    const std::vector<std::string>& accepted) const {
    for (const auto& item : object.items()) {
      if (std::find(accepted.begin(), accepted.end(), item.key()) != accepted.end()) continue;
      return error(
          path_of(prefix, item.key()),
          "is not a key troupe understands; accepted keys " +
              (prefix.empty() ? std::string("at the top level") : "in \"" + prefix + "\"") + ": " +
              join_keys(accepted),
          "remove it (troupe implements only these DeepSpeed settings) or fix its spelling");
    }
    return Status::ok();
  }

  Status get_object(const json& parent, const std::string& prefix, const char* key,
                    const json** out) const {
    *out = nullptr;
    const auto it = parent.find(key);
    if (it == parent.end()) return Status::ok();
    if (!it->is_object())
      return error(path_of(prefix, key), std::string("must be an object, got ") + it->dump(),
                   "write it as {...}");
    *out = &*it;
    return Status::ok();
  }

  Status get_number(const json& parent, const std::string& prefix, const char* key,
                    std::optional<double>* out) const {
    const auto it = parent.find(key);
    if (it == parent.end()) return Status::ok();
    if (!it->is_number())
      return error(path_of(prefix, key), "must be a number, got " + it->dump(), "write a number");
    *out = it->get<double>();
    return Status::ok();
  }

  Status get_integer(const json& parent, const std::string& prefix, const char* key,
                     std::optional<int64_t>* out) const {
    const auto it = parent.find(key);
    if (it == parent.end()) return Status::ok();
    if (!it->is_number_integer() ||
        (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT_MAX)))
      return error(path_of(prefix, key), "must be an integer, got " + it->dump(),
                   "write a whole number without a decimal point");
    *out = it->get<int64_t>();
    return Status::ok();
  }

  Status get_positive_integer(const json& parent, const std::string& prefix, const char* key,
                              std::optional<int64_t>* out) const {
    TROUPE_RETURN_IF_ERROR(get_integer(parent, prefix, key, out));
    if (*out && **out <= 0)
      return error(path_of(prefix, key), "must be positive, got " + std::to_string(**out),
                   "write a positive integer");
    return Status::ok();
  }

  Status get_bool(const json& parent, const std::string& prefix, const char* key,
                  std::optional<bool>* out) const {
    const auto it = parent.find(key);
    if (it == parent.end()) return Status::ok();
    if (!it->is_boolean())
      return error(path_of(prefix, key), "must be true or false, got " + it->dump(),
                   "write true or false (no quotes)");
    *out = it->get<bool>();
    return Status::ok();
  }

  Status get_string(const json& parent, const std::string& prefix, const char* key,
                    std::optional<std::string>* out) const {
    const auto it = parent.find(key);
    if (it == parent.end()) return Status::ok();
    if (!it->is_string())
      return error(path_of(prefix, key), "must be a string, got " + it->dump(),
                   "write it in quotes");
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

  Status merge_precision(const json& top, const char* key) const {
    const json* block = nullptr;
    TROUPE_RETURN_IF_ERROR(get_object(top, "", key, &block));
    if (!block) return Status::ok();
    TROUPE_RETURN_IF_ERROR(check_keys(*block, key, {"enabled"}));
    std::optional<bool> enabled;
    TROUPE_RETURN_IF_ERROR(get_bool(*block, key, "enabled", &enabled));
    if (enabled.value_or(false))
      return error(std::string(key) + ".enabled",
                   "is true, but mixed precision is not available on the CPU backend (troupe "
                   "trains in fp32)",
                   std::string("set \"enabled\": false or remove \"") + key + "\"");
    return Status::ok();
  }

  Status merge_zero(const json& top) const {
    const json* block = nullptr;
    TROUPE_RETURN_IF_ERROR(get_object(top, "", "zero_optimization", &block));
    if (!block) return Status::ok();
    TROUPE_RETURN_IF_ERROR(check_keys(*block, "zero_optimization", {"stage"}));
    std::optional<int64_t> stage;
    TROUPE_RETURN_IF_ERROR(get_integer(*block, "zero_optimization", "stage", &stage));
    const int64_t s = stage.value_or(0);
    if (s >= 1 && s <= 3)
      return error("zero_optimization.stage",
                   "asks for ZeRO stage " + std::to_string(s) +
                       ", which needs data parallelism, which this build does not have yet",
                   "remove zero_optimization or set stage 0");
    if (s != 0)
      return error("zero_optimization.stage",
                   "is " + std::to_string(s) + "; ZeRO stages are 0 to 3",
                   "set stage 0 or remove zero_optimization");
    return Status::ok();
  }

  Status merge_batch(const json& top) {
    std::optional<int64_t> batch, micro, gas;
    TROUPE_RETURN_IF_ERROR(get_positive_integer(top, "", "train_batch_size", &batch));
    TROUPE_RETURN_IF_ERROR(get_positive_integer(top, "", "train_micro_batch_size_per_gpu", &micro));
    TROUPE_RETURN_IF_ERROR(get_positive_integer(top, "", "gradient_accumulation_steps", &gas));
    if (batch && micro && gas && *batch != *micro * *gas)
      return error(
          "train_batch_size",
          fmt::format("is {}, but train_micro_batch_size_per_gpu * gradient_accumulation_steps "
                      "* data-parallel size is {} * {} * 1 = {}",
                      *batch, *micro, *gas, *micro * *gas),
          "make the three agree, or give only two of them and let the third follow");
    if (batch && gas && !micro && *batch % *gas != 0)
      return error(
          "train_batch_size",
          fmt::format("{} is not divisible by gradient_accumulation_steps {}", *batch, *gas),
          "make train_batch_size a multiple of gradient_accumulation_steps");

    if (micro) {
      apply("--micro-batch-size", &cfg_->micro_batch_size, *micro,
            "train_micro_batch_size_per_gpu");
    } else if (batch && gas) {
      apply("--micro-batch-size", &cfg_->micro_batch_size, *batch / *gas,
            "train_batch_size / gradient_accumulation_steps");
    } else if (batch) {  // DeepSpeed: train_batch_size alone means micro = batch, gas = 1
      apply("--micro-batch-size", &cfg_->micro_batch_size, *batch, "train_batch_size");
    }
    if (given_("--global-batch-size")) return Status::ok();
    if (batch) {
      apply("--global-batch-size", &cfg_->global_batch_size, *batch, "train_batch_size");
      set_global_batch_ = true;
    } else if (gas) {
      const int64_t global = static_cast<int64_t>(cfg_->micro_batch_size) * *gas;
      if (global > INT_MAX)
        return error("gradient_accumulation_steps",
                     fmt::format("{} times the micro batch size {} overflows the global batch size",
                                 *gas, cfg_->micro_batch_size),
                     "use fewer accumulation steps");
      apply("--global-batch-size", &cfg_->global_batch_size, global, "gradient_accumulation_steps");
      set_global_batch_ = true;
    }
    return Status::ok();
  }

  Status merge_optimizer(const json& top) {
    const json* block = nullptr;
    TROUPE_RETURN_IF_ERROR(get_object(top, "", "optimizer", &block));
    if (!block) return Status::ok();
    TROUPE_RETURN_IF_ERROR(check_keys(*block, "optimizer", {"type", "params"}));
    std::optional<std::string> type;
    TROUPE_RETURN_IF_ERROR(get_string(*block, "optimizer", "type", &type));
    if (!type)
      return error("optimizer.type", "is missing",
                   "add \"type\": \"AdamW\" to the optimizer block");
    const std::string name = lower(*type);
    if (name != "adam" && name != "adamw")
      return error("optimizer.type", "is \"" + *type + "\", which troupe does not implement",
                   "use \"AdamW\" (or \"Adam\", which DeepSpeed runs as AdamW): troupe's optimizer "
                   "is AdamW");

    static const json kEmpty = json::object();
    const json* params = nullptr;
    TROUPE_RETURN_IF_ERROR(get_object(*block, "optimizer", "params", &params));
    if (!params) params = &kEmpty;
    const std::string p = "optimizer.params";
    TROUPE_RETURN_IF_ERROR(
        check_keys(*params, p, {"lr", "betas", "eps", "weight_decay", "adam_w_mode"}));

    std::optional<bool> adam_w_mode;
    TROUPE_RETURN_IF_ERROR(get_bool(*params, p, "adam_w_mode", &adam_w_mode));
    if (adam_w_mode && !*adam_w_mode && name == "adam")
      return error(
          "optimizer.params.adam_w_mode",
          "is false, which selects Adam with L2 regularisation; troupe's optimizer is AdamW "
          "(decoupled weight decay)",
          "remove adam_w_mode or set it to true");

    // FusedAdam's defaults stand for the params left out (see the comment above the class).
    std::optional<double> lr, eps, weight_decay;
    TROUPE_RETURN_IF_ERROR(get_number(*params, p, "lr", &lr));
    TROUPE_RETURN_IF_ERROR(get_number(*params, p, "eps", &eps));
    TROUPE_RETURN_IF_ERROR(get_number(*params, p, "weight_decay", &weight_decay));
    double beta1 = 0.9, beta2 = 0.999;
    if (const auto it = params->find("betas"); it != params->end()) {
      if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number() || !(*it)[1].is_number())
        return error("optimizer.params.betas", "must be a list of two numbers, got " + it->dump(),
                     "write e.g. [0.9, 0.999]");
      beta1 = (*it)[0].get<double>();
      beta2 = (*it)[1].get<double>();
    }
    const auto key = [&](const char* k, bool present) {
      return p + "." + k + (present ? "" : " (DeepSpeed's default)");
    };
    apply("--lr", &cfg_->lr, lr.value_or(1e-3), key("lr", lr.has_value()));
    apply("--adam-eps", &cfg_->adam_eps, eps.value_or(1e-8), key("eps", eps.has_value()));
    apply("--weight-decay", &cfg_->weight_decay, weight_decay.value_or(0.0),
          key("weight_decay", weight_decay.has_value()));
    const bool has_betas = params->contains("betas");
    apply("--adam-beta1", &cfg_->adam_beta1, beta1,
          has_betas ? p + ".betas[0]" : key("betas", false));
    apply("--adam-beta2", &cfg_->adam_beta2, beta2,
          has_betas ? p + ".betas[1]" : key("betas", false));
    return Status::ok();
  }

  Status merge_scheduler(const json& top) {
    const json* block = nullptr;
    TROUPE_RETURN_IF_ERROR(get_object(top, "", "scheduler", &block));
    if (!block) return Status::ok();
    TROUPE_RETURN_IF_ERROR(check_keys(*block, "scheduler", {"type", "params"}));
    std::optional<std::string> type;
    TROUPE_RETURN_IF_ERROR(get_string(*block, "scheduler", "type", &type));
    const std::string accepted_types = "WarmupLR, WarmupDecayLR, WarmupCosineLR";
    if (!type)
      return error("scheduler.type", "is missing", "add \"type\" with one of " + accepted_types);
    const bool warmup_lr = *type == "WarmupLR", decay_lr = *type == "WarmupDecayLR",
               cosine_lr = *type == "WarmupCosineLR";
    if (!warmup_lr && !decay_lr && !cosine_lr)
      return error(
          "scheduler.type", "is \"" + *type + "\", which troupe does not implement",
          "use one of " + accepted_types + " (or remove the scheduler and use --lr-decay-style)");

    static const json kEmpty = json::object();
    const json* params = nullptr;
    TROUPE_RETURN_IF_ERROR(get_object(*block, "scheduler", "params", &params));
    if (!params) params = &kEmpty;
    const std::string p = "scheduler.params";
    if (cosine_lr) {
      TROUPE_RETURN_IF_ERROR(check_keys(*params, p,
                                        {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                         "cos_min_ratio", "warmup_type"}));
    } else if (decay_lr) {
      TROUPE_RETURN_IF_ERROR(check_keys(*params, p,
                                        {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                         "warmup_type", "total_num_steps"}));
    } else {
      TROUPE_RETURN_IF_ERROR(check_keys(
          *params, p, {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"}));
    }

    // Shared by the three: warm-up length and shape.
    std::optional<int64_t> warmup_steps;
    TROUPE_RETURN_IF_ERROR(get_positive_integer(*params, p, "warmup_num_steps", &warmup_steps));
    std::optional<std::string> warmup_type;
    TROUPE_RETURN_IF_ERROR(get_string(*params, p, "warmup_type", &warmup_type));
    if (warmup_type && *warmup_type != "log" && *warmup_type != "linear")
      return error(p + ".warmup_type", "is \"" + *warmup_type + "\"", "use \"log\" or \"linear\"");
    const int64_t steps = warmup_steps.value_or(1000);
    apply("--lr-warmup-iters", &cfg_->lr_warmup_iters, std::max<int64_t>(2, steps),
          p + ".warmup_num_steps" +
              (!warmup_steps ? " (DeepSpeed's default)"
               : steps < 2   ? " (DeepSpeed raises it to 2)"
                             : ""));
    apply("--lr-warmup-style", &cfg_->lr_warmup_style, warmup_type.value_or("log"),
          p + ".warmup_type" + (warmup_type ? "" : " (DeepSpeed's default)"));

    std::optional<int64_t> total_steps;
    if (decay_lr || cosine_lr) {
      TROUPE_RETURN_IF_ERROR(get_positive_integer(*params, p, "total_num_steps", &total_steps));
      if (!total_steps)
        return error(p + ".total_num_steps", "is missing; " + *type + " needs it",
                     "add the number of optimizer steps the lr decays over");
      apply("--lr-decay-iters", &cfg_->lr_decay_iters, *total_steps, p + ".total_num_steps");
    }

    if (cosine_lr) {
      // The peak is the optimizer's lr (already merged, or --lr); the ratios scale it.
      std::optional<double> warmup_min_ratio, cos_min_ratio;
      TROUPE_RETURN_IF_ERROR(get_number(*params, p, "warmup_min_ratio", &warmup_min_ratio));
      TROUPE_RETURN_IF_ERROR(get_number(*params, p, "cos_min_ratio", &cos_min_ratio));
      apply("--lr-warmup-init", &cfg_->lr_warmup_init, warmup_min_ratio.value_or(0.0) * cfg_->lr,
            p + ".warmup_min_ratio * lr");
      apply("--min-lr", &cfg_->min_lr, cos_min_ratio.value_or(1e-4) * cfg_->lr,
            p + ".cos_min_ratio * lr");
      apply("--lr-decay-style", &cfg_->lr_decay_style, std::string("cosine"), "scheduler.type");
      return Status::ok();
    }

    std::optional<double> min_lr, max_lr;
    TROUPE_RETURN_IF_ERROR(get_number(*params, p, "warmup_min_lr", &min_lr));
    TROUPE_RETURN_IF_ERROR(get_number(*params, p, "warmup_max_lr", &max_lr));
    apply("--lr-warmup-init", &cfg_->lr_warmup_init, min_lr.value_or(0.0),
          p + ".warmup_min_lr" + (min_lr ? "" : " (DeepSpeed's default)"));
    if (max_lr) {
      apply("--lr", &cfg_->lr, *max_lr, p + ".warmup_max_lr");
    } else if (decay_lr) {
      apply("--lr", &cfg_->lr, 1e-3, p + ".warmup_max_lr (WarmupDecayLR's default)");
    }  // WarmupLR without warmup_max_lr keeps the optimizer's lr, as DeepSpeed does.
    if (warmup_lr) {
      apply("--lr-decay-style", &cfg_->lr_decay_style, std::string("constant"), "scheduler.type");
    } else {
      apply("--lr-decay-style", &cfg_->lr_decay_style, std::string("linear"), "scheduler.type");
      apply("--min-lr", &cfg_->min_lr, 0.0, "scheduler.type (WarmupDecayLR decays to 0)");
    }
    return Status::ok();
  }

  GivenFn given_;
  std::string file_;
  TrainConfig* cfg_;
  Origins* origins_;
  bool set_global_batch_ = false;
};

// -------------------------------------------------------------------------------------------------
// Validation. Each message: the flag, what is wrong, where the value came from if it was the file,
// then " -- " and the fix.
// -------------------------------------------------------------------------------------------------
class Validator {
 public:
  explicit Validator(const Origins* origins) : origins_(origins) {}

  Status run(const TrainConfig& c) const {
    TROUPE_RETURN_IF_ERROR(model(c.model));
    TROUPE_RETURN_IF_ERROR(batch(c));
    TROUPE_RETURN_IF_ERROR(optimizer(c));
    TROUPE_RETURN_IF_ERROR(schedule(c));
    TROUPE_RETURN_IF_ERROR(data(c));
    TROUPE_RETURN_IF_ERROR(checkpoints(c));
    return logging(c);
  }

 private:
  Status bad(const std::string& flag, const std::string& what, const std::string& fix) const {
    std::string message = flag + " " + what;
    if (origins_) {
      if (const auto it = origins_->find(flag); it != origins_->end())
        message += " (the value comes from " + it->second + ": fix it there)";
    }
    return Status::error(message + " -- " + fix);
  }

  template <class T>
  Status positive(const std::string& flag, T value, const std::string& example) const {
    if (value > 0) return Status::ok();
    return bad(flag, fmt::format("must be positive, got {}", value),
               "pass e.g. " + flag + " " + example);
  }

  Status model(const GptConfig& m) const {
    TROUPE_RETURN_IF_ERROR(positive("--num-layers", m.num_layers, "4"));
    TROUPE_RETURN_IF_ERROR(positive("--hidden-size", m.hidden_size, "256"));
    TROUPE_RETURN_IF_ERROR(positive("--num-attention-heads", m.num_attention_heads, "4"));
    if (m.hidden_size % m.num_attention_heads != 0)
      return bad(
          "--num-attention-heads",
          fmt::format("{} does not divide --hidden-size {}", m.num_attention_heads, m.hidden_size),
          "choose a head count that divides the hidden size");
    TROUPE_RETURN_IF_ERROR(positive("--seq-length", m.seq_length, "256"));
    if (m.max_position_embeddings < m.seq_length)
      return bad(
          "--max-position-embeddings",
          fmt::format("{} is smaller than --seq-length {}", m.max_position_embeddings,
                      m.seq_length),
          "make it at least the sequence length, or leave it out to use the sequence length");
    TROUPE_RETURN_IF_ERROR(
        positive("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by, "128"));
    if (!(m.init_method_std > 0) || !std::isfinite(m.init_method_std))
      return bad("--init-method-std",
                 fmt::format("must be a positive number, got {}", m.init_method_std),
                 "use e.g. 0.02");
    return Status::ok();
  }

  Status batch(const TrainConfig& c) const {
    TROUPE_RETURN_IF_ERROR(positive("--micro-batch-size", c.micro_batch_size, "4"));
    if (c.global_batch_size <= 0 || c.global_batch_size % c.micro_batch_size != 0)
      return bad("--global-batch-size",
                 fmt::format("{} is not a positive multiple of --micro-batch-size {}",
                             c.global_batch_size, c.micro_batch_size),
                 "make it micro batch size times the gradient accumulation steps");
    TROUPE_RETURN_IF_ERROR(positive("--train-iters", c.train_iters, "1000"));
    return Status::ok();
  }

  Status optimizer(const TrainConfig& c) const {
    if (!(c.adam_beta1 >= 0 && c.adam_beta1 < 1))
      return bad("--adam-beta1", fmt::format("must be in [0, 1), got {}", c.adam_beta1),
                 "use e.g. 0.9");
    if (!(c.adam_beta2 >= 0 && c.adam_beta2 < 1))
      return bad("--adam-beta2", fmt::format("must be in [0, 1), got {}", c.adam_beta2),
                 "use e.g. 0.999");
    if (!(c.adam_eps > 0) || !std::isfinite(c.adam_eps))
      return bad("--adam-eps", fmt::format("must be positive, got {}", c.adam_eps),
                 "use e.g. 1e-8");
    if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay))
      return bad("--weight-decay", fmt::format("must be >= 0, got {}", c.weight_decay),
                 "use e.g. 0.01, or 0 for none");
    if (!(c.clip_grad >= 0) || !std::isfinite(c.clip_grad))
      return bad("--clip-grad", fmt::format("must be >= 0, got {}", c.clip_grad),
                 "use e.g. 1.0, or 0 to disable clipping");
    return Status::ok();
  }

  Status schedule(const TrainConfig& c) const {
    if (!(c.lr >= 0) || !std::isfinite(c.lr))
      return bad("--lr", fmt::format("must be >= 0, got {}", c.lr), "use e.g. 6e-4");
    if (!(c.min_lr >= 0) || c.min_lr > c.lr)
      return bad("--min-lr", fmt::format("must be in [0, --lr {}], got {}", c.lr, c.min_lr),
                 "use a value between 0 and the peak learning rate");
    if (!(c.lr_warmup_init >= 0) || !std::isfinite(c.lr_warmup_init))
      return bad("--lr-warmup-init", fmt::format("must be >= 0, got {}", c.lr_warmup_init),
                 "use e.g. 0");
    const std::string& style = c.lr_decay_style;
    if (style != "constant" && style != "linear" && style != "cosine")
      return bad("--lr-decay-style", "is \"" + style + "\"", "use constant, linear or cosine");
    if (c.lr_warmup_style != "linear" && c.lr_warmup_style != "log")
      return bad("--lr-warmup-style", "is \"" + c.lr_warmup_style + "\"", "use linear or log");
    if (c.lr_warmup_iters < 0)
      return bad("--lr-warmup-iters", fmt::format("must be >= 0, got {}", c.lr_warmup_iters),
                 "use 0 for no warm-up");
    if (c.lr_warmup_style == "log" && c.lr_warmup_iters == 1)
      return bad("--lr-warmup-iters", "is 1, too short for the log warm-up (ln 1 = 0)",
                 "use at least 2 (DeepSpeed rounds up to 2), or --lr-warmup-style linear");
    if (c.lr_decay_iters < 0)
      return bad("--lr-decay-iters", fmt::format("must be >= 0, got {}", c.lr_decay_iters),
                 "use 0 to decay over --train-iters");
    const int64_t decay = c.lr_decay_iters > 0 ? c.lr_decay_iters : c.train_iters;
    if (style != "constant" && c.lr_warmup_iters >= decay)
      return bad("--lr-warmup-iters",
                 fmt::format("{} is not below the {} decay iterations ({})", c.lr_warmup_iters,
                             decay, c.lr_decay_iters > 0 ? "--lr-decay-iters" : "--train-iters"),
                 "shorten the warm-up, lengthen the decay, or use --lr-decay-style constant");
    return Status::ok();
  }

  Status data(const TrainConfig& c) const {
    if (c.mock_data) {
      if (!c.data_path.empty())
        return bad("--mock-data", "and --data-path " + c.data_path + " are both given",
                   "drop one: --mock-data trains on synthetic tokens instead of a dataset");
      return Status::ok();
    }
    if (c.data_path.empty())
      return bad(
          "--data-path", "is required",
          "run `troupe preprocess` first and pass its output prefix (PREFIX of PREFIX.bin and "
          "PREFIX.idx)");
    std::error_code ec;
    for (const char* ext : {".bin", ".idx"}) {
      if (!fs::is_regular_file(c.data_path + ext, ec))
        return bad(
            "--data-path", c.data_path + ": " + c.data_path + ext + " not found",
            "run `troupe preprocess` first, and pass the prefix it wrote (without .bin/.idx)");
    }
    // The data loader's own parser (Megatron's rule), so both accept exactly the same strings.
    if (auto parsed = split_document_indices(1, c.split); !parsed) return parsed.status();
    if (c.tokenizer_type == "GPT2BPETokenizer") {
      const std::pair<const char*, const std::string*> files[] = {{"--vocab-file", &c.vocab_file},
                                                                  {"--merge-file", &c.merge_file}};
      for (const auto& [flag, path] : files) {
        if (path->empty())
          return bad(
              flag, "is required by --tokenizer-type GPT2BPETokenizer",
              "pass GPT-2's vocab.json (--vocab-file) and merges.txt (--merge-file), the ones "
              "the data was preprocessed with");
        if (!fs::is_regular_file(*path, ec))
          return bad(flag, *path + " not found", "check the path");
      }
    } else if (c.tokenizer_type != "ByteLevelTokenizer") {
      return bad(
          "--tokenizer-type", "is \"" + c.tokenizer_type + "\"",
          "use GPT2BPETokenizer or ByteLevelTokenizer, the one the data was preprocessed with");
    }
    return Status::ok();
  }

  // Whether `path` could be created later: it is, or its nearest existing ancestor is, a writable
  // directory. Nothing is created here.
  Status creatable_directory(const std::string& flag, const std::string& path) const {
    std::error_code ec;
    if (fs::exists(path, ec)) {
      if (!fs::is_directory(path, ec))
        return bad(flag, path + " exists and is not a directory", "choose a directory path");
      if (::access(path.c_str(), W_OK) != 0)
        return bad(flag, path + " is not writable", "choose a directory you can write to");
      return Status::ok();
    }
    fs::path ancestor = fs::absolute(path, ec).parent_path();
    while (!ancestor.empty() && !fs::exists(ancestor, ec) && ancestor != ancestor.parent_path())
      ancestor = ancestor.parent_path();
    if (!fs::is_directory(ancestor, ec))
      return bad(flag, path + " cannot be created: " + ancestor.string() + " is not a directory",
                 "choose a path under a directory");
    if (::access(ancestor.c_str(), W_OK) != 0)
      return bad(flag, path + " cannot be created: " + ancestor.string() + " is not writable",
                 "choose a path under a directory you can write to");
    return Status::ok();
  }

  Status checkpoints(const TrainConfig& c) const {
    if (c.save_interval < 0)
      return bad("--save-interval", fmt::format("must be >= 0, got {}", c.save_interval),
                 "use 0 to save only at the end");
    if (c.exit_interval < 0)
      return bad("--exit-interval", fmt::format("must be >= 0, got {}", c.exit_interval),
                 "use 0 to train to --train-iters");
    if (!c.save.empty()) TROUPE_RETURN_IF_ERROR(creatable_directory("--save", c.save));
    if (!c.load.empty()) {
      std::error_code ec;
      if (!fs::is_directory(c.load, ec))
        return bad(
            "--load", c.load + " is not a directory",
            "pass the --save directory of an earlier run, or drop --load to start from scratch");
      if (!fs::is_regular_file(fs::path(c.load) / "latest_checkpointed_iteration.txt", ec))
        return bad(
            "--load",
            c.load + " has no latest_checkpointed_iteration.txt, so no finished checkpoint",
            "pass the --save directory of a run that saved, or drop --load to start from scratch");
    }
    return Status::ok();
  }

  Status logging(const TrainConfig& c) const {
    TROUPE_RETURN_IF_ERROR(positive("--eval-interval", c.eval_interval, "1000"));
    if (c.eval_iters < 0)
      return bad("--eval-iters", fmt::format("must be >= 0, got {}", c.eval_iters),
                 "use 0 to skip evaluation");
    TROUPE_RETURN_IF_ERROR(positive("--log-interval", c.log_interval, "100"));
    if (c.num_threads < 0)
      return bad("--num-threads", fmt::format("must be >= 0, got {}", c.num_threads),
                 "use 0 for all cores");
    if (!c.metrics_file.empty()) {
      std::error_code ec;
      if (fs::is_directory(c.metrics_file, ec))
        return bad("--metrics-file", c.metrics_file + " is a directory",
                   "name a file, e.g. metrics.jsonl");
      fs::path dir = fs::path(c.metrics_file).parent_path();
      if (dir.empty()) dir = ".";
      if (!fs::is_directory(dir, ec))
        return bad("--metrics-file", "directory " + dir.string() + " does not exist",
                   "create it first or choose a file in an existing directory");
    }
    return Status::ok();
  }

  const Origins* origins_;
};

}  // namespace

void add_train_options(CLI::App* cmd, TrainConfig* cfg) {
  GptConfig& m = cfg->model;
  // As with Megatron's argparse, a flag given twice takes its last value (scripts append overrides).
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // Shows the bound value as the default; the two derived defaults say so in their help instead.
  auto opt = [cmd](const char* group, const char* name, auto& var, const char* help) {
    return cmd->add_option(name, var, help)->capture_default_str()->group(group);
  };
  const char* model = "Model";
  opt(model, "--num-layers", m.num_layers, "Transformer layers");
  opt(model, "--hidden-size", m.hidden_size, "Hidden size (width of the residual stream)");
  opt(model, "--num-attention-heads", m.num_attention_heads,
      "Attention heads; must divide --hidden-size");
  opt(model, "--seq-length", m.seq_length, "Tokens per training sequence");
  cmd->add_option("--max-position-embeddings", m.max_position_embeddings,
                  "Learned position embeddings (default: --seq-length)")
      ->group(model);
  opt(model, "--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by,
      "Pad the vocabulary to a multiple of this");
  opt(model, "--init-method-std", m.init_method_std,
      "Standard deviation of the normal weight init");

  const char* batch = "Batch";
  opt(batch, "--micro-batch-size", cfg->micro_batch_size, "Sequences per forward/backward pass");
  cmd->add_option("--global-batch-size", cfg->global_batch_size,
                  "Sequences per optimizer step, a multiple of --micro-batch-size (default: "
                  "--micro-batch-size)")
      ->group(batch);

  const char* optim = "Optimizer and learning-rate schedule";
  opt(optim, "--lr", cfg->lr, "Peak learning rate (AdamW)");
  opt(optim, "--min-lr", cfg->min_lr, "Learning rate at the end of the decay");
  opt(optim, "--lr-decay-style", cfg->lr_decay_style, "constant, linear or cosine");
  opt(optim, "--lr-warmup-iters", cfg->lr_warmup_iters, "Warm-up iterations");
  opt(optim, "--lr-warmup-init", cfg->lr_warmup_init, "Learning rate at the start of the warm-up");
  opt(optim, "--lr-warmup-style", cfg->lr_warmup_style,
      "linear (Megatron) or log (DeepSpeed WarmupLR's default)");
  opt(optim, "--lr-decay-iters", cfg->lr_decay_iters,
      "Iterations to decay over (0: --train-iters)");
  opt(optim, "--train-iters", cfg->train_iters, "Optimizer steps to train for (required)");
  opt(optim, "--weight-decay", cfg->weight_decay, "Decoupled (AdamW) weight decay");
  opt(optim, "--adam-beta1", cfg->adam_beta1, "AdamW first-moment decay");
  opt(optim, "--adam-beta2", cfg->adam_beta2, "AdamW second-moment decay");
  opt(optim, "--adam-eps", cfg->adam_eps, "AdamW denominator epsilon");
  opt(optim, "--clip-grad", cfg->clip_grad,
      "Clip the global gradient norm to this (0: no clipping)");
  opt(optim, "--seed", cfg->seed, "Random seed of the initialisation and the data order");

  const char* data = "Data";
  opt(data, "--data-path", cfg->data_path,
      "Prefix of the PREFIX.bin/PREFIX.idx written by troupe preprocess");
  opt(data, "--split", cfg->split, "Train,validation,test weights over the documents");
  opt(data, "--tokenizer-type", cfg->tokenizer_type, "GPT2BPETokenizer or ByteLevelTokenizer");
  opt(data, "--vocab-file", cfg->vocab_file, "GPT-2 vocab.json (GPT2BPETokenizer)");
  opt(data, "--merge-file", cfg->merge_file, "GPT-2 merges.txt (GPT2BPETokenizer)");
  cmd->add_flag("--no-shuffle", cfg->no_shuffle, "Read the samples in order instead of shuffled")
      ->group(data);
  cmd->add_flag("--mock-data", cfg->mock_data,
                "Train on synthetic uniform random tokens (no --data-path; for benchmarks)")
      ->group(data);

  const char* ckpt = "Checkpoints";
  opt(ckpt, "--save", cfg->save, "Directory to save checkpoints to (created when first saving)");
  opt(ckpt, "--save-interval", cfg->save_interval, "Save every N iterations (0: only at the end)");
  opt(ckpt, "--exit-interval", cfg->exit_interval,
      "Stop (saving a checkpoint when --save is set) once the iteration is a multiple of N");
  opt(ckpt, "--load", cfg->load,
      "Directory to resume from (holds latest_checkpointed_iteration.txt)");

  const char* logs = "Evaluation and logging";
  opt(logs, "--eval-interval", cfg->eval_interval,
      "Evaluate on the validation split every N iterations");
  opt(logs, "--eval-iters", cfg->eval_iters, "Validation batches per evaluation");
  opt(logs, "--log-interval", cfg->log_interval, "Print progress every N iterations");
  opt(logs, "--metrics-file", cfg->metrics_file,
      "Append one JSON object per iteration to this file");
  opt(logs, "--num-threads", cfg->num_threads, "Compute threads (0: all cores)");
  opt(logs, "--deepspeed-config,--deepspeed_config", cfg->deepspeed_config,
      "DeepSpeed JSON file; flags given on the command line win over it");
  // Megatron-DeepSpeed scripts pass a bare --deepspeed switch next to the config file: accepted, and
  // meaningless here (troupe always runs its own ZeRO/offload engine).
  cmd->add_flag("--deepspeed")->description("Accepted for Megatron-DeepSpeed scripts; no effect")->group(logs);
}

Status finalize_train_config(const CLI::App& cmd, TrainConfig* cfg) {
  const GivenFn given = [&cmd](const char* flag) { return cmd.get_option(flag)->count() > 0; };
  Origins origins;
  bool global_from_file = false;
  if (given("--deepspeed-config")) {
    DeepSpeedMerger merger(given, cfg->deepspeed_config, cfg, &origins);
    TROUPE_RETURN_IF_ERROR(merger.merge());
    global_from_file = merger.set_global_batch();
  }
  if (!given("--max-position-embeddings"))
    cfg->model.max_position_embeddings = cfg->model.seq_length;
  if (!given("--global-batch-size") && !global_from_file)
    cfg->global_batch_size = cfg->micro_batch_size;
  return Validator(&origins).run(*cfg);
}

Status validate_train_config(const TrainConfig& cfg) {
  return Validator(nullptr).run(cfg);
}

}  // namespace troupe
