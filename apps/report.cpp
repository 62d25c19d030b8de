#include "apps/report.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "engine/stragglers.hpp"

namespace troupe::apps {

void print_error(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "troupe %s: error: %s\n", command.c_str(), message.c_str());
  std::fflush(stderr);
}

void IntervalAverage::add(const IterationStats& s) {
  last_ = s;
  ++count_;
  if (s.skipped) {
    ++skipped_;
    nan_ += s.nan_loss ? 1 : 0;
  } else {
    ++advanced_;
    loss_sum_ += s.lm_loss;
    moe_loss_sum_ += s.moe_loss;
  }
  ms_sum_ += s.ms_per_iter;
  tokens_sum_ += s.tokens_per_sec * s.ms_per_iter / 1e3;
  tflops_sum_ += s.model_tflops * s.ms_per_iter;
  peak_sum_ += s.fraction_of_peak * s.ms_per_iter;
  busy_min_sum_ += s.busy_fraction_min;
  busy_max_sum_ += s.busy_fraction_max;
  for (const TimerReading& t : s.timers) {
    auto it = std::find_if(timers_.begin(), timers_.end(), [&](const TimerReading& x) { return x.name == t.name; });
    if (it == timers_.end()) {
      timers_.push_back({t.name, 0, 0, std::vector<double>(t.ranks_ms.size(), 0.0)});
      it = timers_.end() - 1;
    }
    it->ms += t.ms;
    it->min_ms += t.min_ms;
    for (size_t r = 0; r < t.ranks_ms.size() && r < it->ranks_ms.size(); ++r) it->ranks_ms[r] += t.ranks_ms[r];
  }
}

IterationStats IntervalAverage::mean() const {
  IterationStats m = last_;
  if (count_ == 0) return m;
  const double n = static_cast<double>(count_);
  m.lm_loss = advanced_ > 0 ? loss_sum_ / static_cast<double>(advanced_) : 0.0;
  m.moe_loss = advanced_ > 0 ? moe_loss_sum_ / static_cast<double>(advanced_) : 0.0;
  m.ms_per_iter = ms_sum_ / n;
  // Throughput over the interval's time: tokens (tokens/s x seconds of each iteration) over seconds.
  m.tokens_per_sec = ms_sum_ > 0 ? tokens_sum_ / (ms_sum_ / 1e3) : 0.0;
  m.model_tflops = ms_sum_ > 0 ? tflops_sum_ / ms_sum_ : 0.0;
  m.fraction_of_peak = ms_sum_ > 0 ? peak_sum_ / ms_sum_ : 0.0;
  if (last_.busy_fraction_min >= 0) {
    m.busy_fraction_min = busy_min_sum_ / n;
    m.busy_fraction_max = busy_max_sum_ / n;
  }
  m.timers = timers_;
  for (TimerReading& t : m.timers) {
    t.ms /= n;
    t.min_ms /= n;
    for (double& r : t.ranks_ms) r /= n;
  }
  return m;
}

std::string format_iteration(const IterationStats& s, int64_t skipped, int64_t nan) {
  std::string busy;
  if (s.busy_fraction_min >= 0)
    busy = fmt::format(" | ranks busy: {:.0f}-{:.0f}%", 100.0 * s.busy_fraction_min, 100.0 * s.busy_fraction_max);
  // As Megatron: a skipped last iteration (an overflow under the loss scaler, or a NaN) has no gradient
  // norm to show, so the field is left out.
  std::string norm = s.skipped ? "" : fmt::format(" grad norm: {:.3f} |", s.grad_norm);
  // Megatron's training_log, after the grad norm: the zero count as the float it reduced it in
  // ("1234.0"), then the parameter norm.
  if (s.num_zeros_in_grad >= 0 && !s.skipped)
    norm += fmt::format(" num zeros: {:.1f} |", static_cast<double>(s.num_zeros_in_grad));
  if (s.params_norm >= 0) norm += fmt::format(" params norm: {:.3f} |", s.params_norm);
  // An MoE model's auxiliary losses as Megatron-DeepSpeed logs its loss_dict: "moe loss" after "lm loss".
  const std::string moe = s.moe.empty() ? "" : fmt::format(" moe loss: {:.6E} |", s.moe_loss);
  return fmt::format(
             " iteration {:>8}/{:>8} | consumed samples: {:>12} | elapsed time per iteration (ms): {:.1f} | learning "
             "rate: {:.6E} | global batch size: {:>5} | lm loss: {:.6E} |{} loss scale: {:.1f} |{} "
             "number of skipped iterations: {:>3} | number of nan iterations: {:>3} | tokens/s: {:.0f} | TFLOP/s: "
             "{:.3f} ({:.1f}% of peak)",
             s.iteration, s.train_iters, s.consumed_samples, s.ms_per_iter, s.lr, s.global_batch_size, s.lm_loss, moe,
             s.loss_scale, norm, skipped, nan, s.tokens_per_sec, s.model_tflops, 100.0 * s.fraction_of_peak) +
         busy;
}

