// Pipeline schedules as data: for each pipeline stage, the ordered list of actions it executes in one
// iteration, (micro-batch, model chunk, forward | backward | weight-grad). Generated for GPipe, 1F1B,
// interleaved 1F1B (Megatron's virtual pipeline) and ZB-H1 (Qi et al., "Zero Bubble Pipeline
// Parallelism", 2023: backward split into an input-gradient pass B and a weight-gradient pass W).
// The rank actors execute their stage's table in order (a forward waits for its input activation, a
// backward for its output gradient); the tables here are what the tests check and the timeline shows.
//
// Terms: p stages, m micro-batches per iteration (per data-parallel rank), v model chunks per stage
// (v > 1 only for interleaved). Chunk c of stage s holds the layers of virtual stage c*p + s
// (Megatron's assignment), so a micro-batch's forward runs virtual stages 0, 1, ..., v*p-1:
//   forward(i, c) on stage s needs forward(i, c) on stage s-1, or for s = 0 and c > 0 forward(i, c-1)
//     on stage p-1; forward(i, 0) on stage 0 needs nothing (it reads tokens).
//   backward(i, c) on stage s needs backward(i, c) on stage s+1, or for s = p-1 and c < v-1
//     backward(i, c+1) on stage 0; backward(i, v-1) on stage p-1 needs forward(i, v-1) on that stage
//     (the loss).
//   weight(i, c) on stage s needs backward(i, c) on stage s (same stage).
// Schedules without a separate weight pass (split_backward == false) have no weight actions: their
// backward computes input and weight gradients together.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::sched {

enum class ScheduleType : uint8_t { gpipe, one_f_one_b, interleaved, zb_h1 };
enum class Kind : uint8_t { forward, backward, weight };

const char* schedule_name(ScheduleType t);  // "gpipe", "1f1b", "interleaved", "zb-h1"
const char* kind_name(Kind k);              // "F", "B", "W"
// From --pipeline-schedule; an unknown name is an error listing the valid ones.
Result<ScheduleType> parse_schedule(const std::string& name);

struct Action {
  Kind kind = Kind::forward;
  int micro = 0;  // 0 .. m-1
  int chunk = 0;  // 0 .. v-1
  bool operator==(const Action&) const = default;
};

struct ScheduleSpec {
  ScheduleType type = ScheduleType::one_f_one_b;
  int stages = 1;        // p >= 1
  int micro_batches = 1; // m >= 1 (any m: need not be a multiple of p)
  int chunks = 1;        // v: 1, or >= 2 for interleaved (then required)
};

struct Schedule {
  ScheduleSpec spec;
  bool split_backward = false;             // true for zb-h1: weight actions exist
  std::vector<std::vector<Action>> stages; // stages[s]: stage s's actions in execution order
  // Most micro-batch activations alive at once on stage s (forward done, backward not yet), counting
  // (micro, chunk) pairs: the activation slots the stage must hold.
  int peak_in_flight(int stage) const;
  // The activation slots chunk `chunk` of stage `stage` holds at most at once as the rank engine runs
  // the table (engine/rank_engine.cpp): a forward's slot is taken when its input's receive is posted,
  // one action ahead of the action it follows (`receives`: the chunk reads an activation from the
  // stage before), or when the forward runs (the first virtual stage, which reads tokens); B frees it,
  // or W with a split backward. A chunk's slots are handed out last freed first, so these are also
  // the distinct slots it ever writes: the memory its activations occupy on the CPU.
  int slots_held(int stage, int chunk, bool receives) const;
  std::string to_string() const;  // one line per stage, e.g. "s0: F0 F1 B0 F2 B1 ..." (chunk as F0.1)
};

// Errors name the flag: e.g. interleaved with chunks < 2, a non-positive size.
Result<Schedule> make_schedule(const ScheduleSpec& spec);

// The activation slots the rank engine gives each chunk of `stage` (engine/rank_engine.cpp) for a job
// of `table`'s micro-batches and, during a batch-size ramp-up, of each count in `fewer` (the same
// type's tables for those counts; an interleaved table of a partial round can hold more in a chunk
// than the whole job's): the most slots_held of any of them, at least 1 per chunk.
std::vector<int> engine_slots(const Schedule& table, int stage, const std::vector<int>& fewer = {});

// Every (micro, chunk) appears exactly once per kind on each stage, and executing every stage's table
// in order under the dependencies above completes (no deadlock). Returns the first violation.
Status validate(const Schedule& schedule);

// Discrete-event run of the tables in order, each action starting when its stage is free and its
// dependency is done; communication takes no time. Costs are per action of one chunk: f forward,
// b backward (input gradient only when split_backward, else input + weight), w weight pass (only
// used when split_backward).
struct SimResult {
  double makespan = 0;
  std::vector<double> busy;  // per stage
  double bubble = 0;         // 1 - sum(busy) / (p * makespan)
  std::vector<std::vector<double>> start;  // start[s][k]: when stages[s][k] begins (the timeline)
};
SimResult simulate(const Schedule& schedule, double f, double b, double w);

// Stages of unequal cost (the first holds the embedding, the last the head; `troupe plan`'s costs):
// one figure per (stage s, chunk c) at index s * v + c, and `hop`, the time a micro-batch's
// activation or gradient takes from one stage to the next, added to every dependency on another
// stage.
struct StageCosts {
  std::vector<double> forward, backward, weight;
  double hop = 0;
};
SimResult simulate(const Schedule& schedule, const StageCosts& costs);

// The bubble fraction theory predicts, as a fraction of the iteration time (idle / (p * makespan)),
// for equal-cost chunks with forward f, backward b (input gradient) and weight pass w:
//   gpipe, 1f1b:  (p-1)/(m+p-1)
//   interleaved:  (p-1)/(v*m+p-1)
//   zb-h1:        (p-1)(f+b-w) / (m(f+b+w) + (p-1)(f+b-w))   (the paper's bubble (p-1)(T_F+T_B-T_W))
double theoretical_bubble(const ScheduleSpec& spec, double f = 1, double b = 1, double w = 1);

}  // namespace troupe::sched
