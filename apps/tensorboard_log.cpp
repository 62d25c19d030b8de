#include "apps/tensorboard_log.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace troupe::apps {

TensorBoardLog::TensorBoardLog(const TensorBoardConfig& config, int64_t log_interval, int ranks, int64_t seq_length,
                               std::function<void(const std::string&)> warn, MoeConfig moe)
    : config_(config),
      moe_(std::move(moe)),
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
    if (!s.moe.empty()) moe_tags(s);
    if (!s.rank_scores.empty()) {  // the slowest rank's straggler scores (engine/stragglers.hpp)
      series("straggler relative score", s.rank_scores.front().relative, s.iteration, s.consumed_samples);
      series("straggler slowest rank", static_cast<double>(s.rank_scores.front().rank), s.iteration,
             s.consumed_samples);
      double individual = 1;
      for (const StragglerScore& r : s.rank_scores) individual = std::min(individual, r.individual);
      series("straggler individual score", individual, s.iteration, s.consumed_samples);
    }
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

void TensorBoardLog::moe_tags(const IterationStats& s) {
  series("moe loss", s.moe_loss, s.iteration, s.consumed_samples);
  // Megatron-Core's names: which load-balancing loss the router has, and the z-loss when it is in the
  // objective (its track_names); the mean over the MoE layers (sum / the MoE layers), then each layer.
  std::string lb = "load_balancing_loss";
  if (moe_.router == MoeRouter::megatron && moe_.load_balancing == MoeLoadBalancing::seq_aux_loss)
    lb = "seq_load_balancing_loss";
  if (moe_.router == MoeRouter::megatron && moe_.load_balancing == MoeLoadBalancing::none) lb.clear();
  const bool z = moe_.z_loss_coeff != 0;
  const double n = static_cast<double>(s.moe.size());
  double lb_sum = 0, z_sum = 0;
  for (const MoeLayerLoad& l : s.moe) lb_sum += l.lb_loss, z_sum += l.z_loss;
  if (!lb.empty()) writer_.add_scalar(lb, lb_sum / n, s.iteration);
  if (z) writer_.add_scalar("z_loss", z_sum / n, s.iteration);
  for (const MoeLayerLoad& l : s.moe) {
    const std::string layer = "_layer_" + std::to_string(l.layer);
    if (!lb.empty()) writer_.add_scalar("moe/" + lb + layer, l.lb_loss, s.iteration);
    if (z) writer_.add_scalar("moe/z_loss" + layer, l.z_loss, s.iteration);
    for (size_t e = 0; e < l.routed.size(); ++e) {
      const std::string expert = layer + "/expert_" + std::to_string(e);
      writer_.add_scalar("moe/tokens_per_expert" + expert, static_cast<double>(l.routed[e]), s.iteration);
      writer_.add_scalar("moe/kept_tokens_per_expert" + expert, static_cast<double>(l.kept[e]), s.iteration);
    }
    writer_.add_scalar("moe/dropped_tokens" + layer, static_cast<double>(l.dropped), s.iteration);
  }
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
