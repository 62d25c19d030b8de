// Plain values that the engine computes and the actors carry: step requests and results, checkpoint
// requests, and what a training run reports (iterations, evaluations, checkpoints, the summary). No
// CAF here: actors/messages.hpp adds their serialisation (inspect) and the typed actor interfaces.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/tensor.hpp"

namespace troupe {

// Optimizer step after the micro-batches of one iteration: clip, AdamW, zero the gradients.
struct StepRequest {
  int64_t step = 1;  // 1-based optimizer step (bias correction)
  double lr = 0;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip_grad = 0;
  // This process wants the job to stop after this step (a signal, --exit-duration-in-mins). The
  // processes of a job agree on it inside the step (StepOutcome::stop), so all stop after the same
  // iteration.
  bool stop = false;
};

// Checkpoint I/O requests; each rank writes and reads its own pieces of the tensors.
struct SaveRequest {
  std::string dir;
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  int64_t optimizer_step = 0;
  std::string config_json;
  std::string rng_json;
};

struct LoadRequest {
  std::string dir;
  int64_t iteration = 0;
  bool load_optimizer = true;
};

// What the trainer reports to whoever listens (the CLI prints it; tests check it).
struct IterationStats {
  int64_t iteration = 0;  // 1-based: iterations completed
  int64_t train_iters = 0;
  double lm_loss = 0;     // mean token loss of the global batch
  double lr = 0;
  double grad_norm = 0;
  double ms_per_iter = 0;
  double tokens_per_sec = 0;
  double model_tflops = 0;        // model FLOP/s / 1e12 (Megatron's count)
  double fraction_of_peak = 0;    // of the sgemm peak measured at start-up
  int64_t consumed_samples = 0;
  // Parallel layouts: the least and most busy rank of this process in the step, busy = forward,
  // backward, weight-gradient, reduction and optimizer time over the step's wall time (the rest is
  // idle: pipeline bubble and waiting for peers). -1 for a 1x1x1 job.
  double busy_fraction_min = -1, busy_fraction_max = -1;
};

struct EvalStats {
  int64_t iteration = 0;
  double loss = 0;
  double perplexity = 0;
  int64_t tokens = 0;
};

struct SavedCheckpoint {
  int64_t iteration = 0;
  std::string path;
  double seconds = 0;      // in the training path (the snapshot); committed: the background write
  bool committed = false;  // sent again by the offload actor once the save is complete on disk
};

struct TrainSummary {
  int64_t iteration = 0;  // last completed iteration
  double last_loss = 0;
  double last_eval_loss = -1;  // < 0: never evaluated
  bool stopped_early = false;
  std::string last_checkpoint;
};

}  // namespace troupe
