// `troupe train --tensorboard-dir`: each iteration's and evaluation's statistics
// (troupe/reports.hpp) as Megatron's TensorBoard tags, written by storage/tfevents.hpp. Rank 0's
// process logs, as with --metrics-file. The tags, their steps and switches follow Megatron-LM's
// training_log and evaluate_and_print_results (megatron/training/training.py); docs/COMPAT.md,
// "TensorBoard", lists them:
//   every --tensorboard-log-interval iterations, each as TAG (step: iteration), TAG vs samples
//   (step: consumed samples) and TAG vs tokens (step: consumed tokens, Megatron-DeepSpeed's):
//     learning-rate (unless --no-log-learnig-rate-to-tensorboard), batch-size, lm loss,
//     loss-scale (unless --no-log-loss-scale-to-tensorboard), world-size
//     (--log-world-size-to-tensorboard), grad-norm;
//   every --log-interval iterations, with --log-timers-to-tensorboard, averaged over the interval:
//     iteration-time (seconds), <timer>-time (seconds, the most any rank spent) for each of
//     IterationStats::timers, throughput (TFLOP/s per rank, also --log-throughput);
//   every evaluation: lm loss validation and, with --log-validation-ppl-to-tensorboard,
//     lm loss validation ppl (exp(min(20, loss)), as Megatron), each also vs samples and vs tokens.
// An I/O failure is reported once through `warn`; the log is off from then on and training goes on.
// Not thread-safe (the callbacks of troupe::train run on one thread).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "storage/tfevents.hpp"
#include "troupe/reports.hpp"
#include "troupe/train_config.hpp"

namespace troupe::apps {

class TensorBoardLog {
 public:
  // ranks: tp x pp x dp of the job (world-size; throughput is per rank). seq_length: tokens per
  // sample (the vs tokens steps). log_interval: --log-interval.
  TensorBoardLog(const TensorBoardConfig& config, int64_t log_interval, int ranks, int64_t seq_length,
                 std::function<void(const std::string&)> warn);
  void iteration(const IterationStats& s);
  void eval(const EvalStats& e);
  void set_log_interval(int64_t n) { log_interval_ = n > 0 ? n : 1; }

 private:
  // TAG, TAG vs samples, TAG vs tokens.
  void series(const std::string& tag, double value, int64_t iteration, int64_t samples);
  void flush();

  TensorBoardConfig config_;
  int64_t log_interval_;
  int ranks_;
  int64_t seq_length_;
  std::function<void(const std::string&)> warn_;
  EventFileWriter writer_;
  int64_t last_samples_ = -1;  // consumed samples after the latest iteration (-1: none yet)
  // Since the last --log-interval boundary: iterations, their seconds, TFLOPs done, timer ms.
  int64_t interval_iterations_ = 0;
  double interval_seconds_ = 0, interval_tflop_ = 0;
  std::map<std::string, double> interval_timer_ms_;
};

}  // namespace troupe::apps
