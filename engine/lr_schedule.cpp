#include "engine/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace troupe {

StepRequest optimizer_step(const TrainConfig& c, int64_t iteration, int64_t consumed_samples) {
  StepRequest req;
  req.step = iteration + 1;
  req.lr = learning_rate(c, iteration, consumed_samples);
  req.weight_decay = c.weight_decay;
  req.beta1 = c.adam_beta1;
  req.beta2 = c.adam_beta2;
  req.eps = c.adam_eps;
  req.clip_grad = c.clip_grad;
  req.params_norm = c.log_params_norm;
  req.zeros_in_grad = c.log_num_zeros_in_grad;
  return req;
}

double learning_rate(const TrainConfig& c, int64_t iteration, int64_t consumed_samples) {
  TROUPE_CHECK(iteration >= 0,
               "the iteration is the number of optimizer steps taken, never negative");
  TROUPE_CHECK(c.lr_warmup_iters >= 0, "validate_train_config rejects a negative --lr-warmup-iters");
  const double delta = c.lr - c.lr_warmup_init;
  // DeepSpeed's WarmupLR counts steps: the log warm-up stays in iterations.
  if (c.lr_warmup_style == "log") {
    const int64_t warmup = c.lr_warmup_iters;
    if (warmup > 0 && iteration <= warmup) {
      TROUPE_CHECK(warmup >= 2,
                   "ln(1) = 0: the log warm-up needs at least 2 steps (DeepSpeed uses max(2, W))");
      // ln(max(iteration, 1)): the first two steps both run at init, as in DeepSpeed (see the
      // header).
      const double it = static_cast<double>(std::max<int64_t>(iteration, 1));
      return c.lr_warmup_init + delta * std::log(it) / std::log(static_cast<double>(warmup));
    }
  } else {
    TROUPE_CHECK(c.lr_warmup_style == "linear", "lr_warmup_style must be linear or log");
  }
  // Megatron's scheduler counts samples (and Megatron-DeepSpeed's tokens): the ones consumed
  // before this step (with --rampup-batch-size, the ramp's batches). Exact in double up to 2^53.
  const TrainConfig::LrLengths l = c.lr_lengths();
  const double samples =
      static_cast<double>(consumed_samples >= 0 ? consumed_samples : c.samples_after(iteration));
  const double tokens = samples * static_cast<double>(c.model.seq_length);
  if (c.lr_warmup_style == "linear") {
    if (l.warmup_tokens >= 0) {
      if (l.warmup_tokens > 0 && tokens <= l.warmup_tokens) return c.lr_warmup_init + delta * tokens / l.warmup_tokens;
    } else if (l.warmup_samples > 0 && samples <= l.warmup_samples) {
      return c.lr_warmup_init + delta * samples / l.warmup_samples;
    }
  }

  if (c.lr_decay_style == "constant") return c.lr;

  double ratio = 0;
  if (l.decay_tokens > 0) {
    if (tokens > l.decay_tokens) return c.min_lr;
    // A warm-up counted in samples ends after warmup_samples / global batch iterations, having
    // consumed warmup_samples x seq_length tokens (validation: whole batches).
    const double w = l.warmup_tokens >= 0 ? l.warmup_tokens : l.warmup_samples * c.model.seq_length;
    TROUPE_CHECK(l.decay_tokens > w, "a decaying schedule needs a decay longer than its warm-up");
    ratio = (tokens - w) / (l.decay_tokens - w);
  } else {
    if (samples > l.decay_samples) return c.min_lr;
    TROUPE_CHECK(l.decay_samples > l.warmup_samples,
                 "a decaying schedule needs more decay iterations than warm-up iterations");
    ratio = (samples - l.warmup_samples) / (l.decay_samples - l.warmup_samples);  // in [0, 1]
  }
  double coeff = 0.0;
  if (c.lr_decay_style == "linear") {
    coeff = 1.0 - ratio;
  } else {
    TROUPE_CHECK(c.lr_decay_style == "cosine", "lr_decay_style must be constant, linear or cosine");
    coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  }
  return c.min_lr + coeff * (c.lr - c.min_lr);
}

}  // namespace troupe
