// The job's last iterations as the trainer reported them (loss, learning rate, gradient norm, step
// time), for the inspector's `history` and the dashboard's curves (docs/INSPECT.md), and the last
// iteration's MoE layer loads for `moe` and the dashboard's expert-load chart. Bounded: the last
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

 private:
  mutable std::mutex mu_;
  std::vector<HistoryPoint> ring_;  // guarded by mu_
  size_t next_ = 0, filled_ = 0;    // guarded by mu_
  MoeSnapshot moe_;                 // guarded by mu_
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

}  // namespace troupe
