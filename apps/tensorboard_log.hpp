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
//   an MoE model, every --tensorboard-log-interval iterations (the iteration's values; docs/COMPAT.md):
//     moe loss (Megatron-DeepSpeed's loss_dict key; also vs samples and vs tokens);
//     Megatron-Core's track_moe_metrics: load_balancing_loss (seq_load_balancing_loss for
//     seq_aux_loss; none when the router has no such loss) and z_loss (with a z-loss coefficient),
//     the mean over the MoE layers, and per layer moe/load_balancing_loss_layer_N, moe/z_loss_layer_N
//     (N the 0-based global layer; what --moe-per-layer-logging writes);
//     troupe's own per layer: moe/tokens_per_expert_layer_N/expert_E (routed),
//     moe/kept_tokens_per_expert_layer_N/expert_E, moe/dropped_tokens_layer_N.
// An I/O failure is reported once through `warn`; the log is off from then on and training goes on.
// Not thread-safe (the callbacks of troupe::train run on one thread).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "storage/tfevents.hpp"
#include "troupe/model_config.hpp"
#include "troupe/reports.hpp"
#include "troupe/train_config.hpp"

namespace troupe::apps {

class TensorBoardLog {
 public:
  // ranks: tp x pp x dp of the job (world-size; throughput is per rank). seq_length: tokens per
  // sample (the vs tokens steps). log_interval: --log-interval.
  // moe: the model's MoE settings (which loss tags an MoE model's iterations get; unused when they
  // carry no MoE loads).
  TensorBoardLog(const TensorBoardConfig& config, int64_t log_interval, int ranks, int64_t seq_length,
                 std::function<void(const std::string&)> warn, MoeConfig moe = {});
  void iteration(const IterationStats& s);
  void eval(const EvalStats& e);
  void set_log_interval(int64_t n) { log_interval_ = n > 0 ? n : 1; }

 private:
  // TAG, TAG vs samples, TAG vs tokens.
  void series(const std::string& tag, double value, int64_t iteration, int64_t samples);
  void moe_tags(const IterationStats& s);
  void flush();

  TensorBoardConfig config_;
  MoeConfig moe_;
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
