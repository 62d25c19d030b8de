#include "apps/tensorboard_log.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace troupe::apps {

TensorBoardLog::TensorBoardLog(const TensorBoardConfig& config, int64_t log_interval, int ranks, int64_t seq_length,
                               std::function<void(const std::string&)> warn)
    : config_(config),
      log_interval_(log_interval > 0 ? log_interval : 1),
      ranks_(std::max(1, ranks)),
      seq_length_(seq_length),
      warn_(std::move(warn)),
      writer_(config.dir) {}

void TensorBoardLog::series(const std::string& tag, double value, int64_t iteration, int64_t samples) {
  writer_.add_scalar(tag, value, iteration);
  if (samples < 0) return;
  writer_.add_scalar(tag + " vs samples", value, samples);
  writer_.add_scalar(tag + " vs tokens", value, samples * seq_length_);
}

void TensorBoardLog::iteration(const IterationStats& s) {
  if (writer_.failed()) return;
  last_samples_ = s.consumed_samples;
  // Megatron's training_log: the scalars of the iteration itself, every --tensorboard-log-interval.
  if (s.iteration % config_.log_interval == 0) {
    if (config_.log_learning_rate) series("learning-rate", s.lr, s.iteration, s.consumed_samples);
    series("batch-size", static_cast<double>(s.global_batch_size), s.iteration, s.consumed_samples);
    series("lm loss", s.lm_loss, s.iteration, s.consumed_samples);
    if (config_.log_loss_scale) series("loss-scale", s.loss_scale, s.iteration, s.consumed_samples);
    if (config_.log_world_size) series("world-size", static_cast<double>(ranks_), s.iteration, s.consumed_samples);
    series("grad-norm", s.grad_norm, s.iteration, s.consumed_samples);
    // --log-num-zeros-in-grad and --log-params-norm (Megatron-LM's tags; Megatron-DeepSpeed puts them
    // under num-zeros/ and params-norm/).
    if (s.num_zeros_in_grad >= 0 && !s.skipped)  // Megatron has no count for a skipped step
      series("num-zeros", static_cast<double>(s.num_zeros_in_grad), s.iteration, s.consumed_samples);
    if (s.params_norm >= 0) series("params-norm", s.params_norm, s.iteration, s.consumed_samples);
  }
  // The timing ones, as Megatron averages them: over the iterations since the last --log-interval
  // boundary (its interval-time / iterations, and its timers normalised by the interval).
  const double seconds = s.ms_per_iter / 1e3;
  ++interval_iterations_;
  interval_seconds_ += seconds;
  interval_tflop_ += s.model_tflops * seconds;
  for (const TimerReading& t : s.timers) interval_timer_ms_[t.name] += t.ms;
  if (s.iteration % log_interval_ == 0) {
    if (config_.log_timers) {
      const double n = static_cast<double>(interval_iterations_);
      writer_.add_scalar("iteration-time", interval_seconds_ / n, s.iteration);
      if (config_.log_throughput && interval_seconds_ > 0)
        writer_.add_scalar("throughput", interval_tflop_ / interval_seconds_ / ranks_, s.iteration);
      for (const auto& [name, ms] : interval_timer_ms_) writer_.add_scalar(name + "-time", ms / n / 1e3, s.iteration);
    }
    interval_iterations_ = 0;
    interval_seconds_ = interval_tflop_ = 0;
    interval_timer_ms_.clear();
  }
  flush();
}

void TensorBoardLog::eval(const EvalStats& e) {
  if (writer_.failed()) return;
  // evaluate_and_print_results: "<key> validation", its perplexity capped as Megatron's.
  series("lm loss validation", e.loss, e.iteration, last_samples_);
  if (config_.log_validation_ppl)
    series("lm loss validation ppl", std::exp(std::min(20.0, e.loss)), e.iteration, last_samples_);
  flush();
}

void TensorBoardLog::flush() {
  if (Status st = writer_.flush(); !st && warn_)
    warn_("--tensorboard-dir: " + st.message() +
          " (TensorBoard logging stops here; training goes on, --metrics-file would keep every iteration)");
}

}  // namespace troupe::apps
