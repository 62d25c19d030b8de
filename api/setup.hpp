// What troupe::train and troupe::spawn_training check before anything runs (api/train.cpp).
#pragma once
#include "troupe/stage.hpp"
#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// What the caller gave besides the config: data of its own (a DataSource, or batches as messages),
// and a model given in code (null: GPT's own).
struct GivenToRun {
  bool data = false;
  const Model* model = nullptr;
};

// Validates `cfg` for a job of `world` processes (`local_world` of them on this host), sets the
// vocabulary from the tokenizer and checks the memory estimate. Every failure is bad input naming
// the setting and the fix.
Status resolve_config(TrainConfig& cfg, int world, int local_world, const GivenToRun& given = {});

// troupe launch --in-job-recovery, as its processes see it (TROUPE_IN_JOB_RECOVERY=1, the launch's
// --max-restarts in TORCHELASTIC_MAX_RESTARTS, TROUPE_REPLACEMENT=1 in a process started in a failed
// one's place): off for a job of one process or without restarts.
struct InJobRecovery {
  bool enabled = false;
  bool replacement = false;  // started in a failed process's place: joins whichever generation forms
  int max_recoveries = 0;    // how often a process may rejoin
  // --spares K (TROUPE_IN_JOB_SPARES=1): warm spare processes wait at the rendezvous and take a lost
  // rank's place; a process whose place a spare took (it was cut off) stays as a spare itself.
  bool spares = false;
};
InJobRecovery in_job_recovery_from_env(int world);

// Whether train() ended because the job failed again after max_recoveries recoveries in the job.
// Counted over the job (its generation, which a replacement process adopts), not per process, so
// every process gives up at the same failure and none waits at a rendezvous for ranks that will not
// come; troupe train then exits 76, which troupe launch does not restart.
bool job_given_up(const Status& st);

}  // namespace troupe
