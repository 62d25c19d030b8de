// The job's last iterations as the trainer reported them (loss, learning rate, gradient norm, step
// time), for the inspector's `history` and the dashboard's curves (docs/INSPECT.md). Bounded: the
// last `capacity` iterations (default 10000, about 400 KiB). Thread-safe: the job's thread adds
// (drive_trainer's progress handler), the inspector's and the dashboard's threads read.
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

class IterationHistory {
 public:
  static constexpr size_t kDefaultCapacity = 10000;
  explicit IterationHistory(size_t capacity = kDefaultCapacity);
  void add(const IterationStats& s);
  // The kept points after iteration `since`, the last `last` of them, oldest first.
  std::vector<HistoryPoint> points(int64_t since, size_t last) const;
  size_t capacity() const { return ring_.size(); }

 private:
  mutable std::mutex mu_;
  std::vector<HistoryPoint> ring_;  // guarded by mu_
  size_t next_ = 0, filled_ = 0;    // guarded by mu_
};

// The `history` answer: columns, full precision.
//   {"kept": 10000, "iteration": [...], "loss": [...], "lr": [...], "grad_norm": [...], "ms": [...]}
std::string history_json(const std::vector<HistoryPoint>& points, size_t kept);

}  // namespace troupe
