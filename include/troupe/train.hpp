// Training and evaluation from code: what `troupe train` and `troupe eval` do, as functions.
//
//   troupe::TrainConfig cfg;                        // or troupe::parse_train_flags (troupe/flags.hpp)
//   cfg.model.num_layers = 2; ...; cfg.mock_data = true; cfg.train_iters = 10;
//   troupe::TrainCallbacks cb;
//   cb.on_iteration = [](const troupe::IterationStats& s) { std::printf("%g\n", s.lm_loss); };
//   troupe::Result<troupe::TrainSummary> r = troupe::train(cfg, nullptr, cb);
//   if (!r) { std::fprintf(stderr, "%s\n", r.status().message().c_str()); return r.status().is_bad_input() ? 2 : 1; }
//
// One process runs every rank of the layout (tp x pp x dp actors on the in-process backend). Started
// by `troupe launch` (or srun / mpirun: the launch environment, TROUPE_* / SLURM_* / OMPI_*
// variables), each process holds one rank: train() meets the other processes at the rendezvous,
// builds the UCX world and trains its rank; rank 0's callbacks see the job's iterations (every rank
// gets them; only rank 0's are meant to be printed). Checkpoints, restarts from --save, run
// identity and every other setting behave exactly as under `troupe train`.
//
// Threading: train() and evaluate() block the calling thread until the run ends; the callbacks run
// on that thread, in order, never concurrently. The actors (and their compute threads) live inside
// the call. Several runs may not share one process at the same time (BLAS thread settings are
// process-wide). Errors come back as a Status: is_bad_input() for a configuration, data or
// checkpoint that cannot work (the message names the setting and the fix; nothing was written),
// otherwise a failure while running (a rank that failed, a peer that died, a full disk).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "troupe/data_source.hpp"
#include "troupe/reports.hpp"
#include "troupe/schedule.hpp"
#include "troupe/stage.hpp"
#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

struct TrainCallbacks {
  // Once the run is set up, before the first iteration: the configuration as resolved (vocabulary
  // from the tokenizer, data-parallel size from the ranks started, threads per rank), the data, this
  // process's rank and the processes of the job (0 and 1 in one process). A failed Status ends the
  // run before it starts (train() returns it).
  std::function<Status(const TrainConfig&, const DataSource&, int rank, int world_size)> on_start;
  std::function<void(const std::string&)> on_note;  // start-up and progress information, one line each
  std::function<void(const IterationStats&)> on_iteration;  // every --log-interval iterations
  std::function<void(const EvalStats&)> on_eval;            // every --eval-interval iterations
  std::function<void(const SavedCheckpoint&)> on_saved;     // snapshot taken, then durable on disk
  // `troupe inspect ... set log-interval N` changed how often progress should be printed.
  std::function<void(int64_t)> on_log_interval;
  // The job moved from one phase of its lifecycle to another (troupe/reports.hpp's JobPhase).
  std::function<void(const PhaseChange&)> on_phase;
};

struct RunOptions {
  // Polled a few times a second: once it is true the run stops after the current iteration (saving
  // a checkpoint when config.save is set) and train() returns a summary with stopped_early.
  const std::atomic<bool>* stop = nullptr;
  // Polled like stop: once it is true a node asks to join the job (troupe launch --nnodes MIN:MAX):
  // the run stops at its next in-memory snapshot (with --save-memory-interval; otherwise after the
  // current iteration, saving with --save) and train() returns a summary with regrouped, for the
  // launchers to start a round with the new node. Without either it is noted and ignored.
  const std::atomic<bool>* regroup = nullptr;
  // Measure the sgemm peak at start-up (IterationStats::fraction_of_peak; about a second).
  bool measure_peak = true;
  // A pipeline schedule given as data instead of config.pipeline_schedule's generated one. It must
  // have the job's pipeline stages, micro-batches per replica and model chunks per stage, and pass
  // sched::validate (every action once, no deadlock); otherwise train() refuses it with the reason
  // before anything runs (bad input).
  std::shared_ptr<const sched::Schedule> schedule;
  // A model given in code instead of GPT's own (include/troupe/stage.hpp): GPT blocks, custom
  // stages, or both, one entry per virtual pipeline stage. It must fit the job (the virtual stages
  // of config's pipeline, tensors that chain from block to block, the loss on the last block:
  // check_model's rules); otherwise train() refuses it, naming every problem, before anything runs
  // (bad input). Checkpoints hold its parameters by their global names and reload on any layout
  // with the same model.
  std::shared_ptr<const Model> model;
  // Under a launcher: when the bootstrap reports that another process died or stopped answering,
  // this process cannot finish its collectives. Called with this rank and the reason; default: give
  // the ordinary failure path 5 s (half the heartbeat's timeout when --distributed-timeout-minutes
  // makes that shorter), then end the process with exit code 1 (troupe launch --max-restarts
  // restarts the job from its latest checkpoint).
  std::function<void(int rank, const std::string& why)> on_peer_failure;
  // A rank stuck in a handler (found by --distributed-timeout-minutes) cannot be torn down. Called
  // with the message; default: train() returns the error and leaves the stuck threads behind.
  std::function<void(const std::string& message)> on_stuck;
  // Under a launcher with several processes (troupe train --auto-layout over several hosts): rank 0
  // calls this once the ranks have met, and every rank trains with the layout it returns — the
  // parallel sizes, micro-batch size, ZeRO stage, recompute, optimizer offload, pipeline schedule and
  // sequence parallelism; the rest of the config stays each rank's own. Its failure fails every rank
  // with its message. Unset, or in one process: not called.
  std::function<Result<TrainConfig>(const TrainConfig& config, int world_size, int local_world_size)> choose_layout;
};

// The data a config names: synthetic tokens (mock_data), the indexed dataset (or blend) at data_path
// with its train/validation/test split, or the per-split blends (open_blended_data; training
// shuffled with seed unless no_shuffle). config.model.vocab_size
// must be set (train() sets it from the tokenizer).
Result<std::shared_ptr<DataSource>> open_data(const TrainConfig& config);

// Trains as `troupe train` does. config: validated here (every problem at once is not guaranteed:
// the first failing check's message names its setting); model.vocab_size is taken from the
// tokenizer (tokenizer_type, vocab_file, merge_file). data: null to open what the config names.
Result<TrainSummary> train(TrainConfig config, std::shared_ptr<const DataSource> data,
                           const TrainCallbacks& callbacks = {}, const RunOptions& options = {});

struct EvalSummary {
  double loss = 0;        // mean next-token loss
  double perplexity = 0;
  int64_t tokens = 0;    // loss terms (tokens for GPT's head)
  int64_t samples = 0;
  int64_t iteration = 0;  // of the checkpoint
};

// As `troupe eval`: loads the model of the checkpoint in `dir` (its latest iteration, saved by any
// layout) into one rank and returns the mean loss over the first `samples` windows of `data`'s
// training split read in order (all windows when samples <= 0). model: for a checkpoint of a model
// given in code, that model (as RunOptions::model was, for any layout: its blocks run in order on
// the one rank); the loss is then per Model::loss_terms_per_sample term. Null: GPT's model, and a
// checkpoint of a model given in code is refused naming one of its tensors.
Result<EvalSummary> evaluate(const std::string& dir, std::shared_ptr<const DataSource> data, int64_t samples,
                             int micro_batch_size, int num_threads, std::shared_ptr<const Model> model = nullptr);

}  // namespace troupe
