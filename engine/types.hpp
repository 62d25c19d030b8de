// Plain values the actors hand the engine: the optimizer step's settings and checkpoint requests
// (what a run reports is the public troupe/reports.hpp). No CAF here: actors/messages.hpp adds their
// serialisation (inspect) and the typed actor interfaces.
#pragma once
#include <cstdint>
#include <string>

#include <vector>

#include "storage/checkpoint.hpp"
#include "storage/shard_file.hpp"
#include "troupe/reports.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// Optimizer step after the micro-batches of one iteration: clip, AdamW, zero the gradients.
struct StepRequest {
  int64_t step = 1;  // 1-based optimizer step: the iteration + 1 (bias correction, less adam_step_offset)
  // Adam steps the moments do not hold (after a --no-load-optim load restarted them): AdamW's bias
  // correction counts step - adam_step_offset, as a freshly built torch optimizer's would.
  int64_t adam_step_offset = 0;
  double lr = 0;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip_grad = 0;
  // Mixed precision's loss scale: the step's grad_scale carries it (the gradients are this many times
  // the loss's), the engine divides it out of the gradient norm and the gradients before clipping.
  // skip_on_overflow (fp16's dynamic or static loss scaling): a non-finite gradient norm skips the
  // step (StepOutcome::skipped) instead of failing it as a diverged run.
  double loss_scale = 1;
  bool skip_on_overflow = false;
  // This process wants the job to stop after this step (a signal, --exit-duration-in-mins). The
  // processes of a job agree on it inside the step (StepOutcome::stop), so all stop after the same
  // iteration.
  bool stop = false;
  // This process wants the job to stop after this step for a node that asks to join (elastic:
  // RunOptions::regroup); agreed like stop, and it implies stop (StepOutcome::regroup).
  bool regroup = false;
  // The latest command of the job's inspector (troupe inspect: pause, set lr, save...) that rank 0's
  // process holds; rides on the step like the stop votes, so every process applies it after the
  // same step (StepOutcome::control). 0: none. Only global rank 0's value counts.
  int64_t control = 0;
  // The inspector asked for this parameter's gradient (its global name; empty: none): the ranks hand
  // their pieces of it, reduced and clipped, before the optimizer step (StepOutcome::captured).
  std::string capture_grad;
  // The inspector asked for an op's result (an activation or its gradient) in this step: the op as
  // TROUPE_FAULT_NAN names it ("layer3:mlp_fc1", "layer3:ln2:backward"; model/op_probe.hpp), on
  // global rank capture_rank, micro-batch capture_micro. That rank hands its own tensor (its
  // tensor-parallel part) in StepOutcome::captured. Empty: none.
  std::string capture_activation;
  int capture_rank = -1, capture_micro = 0;
  // --log-params-norm and --log-num-zeros-in-grad: the step also reports the parameters' L2 norm after
  // its update and the count of exactly-zero gradient elements (StepOutcome::params_norm,
  // zeros_in_grad), each element of the job counted once.
  bool params_norm = false;
  bool zeros_in_grad = false;
};

// Which of a parameter's tensors the inspector reads (troupe inspect's tensor: NAME, NAME.grad,
// NAME.exp_avg, NAME.exp_avg_sq).
enum class TensorKind : uint8_t { value, grad, exp_avg, exp_avg_sq };
const char* tensor_kind_suffix(TensorKind kind);  // "", ".grad", ".exp_avg", ".exp_avg_sq"

// A rank's pieces of one tensor (RankEngine::tensor_pieces), for the inspector.
struct RankPieces {
  int rank = 0;
  std::vector<TensorPiece> pieces;
};

// Checkpoint I/O requests; each rank writes and reads its own pieces of the tensors.
struct SaveRequest {
  std::string dir;
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  int64_t optimizer_step = 0;
  std::string config_json;
  std::string rng_json;
  bool memory = false;  // an in-memory snapshot (TrainConfig::save_memory_interval) in `dir`
};

struct LoadRequest {
  std::string dir;
  int64_t iteration = 0;
  bool load_optimizer = true;
};

// What a checkpoint of this save records, with the run identity (config/run_identity.hpp's
// run_json): the metadata.json the save's commit writes.
CheckpointMeta checkpoint_meta(const SaveRequest& r, std::string run_json);

// The report of an optimizer step of config `c` that took `seconds`: `iteration` and `consumed`
// counted after it, the loss as the mean over the global batch's tokens, throughput and Megatron's
// model FLOP/s; fraction_of_peak of `peak_gflops` (0: not measured) and the busy share are left to
// the caller. A model given in code (include/troupe/stage.hpp) divides the loss by its own terms
// per sample (loss_terms, 0: seq_length) and, without GPT layers (gpt_flops false), reports no
// model FLOP/s (Megatron's count is GPT's). global_batch: the iteration's samples (0: the config's
// global batch; less during --rampup-batch-size's ramp).
IterationStats iteration_stats(const TrainConfig& c, int64_t iteration, int64_t consumed, double loss_sum,
                               double grad_norm, double lr, double seconds, int64_t loss_terms = 0,
                               bool gpt_flops = true, int64_t global_batch = 0);

}  // namespace troupe
