// How the CLI prints: error lines, the live progress line, and JSON lines for --metrics-file.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "engine/types.hpp"
#include "troupe/status.hpp"

namespace troupe::apps {

// "troupe <command>: error: <message>" on stderr.
void print_error(const std::string& command, const std::string& message);
inline void print_error(const std::string& command, const Status& st) { print_error(command, st.message()); }

// The iterations since the last log line, as Megatron's training_log sums them: the loss (and an
// MoE model's moe loss) averaged over the iterations whose loss was finite and whose step was not
// skipped, the time per iteration (and so tokens/s and TFLOP/s) over all of them, the skipped and
// nan counts, the timers averaged per iteration (Megatron's normalizer = the log interval); the
// learning rate, gradient norm, batch size, loss scale, consumed samples and MoE layer loads are
// the last iteration's.
class IntervalAverage {
 public:
  void add(const IterationStats& s);
  bool empty() const { return count_ == 0; }
  IterationStats mean() const;  // of the iterations added since reset
  int64_t skipped() const { return skipped_; }
  int64_t nan() const { return nan_; }
  void reset() { *this = IntervalAverage(); }

 private:
  IterationStats last_;
  int64_t count_ = 0, advanced_ = 0, skipped_ = 0, nan_ = 0;
  double loss_sum_ = 0, moe_loss_sum_ = 0, ms_sum_ = 0, tokens_sum_ = 0, tflops_sum_ = 0, peak_sum_ = 0;
  double busy_min_sum_ = 0, busy_max_sum_ = 0;
  std::vector<TimerReading> timers_;  // sums (ms, min_ms, ranks_ms) per name
};

// Megatron's iteration line (training_log) with troupe's throughput fields after it; `s` is an
// interval's mean (IntervalAverage) or one iteration.
std::string format_iteration(const IterationStats& s, int64_t skipped = 0, int64_t nan = 0);
// Megatron's timer lines ("(min, max) time across ranks (ms):", Timers.log), by --timing-log-option
// (minmax, max, all); empty when there are no timers.
std::string format_timers(const std::vector<TimerReading>& timers, const std::string& option);
// Megatron's validation line: " validation loss at iteration N | lm loss value: X | lm loss PPL: Y |".
std::string format_eval(const EvalStats& e);
std::string iteration_json(const IterationStats& s);
std::string eval_json(const EvalStats& e);

// Prints progress: on a terminal a status line rewritten every iteration (that iteration's values)
// plus a permanent line every log_interval iterations (the interval's averages, then the timers);
// elsewhere (logs, CI) only the permanent lines.
class ProgressPrinter {
 public:
  // enabled false: prints nothing (the ranks other than 0 of a multi-process job).
  explicit ProgressPrinter(int64_t log_interval, bool enabled = true, std::string timing_log_option = "minmax");
  void iteration(const IterationStats& s);
  void line(const std::string& text);  // a permanent line (clears the status line first)
  void set_log_interval(int64_t n) { log_interval_ = n > 0 ? n : 1; }

 private:
  int64_t log_interval_;
  bool tty_;
  bool enabled_;
  std::string timing_log_option_;
  bool status_shown_ = false;
  IntervalAverage interval_;
};

}  // namespace troupe::apps
