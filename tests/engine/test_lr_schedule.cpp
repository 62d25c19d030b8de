// learning_rate against hand-computed values at the warm-up boundaries, the middle, the end and
// past the end of each style, and against a literal transcription of DeepSpeed's WarmupLR /
// WarmupCosineLR.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numbers>

#include "engine/lr_schedule.hpp"

namespace troupe {
namespace {

using Catch::Matchers::WithinRel;

// lr 1e-3 -> 1e-4 over 110 iterations after a 10-iteration warm-up from 0.
TrainConfig base(const char* decay_style) {
  TrainConfig c;
  c.lr = 1e-3;
  c.min_lr = 1e-4;
  c.lr_warmup_init = 0.0;
  c.lr_warmup_iters = 10;
  c.lr_warmup_style = "linear";
  c.lr_decay_style = decay_style;
  c.lr_decay_iters = 0;  // -> train_iters
  c.train_iters = 110;
  return c;
}

// Exact-ish comparison: relative 1e-12, or absolute 1e-18 around zero.
void check_lr(const TrainConfig& c, int64_t iteration, double expected) {
  INFO("iteration " << iteration << " style " << c.lr_decay_style << "/" << c.lr_warmup_style);
  const double got = learning_rate(c, iteration);
  if (expected == 0.0) {
    CHECK(std::abs(got) < 1e-18);
  } else {
    CHECK_THAT(got, WithinRel(expected, 1e-12));
  }
}

TEST_CASE("lr schedule: linear warm-up then linear decay", "[lr_schedule]") {
  const TrainConfig c = base("linear");
  check_lr(c, 0, 0.0);       // first step: init
  check_lr(c, 1, 1e-4);      // 1/10 of the way
  check_lr(c, 5, 5e-4);      // middle of the warm-up
  check_lr(c, 10, 1e-3);     // end of the warm-up: peak
  check_lr(c, 11, 9.91e-4);  // r = 1/100: 1e-4 + 9e-4 * 0.99
  check_lr(c, 60, 5.5e-4);   // r = 1/2
  check_lr(c, 110, 1e-4);    // r = 1: min
  check_lr(c, 111, 1e-4);    // past the end
  check_lr(c, 100000, 1e-4);
}

TEST_CASE("lr schedule: cosine decay", "[lr_schedule]") {
  const TrainConfig c = base("cosine");
  check_lr(c, 0, 0.0);
  check_lr(c, 5, 5e-4);
  check_lr(c, 10, 1e-3);
  // r = 0.01: cos(0.0314159...) = 0.999506560365732; coeff 0.999753280182866.
  check_lr(c, 11, 1e-4 + 9e-4 * 0.999753280182866);
  check_lr(c, 35, 1e-4 + 9e-4 * 0.853553390593274);  // r = 1/4: (1 + sqrt(2)/2) / 2
  check_lr(c, 60, 5.5e-4);                           // r = 1/2: coeff 1/2
  check_lr(c, 85, 1e-4 + 9e-4 * 0.146446609406726);  // r = 3/4
  check_lr(c, 110, 1e-4);
  check_lr(c, 111, 1e-4);
}

TEST_CASE("lr schedule: constant after warm-up, forever", "[lr_schedule]") {
  const TrainConfig c = base("constant");
  check_lr(c, 0, 0.0);
  check_lr(c, 5, 5e-4);
  check_lr(c, 10, 1e-3);
  check_lr(c, 11, 1e-3);
  check_lr(c, 110, 1e-3);
  check_lr(c, 1000000, 1e-3);
}

TEST_CASE("lr schedule: no warm-up, explicit decay iterations, warm-up init", "[lr_schedule]") {
  TrainConfig c = base("linear");
  c.lr_warmup_iters = 0;
  check_lr(c, 0, 1e-3);     // r = 0: peak from the first step
  check_lr(c, 55, 5.5e-4);  // r = 55/110
  c.lr_decay_iters = 60;    // wins over train_iters
  c.train_iters = 1000;
  check_lr(c, 30, 5.5e-4);
  check_lr(c, 60, 1e-4);
  check_lr(c, 61, 1e-4);

  TrainConfig w = base("linear");
  w.lr_warmup_init = 2e-4;
  check_lr(w, 0, 2e-4);
  check_lr(w, 5, 6e-4);  // 2e-4 + 8e-4 / 2
  check_lr(w, 10, 1e-3);
}

TEST_CASE("lr schedule: log warm-up (DeepSpeed)", "[lr_schedule]") {
  TrainConfig c = base("linear");
  c.lr_warmup_style = "log";
  c.lr_warmup_init = 1e-4;
  check_lr(c, 0, 1e-4);                             // DeepSpeed's counter is -1: warmup_min_lr
  check_lr(c, 1, 1e-4);                             // counter 0: ln 1 = 0
  check_lr(c, 2, 1e-4 + 9e-4 * 0.301029995663981);  // ln 2 / ln 10
  check_lr(c, 5, 1e-4 + 9e-4 * 0.698970004336019);  // ln 5 / ln 10
  check_lr(c, 10, 1e-3);
  check_lr(c, 11, 1e-4 + 9e-4 * 0.99);  // then Megatron's decay
  check_lr(c, 111, 1e-4);
}

// DeepSpeed's schedulers, transcribed from deepspeed/runtime/lr_schedules.py: `j` is the
// scheduler's last_batch_iteration, -1 before the first step; the engine steps it after each
// optimizer step, so the optimizer step taken after k steps uses j = k - 1.
double deepspeed_warmup_gamma(int64_t j, int64_t warmup_num_steps, bool log) {
  const int64_t w = std::max<int64_t>(2, warmup_num_steps);
  if (j < 0) return 0.0;  // get_lr returns min_lrs before the first step
  if (j < w)
    return log ? std::log(j + 1.0) / std::log(static_cast<double>(w)) : double(j) / double(w);
  return 1.0;
}

double deepspeed_warmup_lr(int64_t j, double min_lr, double max_lr, int64_t warmup, bool log) {
  return min_lr + (max_lr - min_lr) * deepspeed_warmup_gamma(j, warmup, log);
}

double deepspeed_warmup_cosine_lr(int64_t j, double lr, int64_t total, double warmup_min_ratio,
                                  int64_t warmup_num_steps, double cos_min_ratio) {
  const int64_t w = std::max<int64_t>(2, warmup_num_steps);
  if (j < 0) return 0.0;  // get_lr returns 0.0 before the first step
  if (j < w) {
    const double ratio = std::log(j + 1.0) / std::log(static_cast<double>(w));
    return lr * (warmup_min_ratio + ratio * (1.0 - warmup_min_ratio));
  }
  const double progress =
      std::min(1.0, double(j - w + 1) / double(std::max<int64_t>(1, total - w)));
  const double ratio = (1 + std::cos(std::numbers::pi * progress)) / 2;
  return lr * std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * ratio);
}

TEST_CASE("lr schedule: log warm-up equals DeepSpeed WarmupLR step for step", "[lr_schedule]") {
  TrainConfig c = base("constant");
  c.lr_warmup_style = "log";
  c.lr_warmup_init = 3e-5;
  c.lr = 7e-4;
  c.lr_warmup_iters = 16;
  for (int64_t k = 0; k <= 40; ++k) {
    INFO("k " << k);
    CHECK_THAT(learning_rate(c, k),
               WithinRel(deepspeed_warmup_lr(k - 1, 3e-5, 7e-4, 16, true), 1e-12));
  }
}

TEST_CASE("lr schedule: equals DeepSpeed WarmupCosineLR step for step", "[lr_schedule]") {
  // What train_options makes of {"type": "WarmupCosineLR", "params": {"total_num_steps": 50,
  // "warmup_min_ratio": 0.1, "warmup_num_steps": 8, "cos_min_ratio": 0.05}} with optimizer lr 1e-3.
  TrainConfig c = base("cosine");
  c.lr = 1e-3;
  c.lr_warmup_init = 0.1 * 1e-3;
  c.min_lr = 0.05 * 1e-3;
  c.lr_warmup_iters = 8;
  c.lr_warmup_style = "log";
  c.lr_decay_iters = 50;
  for (int64_t k = 0; k <= 60; ++k) {
    INFO("k " << k);
    const double ds = k == 0 ? c.lr_warmup_init  // DeepSpeed's j = -1 gives ratio 0, see below
                             : deepspeed_warmup_cosine_lr(k - 1, 1e-3, 50, 0.1, 8, 0.05);
    CHECK_THAT(learning_rate(c, k), WithinRel(ds, 1e-12));
  }
  // The one point where troupe and DeepSpeed differ: before its first step() WarmupCosineLR reports
  // a ratio of 0 (lr 0), not warmup_min_ratio; troupe starts the warm-up at warmup_min_ratio * lr.
  CHECK(deepspeed_warmup_cosine_lr(-1, 1e-3, 50, 0.1, 8, 0.05) == 0.0);
}

TEST_CASE("lr schedule: linear warm-up is Megatron's, one step ahead of DeepSpeed's",
          "[lr_schedule]") {
  TrainConfig c = base("constant");
  for (int64_t k = 1; k <= 12; ++k) {
    INFO("k " << k);
    // Megatron at k equals DeepSpeed's linear warm-up one optimizer step later (counter j = k).
    CHECK_THAT(learning_rate(c, k), WithinRel(deepspeed_warmup_lr(k, 0.0, 1e-3, 10, false), 1e-12));
  }
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Megatron's OptimizerParamScheduler as its training loop drives it, transcribed independently
// (megatron/training/training.py get_optimizer_param_scheduler; Megatron-DeepSpeed's
// megatron/optimizer_param_scheduler.py for the tokens): state num_steps (samples) and num_tokens,
// step(increment = global batch) after every iteration, the lr of the next step read from it;
// lr_warmup_tokens set to num_tokens when a sample-counted warm-up ends (its hack for
// step-wise warm-up with token-wise decay).
struct MegatronScheduler {
  double max_lr, min_lr, init_lr, warmup_steps, decay_steps;
  double warmup_tokens = -1, decay_tokens = -1;  // -1: None
  std::string style;
  double num_steps = 0, num_tokens = 0;
  double get_lr() {
    if (warmup_tokens < 0) {
      if (warmup_steps > 0 && num_steps <= warmup_steps) {
        if (num_steps == warmup_steps && decay_tokens >= 0) warmup_tokens = num_tokens;
        return init_lr + (max_lr - init_lr) * num_steps / warmup_steps;
      }
    } else if (warmup_tokens > 0 && num_tokens <= warmup_tokens) {
      return init_lr + (max_lr - init_lr) * num_tokens / warmup_tokens;
    }
    if (style == "constant") return max_lr;
    if (decay_tokens < 0 ? num_steps > decay_steps : num_tokens > decay_tokens) return min_lr;
    const double ratio = decay_tokens < 0 ? (num_steps - warmup_steps) / (decay_steps - warmup_steps)
                                          : (num_tokens - (warmup_tokens < 0 ? 0 : warmup_tokens)) /
                                                (decay_tokens - (warmup_tokens < 0 ? 0 : warmup_tokens));
    const double coeff = style == "linear" ? 1.0 - ratio : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
    return min_lr + coeff * (max_lr - min_lr);
  }
};

// Every iteration of a run: troupe's learning_rate(c, i) against the scheduler after i steps.
void check_against_megatron(const TrainConfig& c, MegatronScheduler m, int64_t iterations) {
  const double batch = c.global_batch_size, tokens = batch * c.model.seq_length;
  for (int64_t i = 0; i <= iterations; ++i) {
    INFO("iteration " << i);
    const double want = m.get_lr();
    CHECK(learning_rate(c, i) == want);  // the same operations in the same order: bitwise
    m.num_steps += batch;
    m.num_tokens += tokens;
  }
}

TrainConfig megatron_base(const char* style, int batch) {
  TrainConfig c;
  c.lr = 6e-4;
  c.min_lr = 6e-5;
  c.lr_decay_style = style;
  c.global_batch_size = batch;
  c.micro_batch_size = 1;
  c.model.seq_length = 37;
  return c;
}

TEST_CASE("lr schedule: Megatron's, iteration-based, with --lr-warmup-fraction", "[lr_schedule]") {
  for (const char* style : {"linear", "cosine", "constant"}) {
    TrainConfig c = megatron_base(style, 12);
    c.train_iters = 130;
    c.lr_decay_iters = 97;
    c.lr_warmup_fraction = 0.037;  // 3.589 iterations: a warm-up ending between steps
    check_against_megatron(c, {c.lr, c.min_lr, 0.0, 0.037 * 97 * 12, 97.0 * 12, -1, -1, style}, 130);
    c.lr_warmup_fraction = -1;
    c.lr_warmup_iters = 7;
    c.lr_warmup_init = 1e-5;
    check_against_megatron(c, {c.lr, c.min_lr, 1e-5, 7.0 * 12, 97.0 * 12, -1, -1, style}, 130);
  }
}

TEST_CASE("lr schedule: Megatron's, sample-based (--train-samples)", "[lr_schedule]") {
  for (const char* style : {"linear", "cosine"}) {
    TrainConfig c = megatron_base(style, 10);
    c.train_samples = 1234;
    c.train_iters = 1234 / 10;
    c.lr_warmup_samples = 95;    // not a whole number of batches
    c.lr_decay_samples = 1001;
    check_against_megatron(c, {c.lr, c.min_lr, 0.0, 95, 1001, -1, -1, style}, 123);
    c.lr_warmup_samples = 0;
    c.lr_decay_samples = 0;  // -> train_samples
    c.lr_warmup_fraction = 0.01;
    check_against_megatron(c, {c.lr, c.min_lr, 0.0, 0.01 * 1234, 1234, -1, -1, style}, 123);
  }
}

TEST_CASE("lr schedule: Megatron-DeepSpeed's token-based warm-up and decay", "[lr_schedule]") {
  for (const char* style : {"linear", "cosine"}) {
    TrainConfig c = megatron_base(style, 8);
    c.train_iters = 200;
    c.lr_warmup_tokens = 8 * 37 * 9 + 100;  // mid-iteration
    c.lr_decay_tokens = 8 * 37 * 150 + 7;
    check_against_megatron(c, {c.lr, c.min_lr, 0.0, 0, 200.0 * 8, double(c.lr_warmup_tokens),
                               double(c.lr_decay_tokens), style},
                           200);
    // The 125M script's mix: a warm-up counted in iterations, the decay in tokens.
    c.lr_warmup_tokens = -1;
    c.lr_warmup_iters = 11;
    check_against_megatron(c, {c.lr, c.min_lr, 0.0, 11.0 * 8, 200.0 * 8, -1, double(c.lr_decay_tokens), style}, 200);
  }
}

TEST_CASE("lr schedule: --train-tokens stops the run where Megatron-DeepSpeed's loop does", "[lr_schedule]") {
  TrainConfig c = megatron_base("linear", 6);
  c.train_iters = 50;
  for (int64_t budget : {1, 6 * 37 - 1, 6 * 37, 6 * 37 + 1, 6 * 37 * 20, 6 * 37 * 500}) {
    c.train_tokens = budget;
    int64_t iterations = 0, consumed = 0;  // while iteration < train_iters and consumed < train_tokens
    while (iterations < c.train_iters && consumed < budget) {
      consumed += 6 * 37;
      ++iterations;
    }
    INFO("budget " << budget);
    CHECK(c.iterations_to_run() == iterations);
  }
}

}  // namespace
}  // namespace troupe
