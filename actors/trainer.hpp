// The trainer actor (trainer_actor in actors/messages.hpp): drives iterations. Per iteration it asks the
// data loader for the global batch, hands it to the rank group (one train_step message: the ranks
// split it over the data-parallel replicas and run the schedule and the optimizer step) with the
// scheduled learning rate, reports IterationStats to the listener, evaluates and saves at their
// intervals, and reads the next batch ahead while the ranks compute. Reports to the listener (an
// untyped actor):
//   (progress_atom, IterationStats)  (eval_atom, EvalStats)  (save_atom, SavedCheckpoint)
//   (done_atom, TrainSummary)        (failed_atom, std::string message)
// It monitors the rank group and the data loader: if one dies, the job fails with the cause.
#pragma once
#include <caf/all.hpp>

#include <chrono>
#include <functional>
#include <optional>

#include "inspect/job_control.hpp"
#include "actors/messages.hpp"
#include "actors/offload_actor.hpp"
#include "actors/rank_actor.hpp"
#include "engine/loss_scaler.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

struct TrainerSpec {
  TrainConfig config;
  group_actor group;  // the ranks of this process, whatever the layout (actors/rank_actor.hpp)
  // IterationStats carry the ranks' busy share (parallel layouts; a 1x1x1 job leaves it -1).
  bool report_busy = true;
  // After every local rank handed over its shard, completes the save (in the job: the
  // offload actor writes, waits for the other processes, writes the metadata and the latest
  // pointer); runs on the trainer's thread. Null: nothing to complete.
  std::function<Status(const SaveRequest&)> finalize_save;
  // Background saves in flight (snapshots handed to the offload actor, not yet committed). Before a
  // save takes its snapshot the trainer waits (flushing `offload`) while --max-saves-in-flight of
  // them are, so the snapshots held in memory and the distance to the latest durable checkpoint
  // stay bounded. While it waits it counts itself in (the writer stops pacing itself: a save is
  // waiting behind). Null: no waiting.
  std::shared_ptr<std::atomic<int>> saves_in_flight;
  offload_actor offload;
  // Where in-memory snapshots go (config.save_memory_interval > 0), resolved by the job.
  std::string memory_dir;
  data_loader_actor loader;
  caf::actor listener;
  int64_t start_iteration = 0;   // iterations already done (from a checkpoint)
  int64_t consumed_samples = 0;
  // Iterations whose Adam steps the moments do not hold (a --no-load-optim load: its moments start
  // afresh, so AdamW's bias correction counts from there, as a fresh torch optimizer's does).
  int64_t optimizer_step_offset = 0;
  // Mixed precision's loss scaling (engine/loss_scaler.hpp), from a checkpoint: the scaler's state
  // (none: a fresh scaler from config.precision) and the steps and samples its overflows skipped
  // before (they advance neither the learning-rate schedule nor Adam's step count, as in Megatron
  // and DeepSpeed).
  std::optional<LossScalerState> loss_scaler_state;
  int64_t skipped_steps = 0, skipped_samples = 0;
  int64_t validation_windows = 0;
  double sgemm_peak_gflops = 0;  // for % of peak; 0 when not measured
  // A model given in code (include/troupe/stage.hpp): its loss terms per sample (0: seq_length, a
  // loss per token) and whether Megatron's GPT FLOP count applies to it.
  int64_t loss_terms_per_sample = 0;
  bool gpt_flops = true;
  // Stopping early (stop_atom: a signal; exit_deadline: --exit-duration-in-mins). In one process the
  // trainer stops after the current iteration. When the job spans processes (agree_on_stop), each
  // has its own trainer: the wish to stop rides on the next step (StepRequest::stop), and every
  // trainer stops after the step in which any of them asked, so all save the same iteration.
  bool agree_on_stop = false;
  std::optional<std::chrono::steady_clock::time_point> exit_deadline;
  // RunOptions::regroup: while it is true this process votes, with the step of the next in-memory
  // snapshot's iteration (any step without snapshots), for the job to stop there (regrouped).
  const std::atomic<bool>* regroup = nullptr;
  // The inspector's commands (inspect/job_control.hpp): pause, step, resume, set, save between
  // iterations, after the same iteration in every process. Null: none. A (control_atom) message
  // tells the trainer that a command arrived.
  std::shared_ptr<JobControl> control;
};

trainer_actor spawn_trainer(caf::actor_system& system, const TrainerSpec& spec);

}  // namespace troupe
