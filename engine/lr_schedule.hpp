// The learning rate of each optimizer step: Megatron's OptimizerParamScheduler (warm-up, then
// constant, linear or cosine decay down to min_lr) with DeepSpeed's logarithmic warm-up as a second
// warm-up style.
//
// `iteration` counts the optimizer steps already taken (0 for the first step). With W =
// lr_warmup_iters, D = lr_decay_iters (train_iters when 0), init = lr_warmup_init:
//
//   W > 0, iteration <= W   linear (Megatron):  init + (lr - init) * iteration / W
//                           log (DeepSpeed):    init + (lr - init) * ln(max(iteration, 1)) / ln(W)
//   decay style constant    lr
//   iteration > D           min_lr
//   otherwise, with r = (iteration - W) / (D - W):
//     linear                min_lr + (lr - min_lr) * (1 - r)
//     cosine                min_lr + (lr - min_lr) * (1 + cos(pi * r)) / 2
//
// Worked example, lr 1e-3, init 0, min_lr 1e-4, W 10, D 110, linear/cosine:
//   iteration 0 -> 0, 5 -> 5e-4, 10 -> 1e-3, 60 -> 5.5e-4 (both), 110 -> 1e-4, 111 -> 1e-4.
//
// The log style is DeepSpeed's WarmupLR: gamma = ln(j + 1) / ln(W) from the scheduler counter j,
// which the engine advances after each optimizer step and which starts at -1 (giving init). The
// step taken after `iteration` steps therefore sees j = iteration - 1; it reaches lr at iteration
// == W, as Megatron's linear warm-up does.
//
// Preconditions (validate_train_config enforces them; a violation here aborts): iteration >= 0, a
// known decay and warm-up style, D > W when the style decays, W != 1 for the log style.
// Pure function of its arguments; thread-safe.
#pragma once
#include <cstdint>

#include "engine/types.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// consumed_samples: the samples the run consumed before this step, which Megatron's scheduler
// counts (a resumed run's may differ from iteration x global batch when the batch changed);
// -1: those `iteration` iterations of this config would consume (TrainConfig::samples_after).
double learning_rate(const TrainConfig& c, int64_t iteration, int64_t consumed_samples = -1);

// The optimizer step after `iteration` steps: step iteration + 1 (bias correction), its learning
// rate, and the config's weight decay, Adam betas and eps, and gradient clipping.
StepRequest optimizer_step(const TrainConfig& c, int64_t iteration, int64_t consumed_samples = -1);

}  // namespace troupe
