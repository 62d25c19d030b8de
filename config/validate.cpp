// validate_train_config and validate_world (config/validate.hpp): every setting of a TrainConfig
// checked before anything runs, each message naming the flag (or the DeepSpeed key it came from)
// and the fix.
#include "config/validate.hpp"

#include <fmt/format.h>
#include <unistd.h>  // access(W_OK): whether --save could be created later

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "storage/data_blend.hpp"
#include "storage/gpt_dataset.hpp"
#include "storage/hf_import.hpp"
#include "storage/tokenizer.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// For each flag whose value came from the DeepSpeed file: which key, in which file. Validation adds
// it to its message so the user fixes the file, not a flag they never passed.
using Origins = FlagOrigins;

// "a, b or c".
std::string join_with(const std::vector<std::string>& items, const std::string& last_separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? last_separator : ", ") + items[i];
  return out;
}

// -------------------------------------------------------------------------------------------------
// Validation. Each message: the flag, what is wrong, where the value came from if it was the file,
// then " -- " and the fix.
// -------------------------------------------------------------------------------------------------
class Validator {
 public:
  explicit Validator(const Origins* origins, GivenInCode given = {}) : origins_(origins), given_(given) {}

  // Every area's first problem at once (one run shows what to fix). The batch rules divide by the
  // model's and the layout's numbers, so they are checked only once those are valid.
  Status run(const TrainConfig& c) const {
    std::vector<Status> problems;
    auto check = [&](Status st) {
      const bool ok = st.is_ok();
      if (!ok) problems.push_back(std::move(st));
      return ok;
    };
    bool model_ok = check(given_.model_without_gpt_layers
                              ? positive("--seq-length", c.model.seq_length, "256")
                              : model_sizes(c.model));
    if (model_ok && !given_.model_without_gpt_layers)
      for (const std::string& p : c.model.architecture_problems()) model_ok = check(Status::error(p)) && model_ok;
    const bool shape = model_ok & check(parallel(c));
    if (shape) check(batch(c));
    check(optimizer(c));
    check(precision(c));
    check(schedule(c));
    check(data(c));
    check(checkpoints(c));
    check(offload_and_restarts(c));
    check(device(c));
    check(logging(c));
    if (problems.empty()) return Status::ok();
    if (problems.size() == 1) return problems[0];
    std::string message = fmt::format("{} problems:", problems.size());
    for (const Status& p : problems) message += "\n  - " + p.message();
    return Status::error(message);
  }

