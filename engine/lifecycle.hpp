// A training job's lifecycle in one place: the phases a process's job goes through and the only
// transitions between them.
//
//   resolving   -> starting | failed
//   starting    -> training | recovering | failed
//   training    -> stopping | recovering | failed
//   recovering  -> starting | failed
//   stopping    -> finished | recovering (a last save failed) | failed
//   finished, failed: the end
//
// resolving: the run's identity and what it loads (engine/run_start.hpp), the layout and the
// checks that can refuse the run; starting: an attempt's actors spawned, the model loaded or
// initialised; training: the trainer runs; recovering: an attempt failed and the next one's start
// point is chosen (a checkpoint or in-memory snapshot); stopping: the last saves flushed, the actors
// torn down; finished and failed end the run. actors/job.cpp's supervisor moves through them (and
// only through these transitions); each change is reported to the job's observer with the time and
// why.
#pragma once
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/reports.hpp"

namespace troupe {

// Whether the lifecycle may go from `from` to `to`.
bool phase_transition_allowed(JobPhase from, JobPhase to);

class JobLifecycle {
 public:
  using Observer = std::function<void(const PhaseChange&)>;
  explicit JobLifecycle(Observer observer = {});

  // Moves to `to` (TROUPE_CHECK: an allowed transition from the current phase); entering starting
  // after recovering begins the next attempt.
  void enter(JobPhase to, std::string why = {});
  JobPhase phase() const;
  int attempt() const;
  std::vector<PhaseChange> history() const;

 private:
  mutable std::mutex mutex_;
  Observer observer_;
  std::chrono::steady_clock::time_point began_;
  JobPhase phase_ = JobPhase::resolving;
  int attempt_ = 0;
  std::vector<PhaseChange> history_;
};

// The metrics file's line of a change: {"type":"phase","phase":..,"from":..,"attempt":..,"seconds":..,"why":..}.
std::string phase_json(const PhaseChange& change);

// "resolving -> starting -> training -> stopping -> finished" (attempts after a recovery included).
std::string describe_phases(const std::vector<PhaseChange>& history);

}  // namespace troupe
