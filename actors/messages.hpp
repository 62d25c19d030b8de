// Every message troupe's actors exchange, and the typed interfaces they form (STYLE: typed messages).
// Messages that carry tensors are local-only: tensors never travel through CAF's serialisation (the
// comm layer moves them); those types are whitelisted as unsafe. Control-only types have inspect().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "kernels/tensor.hpp"

namespace troupe {

using init_atom = caf::atom_constant<caf::atom("init")>;
using fwd_bwd_atom = caf::atom_constant<caf::atom("fwdbwd")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using save_atom = caf::atom_constant<caf::atom("save")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
using batch_atom = caf::atom_constant<caf::atom("batch")>;
using run_atom = caf::atom_constant<caf::atom("run")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using progress_atom = caf::atom_constant<caf::atom("progress")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using ok_atom = caf::atom_constant<caf::atom("ok")>;

enum class DataSplit : uint8_t { train = 0, validation = 1, test = 2 };

// One micro-batch for a shard: (B, seq_length+1) token windows and the gradient scale (1 / tokens of
// the global batch), so accumulated gradients are those of the global batch's mean loss.
struct MicroBatch {
  int64_t index = 0;
  Tensor tokens;
  double grad_scale = 0;
};

struct MicroBatchResult {
  int64_t index = 0;
  double loss_sum = 0;  // sum of the B*T token losses
  int64_t tokens = 0;
};

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

struct StepResult {
  double grad_norm = 0;  // before clipping
};

// Checkpoint I/O requests; the shard owns the tensors and writes/reads them itself.
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

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MicroBatchResult& x) {
  return f(caf::meta::type_name("MicroBatchResult"), x.index, x.loss_sum, x.tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepRequest& x) {
  return f(caf::meta::type_name("StepRequest"), x.step, x.lr, x.weight_decay, x.beta1, x.beta2, x.eps, x.clip_grad,
           x.stop);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepResult& x) {
  return f(caf::meta::type_name("StepResult"), x.grad_norm);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SaveRequest& x) {
  return f(caf::meta::type_name("SaveRequest"), x.dir, x.iteration, x.consumed_samples, x.optimizer_step,
           x.config_json, x.rng_json);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadRequest& x) {
  return f(caf::meta::type_name("LoadRequest"), x.dir, x.iteration, x.load_optimizer);
}

// A shard: one (pp, tp, dp) coordinate's slice of the model, its gradients and (today) its optimizer
// state. Runs on its own thread (spawned detached); handles one message at a time, in mailbox order.
using shard_actor = caf::typed_actor<
    caf::replies_to<init_atom, uint64_t>::with<ok_atom>,             // initialise parameters from a seed
    caf::replies_to<fwd_bwd_atom, MicroBatch>::with<MicroBatchResult>,  // accumulate one micro-batch
    caf::replies_to<step_atom, StepRequest>::with<StepResult>,       // clip + AdamW + zero grads
    caf::replies_to<eval_atom, Tensor>::with<double>,                // sum of token losses, no grads
    caf::replies_to<save_atom, SaveRequest>::with<ok_atom>,
    caf::replies_to<load_atom, LoadRequest>::with<ok_atom>>;

// Serves (count, seq_length+1) token windows of a split, starting at a sample index.
using data_loader_actor =
    caf::typed_actor<caf::replies_to<batch_atom, DataSplit, int64_t, int32_t>::with<Tensor>>;

}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::Tensor)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::MicroBatch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::DataSplit)

namespace troupe {

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
  // idle: pipeline bubble and waiting for peers). -1 on the single-shard path.
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

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, IterationStats& x) {
  return f(caf::meta::type_name("IterationStats"), x.iteration, x.train_iters, x.lm_loss, x.lr, x.grad_norm,
           x.ms_per_iter, x.tokens_per_sec, x.model_tflops, x.fraction_of_peak, x.consumed_samples,
           x.busy_fraction_min, x.busy_fraction_max);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EvalStats& x) {
  return f(caf::meta::type_name("EvalStats"), x.iteration, x.loss, x.perplexity, x.tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SavedCheckpoint& x) {
  return f(caf::meta::type_name("SavedCheckpoint"), x.iteration, x.path, x.seconds, x.committed);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TrainSummary& x) {
  return f(caf::meta::type_name("TrainSummary"), x.iteration, x.last_loss, x.last_eval_loss, x.stopped_early,
           x.last_checkpoint);
}

// The trainer: drives iterations once told to run; stops after the current iteration on stop.
using trainer_actor = caf::typed_actor<caf::reacts_to<run_atom>, caf::reacts_to<stop_atom>>;

}  // namespace troupe
