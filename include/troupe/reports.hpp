// What a training or evaluation run reports while it runs and when it ends: one IterationStats per
// logged iteration, one EvalStats per evaluation, one SavedCheckpoint per save (twice: when the
// snapshot is taken and once it is durable on disk), and the TrainSummary at the end. Plain values,
// copied to the callbacks of troupe::train (troupe/train.hpp) on the caller's thread.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

// A training job's phases in this process (docs/ARCHITECTURE.md, "The job's lifecycle"): resolving
// what the run is and loads, starting an attempt's actors, training, recovering from a failed
// attempt (choosing where the next one starts), stopping (the last saves flushed), and the end:
// finished or failed. TrainCallbacks::on_phase gets each change.
enum class JobPhase { resolving, starting, training, recovering, stopping, finished, failed };

inline const char* phase_name(JobPhase phase) {
  switch (phase) {
    case JobPhase::resolving: return "resolving";
    case JobPhase::starting: return "starting";
    case JobPhase::training: return "training";
    case JobPhase::recovering: return "recovering";
    case JobPhase::stopping: return "stopping";
    case JobPhase::finished: return "finished";
    case JobPhase::failed: return "failed";
  }
  return "unknown";
}

struct PhaseChange {
  JobPhase from = JobPhase::resolving, to = JobPhase::resolving;
  double seconds = 0;  // since the run began
  int attempt = 0;     // 1 for the first attempt, 2 after the first restart, ...
  std::string why;     // what moved it (the failure, for recovering and failed)
};

// One of Megatron's timers over one iteration (its names: "forward-compute", "backward-compute",
// "all-grads-sync", "optimizer", ...; engine/step_timers.hpp): milliseconds, the most any rank of
// this process spent (ms), the least (min_ms), and each rank's (ranks_ms, in rank order).
struct TimerReading {
  std::string name;
  double ms = 0;
  double min_ms = 0;
  std::vector<double> ranks_ms;
};

// One mixture-of-experts layer's routing over one iteration: every training micro-batch of every
// data-parallel replica (a recomputed forward is not counted again). Token counts are (token, expert)
// assignments: top-k routing makes k of each token.
struct MoeLayerLoad {
  int layer = 0;                      // global transformer layer, 0-based
  int64_t micro_batches = 0;          // routed by the layer in the iteration, over all replicas
  std::vector<int64_t> routed, kept;  // (E) per expert: assignments routed to it, those its capacity kept
  int64_t dropped = 0;                // assignments past an expert's capacity (sum of routed - kept)
  // Means over the micro-batches, before their coefficients: the load-balancing loss (DeepSpeed's
  // l_aux, Megatron-Core's aux_loss or seq_aux_loss; 0 when the router has none) and the z-loss.
  double lb_loss = 0, z_loss = 0;
};

// How one rank compares (engine/stragglers.hpp computes it from every rank's activity timers).
struct StragglerScore {
  int rank = 0;
  int stage = 0;          // its pipeline stage: its peers are the ranks of the same stage
  double relative = 1;    // the stage's fastest rank's compute time / this rank's
  double individual = 1;  // this rank's best compute time over its recent steps / now
  std::string section;    // where its time goes beyond the fastest peer's ("" for none)
  double section_ms = 0, fastest_section_ms = 0;
  double compute_ms = 0;  // forward, backward and optimizer compute together
};

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
  // Megatron's log fields: the global batch of this iteration (smaller than --global-batch-size
  // while --rampup-batch-size ramps up), the loss scale (1: float32 training scales nothing), and
  // whether the optimizer step was skipped (a non-finite gradient) and the loss was not finite.
  int64_t global_batch_size = 0;
  double loss_scale = 1.0;
  bool skipped = false;
  bool nan_loss = false;
  // The iteration's timers (wall_clock_breakdown / --timing-log-level): empty when not asked for.
  std::vector<TimerReading> timers;
  // Megatron's --log-params-norm: the L2 norm of the parameters after the iteration's update (the
  // fp32 master weights, each element of the model once); --log-num-zeros-in-grad: how many elements
  // of the iteration's gradients are exactly zero (each once; the vocabulary padding left out).
  // Negative when not asked for.
  double params_norm = -1;
  int64_t num_zeros_in_grad = -1;
  // Mixture of experts (empty for a dense model): each MoE layer's load in this iteration, in layer
  // order, and Megatron-DeepSpeed's "moe loss": what the auxiliary losses add to the objective,
  // sum over MoE layers of (aux_loss_coeff * lb_loss + z_loss_coeff * z_loss), averaged over the
  // micro-batches (0 for a dense model).
  std::vector<MoeLayerLoad> moe;
  double moe_loss = 0;
  // Straggler scores of the previous iteration (engine/stragglers.hpp), every rank of a job of more
  // than one, lowest relative score first; a rank below straggler_threshold is a straggler.
  std::vector<StragglerScore> rank_scores;
  double straggler_threshold = 0;
};

struct EvalStats {
  int64_t iteration = 0;
  double loss = 0;
  double perplexity = 0;
  int64_t tokens = 0;
  double seconds = 0;  // the validation pass's wall time
};

struct SavedCheckpoint {
  int64_t iteration = 0;
  std::string path;
  double seconds = 0;      // in the training path (the snapshot); committed: the background write
  bool committed = false;  // sent again by the offload actor once the save is complete on disk
  bool memory = false;     // an in-memory snapshot (--save-memory-interval), not a save in --save
  // Committed in-memory snapshots: how many of this process's shards became the snapshot where the
  // pieces were copied (a dropped snapshot's file: the writer copied none of their bytes again).
  int shards_in_place = 0;
  // Committed saves and snapshots: the CPU time the background writer spent on this process's shards.
  double writer_cpu_seconds = 0;
};

// Where a run's wall-clock time went (engine/goodput.hpp): the productive part and the time lost by
// cause, in this order: startup, failures, recovery, saves, evaluation, stragglers, pipeline bubble,
// other.
struct GoodputReport {
  double wall_seconds = 0;
  double productive_seconds = 0;
  double goodput = 0;  // productive / wall (0 for an empty run)
  int64_t iterations_lost = 0;  // steps a failure undid (computed again after the restart)
  std::vector<std::pair<std::string, double>> lost_seconds;
  double lost(const std::string& cause) const {
    for (const auto& [c, s] : lost_seconds)
      if (c == cause) return s;
    return 0;
  }
};

struct TrainSummary {
  int64_t iteration = 0;  // last completed iteration
  double last_loss = 0;
  double last_eval_loss = -1;  // < 0: never evaluated
  bool stopped_early = false;
  bool regrouped = false;  // stopped for a node that asks to join (RunOptions::regroup)
  bool spare_unused = false;  // a warm spare (troupe launch --spares) the job finished without needing
  std::string last_checkpoint;
  GoodputReport goodput;  // this process's view of the run, restarts in it included
};

}  // namespace troupe
