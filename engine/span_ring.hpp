// The spans of a rank's last steps, always on, for the inspector's `stages` and the dashboard
// (docs/INSPECT.md): each forward, backward and weight pass of the schedule table, each wait for a
// neighbouring stage, the gradient reduction, the optimizer step and the parameter gather, with
// its micro-batch and chunk. The rank's own thread writes (begin_step, add, end_step); any thread
// may copy the completed steps out (snapshot).
//
// Cost: add() touches only the step being written, which the writer owns, without a lock;
// end_step() takes one uncontended mutex and swaps that step into the ring, getting back the
// oldest step's storage. Once every slot has held a step as long as the longest, nothing is
// allocated: a span is 32 bytes in a vector that keeps its capacity. A reader copies under the
// same mutex (a few KiB).
//
// The steps (--timeline's spans, engine/timeline.hpp, are the first 20 steps' and carry names; these
// are the last steps', kept as numbers).
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

namespace troupe {

enum class SpanKind : uint8_t { forward, backward, weight, wait, reduce, optimizer };
// "forward", "backward", "weight", "wait", "reduce", "optimizer": the timeline's categories.
const char* span_kind_name(SpanKind kind);
std::optional<SpanKind> span_kind_from_name(std::string_view name);
bool computes(SpanKind kind);  // forward, backward or weight: a pass of the schedule table

struct StepSpan {
  SpanKind kind = SpanKind::forward;
  int32_t micro = -1, chunk = -1;  // of the pass, or the pass a wait is for; -1: none
  double start_us = 0;             // since the step began
  double dur_us = 0;
};

struct StepRecord {
  int64_t iteration = 0;  // the optimizer step (StepRequest::step, 1-based)
  double start_us = 0;    // since span_epoch() (the host's steady clock)
  double dur_us = 0;      // from the start of the step to the end of its parameter gather
  std::vector<StepSpan> spans;  // in the order they ended
};

class SpanRing {
 public:
  // Enough for rank 0's inspector to find the iterations every rank completed when it asks the
  // other processes one after the other: they must still hold the iterations it saw, tens of steps
  // later for a job of milliseconds per step.
  static constexpr int kDefaultSteps = 64;
  explicit SpanRing(int steps = kDefaultSteps);  // steps >= 1

  // Writer (the rank's thread). A step begun while another is open replaces it (a step that
  // failed, or whose gradient norm was not finite, never ends).
  void begin_step(int64_t iteration, double start_us);
  // start_us since span_epoch(); ignored outside a step.
  void add(SpanKind kind, int micro, int chunk, double start_us, double dur_us);
  void end_step(double end_us);

  // Any thread: of the completed steps after iteration `since`, the last `last`, oldest first.
  std::vector<StepRecord> snapshot(int last, int64_t since = -1) const;
  int capacity() const { return static_cast<int>(ring_.size()); }

 private:
  mutable std::mutex mu_;
  std::vector<StepRecord> ring_;  // guarded by mu_ (its slots' storage is recycled by end_step)
  size_t next_ = 0, filled_ = 0;  // guarded by mu_
  StepRecord current_;            // the writer's own
  bool open_ = false;             // the writer's own
};

}  // namespace troupe
