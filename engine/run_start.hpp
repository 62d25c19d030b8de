// Where a training run starts, and where a failed attempt starts again: the run's identity (a
// restarted process resumes only this run's checkpoints), what --load holds and what the trainer
// takes from it, a Hugging Face folder staged as a checkpoint, the folder of in-memory snapshots,
// and the restart point after a failure (the newer of --save's latest checkpoint and the in-memory
// snapshot). Plain code over files and the bootstrap (no CAF): actors/job.cpp's lifecycle calls it
// in its resolving, starting and recovering phases (engine/lifecycle.hpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/run_identity.hpp"
#include "engine/job_options.hpp"
#include "engine/loss_scaler.hpp"
#include "engine/types.hpp"
#include "storage/checkpoint.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

using NoteFn = std::function<void(const std::string&)>;

// This run's identity and where it starts (config/run_identity.hpp): a restarted process
// (options.restarted) resumes the newer of this run's in-memory snapshot and its latest checkpoint
// in --save, never another run's; a new run inherits the id of what it loads or takes the
// launcher's (or a fresh) one; --save must not hold another run's checkpoints. Under troupe launch
// rank 0 decides and every rank follows (a save could land between their reads). Sets config.load,
// .finetune, .no_load_optim and .run_id. `copies` (a job whose in-memory snapshots span hosts:
// engine/snapshot_copies.hpp): every process takes part in finding the newest snapshot whole over
// the hosts, and a host fetches the shards it lacks; each process then loads its own host's folder.
class SnapshotCopies;
Status resolve_run(TrainConfig& config, const JobOptions& options, const NoteFn& note,
                   SnapshotCopies* copies = nullptr);

// The job's folder of in-memory snapshots (storage/sharded_checkpoint.hpp's memory_snapshot_dir):
// one per process, or under troupe launch one per launched run (its restarts share it).
std::string job_memory_snapshot_dir(const TrainConfig& config, const JobOptions& options);

// A troupe checkpoint in --load, read and checked against the config: its latest iteration, the
// metadata and the config it stored, and what the resume (or fine-tune) changes. Bad input when it
// cannot be this run's start. Reads only the metadata (the shards are read by the ranks).
struct LoadPlan {
  int64_t iteration = 0;
  CheckpointMeta meta;
  TrainConfig saved;
  ResumeCheck resume;
};
Result<LoadPlan> plan_load(const TrainConfig& config);

// What the ranks load from a planned checkpoint and where the trainer goes on: --finetune takes the
// parameters only and starts at iteration 0; --no-load-optim takes the parameters and the position,
// not the moments. `before` are the notes for before the load, `loaded` the one after it.
struct ResumePoint {
  LoadRequest request;
  int64_t start_iteration = 0, consumed_samples = 0;
  int64_t skipped_steps = 0, skipped_samples = 0;  // fp16's overflow-skipped steps
  int64_t optimizer_step_offset = 0;
  std::optional<LossScalerState> loss_scaler_state;
  std::vector<std::string> before;
  std::string loaded;
};
Result<ResumePoint> resume_point(const TrainConfig& config, const LoadPlan& plan);

// --load of a Hugging Face folder (storage/hf_import.hpp): read and checked against the flags, then
// written as a one-shard troupe checkpoint in a private temporary folder that the ranks load like
// any other (each process its own: under troupe launch every process reads the folder). The folder
// is removed when the object goes.
class StagedHfFolder {
 public:
  StagedHfFolder(std::string dir, ResumeCheck check) : dir_(std::move(dir)), check_(std::move(check)) {}
  ~StagedHfFolder();
  StagedHfFolder(const StagedHfFolder&) = delete;
  StagedHfFolder& operator=(const StagedHfFolder&) = delete;
  const std::string& dir() const { return dir_; }
  LoadRequest request() const;  // the parameters at iteration 0, no optimizer state
  std::string loaded_note(const TrainConfig& config) const;

 private:
  std::string dir_;
  ResumeCheck check_;
};
Result<std::unique_ptr<StagedHfFolder>> stage_hf_folder(const TrainConfig& config);

// Removes the unfinished saves in `save` newer than its latest complete checkpoint (debris this
// run's own saves would have to find room beside), one note each.
void discard_unfinished_saves(const std::string& save, const NoteFn& note);

// The folder of in-memory snapshots of a run with --save-memory-interval: created (an owned folder
// of an earlier process with this pid emptied first), its unfinished snapshots discarded (by rank 0's
// process), and removed when the object goes if this process owns it (no troupe launch: the
// launcher owns a launched run's folder and removes it at its end). spans_hosts: the job's
// processes are on several hosts, which a host's memory cannot serve (bad input).
class MemorySnapshotFolder {
 public:
  MemorySnapshotFolder() = default;
  ~MemorySnapshotFolder();
  MemorySnapshotFolder(const MemorySnapshotFolder&) = delete;
  MemorySnapshotFolder& operator=(const MemorySnapshotFolder&) = delete;
  const std::string& dir() const { return dir_; }
  // `copies`: the snapshots span hosts (null: one host); its first process on each host keeps the folder tidy.
  Status open(const TrainConfig& config, const JobOptions& options, const SnapshotCopies* copies, const NoteFn& note);

 private:
  std::string dir_;
  bool owned_ = false;
};

// Where a failed attempt starts again: this run's latest checkpoint in config.save, or the
// in-memory snapshot in memory_dir when it is newer; else where `attempt` started (the start, or
// --load). Sets attempt.load (and clears .finetune, .no_load_optim) to resume it. An error when
// --save's latest checkpoint is another run's (it is not this run's to resume).
struct RestartPoint {
  bool found = false;      // a checkpoint or snapshot of this run
  int64_t iteration = 0;   // its iteration
  std::string from;        // where, in words
};
Result<RestartPoint> restart_point(const TrainConfig& config, TrainConfig& attempt, const std::string& memory_dir,
                                   const Status& failure);

// The sgemm peak the job's FLOP rates are measured against: this process's on `threads`, summed
// over the job's processes under troupe launch (measured at the same time, so processes that share
// a host share its cores as they will while training). One note says it. local: this process's own
// figure, taken when > 0 (a process recovering in the job measured it before), stored when measured;
// < 0 under several processes: not measured, counted as the mean of the others' (a process started in
// a failed one's place, which the others wait for).
Result<double> measure_job_peak(int threads, comm::Bootstrap* bootstrap, const NoteFn& note, double* local = nullptr);

}  // namespace troupe
