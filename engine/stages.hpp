// What the pipeline's stages did in their last steps, beside what the schedule predicts: the
// inspector's `stages` and `plan` and the dashboard (docs/INSPECT.md). Plain arithmetic on the
// ranks' span rings (engine/span_ring.hpp), tested on hand-made spans.
//
// Per rank and step, from its spans:
//   compute   the forward, backward and weight passes (ms; F, B and W apart, with their counts);
//   busy      compute / the step's wall time (from the start of the step to the end of its
//             parameter gather); idle = 1 - busy: waits, reductions, the optimizer, the gaps;
//   makespan  of the step's pipeline: the end of its last pass, from the step's start; the job's
//             makespan of an iteration is the largest over its ranks;
//   bubble    1 - compute / the job's makespan of that iteration: the share of the pipeline's
//             time the rank did not compute, as the schedule's bubble is defined
//             (sched::simulate: idle / (p * makespan), communication taking no time).
// Over several steps each share is a ratio of sums (total compute over total time). Only the
// iterations every rank has completed count, so the ranks are compared on the same steps. The
// ranks' clocks are not compared: each step is measured from its rank's own start, which the
// ranks reach within the time a command takes to reach them.
//
// The predicted bubble is computed from the schedule's table itself: sched::simulate with unit
// costs, a backward twice a forward (F = 1, B = 2; with a separate weight pass F = B = W = 1, the
// same backward split in two), per stage 1 - busy / makespan; and again with the mean F, B and W
// the ranks measured. Beside it, the formula of the schedule's kind (sched::theoretical_bubble),
// which the table meets exactly when every group of micro-batches is full.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/activity.hpp"
#include "engine/span_ring.hpp"
#include "troupe/schedule.hpp"
#include "troupe/status.hpp"

namespace troupe {

// One rank's recent steps, with its coordinates.
struct RankSteps {
  int rank = 0, stage = 0, tp = 0, dp = 0;
  std::vector<StepRecord> steps;  // oldest first
  int cp = -1;  // -1: the job has no context parallelism
};

struct StepFigures {
  int64_t iteration = 0;
  double step_ms = 0, makespan_ms = 0;  // makespan: the job's, of this iteration
  double f_ms = 0, b_ms = 0, w_ms = 0, wait_ms = 0, reduce_ms = 0, optimizer_ms = 0;
  int f = 0, b = 0, w = 0;  // passes
  double busy = 0, bubble = 0;
};

struct RankFigures {
  int rank = 0, stage = 0, tp = 0, dp = 0;
  int cp = -1;
  std::vector<StepFigures> steps;  // the iterations counted, oldest first
  // Means per step (ms) and shares over the steps.
  double step_ms = 0, f_ms = 0, b_ms = 0, w_ms = 0, wait_ms = 0, reduce_ms = 0, optimizer_ms = 0;
  double busy = 0, idle = 0, bubble = 0;
  double predicted_bubble = 0;  // of this rank's stage (unit costs)
};

struct BubblePrediction {
  double bubble = 0;                   // the table with unit costs, the whole pipeline
  std::vector<double> per_stage;       // the same, stage by stage
  double formula = -1;                 // sched::theoretical_bubble; -1 for a schedule given as data
  double at_measured_costs = -1;       // the table with the measured mean F, B, W; -1 without them
  std::string method;                  // how, in words
};

struct StagesReport {
  std::vector<int64_t> iterations;  // counted: completed by every rank, the last `last` of them
  std::vector<RankFigures> ranks;   // by rank
  double bubble = 0;                // the job's: 1 - total compute / (ranks x total makespan)
  double f_ms = 0, b_ms = 0, w_ms = 0;  // mean duration of one pass of each kind, over every rank
  BubblePrediction predicted;
};

// given_as_data: the schedule is not one of the generated kinds (no formula applies).
BubblePrediction predict_bubble(const sched::Schedule& schedule, bool given_as_data, double f_ms = -1,
                                double b_ms = -1, double w_ms = -1);
StagesReport stage_figures(const std::vector<RankSteps>& ranks, const sched::Schedule& schedule, bool given_as_data,
                           int last);

// What another process answers to "local stages": its ranks' steps, spans included.
//   {"ranks": [{"rank", "pp", "tp", "dp", "steps": [{"iteration", "start_us", "dur_us",
//              "spans": [["forward", micro, chunk, start_us, dur_us], ...]}]}]}
std::string rank_steps_json(const std::vector<RankSteps>& ranks);
// Fails on a malformed document (a peer's bytes): a missing field, an unknown kind, a negative or
// non-finite time, more than kMaxPeerSpans spans.
inline constexpr size_t kMaxPeerSpans = 1 << 20;
Result<std::vector<RankSteps>> rank_steps_from_json(const std::string& text);

// The `stages` answer (docs/INSPECT.md); spans_of: the spans of the last this-many counted
// iterations too (the dashboard's lanes; 0: none).
std::string stages_json(const StagesReport& report, const sched::Schedule& schedule, bool given_as_data,
                        const std::vector<RankSteps>& ranks, int spans_of);
// The `plan` answer: every stage's table (or only `only_rank`'s stage when >= 0) with each action's
// planned start and end in units of one forward, and where the ranks are now (their activities).
std::string plan_json(const sched::Schedule& schedule, bool given_as_data, const std::vector<Activity>& ranks,
                      int only_rank);

}  // namespace troupe
