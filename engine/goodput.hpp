// Goodput (docs/RESILIENCE.md, "Goodput"): where a run's wall-clock time went. The productive part
// is the time of the training steps whose results stand, less what those steps spent in the
// pipeline bubble and waiting for stragglers; everything else is time lost, by cause:
//   startup          from the run's start to its first step (reading data, loading, measuring)
//   failures         steps a failure undid (computed after the checkpoint the restart resumed from),
//                    and the time from the attempt's last step to its end (the step the failure
//                    interrupted, the failed attempt's teardown)
//   recovery         from the failed attempt's end to the restarted attempt's first step (start,
//                    reload); a process troupe launch restarted counts its whole start-up here (what
//                    the process before it lost is that process's to report)
//   saves            checkpoint snapshots and waits for the background writer, in the training path
//   evaluation       validation passes
//   stragglers       steps' waits for a slow rank: the named stragglers' compute beyond their stage's
//                    fastest rank's (engine/stragglers.hpp)
//   pipeline bubble  steps' idle time on the busiest rank (a pipeline's fill and drain); 0 without a
//                    pipeline
//   other            the rest between steps (data not ready, logging, commands)
// goodput = productive / wall. The ledger is fed by the job (actors/job.cpp) as the events come; it
// keeps a few numbers per iteration.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "troupe/reports.hpp"

namespace troupe {

class GoodputLedger {
 public:
  // Times are seconds on one monotonic clock; `start` is the run's start. `restarted`: this process
  // replaces one that failed (its start-up is recovery).
  explicit GoodputLedger(double start, bool restarted = false);

  // An attempt's first step began at `now` (once per attempt).
  void attempt_started(double now);
  bool in_attempt() const { return in_attempt_; }
  // A step ended at `now`: iteration `iteration` took `seconds` (wall), of which `bubble` idle in the
  // pipeline and `straggler` waiting for slow ranks. A step of an iteration already recorded (redone
  // after a restart) replaces it; the first one was lost to the failure.
  void step(double now, int64_t iteration, double seconds, double bubble, double straggler);
  // A save's time in the training path (snapshot, waiting for the writer), or a validation pass,
  // ended at `now`.
  void save(double now, double seconds);
  void evaluation(double now, double seconds);
  // The attempt failed at `now`; the next resumes after iteration `resume_from` (0: from the start).
  void failed(double now, int64_t resume_from);

  GoodputReport report(double now) const;

  // The step's idle and straggler seconds from its statistics: the bubble only with a pipeline
  // (busy_fraction_max known), the wait as the largest excess of a named straggler.
  static double bubble_seconds(const IterationStats& s, int pipeline_stages);
  static double straggler_seconds(const IterationStats& s);

 private:
  struct Step {
    double seconds = 0, bubble = 0, straggler = 0;
  };
  double start_;
  bool restarted_;
  bool in_attempt_ = false;
  bool first_attempt_ = true;
  double attempt_origin_;  // the run's start, or the failure the attempt recovers from
  double last_mark_;  // the end of the attempt's latest step, save or evaluation (or its first step's start)
  double startup_ = 0, recovery_ = 0, failures_ = 0, saves_ = 0, evaluation_ = 0;
  int64_t iterations_lost_ = 0;
  std::map<int64_t, Step> steps_;  // the standing steps
};

// "goodput 91.3% of 120.4 s: lost 4.10 s startup, 3.20 s saves, ..." (causes under 5 ms left out).
std::string format_goodput(const GoodputReport& g);
// {"type":"goodput","wall_seconds":...,"productive_seconds":...,"goodput":...,"lost_seconds":{...}}
std::string goodput_json(const GoodputReport& g);

}  // namespace troupe
