// Plain values the actors hand the engine: the optimizer step's settings and checkpoint requests
// (what a run reports is the public troupe/reports.hpp). No CAF here: actors/messages.hpp adds their
// serialisation (inspect) and the typed actor interfaces.
#pragma once
#include <cstdint>
#include <string>

#include "troupe/reports.hpp"

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

}  // namespace troupe
