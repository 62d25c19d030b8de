// Straggler scores (docs/RESILIENCE.md, "Stragglers"): which ranks are slow, by how much, and where
// their time goes, from the activity timers every rank records (engine/step_timers.hpp).
//
// Each step every rank adds its previous step's compute sections -- forward-compute,
// backward-compute, optimizer (milliseconds) -- to the world's all-reduce the step already does
// (engine/rank_engine.cpp), so every rank learns every rank's sections one step late, at no extra
// collective. A rank is compared with its peers: the ranks of its pipeline stage (its tensor- and
// data-parallel neighbours do the same work per micro-batch; another stage does other work). Each
// section is taken as the median of the rank's last `window` steps, so one step that the machine's
// other work delayed does not make a straggler; a rank is scored from `min_steps` steps on:
//   relative score    the fastest peer's compute time / the rank's (1: as fast as the fastest)
//   individual score  the rank's own best step over its last `history` steps / its median now
//   section           where the rank's time goes beyond the fastest peer's: the section with the
//                     largest excess, with the rank's and the fastest peer's milliseconds
// A rank whose relative score is below the threshold is a straggler (nvidia-resiliency-ext's
// straggler detector scores alike: relative to the fastest rank and to the rank's own history).
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "troupe/reports.hpp"

namespace troupe {

constexpr int kStragglerSections = 3;
extern const std::array<const char*, kStragglerSections> kStragglerSectionNames;  // forward-compute, ...

class StragglerTracker {
 public:
  // stage_of[r]: rank r's pipeline stage (its peers share it).
  explicit StragglerTracker(std::vector<int> stage_of, int history = 20, double threshold = 0.75, int window = 5,
                            int min_steps = 3);
  int ranks() const { return static_cast<int>(stage_of_.size()); }
  double threshold() const { return threshold_; }
  // One step's sections: ranks() x kStragglerSections milliseconds, rank-major. A step whose
  // sections are all zero (the first: nothing measured yet) is ignored.
  void add(const std::vector<double>& sections);
  bool has_scores() const { return steps_ >= min_steps_; }
  // The scores of the latest window, every rank, lowest relative score first (ties: lower rank);
  // empty before min_steps steps.
  std::vector<StragglerScore> scores() const;
  // The ranks below the threshold, lowest first.
  std::vector<StragglerScore> stragglers() const;

 private:
  std::vector<int> stage_of_;
  int history_;
  double threshold_;
  int window_, min_steps_;
  int64_t steps_ = 0;
  std::deque<std::vector<double>> recent_;  // the last `window` steps' sections, newest last
  std::vector<std::deque<double>> past_;    // per rank: compute ms of its last `history` steps, newest last
};

// "rank 3 (stage 1): 0.41 of its stage's fastest, forward-compute 310.2 ms against 120.5 ms; 0.44 of
// its own best" -- one line per straggler.
std::string describe_straggler(const StragglerScore& s);

}  // namespace troupe
