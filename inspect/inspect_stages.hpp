// The inspector's `stages`, `plan`, `history` and `moe` (docs/INSPECT.md), registered on the job's
// InspectHub (inspect/inspector.hpp) by run_ranks:
//   stages [--last N] [--spans N]
//                                per rank over the last N iterations every rank completed (default
//                                8, at most 16): busy, idle and bubble shares, F/B/W ms, beside the
//                                bubble the schedule predicts (engine/stages.hpp); --spans N adds
//                                the spans of the last N of those iterations. Job-wide: rank 0's process takes its own ranks'
//                                last 16 steps, then asks the others for their steps since the
//                                oldest of those ("local stages --since ITERATION"), which their
//                                rings of 64 still hold when they answer tens of steps later.
//   plan [RANK]                  the schedule table every stage executes (or RANK's stage), each
//                                action's planned start, and where the ranks are in it now.
//   history [--last N] [--since ITER]
//                                the job's iterations (loss, lr, grad norm, ms), as drive_trainer
//                                received them: the process's own record, the same in every process.
//   moe                          each MoE layer's load in the last iteration (tokens per expert routed
//                                and kept, dropped, lb and z losses), from the same record; a dense
//                                model's answer has no layers.
// The handlers read only what other threads publish: the boards' span rings, the history (both
// locked), and the schedule, which is fixed for the job.
#pragma once
#include <memory>
#include <vector>

#include "inspect/inspector.hpp"
#include "engine/activity.hpp"
#include "engine/iteration_history.hpp"
#include "troupe/schedule.hpp"

namespace troupe {

struct StageSources {
  std::vector<std::shared_ptr<const ActivityBoard>> boards;  // this process's ranks
  sched::Schedule schedule;                                  // what the ranks execute (job_schedule)
  bool given_as_data = false;                                // RunOptions::schedule, not a generated kind
  std::shared_ptr<const IterationHistory> history;
};

void add_stage_commands(InspectHub& hub, StageSources sources);

}  // namespace troupe
