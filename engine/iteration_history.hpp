// The job's last iterations as the trainer reported them (loss, learning rate, gradient norm, step
// time), for the inspector's `history` and the dashboard's curves (docs/INSPECT.md), and the last
// iteration's MoE layer loads for `moe` and the dashboard's expert-load chart, and its straggler
// scores for `stragglers`. Bounded: the last
// `capacity` iterations (default 10000, about 400 KiB) and one iteration's loads. Thread-safe: the
// job's thread adds (drive_trainer's progress handler), the inspector's and the dashboard's threads
// read.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/reports.hpp"

namespace troupe {

struct HistoryPoint {
  int64_t iteration = 0;
  double loss = 0, lr = 0, grad_norm = 0, ms = 0;
};

// The MoE layers' load of one iteration (IterationStats::moe, moe_loss); iteration 0: none yet.
struct MoeSnapshot {
  int64_t iteration = 0;
  double moe_loss = 0;
  std::vector<MoeLayerLoad> layers;
};

// The straggler scores of one iteration (IterationStats::rank_scores: every rank, lowest relative
// score first); iteration 0: none yet (a job of one rank never has any).
struct StragglerSnapshot {
  int64_t iteration = 0;
  double threshold = 0;
  std::vector<StragglerScore> ranks;
};

class IterationHistory {
 public:
  static constexpr size_t kDefaultCapacity = 10000;
  explicit IterationHistory(size_t capacity = kDefaultCapacity);
  void add(const IterationStats& s);
  // The kept points after iteration `since`, the last `last` of them, oldest first.
  std::vector<HistoryPoint> points(int64_t since, size_t last) const;
  size_t capacity() const { return ring_.size(); }
  // The latest iteration with MoE layers (a dense model's: iteration 0, no layers).
  MoeSnapshot last_moe() const;
  // The latest iteration's straggler scores (engine/stragglers.hpp).
  StragglerSnapshot last_stragglers() const;

 private:
  mutable std::mutex mu_;
  std::vector<HistoryPoint> ring_;  // guarded by mu_
  size_t next_ = 0, filled_ = 0;    // guarded by mu_
  MoeSnapshot moe_;                 // guarded by mu_
  StragglerSnapshot stragglers_;    // guarded by mu_
};

// The `history` answer: columns, full precision.
//   {"kept": 10000, "iteration": [...], "loss": [...], "lr": [...], "grad_norm": [...], "ms": [...]}
std::string history_json(const std::vector<HistoryPoint>& points, size_t kept);

// The `moe` answer, full precision; tokens are (token, expert) assignments over the iteration's
// micro-batches of every data-parallel replica, losses means over them before their coefficients:
//   {"iteration": 12, "moe_loss": 0.0102,
//    "layers": [{"layer": 1, "experts": 4, "micro_batches": 6, "routed": [...], "kept": [...],
//                "dropped": 3, "lb_loss": 1.01, "z_loss": 2.3}]}
std::string moe_json(const MoeSnapshot& snapshot);

// The `stragglers` answer, every rank lowest relative score first:
//   {"iteration": 12, "threshold": 0.75,
//    "ranks": [{"rank": 1, "stage": 0, "relative_score": 0.41, "individual_score": 0.98, "straggler": true,
//               "section": "forward-compute", "section_ms": 81.2, "fastest_section_ms": 1.1, "compute_ms": 83.0}]}
std::string stragglers_json(const StragglerSnapshot& snapshot);

}  // namespace troupe
