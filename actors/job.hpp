// Runs a training or evaluation job inside one actor system: spawns the rank actors of this process
// (detached; one engine for every layout, 1x1x1 included), their group, the optimizer partitions,
// the offload actor, the data loader and the trainer, initialises or loads the model, and relays the trainer's reports to the
// caller's callbacks on the calling thread. Returns when the job is done, failed, or stopped.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "troupe/data_source.hpp"
#include "troupe/train.hpp"
#include "actors/messages.hpp"
#include "engine/rank_engine.hpp"
#include "model/footprint.hpp"
#include "troupe/train_config.hpp"
#include "comm/bootstrap.hpp"
#include "comm/world.hpp"

namespace troupe {

// The callbacks of troupe::train. run_training calls on_start once everything that can refuse the
// run was checked (the run identity, the layout, a schedule or model given in code, --load's
// checkpoint against the config), so that on_start sees only a run that starts.
using JobCallbacks = TrainCallbacks;

struct JobOptions {
  bool measure_peak = true;
  // Polled a few times a second; when it becomes true the trainer stops after the current iteration
  // (saving a checkpoint when --save is set).
  const std::atomic<bool>* stop = nullptr;
  // Under `troupe launch`: this process's view of the job's UCX world (it holds one rank) and the
  // bootstrap its ranks met through (the timeline is gathered over it). Null: every rank of a
  // parallel layout runs in this process on the local backend.
  std::shared_ptr<comm::CommWorld> world;
  comm::Bootstrap* bootstrap = nullptr;
  // --device cuda: the GPU of this process's rank (under troupe launch: its LOCAL_RANK; the world
  // is then NCCL's).
  int cuda_device = 0;
  // Called with the message when the watchdog (--distributed-timeout-minutes) finds a stuck rank. A
  // stuck actor cannot be torn down: troupe train prints the message and ends the process here.
  // Without it, run_training returns the error and leaves the stuck actors (and their actor system
  // and threads) behind.
  std::function<void(const std::string&)> on_stuck;
  // This process was restarted after a failure (troupe launch --max-restarts: TROUPE_RESTART_COUNT
  // > 0): it resumes from the latest checkpoint in --save when that checkpoint belongs to this run,
  // the run of --load or, without --load, the launcher's run (launch_run_id, TROUPE_RUN_ID; empty:
  // a fresh id). Under troupe launch rank 0 decides and every rank follows.
  bool restarted = false;
  std::string launch_run_id;
  // A schedule given as data (troupe::RunOptions::schedule); checked before any rank starts.
  std::shared_ptr<const sched::Schedule> schedule;
  // A model given in code (troupe::RunOptions::model); checked by check_model before any rank starts.
  std::shared_ptr<const Model> model;
  // The job's secret (the launch environment's, or one made for a single process): the key of the
  // inspector's connections (--inspect).
  std::string job_token;
};

Result<TrainSummary> run_training(const TrainConfig& config, std::shared_ptr<const DataSource> data,
                                  const JobCallbacks& callbacks, const JobOptions& options = {});

// Loads the model of checkpoint `dir` (its latest iteration) and returns the mean next-token loss over
// the first `samples` windows of `data`'s training split read in order (all windows when samples <= 0).
// model: the model given in code the checkpoint holds (null: GPT's), for any layout it trained on.
Result<EvalSummary> run_evaluation(const std::string& dir, std::shared_ptr<const DataSource> data, int64_t samples,
                                   int micro_batch_size, int num_threads, std::shared_ptr<const Model> model = nullptr);

// The parallel layout a validated config asks for, with world_size ranks started (1: one process).
Result<ParallelConfig> parallel_config(const TrainConfig& config, int world_size);

// How a run reports a model given in code (null: GPT's): the loss terms per sample (0: seq_length,
// a loss per token) and whether Megatron's GPT FLOP count applies (the model has GPT layers).
struct ModelReport {
  int64_t loss_terms_per_sample = 0;
  bool gpt_flops = true;
};
ModelReport model_report(const Model* model);

// The rank spec of this process's ranks: the layout against the ranks started (options.world's, or
// one process), the device, a schedule and a model given in code (options.schedule, .model), each
// checked (bad input naming the problem) before any actor exists. threads: this process's compute
// threads (split among its ranks in one process).
Result<RankSpec> plan_ranks(const TrainConfig& config, const JobOptions& options, int threads);

// A model given in code against the job `config` describes with world_size ranks started:
// check_model's rules (every problem at once), and custom blocks refused on --device cuda. Bad input
// naming each problem; footprint (when given) gets each virtual stage's for the memory estimate.
Status check_model_for_job(const Model& model, const TrainConfig& config, int world_size,
                           std::vector<StageFootprint>* footprint = nullptr);

// Model configuration stored in a checkpoint (its latest iteration), accepted only when it describes
// the tensors the checkpoint holds (config/stored_config.hpp).
Result<TrainConfig> checkpoint_config(const std::string& dir);

}  // namespace troupe