std::string format_timers(const std::vector<TimerReading>& timers, const std::string& option) {
  if (timers.empty()) return "";
  auto label = [](const std::string& name) {
    std::string l = name + " ";
    if (l.size() < 48) l.append(48 - l.size(), '.');
    return l;
  };
  std::string out;
  if (option == "max") {
    out = "max time across ranks (ms):";
    for (const TimerReading& t : timers) out += fmt::format("\n    {}: {:.2f}", label(t.name), t.ms);
  } else if (option == "all") {
    out = "times across ranks (ms):";
    const size_t ranks = timers.front().ranks_ms.size();
    for (size_t r = 0; r < ranks; ++r) {
      out += fmt::format("\n  rank {:2d}:", r);
      for (const TimerReading& t : timers)
        out += fmt::format("\n    {}: {:.2f}", label(t.name), r < t.ranks_ms.size() ? t.ranks_ms[r] : 0.0);
    }
  } else {
    out = "(min, max) time across ranks (ms):";
    for (const TimerReading& t : timers) out += fmt::format("\n    {}: ({:.2f}, {:.2f})", label(t.name), t.min_ms, t.ms);
  }
  return out;
}

std::string format_eval(const EvalStats& e) {
  return fmt::format(" validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} | tokens: {} |",
                     e.iteration, e.loss, e.perplexity, e.tokens);
}

std::string iteration_json(const IterationStats& s) {
  nlohmann::json j = {{"type", "train"},
                      {"iteration", s.iteration},
                      {"lm_loss", s.lm_loss},
                      {"lr", s.lr},
                      {"grad_norm", s.grad_norm},
                      {"ms_per_iter", s.ms_per_iter},
                      {"tokens_per_sec", s.tokens_per_sec},
                      {"model_tflops", s.model_tflops},
                      {"fraction_of_peak", s.fraction_of_peak},
                      {"consumed_samples", s.consumed_samples},
                      {"global_batch_size", s.global_batch_size},
                      {"loss_scale", s.loss_scale},
                      {"skipped", s.skipped},
                      {"nan", s.nan_loss}};
  if (s.params_norm >= 0) j["params_norm"] = s.params_norm;                    // --log-params-norm
  if (s.num_zeros_in_grad >= 0) j["num_zeros_in_grad"] = s.num_zeros_in_grad;  // --log-num-zeros-in-grad
  if (s.busy_fraction_min >= 0) {  // parallel layouts: the ranks' busy share of the step
    j["busy_fraction_min"] = s.busy_fraction_min;
    j["busy_fraction_max"] = s.busy_fraction_max;
  }
  if (!s.moe.empty()) {  // an MoE model: its auxiliary losses and each MoE layer's load (troupe/reports.hpp)
    j["moe_loss"] = s.moe_loss;
    nlohmann::json layers = nlohmann::json::array();
    for (const MoeLayerLoad& l : s.moe)
      layers.push_back({{"layer", l.layer},
                        {"micro_batches", l.micro_batches},
                        {"routed", l.routed},
                        {"kept", l.kept},
                        {"dropped", l.dropped},
                        {"lb_loss", l.lb_loss},
                        {"z_loss", l.z_loss}});
    j["moe"] = std::move(layers);
  }
  if (!s.rank_scores.empty()) {  // straggler scores (engine/stragglers.hpp): the slowest rank, and every straggler
    const StragglerScore& worst = s.rank_scores.front();
    j["slowest_rank"] = {{"rank", worst.rank}, {"relative_score", worst.relative}, {"individual_score", worst.individual}};
    nlohmann::json list = nlohmann::json::array();
    for (const StragglerScore& r : s.rank_scores)
      if (r.relative < s.straggler_threshold)
        list.push_back({{"rank", r.rank},
                        {"stage", r.stage},
                        {"relative_score", r.relative},
                        {"individual_score", r.individual},
                        {"section", r.section},
                        {"section_ms", r.section_ms},
                        {"fastest_section_ms", r.fastest_section_ms}});
    j["stragglers"] = std::move(list);
  }
  if (!s.timers.empty()) {  // --timing-log-level's timers of this iteration, ms: [min, max]
    nlohmann::json t = nlohmann::json::object();
    for (const TimerReading& r : s.timers) t[r.name] = {r.min_ms, r.ms};
    j["timers_ms"] = std::move(t);
  }
  return j.dump();
}

std::string eval_json(const EvalStats& e) {
  nlohmann::json j = {{"type", "eval"},
                      {"iteration", e.iteration},
                      {"validation_loss", e.loss},
                      {"validation_ppl", e.perplexity},
                      {"tokens", e.tokens}};
  return j.dump();
}

ProgressPrinter::ProgressPrinter(int64_t log_interval, bool enabled, std::string timing_log_option)
    : log_interval_(log_interval > 0 ? log_interval : 1),
      tty_(isatty(STDOUT_FILENO) == 1),
      enabled_(enabled),
      timing_log_option_(std::move(timing_log_option)) {}

void ProgressPrinter::iteration(const IterationStats& s) {
  if (!enabled_) return;
  interval_.add(s);
  const bool permanent = s.iteration % log_interval_ == 0 || s.iteration == s.train_iters;
  if (permanent) {
    const IterationStats mean = interval_.mean();
    line(format_iteration(mean, interval_.skipped(), interval_.nan()));
    if (const std::string timers = format_timers(mean.timers, timing_log_option_); !timers.empty()) line(timers);
    for (const StragglerScore& r : s.rank_scores)  // the latest iteration's, lowest first
      if (r.relative < s.straggler_threshold) line("  straggler: " + describe_straggler(r));
    interval_.reset();
    return;
  }
  if (!tty_) return;
  std::printf("\r\033[K%s", format_iteration(s).c_str());
  std::fflush(stdout);
  status_shown_ = true;
}

void ProgressPrinter::line(const std::string& text) {
  if (!enabled_) return;
  if (status_shown_) std::printf("\r\033[K");
  status_shown_ = false;
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace troupe::apps
