#include "engine/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace troupe {

StepRequest optimizer_step(const TrainConfig& c, int64_t iteration) {
  StepRequest req;
  req.step = iteration + 1;
  req.lr = learning_rate(c, iteration);
  req.weight_decay = c.weight_decay;
  req.beta1 = c.adam_beta1;
  req.beta2 = c.adam_beta2;
  req.eps = c.adam_eps;
  req.clip_grad = c.clip_grad;
  return req;
}

double learning_rate(const TrainConfig& c, int64_t iteration) {
  TROUPE_CHECK(iteration >= 0,
               "the iteration is the number of optimizer steps taken, never negative");
  const int64_t warmup = c.lr_warmup_iters;
  TROUPE_CHECK(warmup >= 0, "validate_train_config rejects a negative --lr-warmup-iters");

  if (warmup > 0 && iteration <= warmup) {
    const double delta = c.lr - c.lr_warmup_init;
    if (c.lr_warmup_style == "log") {
      TROUPE_CHECK(warmup >= 2,
                   "ln(1) = 0: the log warm-up needs at least 2 steps (DeepSpeed uses max(2, W))");
      // ln(max(iteration, 1)): the first two steps both run at init, as in DeepSpeed (see the
      // header).
      const double it = static_cast<double>(std::max<int64_t>(iteration, 1));
      return c.lr_warmup_init + delta * std::log(it) / std::log(static_cast<double>(warmup));
    }
    TROUPE_CHECK(c.lr_warmup_style == "linear", "lr_warmup_style must be linear or log");
    return c.lr_warmup_init + delta * static_cast<double>(iteration) / static_cast<double>(warmup);
  }

  if (c.lr_decay_style == "constant") return c.lr;

  const int64_t decay = c.lr_decay_iters > 0 ? c.lr_decay_iters : c.train_iters;
  TROUPE_CHECK(decay > warmup,
               "a decaying schedule needs more decay iterations than warm-up iterations");
  if (iteration > decay) return c.min_lr;

  const double ratio =
      static_cast<double>(iteration - warmup) / static_cast<double>(decay - warmup);  // in [0, 1]
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
