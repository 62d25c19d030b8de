// The job's supervisor (docs/ARCHITECTURE.md, "The job's lifecycle"): an actor that moves a run through
// its lifecycle (engine/lifecycle.hpp) after resolving -- starting an attempt, and when it fails,
// recovering (or failing) and starting the next. Its decisions are messages: it starts each attempt on
// a thread of its own (an attempt builds and tears down an actor system of its own, and blocks while
// it trains) and hears of its end as a message, so between and during attempts the supervisor itself
// stays free for messages. What an attempt is, whether a failure is restarted and from where are the
// job's (actors/job.cpp), given as hooks.
#pragma once
#include <functional>
#include <string>

#include "engine/lifecycle.hpp"
#include "troupe/reports.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct AttemptOutcome {
  Result<TrainSummary> result = Status::error("the attempt did not run");
  bool stuck = false;  // an actor of the attempt never stopped (its thread is left behind)
};

struct SupervisorHooks {
  // One attempt (the lifecycle in `starting`; it enters training and stopping itself), on a thread of
  // its own. An exception it throws is the attempt's failure.
  std::function<AttemptOutcome(int attempt)> attempt;
  // After a failed attempt: ok to restart, or the status the run fails with.
  std::function<Status(const AttemptOutcome& failed, int attempt)> may_restart;
  // Where the next attempt starts (a note for the log), or why it cannot; called in `recovering`.
  std::function<Result<std::string>(const AttemptOutcome& failed, int attempt)> restart_from;
  // A successful attempt's summary, before the run returns it (the lifecycle still in stopping).
  std::function<void(TrainSummary&)> finished;
};

// Spawns the supervisor (in a small actor system of its own), runs the job to its end and returns its
// result: the last attempt's summary (finished), or why the run failed (failed). `lifecycle` must be
// in resolving.
Result<TrainSummary> supervise(JobLifecycle& lifecycle, const SupervisorHooks& hooks);

}  // namespace troupe
