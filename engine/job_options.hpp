// What a training job is given besides its config and data: the caller's callbacks and the options
// of the process it runs in (the launch world, the bootstrap, a schedule or model given in code).
// Plain data (no CAF): the job's plan (engine/job_plan.hpp), its start (engine/run_start.hpp) and the
// actors of actors/job.cpp all read it.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "comm/bootstrap.hpp"
#include "comm/world.hpp"
#include "troupe/schedule.hpp"
#include "troupe/stage.hpp"
#include "troupe/train.hpp"

namespace troupe {

// The callbacks of troupe::train. run_training calls on_start once everything that can refuse the
// run was checked (the run identity, the layout, a schedule or model given in code, --load's
// checkpoint against the config), so that on_start sees only a run that starts.
using JobCallbacks = TrainCallbacks;

struct JobOptions {
  bool measure_peak = true;
  // This process's own sgemm peak (GFLOP/s): > 0 is taken instead of measuring again (a process
  // that recovers in the job measured it before), 0 is measured and stored here. Null: measured.
  double* local_peak = nullptr;
  // Polled a few times a second; when it becomes true the trainer stops after the current iteration
  // (saving a checkpoint when --save is set).
  const std::atomic<bool>* stop = nullptr;
  const std::atomic<bool>* regroup = nullptr;  // RunOptions::regroup
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
  // In-job recovery: the run the job decided at an earlier generation (every process learns it at
  // the rendezvous, so a spare that takes rank 0's place resumes the job's run, not its own
  // launcher's); empty: launch_run_id. The run this attempt decides is written to *run_id_out.
  std::string job_run_id;
  std::string* run_id_out = nullptr;
  // A schedule given as data (troupe::RunOptions::schedule); checked before any rank starts.
  std::shared_ptr<const sched::Schedule> schedule;
  // A model given in code (troupe::RunOptions::model); checked by check_model before any rank starts.
  std::shared_ptr<const Model> model;
  // The job's secret (the launch environment's, or one made for a single process): the key of the
  // inspector's connections (--inspect).
  std::string job_token;
};

}  // namespace troupe
