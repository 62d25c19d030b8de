// The NaN locator (troupe train --watch-nan, the inspector's `watch nan`; docs/INSPECT.md "A NaN
// hunt"). While the watch is on, every step of every rank
//   - keeps what it needs to compute the iteration again: a copy of its token rows, of every
//     activation and output gradient it received (per micro-batch and chunk) and of its parameters
//     before the step;
//   - checks the loss and the gradient norm (all-reduced: non-finite when any gradient is), and
//     after the optimizer step its own parameters, a flag all-reduced over the world.
// When a check fails at iteration i, every rank knows it (the same all-reduce), so all of them
// replay iteration i's micro-batches from the saved inputs, forward and backward, with the
// parameters as they were before the step: bitwise the same computation, now with a check after
// every op (model/op_probe.hpp). Each rank notes the first op whose result is not finite; the ranks
// all-gather their findings and take the earliest in pipeline order (micro-batch, then forward over
// the virtual stages 0..K-1, then backward over K-1..0, then the op's place in the stage, the
// smallest tensor-parallel and data-parallel rank). The job stops with the report.
//
// Agreement. Every rank votes in the step's all-reduce (RankEngine::compute_gradients) whether its
// process wants the watch when the step began; the step is watched when all ranks did. A watched
// step's parameter check is a separate all-reduce of one value, on every rank alike.
//
// Cost, with the watch off: nothing but a vote in an all-reduce that runs anyway and a null probe
// per op. With it on: the copies (the rank's parameters once, each received boundary tensor once),
// and the parameter check (a pass over the owned parameters and an all-reduce of one value per
// step). The replay runs only when a check failed: one more forward and backward of the iteration.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/fault_injection.hpp"
#include "model/op_probe.hpp"

namespace troupe {

// What one rank's replay found first (or that it found nothing), and where it sits in the
// pipeline's order.
struct NanFinding {
  bool found = false;
  int rank = 0, pp = 0, tp = 0, dp = 0;
  int micro_batch = -1;  // -1: the parameters before the step
  int pass = 0;          // -1 parameters, 0 forward, 1 backward
  int position = 0;      // forward: the virtual stage; backward: virtual stages - 1 - it
  int64_t op = 0;        // the point's index in its chunk's pass (-1: the received input)
  int virtual_stage = -1, chunk = -1, layer = 0;
  ProbeDir dir = ProbeDir::forward;
  std::string what;      // "layer 3 mlp fc1 output", "the activation received from stage 0"
  std::string spec;      // "layer3:mlp_fc1:forward" (TROUPE_FAULT_NAN's form); empty for inputs
  std::string where;     // "layer 3", "the head", ...
  std::string tensor;    // "mlp_fc1"
  int64_t non_finite = 0, elements = 0, first_index = -1;
  double first_value = 0;
  // The first of this rank's parameters that is not finite after the optimizer step ("" if none).
  std::string bad_parameter;
  // Orders findings: the pipeline's order, then tp, dp.
  bool before(const NanFinding& o) const;
};

// The words a finding travels in between ranks (fixed size: an all-gather of i64).
constexpr size_t kNanFindingWords = 112;
std::vector<int64_t> encode_finding(const NanFinding& f);
NanFinding decode_finding(const int64_t* words);

struct NanReport {
  int64_t iteration = 0;
  std::string trigger;  // "the loss", "the gradient norm", "a parameter after the optimizer step", ...
  bool located = false;
  NanFinding origin;                     // located: the earliest finding
  std::vector<NanFinding> ranks;         // every rank's, by rank
  std::string bad_parameter;             // the first non-finite parameter after the step
  int bad_parameter_rank = -1;
  std::string message() const;  // one line
  std::string to_json() const;  // docs/INSPECT.md "A NaN hunt" has the schema
};

// The combined report from every rank's finding (by rank).
NanReport combine_findings(int64_t iteration, const std::string& trigger, std::vector<NanFinding> ranks);

// Shared by the ranks of a process and the inspector (thread-safe).
class NanControl {
 public:
  explicit NanControl(bool wanted = false) : wanted_(wanted) {}
  // This process asks for the watch (--watch-nan, `watch nan`) or not; the ranks agree at a step.
  void want(bool on) { wanted_.store(on); }
  bool wanted() const { return wanted_.load(); }
  // Whether the last step ran watched (set by the ranks).
  void set_watching(bool on) { watching_.store(on); }
  bool watching() const { return watching_.load(); }
  // Where the report goes as JSON when set (the process of rank 0: troupe-nan-PID.json); empty: no file.
  void set_report_file(std::string path);
  std::string report_file() const;
  // The first report wins (every rank of a process sets the same one). Writes the report file; the
  // error of writing it, if any, is kept with the report.
  void set_report(const NanReport& report);
  std::optional<NanReport> report() const;
  std::string report_file_error() const;

 private:
  std::atomic<bool> wanted_, watching_{false};
  mutable std::mutex mu_;
  std::string file_, file_error_;
  std::optional<NanReport> report_;
};

// The probe a rank's chunks see: it writes TROUPE_FAULT_NAN's NaN where it matches, and while
// checking notes the first non-finite result. The engine tells it where the chunk is (at) before
// each forward or backward call.
class WatchProbe final : public OpProbe {
 public:
  explicit WatchProbe(std::optional<NanFault> fault) : fault_(std::move(fault)) {}
  bool injects() const { return fault_.has_value(); }
  void set_iteration(int64_t iteration) { iteration_ = iteration; }
  void at(int micro_batch, int chunk, int virtual_stage, int pass, int position);
  void start_checking(const NanFinding& who);  // rank and coordinates of the finding
  NanFinding stop_checking();
  // An input of the current call (the saved activation or gradient, a parameter before the step).
  void check_input(const Tensor& t, const std::string& what);
  void after(const ProbePoint& at, const Tensor& result) override;

 private:
  void note(const Tensor& t, int64_t bad, const std::string& what, const ProbePoint* at);
  std::optional<NanFault> fault_;
  int64_t iteration_ = 0;
  int micro_ = 0, chunk_ = 0, vstage_ = 0, pass_ = 0, position_ = 0;
  int64_t op_ = 0;
  bool checking_ = false;
  NanFinding finding_;
};

// Writes a quiet NaN into element 0 of t (f32 or f64).
void poison(const Tensor& t);

}  // namespace troupe
