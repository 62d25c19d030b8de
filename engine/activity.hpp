// What each rank is doing now, for the inspector and the stall explainer (issue 12): the rank's own
// thread records every change of its state (an action of the schedule table begins, a wait for a
// peer begins or ends, a phase of the step), and any thread may read a copy at any time. A change
// costs one uncontended mutex: a few dozen per step.
//
// wait_graph() turns the activities of a job's ranks into the wait-for graph and names the
// culprits of a stall: the ranks that the waiting ranks wait on, transitively, and that wait on
// nobody themselves (a rank stuck in its compute, or one that never started the step), or, when the
// waits form a cycle with no way out, the ranks of that cycle (a deadlock).
//
// Granularity today: receives between pipeline stages are waits on one peer; the step's collectives
// (ZeRO's gradient reduction and gathers, the world's norm and loss reduction) are waits on the
// other members of their group. Collectives inside a chunk's layers (tensor-parallel all-reduces,
// ZeRO-3's per-unit gathers) show as the action that runs them.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "engine/span_ring.hpp"
#include "troupe/status.hpp"

namespace troupe {

enum class Doing : uint8_t { idle, forward, backward, weight, waiting, reducing, optimizer, gathering, evaluating };
const char* doing_name(Doing doing);  // "idle", "forward", ..., "evaluating"

// What a waiting rank waits for.
struct WaitTarget {
  std::string what;        // "the activation of micro-batch 3 (chunk 0) from stage 1", "dp gradient reduction"
  std::vector<int> ranks;  // global ranks waited on: a receive's sender; a collective's other members
  bool collective = false;
};

struct Activity {
  int rank = 0, stage = 0, tp = 0, dp = 0;  // global rank and coordinates
  int cp = -1;                              // context-parallel coordinate; -1: the job has no cp (size 1)
  int64_t step = 0;                         // steps this rank has begun (0: none yet)
  Doing doing = Doing::idle;
  int micro = -1, chunk = -1;    // of the running (or awaited) action; -1: none
  int action = -1, actions = 0;  // position in this stage's schedule table; -1: outside it
  WaitTarget waiting;            // when doing == waiting
  double seconds_in_state = 0;   // since the current state began
  double seconds_since_progress = 0;  // since the rank last changed state
  int64_t mailbox = -1;  // messages waiting in the rank actor's mailbox at its last change of state; -1: unknown
  double last_step_seconds = 0;  // wall time of the rank's last complete step (begin to begin); 0: none yet
  std::string describe() const;  // "rank 2 (pp 2, tp 0, dp 0) step 1: waiting for ... (0.31 s)"; ", cp 1" after dp
};

class ActivityBoard {
 public:
  ActivityBoard(int rank, int stage, int tp, int dp, int cp = -1);
  void begin_step(int actions);
  // A new state: an action (micro, chunk, its index in the table) or a phase of the step.
  void set(Doing doing, int micro = -1, int chunk = -1, int action = -1);
  // A wait inside the current state; done_waiting() returns to it.
  void wait(WaitTarget target);
  void done_waiting();
  Activity snapshot() const;
  // The rank actor's mailbox depth, read at every change of state by the thread that calls this
  // (the actor's own: only it may look into its mailbox); changes from other threads leave it.
  void set_mailbox_probe(std::function<size_t()> probe);
  // The spans of the rank's last steps (engine/span_ring.hpp): the rank's thread writes them, the
  // inspector's `stages` and the dashboard read them.
  SpanRing& recent() { return recent_; }
  const SpanRing& recent() const { return recent_; }

 private:
  using Clock = std::chrono::steady_clock;
  void sample_mailbox();
  std::function<size_t()> probe_;
  std::thread::id probe_thread_;
  mutable std::mutex mu_;
  Activity now_;
  Doing before_wait_ = Doing::idle;
  Clock::time_point state_since_, progress_, step_began_;
  SpanRing recent_;
};

struct WaitEdge {
  int from = 0, to = 0;
  std::string what;
};

struct WaitGraph {
  std::vector<WaitEdge> edges;     // the waits that count as stalls (longer than stall_seconds)
  std::vector<WaitEdge> momentary; // shorter waits: a healthy job's passing waits on its neighbours
  std::vector<int> culprits;  // ascending
  bool deadlock = false;      // the culprits wait on each other in a cycle
  bool stuck = false;         // some wait is a stall
  // One line: "rank 6 (pp 3, tp 0, dp 0) step 0: idle (2.01 s) -- ranks 4, 7 wait on it, 7 ranks in
  // all through them", or "deadlock: ranks 0, 1 wait on each other", or, when nothing is stuck,
  // "nothing is stuck: no rank is waiting on another" / "nothing is stuck: ranks 1, 3 wait
  // momentarily (at most 0.08 s; a stall is a wait over 1.0 s)".
  std::string summary;
};

// `ranks`: one activity per rank of the job (any order). A collective's member counts as arrived
// (no edge to it) when it waits in a collective of the same members. A wait is a stall once it has
// lasted stall_seconds (0: every wait, as after a failure, when the last waits are what stopped).
WaitGraph wait_graph(const std::vector<Activity>& ranks, double stall_seconds = 0);

// The stall threshold of a running job: three times the slowest rank's last step, at least 1 s (a
// healthy rank waits on its neighbours for a fraction of a step; a wait of several steps is not
// that).
double stall_threshold(const std::vector<Activity>& ranks);

// JSON documents (docs/INSPECT.md has the schema). A rank: {"rank", "pp", "tp", "dp", "step",
// "doing", "micro_batch", "chunk", "action", "actions", "waiting_for", "waiting_on" [ranks],
// "collective", "seconds_in_state", "seconds_since_progress", "mailbox", "describe"}.
//   status: {"iteration", "ranks": [rank...]}
//   where:  {"summary", "deadlock", "culprits": [rank...], "edges": [{"from", "to", "what"}],
//            "ranks": [rank...]}
//   stall:  where's, with "stalled_seconds" and "after_iteration".
std::string status_json(const std::vector<Activity>& ranks, int64_t iteration);
// The ranks of a status document (another process's inspector); fails on a malformed one.
Result<std::vector<Activity>> activities_from_status_json(const std::string& text);
std::string where_json(const std::vector<Activity>& ranks, const WaitGraph& graph);
std::string stall_report_json(const std::vector<Activity>& ranks, const WaitGraph& graph, double stalled_seconds,
                              int64_t after_iteration);

}  // namespace troupe