  // validate_world's checks; see its declaration.
  Status world(const TrainConfig& c, int world_size) const {
    if (world_size < 1)
      return Status::error(fmt::format(
          "troupe launch reported {} ranks -- start at least one (--nproc-per-node)", world_size));
    TROUPE_RETURN_IF_ERROR(sizes(c));  // so that the arithmetic below is defined
    TROUPE_RETURN_IF_ERROR(positive("--micro-batch-size", c.micro_batch_size, "4"));
    const int tp = c.tensor_model_parallel_size, pp = c.pipeline_model_parallel_size;
    const int dp = c.resolved_dp(world_size);
    const int64_t model_parallel = int64_t{tp} * pp;
    const int64_t needed = model_parallel * dp;
    if (needed != world_size) {
      const std::string dp_text =
          c.data_parallel_size > 0 ? fmt::format("--data-parallel-size {}", dp)
                                   : fmt::format("data-parallel {} (derived from the ranks)", dp);
      std::string fix;
      if (world_size % model_parallel == 0)
        fix = fmt::format(
            "set --data-parallel-size {} (or leave it out to derive it) or start "
            "{} ranks",
            world_size / model_parallel, needed);
      else
        fix = fmt::format(
            "start a multiple of --tensor-model-parallel-size x "
            "--pipeline-model-parallel-size = {} ranks (e.g. {}), or change those "
            "sizes",
            model_parallel, needed);
      return bad("--tensor-model-parallel-size",
                 fmt::format("{} x --pipeline-model-parallel-size {} x {} = {} ranks, but troupe "
                             "launch started {}",
                             tp, pp, dp_text, needed, world_size),
                 fix);
    }
    return batch_divisible(c, dp, fmt::format(" (troupe launch started {} ranks)", world_size));
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

  // The sizes every other check divides by; the rest of the architecture, every problem at once,
  // is GptConfig::architecture_problems (include/troupe/model_config.hpp).
  Status model_sizes(const GptConfig& m) const {
    TROUPE_RETURN_IF_ERROR(positive("--num-layers", m.num_layers, "4"));
    TROUPE_RETURN_IF_ERROR(positive("--hidden-size", m.hidden_size, "256"));
    TROUPE_RETURN_IF_ERROR(positive("--num-attention-heads", m.num_attention_heads, "4"));
    TROUPE_RETURN_IF_ERROR(positive("--seq-length", m.seq_length, "256"));
    return Status::ok();
  }

  Status batch(const TrainConfig& c) const {
    TROUPE_RETURN_IF_ERROR(positive("--micro-batch-size", c.micro_batch_size, "4"));
    TROUPE_RETURN_IF_ERROR(rampup(c));
    // In one process; under troupe launch validate_world checks the dp the ranks give.
    TROUPE_RETURN_IF_ERROR(batch_divisible(c, c.resolved_dp(1), ""));
    if (c.train_iters <= 0 && c.train_samples <= 0 && c.train_tokens <= 0)
      return bad("--train-iters", fmt::format("must be positive, got {}", c.train_iters),
                 "give --train-iters N (or Megatron's --train-samples, Megatron-DeepSpeed's --train-tokens)");
    if (c.train_iters <= 0)
      return bad(c.train_samples > 0 ? "--train-samples" : "--train-tokens",
                 fmt::format("gives no whole iteration of --global-batch-size {}", c.global_batch_size),
                 "train for at least one global batch");
    return Status::ok();
  }

  // Megatron's --rampup-batch-size (RampupBatchsizeNumMicroBatchesCalculator's assertions, and its
  // consistency check at every iteration: each batch of the ramp splits into whole micro-batches
  // per replica, i.e. START and INCREMENT are multiples of micro x dp). Megatron's validate_args
  // also refuses a ramp-up in an iteration-based run, which its own
  // examples/gpt3/train_gpt3_175b_distributed.sh asks for; troupe runs it (a start-up note says so).
  static constexpr int64_t kMaxRampIterations = 100'000'000;
  Status rampup(const TrainConfig& c) const {
    if (!c.rampup() && c.rampup_batch_increment == 0 && c.rampup_samples == 0) return Status::ok();
    if (c.rampup_start_batch <= 0 || c.rampup_batch_increment <= 0 || c.rampup_samples < 0)
      return bad("--rampup-batch-size",
                 fmt::format("is {} {} {}; START and INCREMENT must be positive, SAMPLES >= 0", c.rampup_start_batch,
                             c.rampup_batch_increment, c.rampup_samples),
                 "give e.g. --rampup-batch-size 16 16 5859375 (start, increment, ramp-up samples)");
    if (c.rampup_samples / c.rampup_start_batch > kMaxRampIterations)
      return bad("--rampup-batch-size",
                 fmt::format("ramps up over {} samples from batches of {}: more than {} iterations", c.rampup_samples,
                             c.rampup_start_batch, kMaxRampIterations),
                 "start from a larger batch or ramp over fewer samples");
    const int64_t diff = c.global_batch_size - c.rampup_start_batch;
    if (diff < 0 || diff % c.rampup_batch_increment != 0)
      return bad("--rampup-batch-size",
                 fmt::format("starts at {}, which does not reach --global-batch-size {} in steps of {}",
                             c.rampup_start_batch, c.global_batch_size, c.rampup_batch_increment),
                 "make --global-batch-size - START a multiple of INCREMENT (and START <= --global-batch-size)");
    return Status::ok();
  }

  Status rampup_divisible(const TrainConfig& c, int64_t step, const std::string& ranks) const {
    if (!c.rampup() || c.rampup_batch_increment <= 0) return Status::ok();
    if (c.rampup_start_batch % step == 0 && c.rampup_batch_increment % step == 0) return Status::ok();
    return bad("--rampup-batch-size",
               fmt::format("{} {} {}: its batches are not all multiples of --micro-batch-size {} x the data-parallel "
                           "size ({}){}",
                           c.rampup_start_batch, c.rampup_batch_increment, c.rampup_samples, c.micro_batch_size, step,
                           ranks),
               fmt::format("make START and INCREMENT multiples of {}", step));
  }

  // The global batch splits into whole micro-batches on each of `dp` data-parallel replicas.
  // `ranks`: appended to the message when the dp comes from troupe launch.
  Status batch_divisible(const TrainConfig& c, int dp, const std::string& ranks) const {
    const int64_t step = int64_t{c.micro_batch_size} * dp;
    if (c.global_batch_size > 0 && c.global_batch_size % step == 0) return rampup_divisible(c, step, ranks);
    if (dp == 1)
      return bad("--global-batch-size",
                 fmt::format("{} is not a positive multiple of --micro-batch-size {}",
                             c.global_batch_size, c.micro_batch_size),
                 "make it micro batch size times the gradient accumulation steps");
    const int64_t example = std::max<int64_t>(1, (c.global_batch_size + step - 1) / step) * step;
    return bad("--global-batch-size",
               fmt::format("{} is not a positive multiple of --micro-batch-size {} x {} = {}{}",
                           c.global_batch_size, c.micro_batch_size,
                           ranks.empty() ? fmt::format("--data-parallel-size {}", dp)
                                         : fmt::format("data-parallel size {}", dp),
                           step, ranks),
               fmt::format("make it micro batch size x data-parallel size x the gradient "
                           "accumulation steps, e.g. {}",
                           example));
  }

  // Tensor, pipeline and data parallelism, ZeRO, recomputation. Megatron's rules
  // (megatron/training/arguments.py) unless a comment says otherwise.
  Status parallel(const TrainConfig& c) const {
    const GptConfig& m = c.model;
    const int tp = c.tensor_model_parallel_size;
    TROUPE_RETURN_IF_ERROR(sizes(c));

    // Each tensor-parallel rank holds whole heads and whole key/value groups (Megatron-Core also
    // replicates groups over tp > groups; troupe does not), and an equal share of the MLP's width
    // and of the model width (the row-parallel inputs); the vocabulary is padded to a multiple of
    // tp (GptConfig::padded_vocab_size). Every layout problem at once.
    std::vector<std::string> split;
    const int groups = m.num_query_groups;
    if (groups > 0 && m.num_attention_heads % groups == 0 && groups % tp != 0)
      split.push_back(bad("--num-query-groups",
                          fmt::format("{} is not divisible by --tensor-model-parallel-size {}", groups, tp),
                          "each tensor-parallel rank holds whole key/value groups: use a group count that is a "
                          "multiple of the tensor-parallel size, or a smaller --tensor-model-parallel-size")
                          .message());
    const int ffn = m.ffn_hidden_size();
    if (ffn > 0 && ffn % tp != 0)
      split.push_back(bad("--ffn-hidden-size",
                          fmt::format("{} is not divisible by --tensor-model-parallel-size {}", ffn, tp),
                          "each tensor-parallel rank holds an equal share of the MLP: use a multiple of the "
                          "tensor-parallel size")
                          .message());
    if (!split.empty() && m.num_attention_heads % tp == 0) {
      if (split.size() == 1) return Status::error(split[0]);
      std::string message = split[0];
      for (size_t i = 1; i < split.size(); ++i) message += "\n  " + split[i];
      return Status::error(message);
    }
    if (m.num_attention_heads % tp != 0) {
      int divisor = tp;
      while (m.num_attention_heads % divisor != 0) --divisor;
      return bad("--num-attention-heads",
                 fmt::format("{} is not divisible by --tensor-model-parallel-size {}",
                             m.num_attention_heads, tp),
                 fmt::format("each tensor-parallel rank holds whole heads: use a head count that "
                             "is a multiple of {}, or --tensor-model-parallel-size {}",
                             tp, divisor));
    }
    // Megatron turns sequence parallelism off with tp 1 (finalize_train_config does too); it
    // splits each micro-batch's tokens over the tensor-parallel ranks.
    if (c.sequence_parallel && tp > 1 && int64_t{c.micro_batch_size} * m.seq_length < tp)
      return bad("--sequence-parallel",
                 fmt::format("splits the --micro-batch-size {} x --seq-length {} = {} tokens of a "
                             "micro-batch over --tensor-model-parallel-size {} ranks, fewer tokens "
                             "than ranks",
                             c.micro_batch_size, m.seq_length,
                             int64_t{c.micro_batch_size} * m.seq_length, tp),
                 "use longer sequences or a larger micro batch, or drop --sequence-parallel");

    TROUPE_RETURN_IF_ERROR(pipeline(c));

    if (c.zero_stage < 0 || c.zero_stage > 3)
      return bad("--zero-stage", fmt::format("is {}; ZeRO stages are 0 to 3", c.zero_stage),
                 "use 0 (off), 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters)");
    const std::string& r = c.recompute_granularity;
    if (r != "none" && r != "full" && r != "selective")
      return bad("--recompute-granularity", "is \"" + r + "\"",
                 "use full or selective, or leave the flag out for no recomputation");
    return Status::ok();
  }

  Status sizes(const TrainConfig& c) const {
    TROUPE_RETURN_IF_ERROR(
        positive("--tensor-model-parallel-size", c.tensor_model_parallel_size, "1"));
    TROUPE_RETURN_IF_ERROR(
        positive("--pipeline-model-parallel-size", c.pipeline_model_parallel_size, "1"));
    if (c.data_parallel_size < 0)
      return bad("--data-parallel-size", fmt::format("must be >= 0, got {}", c.data_parallel_size),
                 "use 0 to derive it from the ranks troupe launch starts (1 in one process)");
    return Status::ok();
  }

  Status pipeline(const TrainConfig& c) const {
    const int layers = c.model.num_layers, pp = c.pipeline_model_parallel_size;
    const int chunk = c.num_layers_per_virtual_pipeline_stage;
    const std::string& schedule = c.pipeline_schedule;
    if (schedule != "1f1b" && schedule != "gpipe" && schedule != "interleaved" &&
        schedule != "zb-h1")
      return bad("--pipeline-schedule", "is \"" + schedule + "\"",
                 "use one of 1f1b, gpipe, interleaved, zb-h1");
    if (schedule != "interleaved") {
      if (chunk != 0)
        return bad("--num-layers-per-virtual-pipeline-stage",
                   fmt::format("{} is only used by --pipeline-schedule interleaved, but the "
                               "schedule is {}",
                               chunk, schedule),
                   "drop --num-layers-per-virtual-pipeline-stage, or drop --pipeline-schedule "
                   "(the flag alone selects interleaved, as in Megatron)");
      // Megatron requires num_layers % pp == 0; troupe's stages may hold unequal numbers of
      // layers, but not none.
      if (layers < pp)
        return bad("--pipeline-model-parallel-size",
                   fmt::format("{} is more than --num-layers {}: every pipeline stage needs at "
                               "least one layer",
                               pp, layers),
                   fmt::format("use at most {} stages, or more layers", layers));
      return Status::ok();
    }

    // Interleaved: each of the pp stages holds v >= 2 model chunks of `chunk` layers.
    if (pp < 2)
      return bad(
          "--pipeline-schedule",
          fmt::format("interleaved needs --pipeline-model-parallel-size 2 or more, got {}", pp),
          "use more pipeline stages, or another --pipeline-schedule without "
          "--num-layers-per-virtual-pipeline-stage");
    std::vector<std::string> valid;  // every chunk size that works, for the fix
    for (int n = 1; int64_t{2} * pp * n <= layers; ++n)
      if (layers % (pp * n) == 0) valid.push_back(std::to_string(n));
    const std::string fix =
        valid.empty() ? fmt::format(
                            "no chunk size works for --num-layers {} over {} stages: make "
                            "--num-layers a multiple of {} and at least {}, or use "
                            "--pipeline-schedule 1f1b",
                            layers, pp, pp, 2 * pp)
                      : fmt::format(
                            "use --num-layers-per-virtual-pipeline-stage {} (every stage then "
                            "holds 2 or more chunks)",
                            join_with(valid, " or "));
    if (chunk <= 0)
      return bad("--pipeline-schedule",
                 fmt::format("interleaved needs --num-layers-per-virtual-pipeline-stage N > 0 "
                             "(layers per model chunk), got {}",
                             chunk),
                 fix);
    if (layers % (int64_t{pp} * chunk) != 0)
      return bad("--num-layers-per-virtual-pipeline-stage",
                 fmt::format("{} does not split --num-layers {} evenly over "
                             "--pipeline-model-parallel-size {} stages ({} is not a multiple of "
                             "{} x {} = {})",
                             chunk, layers, pp, layers, pp, chunk, int64_t{pp} * chunk),
                 fix);
    if (layers / (pp * chunk) < 2)
      return bad("--num-layers-per-virtual-pipeline-stage",
                 fmt::format("{} leaves 1 model chunk per pipeline stage (--num-layers {} / "
                             "(--pipeline-model-parallel-size {} x {})); interleaving needs 2 "
                             "or more",
                             chunk, layers, pp, chunk),
                 fix);
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

  // The loss scaling's settings (include/troupe/precision.hpp; engine/loss_scaler.hpp runs them).
  // Checked whatever the type, as Megatron's argparse reads them whatever the type. Megatron's
  // DynamicGradScaler asserts min_scale <= initial_scale; DeepSpeed's DynamicLossScaler asserts
  // nothing (a min above the initial scale lifts the scale at the first halving), so that rule is
  // Megatron's recipe's only.
  Status precision(const TrainConfig& c) const {
    const PrecisionConfig& p = c.precision;
    if (!(p.loss_scale >= 0) || !std::isfinite(p.loss_scale))
      return bad("--loss-scale", fmt::format("must be >= 0, got {}", p.loss_scale),
                 "give a static scale such as 1024, or leave it out (0) for dynamic loss scaling");
    if (!(p.initial_loss_scale > 0) || !std::isfinite(p.initial_loss_scale))
      return bad("--initial-loss-scale", fmt::format("must be positive, got {}", p.initial_loss_scale),
                 "use e.g. 4294967296 (2^32, Megatron's default)");
    if (!(p.min_loss_scale > 0) || !std::isfinite(p.min_loss_scale))
      return bad("--min-loss-scale", fmt::format("must be positive, got {}", p.min_loss_scale), "use e.g. 1");
    if (p.loss_scale_window < 1)
      return bad("--loss-scale-window", fmt::format("must be at least 1, got {}", p.loss_scale_window),
                 "use e.g. 1000 (clean steps before the scale doubles)");
    if (p.hysteresis < 1)
      return bad("--hysteresis", fmt::format("must be at least 1, got {}", p.hysteresis),
                 "use e.g. 2 (overflows before the scale halves)");
    if (p.dynamic_loss_scaling() && p.recipe == PrecisionRecipe::megatron && p.min_loss_scale > p.initial_loss_scale)
      return bad("--min-loss-scale",
                 fmt::format("{} is above --initial-loss-scale {}", p.min_loss_scale, p.initial_loss_scale),
                 "make the minimum at most the initial scale (Megatron asserts it)");
    PrecisionDType ignored = PrecisionDType::fp32;
    if (!p.communication_data_type.empty() && !parse(p.communication_data_type, ignored))
      return bad("communication_data_type", "is \"" + p.communication_data_type + "\"", "use fp16, bf16 or fp32");
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
    TROUPE_RETURN_IF_ERROR(schedule_units(c));
    const TrainConfig::LrLengths l = c.lr_lengths();
    if (c.lr_decay_tokens <= 0 && style != "constant" && l.warmup_samples >= l.decay_samples) {
      if (c.train_samples > 0 || c.lr_warmup_fraction >= 0)
        return bad(c.lr_warmup_fraction >= 0 ? "--lr-warmup-fraction" : "--lr-warmup-samples",
                   fmt::format("gives a warm-up of {} samples, not below the decay's {}", l.warmup_samples,
                               l.decay_samples),
                   "shorten the warm-up, lengthen the decay, or use --lr-decay-style constant");
      const int64_t decay = c.lr_decay_iters > 0 ? c.lr_decay_iters : c.train_iters;
      return bad("--lr-warmup-iters",
                 fmt::format("{} is not below the {} decay iterations ({})", c.lr_warmup_iters,
                             decay, c.lr_decay_iters > 0 ? "--lr-decay-iters" : "--train-iters"),
                 "shorten the warm-up, lengthen the decay, or use --lr-decay-style constant");
    }
    return Status::ok();
  }

  // Megatron's rules for the units of a run and its schedule (megatron/training/arguments.py,
  // validate_args): an iteration-based run measures its schedule in iterations, a sample-based one
  // in samples; one warm-up length at most; Megatron-DeepSpeed's token lengths on top.
  Status schedule_units(const TrainConfig& c) const {
    const bool by_samples = c.train_samples > 0;
    if (c.train_samples < 0 || c.lr_warmup_samples < 0 || c.lr_decay_samples < 0 || c.train_tokens < 0 ||
        c.lr_decay_tokens < 0 || c.lr_warmup_tokens < -1)
      return bad("the sample and token flags", "hold a negative count", "give counts of 0 or more");
    if (!by_samples && (c.lr_warmup_samples > 0 || c.lr_decay_samples > 0))
      return bad(c.lr_decay_samples > 0 ? "--lr-decay-samples" : "--lr-warmup-samples",
                 "is given in an iteration-based run (no --train-samples)",
                 "give --lr-decay-iters / --lr-warmup-iters, or train by --train-samples");
    if (by_samples && (c.lr_warmup_iters > 0 || c.lr_decay_iters > 0))
      return bad(c.lr_decay_iters > 0 ? "--lr-decay-iters" : "--lr-warmup-iters",
                 "is given in a sample-based run (--train-samples)",
                 "give --lr-decay-samples / --lr-warmup-samples, or train by --train-iters");
    if (c.lr_warmup_fraction >= 0 && (c.lr_warmup_iters > 0 || c.lr_warmup_samples > 0))
      return bad("--lr-warmup-fraction", "is given with another warm-up length",
                 "give one of --lr-warmup-fraction, --lr-warmup-iters and --lr-warmup-samples");
    if (c.lr_warmup_fraction != -1 && !(c.lr_warmup_fraction >= 0 && c.lr_warmup_fraction < 1))
      return bad("--lr-warmup-fraction", fmt::format("must be in [0, 1), got {}", c.lr_warmup_fraction),
                 "use e.g. .01");
    const bool tokens = c.lr_warmup_tokens >= 0 || c.lr_decay_tokens > 0;
    if (c.lr_warmup_style == "log" && (by_samples || c.lr_warmup_fraction >= 0 || tokens))
      return bad("--lr-warmup-style", "is log (DeepSpeed's, counted in steps) with a sample- or token-based warm-up",
                 "use --lr-warmup-style linear, or --lr-warmup-iters");
    if (c.lr_decay_tokens > 0 && c.lr_decay_style != "constant") {
      const TrainConfig::LrLengths l = c.lr_lengths();
      if (c.lr_warmup_tokens < 0 && l.warmup_samples > 0 &&
          std::fmod(l.warmup_samples, static_cast<double>(c.global_batch_size)) != 0)
        return bad("--lr-decay-tokens",
                   fmt::format("with a warm-up of {} samples, not whole global batches of {}", l.warmup_samples,
                               c.global_batch_size),
                   "give --lr-warmup-tokens too (Megatron-DeepSpeed takes the tokens consumed when the warm-up "
                   "ends, which it never reaches exactly here)");
      const double w = c.lr_warmup_tokens >= 0 ? static_cast<double>(c.lr_warmup_tokens)
                                               : l.warmup_samples * c.model.seq_length;
      if (w >= static_cast<double>(c.lr_decay_tokens))
        return bad("--lr-decay-tokens", fmt::format("{} is not above the warm-up's {} tokens", c.lr_decay_tokens, w),
                   "lengthen the decay or shorten the warm-up");
    }
    return Status::ok();
  }

  // Megatron's rule (arguments.py): one data source, --mock-data, --data-path or the per-split
  // paths; each a blend (storage/data_blend.hpp) whose datasets exist. Every problem at once.
  // A DataSource given in code is the run's data: a config that also names some would leave one of
  // the two unused, so it is refused rather than guessed.
  Status no_data_named(const TrainConfig& c) const {
    if (c.mock_data)
      return bad("--mock-data", "is set, but a DataSource was given in code (the run's data)",
                 "drop mock_data, or pass no DataSource (null) to train on mock data");
    for (const auto* paths : {&c.data_path, &c.train_data_path, &c.valid_data_path, &c.test_data_path})
      if (blend_given(*paths))
        return bad(paths == &c.data_path ? "--data-path" : paths == &c.train_data_path ? "--train-data-path"
                                       : paths == &c.valid_data_path ? "--valid-data-path" : "--test-data-path",
                   "names datasets, but a DataSource was given in code (the run's data)",
                   "clear the config's data paths, or pass no DataSource (null) to open what the config names");
    return Status::ok();
  }

  Status data_paths(const TrainConfig& c) const {
    const bool per_split =
        blend_given(c.train_data_path) || blend_given(c.valid_data_path) || blend_given(c.test_data_path);
    const bool data_path = blend_given(c.data_path);
    const int sources = int{c.mock_data} + int{data_path} + int{per_split};
    if (sources > 1)
      return bad(c.mock_data ? "--mock-data" : "--data-path",
                 std::string("and ") +
                     (c.mock_data && data_path ? "--data-path" : "--train/valid/test-data-path") +
                     " are both given (Megatron: a single data source)",
                 "drop all but one: --mock-data (synthetic tokens), --data-path (datasets split by --split), or "
                 "--train-data-path with --valid-data-path / --test-data-path (a blend per split)");
    if (c.mock_data) return Status::ok();
    if (sources == 0)
      return bad("--data-path", "is required",
                 "run `troupe preprocess` first and pass its output prefix (PREFIX of PREFIX.bin and PREFIX.idx), "
                 "or a blend: --data-path 0.3 a_text_document 0.7 b_text_document");
    std::vector<std::string> problems;
    const std::pair<const char*, const std::vector<std::string>*> lists[] = {
        {"--data-path", &c.data_path},
        {"--train-data-path", &c.train_data_path},
        {"--valid-data-path", &c.valid_data_path},
        {"--test-data-path", &c.test_data_path}};
    for (const auto& [flag, items] : lists) {
      auto blend = parse_data_blend(*items, flag);
      if (!blend) {
        problems.push_back(blend.status().message());
        continue;
      }
      std::error_code ec;
      for (const std::string& prefix : blend->prefixes) {
        std::string missing;
        for (const char* ext : {".bin", ".idx"})
          if (!fs::is_regular_file(prefix + ext, ec)) missing += std::string(missing.empty() ? "" : " and ") + prefix + ext;
        if (!missing.empty())
          problems.push_back(std::string(flag) + " " + prefix + ": " + missing + " not found -- run `troupe "
                             "preprocess` first, and pass the prefix it wrote (without .bin/.idx)");
      }
    }
    if (per_split && !blend_given(c.train_data_path))
      problems.push_back("--valid-data-path / --test-data-path without --train-data-path -- give the training "
                         "datasets with --train-data-path, or use --data-path with --split");
    // The data loader's own parser (Megatron's rule), so both accept exactly the same strings;
    // Megatron ignores --split with per-split paths.
    if (data_path)
      if (auto parsed = split_document_indices(1, c.split); !parsed) problems.push_back(parsed.status().message());
    if (problems.empty()) return Status::ok();
    std::string message = problems[0];
    for (size_t i = 1; i < problems.size(); ++i) message += "\n  " + problems[i];
    return Status::error(message);
  }

  Status data(const TrainConfig& c) const {
    TROUPE_RETURN_IF_ERROR(given_.data ? no_data_named(c) : data_paths(c));
    if (c.mock_data) return Status::ok();
    std::error_code ec;
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
    } else if (tokenizer_uses_model(c.tokenizer_type)) {
      if (c.tokenizer_model.empty())
        return bad("--tokenizer-model", "is required by --tokenizer-type " + c.tokenizer_type,
                   c.tokenizer_type == "HuggingFaceTokenizer"
                       ? "pass the folder holding tokenizer.json (or the file), the one the data was preprocessed with"
                       : "pass the SentencePiece model file the data was preprocessed with");
      if (!fs::exists(c.tokenizer_model, ec)) return bad("--tokenizer-model", c.tokenizer_model + " not found", "check the path");
    } else if (c.tokenizer_type != "ByteLevelTokenizer") {
      return bad("--tokenizer-type", "is \"" + c.tokenizer_type + "\"",
                 std::string("use one of ") + kTokenizerTypes + ", the one the data was preprocessed with");
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
    if (c.override_opt_param_scheduler && c.use_checkpoint_opt_param_scheduler)
      return bad("--override-opt_param-scheduler", "and --use-checkpoint-opt_param-scheduler are both given",
                 "keep one: this run's schedule wins (override) or the checkpoint's (use-checkpoint)");
    if (!(c.exit_duration_in_mins >= 0) || !std::isfinite(c.exit_duration_in_mins))
      return bad("--exit-duration-in-mins", fmt::format("must be a non-negative number, got {}", c.exit_duration_in_mins),
                 "use 0 to train to --train-iters");
    if (c.max_saves_in_flight < 1 || c.max_saves_in_flight > 64)
      return bad("--max-saves-in-flight", fmt::format("must be 1 to 64, got {}", c.max_saves_in_flight),
                 "use 1 (the default): each save holds a host copy of this process's shards until written");
    if (!c.save.empty()) TROUPE_RETURN_IF_ERROR(creatable_directory("--save", c.save));
    if (!c.load.empty()) {
      std::error_code ec;
      if (!fs::is_directory(c.load, ec))
        return bad(
            "--load", c.load + " is not a directory",
            "pass the --save directory of an earlier run, or drop --load to start from scratch");
      if (!fs::is_regular_file(fs::path(c.load) / "latest_checkpointed_iteration.txt", ec) && !is_hf_folder(c.load))
        return bad(
            "--load",
            c.load + " has no latest_checkpointed_iteration.txt, so no finished checkpoint",
            "pass the --save directory of a run that saved, or drop --load to start from scratch");
    }
    return Status::ok();
  }

  // --device: cpu, or cuda (one process per GPU under troupe launch; every layout: docs/CUDA.md).
  Status device(const TrainConfig& c) const {
    if (c.device != "cpu" && c.device != "cuda")
      return bad("--device", "is \"" + c.device + "\"", "use cpu or cuda");
    return Status::ok();
  }

  Status offload_and_restarts(const TrainConfig& c) const {
    const std::string& device = c.offload_optimizer;
    if (device != "none" && device != "cpu" && device != "nvme")
      return bad("--offload-optimizer", "is \"" + device + "\"",
                 "use cpu (host memory pool) or nvme (files under --offload-path), or none");
    if (device == "nvme") {
      if (c.offload_path.empty())
        return bad("--offload-optimizer", "is nvme but no --offload-path is given",
                   "add --offload-path DIR, a directory on a fast local disk for the swap files");
      std::error_code ec;
      if (!fs::is_directory(c.offload_path, ec))
        return bad("--offload-path", c.offload_path + " is not a directory",
                   "create it (mkdir -p) on a fast local disk, or give another directory");
      if (::access(c.offload_path.c_str(), W_OK | X_OK) != 0)
        return bad("--offload-path", c.offload_path + " is not writable by this user",
                   "give a directory you can write to");
    } else if (!c.offload_path.empty()) {
      return bad("--offload-path", "is only used by --offload-optimizer nvme, but that is " + device,
                 "add --offload-optimizer nvme, or drop --offload-path");
    }
    if (c.max_restarts < 0)
      return bad("--max-restarts", fmt::format("must be >= 0, got {}", c.max_restarts),
                 "use 0 to stop at the first failure");
    if (!(c.distributed_timeout_minutes > 0))
      return bad("--distributed-timeout-minutes", fmt::format("must be positive, got {}", c.distributed_timeout_minutes),
                 "use e.g. 10 (Megatron's default)");
    if (!c.inspect.empty() && !parse_inspect_address(c.inspect))
      return bad("--inspect", "is \"" + c.inspect + "\", not [HOST:]PORT with a port from 0 to 65535",
                 "use e.g. --inspect 0 (loopback, a free port) or --inspect 0.0.0.0:29600");
    if (!c.dashboard.empty() && !parse_inspect_address(c.dashboard))
      return bad("--dashboard", "is \"" + c.dashboard + "\", not [HOST:]PORT with a port from 0 to 65535",
                 "use e.g. --dashboard 0 (loopback, a free port) or --dashboard 0.0.0.0:8080");
    if (c.inspect.empty() && c.dashboard.empty() && !c.inspect_file.empty())
      return bad("--inspect-file", "is only used with --inspect or --dashboard",
                 "add --inspect 0, or drop --inspect-file");
    if (!(c.inspect_stall_seconds >= 0) || !std::isfinite(c.inspect_stall_seconds))
      return bad("--inspect-stall-seconds", fmt::format("must be >= 0, got {}", c.inspect_stall_seconds),
                 "use 0 for the default (the smaller of 60 s and half of --distributed-timeout-minutes)");
    if (c.max_restarts > 0 && c.save.empty())
      return bad("--max-restarts",
                 fmt::format("is {}, but without --save there is no checkpoint to restart from",
                             c.max_restarts),
                 "add --save DIR and --save-interval N (restarts resume from the latest checkpoint)");
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
    TROUPE_RETURN_IF_ERROR(output_file("--metrics-file", c.metrics_file, "metrics.jsonl"));
    TROUPE_RETURN_IF_ERROR(output_file("--timeline", c.timeline, "timeline.json"));
    return tensorboard(c.tensorboard);
  }

  Status tensorboard(const TensorBoardConfig& t) const {
    TROUPE_RETURN_IF_ERROR(positive("--tensorboard-log-interval", t.log_interval, "1"));
    TROUPE_RETURN_IF_ERROR(positive("--tensorboard-queue-size", t.queue_size, "1000"));
    return t.dir.empty() ? Status::ok() : creatable_directory("--tensorboard-dir", t.dir);
  }

  // A file written later: not a directory, and its directory exists. Nothing is created here.
  Status output_file(const std::string& flag, const std::string& path,
                     const std::string& example) const {
    if (path.empty()) return Status::ok();
    std::error_code ec;
    if (fs::is_directory(path, ec))
      return bad(flag, path + " is a directory", "name a file, e.g. " + example);
    fs::path dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    if (!fs::is_directory(dir, ec))
      return bad(flag, "directory " + dir.string() + " does not exist",
                 "create it first or choose a file in an existing directory");
    return Status::ok();
  }

  const Origins* origins_;
  GivenInCode given_;
};

}  // namespace

Status validate_train_config(const TrainConfig& cfg, const FlagOrigins* origins, const GivenInCode& given) {
  return Validator(origins, given).run(cfg);
}

Status validate_world(const TrainConfig& cfg, int world_size) {
  return Validator(nullptr).world(cfg, world_size);
}

std::optional<InspectAddress> parse_inspect_address(const std::string& text) {
  InspectAddress a;
  std::string port = text;
  a.host = "127.0.0.1";
  if (!text.empty() && text.front() == '[') {  // [v6]:port
    const size_t close = text.find("]:");
    if (close == std::string::npos || close == 1) return std::nullopt;
    a.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    if (colon == 0 || text.find(':') != colon) return std::nullopt;
    a.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  a.port = std::stoi(port);
  if (a.port > 65535) return std::nullopt;
  for (char ch : a.host)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == ':' || ch == '-')) return std::nullopt;
  return a;
}

}  // namespace troupe
