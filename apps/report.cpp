#include "apps/report.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace troupe::apps {

void print_error(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "troupe %s: error: %s\n", command.c_str(), message.c_str());
  std::fflush(stderr);
}

std::string format_iteration(const IterationStats& s) {
  std::string busy;
  if (s.busy_fraction_min >= 0)
    busy = fmt::format(" | ranks busy: {:.0f}-{:.0f}%", 100.0 * s.busy_fraction_min, 100.0 * s.busy_fraction_max);
  return fmt::format(
      " iteration {:>7}/{:>7} | consumed samples: {:>9} | elapsed time per iteration (ms): {:.1f} | learning rate: "
      "{:.3E} | lm loss: {:.6E} | grad norm: {:.3f} | tokens/s: {:.0f} | TFLOP/s: {:.3f} ({:.1f}% of peak)",
      s.iteration, s.train_iters, s.consumed_samples, s.ms_per_iter, s.lr, s.lm_loss, s.grad_norm, s.tokens_per_sec,
      s.model_tflops, 100.0 * s.fraction_of_peak) + busy;
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
                      {"consumed_samples", s.consumed_samples}};
  if (s.busy_fraction_min >= 0) {  // parallel layouts: the ranks' busy share of the step
    j["busy_fraction_min"] = s.busy_fraction_min;
    j["busy_fraction_max"] = s.busy_fraction_max;
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

ProgressPrinter::ProgressPrinter(int64_t log_interval, bool enabled)
    : log_interval_(log_interval > 0 ? log_interval : 1), tty_(isatty(STDOUT_FILENO) == 1), enabled_(enabled) {}

void ProgressPrinter::iteration(const IterationStats& s) {
  if (!enabled_) return;
  const bool permanent = s.iteration % log_interval_ == 0 || s.iteration == s.train_iters;
  if (permanent) {
    line(format_iteration(s));
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
