#include "troupe/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>

namespace troupe::sched {
namespace {

constexpr ScheduleType kAllTypes[] = {ScheduleType::gpipe, ScheduleType::one_f_one_b,
                                      ScheduleType::interleaved, ScheduleType::zb_h1};

std::string action_name(const Action& a, bool show_chunk) {
  std::string s = fmt::format("{}{}", kind_name(a.kind), a.micro);
  if (show_chunk) s += fmt::format(".{}", a.chunk);
  return s;
}

// (micro, chunk) pairs in the order one pass kind visits them on a stage.
using Order = std::vector<std::pair<int, int>>;

Order micro_order(int m) {
  Order order;
  for (int i = 0; i < m; ++i) order.emplace_back(i, 0);
  return order;
}

// Megatron's interleaved traversal: micro-batches in groups, each group run through every chunk
// before the next group starts, so chunk c of a micro-batch comes (group size) forwards after chunk
// c-1 -- at least p, the time it takes to cross the other p-1 stages.
Order grouped_order(const std::vector<int>& groups, int v, bool backward) {
  Order order;
  int first = 0;
  for (int size : groups) {
    for (int k = 0; k < v; ++k) {
      const int c = backward ? v - 1 - k : k;
      for (int i = first; i < first + size; ++i) order.emplace_back(i, c);
    }
    first += size;
  }
  return order;
}

// Forwards in `fwd` order and backwards in `bwd` order, merged so that backward k runs right after
// forward number min(warmup + k + lag(k), total): `warmup` forwards, then one forward per backward
// while forwards remain, then the remaining backwards. lag(k) = extra for k >= extra_from, else 0:
// a stage may run `extra` more forwards before a later backward. GPipe is warmup == every forward.
std::vector<Action> warmup_then_alternate(const Order& fwd, const Order& bwd, int warmup,
                                          int extra_from = 0, int extra = 0) {
  TROUPE_CHECK(fwd.size() == bwd.size() && warmup >= 0 && extra >= 0,
               "every forward has one backward");
  std::vector<Action> out;
  const int total = static_cast<int>(fwd.size());
  int done = 0;  // forwards emitted
  for (int k = 0; k < total; ++k) {
    const int before = std::min(total, warmup + k + 1 + (k >= extra_from ? extra : 0));
    for (; done < before; ++done) out.push_back({Kind::forward, fwd[done].first, fwd[done].second});
    out.push_back({Kind::backward, bwd[k].first, bwd[k].second});
  }
  return out;
}

// ZB-H1 as in the paper's figure: time slot x on stage s runs F(x), then B(x - (p-1-s)), then
// W(x - (p-1)), each only when its index lies in [0, m). Without the W passes this is 1F1B's table;
// B no longer carries the weight gradient, so it reaches the previous stage W sooner at every hop,
// and W lags p-1 slots on every stage, which moves the W passes into the cool-down, where stage s
// otherwise waits for backwards from stage s+1. Memory: a micro-batch
// is held from F(x) to W(x), at most p slots -- 1F1B's peak on stage 0, now on every stage.
// No deadlock: order actions by (slot, F < B < W, stage for F). A forward waits on the previous
// stage's forward in the same slot, a backward on the next stage's backward one slot earlier (or,
// on the last stage, the forward of its own slot), a W on its own stage's B: always an earlier key.
std::vector<Action> zb_h1_stage(int p, int m, int s) {
  std::vector<Action> out;
  for (int x = 0; x < m + p - 1; ++x) {
    if (x < m) out.push_back({Kind::forward, x, 0});
    if (const int i = x - (p - 1 - s); i >= 0 && i < m) out.push_back({Kind::backward, i, 0});
    if (const int i = x - (p - 1); i >= 0 && i < m) out.push_back({Kind::weight, i, 0});
  }
  return out;
}

struct Dependency {
  int stage;
  Action action;
};

// The header's dependency rules; nullopt for forward(i, 0) on stage 0.
std::optional<Dependency> dependency(const ScheduleSpec& spec, int s, const Action& a) {
  const int p = spec.stages, v = spec.chunks;
  switch (a.kind) {
    case Kind::forward:
      if (s > 0) return Dependency{s - 1, a};
      if (a.chunk > 0) return Dependency{p - 1, {Kind::forward, a.micro, a.chunk - 1}};
      return std::nullopt;
    case Kind::backward:
      if (s < p - 1) return Dependency{s + 1, a};
      if (a.chunk < v - 1) return Dependency{0, {Kind::backward, a.micro, a.chunk + 1}};
      return Dependency{s, {Kind::forward, a.micro, a.chunk}};
    case Kind::weight:
      return Dependency{s, {Kind::backward, a.micro, a.chunk}};
  }
  TROUPE_CHECK(false, "Kind has three values");
  return std::nullopt;
}

// Dense index of (stage, kind, micro, chunk); only for actions that passed check_contents.
size_t slot(const ScheduleSpec& spec, int s, const Action& a) {
  const size_t m = spec.micro_batches, v = spec.chunks;
  return ((static_cast<size_t>(s) * 3 + static_cast<size_t>(a.kind)) * m + a.micro) * v + a.chunk;
}

// Every action in range, and each (kind, micro, chunk) the schedule should have exactly once.
Status check_contents(const Schedule& sc) {
  const ScheduleSpec& spec = sc.spec;
  if (spec.stages < 1 || spec.micro_batches < 1 || spec.chunks < 1)
    return Status::error(fmt::format("schedule spec has p = {}, m = {}, v = {}: all must be >= 1",
                                     spec.stages, spec.micro_batches, spec.chunks));
  if (static_cast<int>(sc.stages.size()) != spec.stages)
    return Status::error(fmt::format("schedule has {} stage tables for {} stages",
                                     sc.stages.size(), spec.stages));
  const bool show_chunk = spec.chunks > 1;
  std::vector<int> seen(static_cast<size_t>(spec.stages) * 3 * spec.micro_batches * spec.chunks);
  for (int s = 0; s < spec.stages; ++s) {
    for (const Action& a : sc.stages[s]) {
      if (a.micro < 0 || a.micro >= spec.micro_batches || a.chunk < 0 || a.chunk >= spec.chunks)
        return Status::error(fmt::format("stage {}: {} is outside m = {}, v = {}", s,
                                         action_name(a, true), spec.micro_batches, spec.chunks));
      if (a.kind == Kind::weight && !sc.split_backward)
        return Status::error(fmt::format(
            "stage {}: {} in a schedule whose backward also computes weight gradients", s,
            action_name(a, show_chunk)));
      if (++seen[slot(spec, s, a)] > 1)
        return Status::error(
            fmt::format("stage {}: {} appears more than once", s, action_name(a, show_chunk)));
    }
    const int kinds = sc.split_backward ? 3 : 2;
    for (int k = 0; k < kinds; ++k) {
      for (int i = 0; i < spec.micro_batches; ++i) {
        for (int c = 0; c < spec.chunks; ++c) {
          const Action a{static_cast<Kind>(k), i, c};
          if (seen[slot(spec, s, a)] == 0)
            return Status::error(
                fmt::format("stage {}: {} is missing", s, action_name(a, show_chunk)));
        }
      }
    }
  }
  return Status::ok();
}

struct Execution {
  Status status;  // failed on deadlock
  SimResult result;
};

// One engine for validate() and simulate(): a stage's start time depends only on its own previous
// action and on one dependency's completion, so sweeping the stages round-robin and advancing each
// as far as it can gives the event-driven times regardless of sweep order. A sweep that advances no
// stage while work remains is a deadlock.
// cost(s, a): the duration of action a on stage s; hop: added to a dependency on another stage.
template <class Cost>
Execution execute(const Schedule& sc, const Cost& cost_of, double hop) {
  const ScheduleSpec& spec = sc.spec;
  const int p = spec.stages;
  const bool show_chunk = spec.chunks > 1;
  std::vector<double> done(static_cast<size_t>(p) * 3 * spec.micro_batches * spec.chunks, -1.0);
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0);
  Execution ex;
  ex.result.busy.assign(p, 0.0);
  for (const auto& list : sc.stages) ex.result.start.emplace_back(list.size(), 0.0);
  size_t remaining = 0;
  for (const auto& list : sc.stages) remaining += list.size();

  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < p; ++s) {
      const std::vector<Action>& list = sc.stages[s];
      for (; next[s] < list.size(); ++next[s], --remaining, progressed = true) {
        const Action& a = list[next[s]];
        double ready = 0;
        if (const auto dep = dependency(spec, s, a)) {
          ready = done[slot(spec, dep->stage, dep->action)];
          if (ready < 0) break;
          if (dep->stage != s) ready += hop;
        }
        const double cost = cost_of(s, a);
        ex.result.start[s][next[s]] = std::max(free_at[s], ready);
        free_at[s] = ex.result.start[s][next[s]] + cost;
        done[slot(spec, s, a)] = free_at[s];
        ex.result.busy[s] += cost;
      }
    }
    if (progressed) continue;
    // Each blocked stage waits on one action of some stage (maybe itself) that is blocked too, as
    // the action is in that table but not done. Following the waits from any blocked stage ends
    // in a cycle; the cycle, not the first stage that happens to wait, is what to report.
    const auto waits_on = [&](int s) { return *dependency(spec, s, sc.stages[s][next[s]]); };
    int s = 0;
    while (next[s] == sc.stages[s].size()) ++s;
    std::vector<int> seen_at(p, -1), path;
    for (; seen_at[s] < 0; s = waits_on(s).stage) {
      seen_at[s] = static_cast<int>(path.size());
      path.push_back(s);
    }
    std::string cycle;
    for (size_t j = seen_at[s]; j < path.size(); ++j) {
      const Dependency dep = waits_on(path[j]);
      cycle += fmt::format("{}stage {} is blocked at its action {} ({}), waiting for {} on stage {}",
                           cycle.empty() ? "" : "; ", path[j], next[path[j]],
                           action_name(sc.stages[path[j]][next[path[j]]], show_chunk),
                           action_name(dep.action, show_chunk), dep.stage);
    }
    ex.status = Status::error("deadlock: " + cycle +
                              " -- each action waited for comes after a blocked one in its table");
    return ex;
  }
  for (int s = 0; s < p; ++s) ex.result.makespan = std::max(ex.result.makespan, free_at[s]);
  double busy = 0;
  for (double t : ex.result.busy) busy += t;
  ex.result.bubble = ex.result.makespan > 0 ? 1.0 - busy / (p * ex.result.makespan) : 0.0;
  return ex;
}

}  // namespace

const char* schedule_name(ScheduleType t) {
  switch (t) {
    case ScheduleType::gpipe:
      return "gpipe";
    case ScheduleType::one_f_one_b:
      return "1f1b";
    case ScheduleType::interleaved:
      return "interleaved";
    case ScheduleType::zb_h1:
      return "zb-h1";
  }
  TROUPE_CHECK(false, "ScheduleType has four values");
  return "";
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::forward:
      return "F";
    case Kind::backward:
      return "B";
    case Kind::weight:
      return "W";
  }
  TROUPE_CHECK(false, "Kind has three values");
  return "";
}

Result<ScheduleType> parse_schedule(const std::string& name) {
  std::string valid;
  for (ScheduleType t : kAllTypes) {
    if (name == schedule_name(t)) return t;
    valid += valid.empty() ? "" : ", ";
    valid += schedule_name(t);
  }
  return Status::error(fmt::format("--pipeline-schedule \"{}\" is not a schedule -- use one of: {}",
                                   name, valid));
}

int Schedule::peak_in_flight(int stage) const {
  TROUPE_CHECK(stage >= 0 && stage < static_cast<int>(stages.size()), "stage out of range");
  // Without a split backward, B frees the activations; with one, W still reads them (the layer
  // inputs it multiplies with the output gradients), so they live until W.
  const Kind frees = split_backward ? Kind::weight : Kind::backward;
  int alive = 0, peak = 0;
  for (const Action& a : stages[stage]) {
    if (a.kind == Kind::forward) peak = std::max(peak, ++alive);
    if (a.kind == frees) --alive;
  }
  return peak;
}

int Schedule::slots_held(int stage, int chunk, bool receives) const {
  TROUPE_CHECK(stage >= 0 && stage < static_cast<int>(stages.size()), "stage out of range");
  const Kind frees = split_backward ? Kind::weight : Kind::backward;
  const std::vector<Action>& acts = stages[stage];
  std::vector<char> holding(static_cast<size_t>(std::max(1, spec.micro_batches)), 0);
  int held = 0, peak = 0;
  auto take = [&](const Action& a) {
    if (a.kind != Kind::forward || a.chunk != chunk || a.micro < 0 || a.micro >= static_cast<int>(holding.size()) ||
        holding[a.micro])
      return;
    holding[a.micro] = 1;
    peak = std::max(peak, ++held);
  };
  for (size_t j = 0; j < acts.size(); ++j) {
    take(acts[j]);
    if (receives && j + 1 < acts.size()) take(acts[j + 1]);
    const Action& a = acts[j];
    if (a.chunk == chunk && a.kind == frees && a.micro >= 0 && a.micro < static_cast<int>(holding.size()) &&
        holding[a.micro]) {
      holding[a.micro] = 0;
      --held;
    }
  }
  return peak;
}

std::string Schedule::to_string() const {
  std::string out;
  for (size_t s = 0; s < stages.size(); ++s) {
    out += fmt::format("s{}:", s);
    for (const Action& a : stages[s]) {
      out += ' ';  // appended apart: GCC 12's -Wrestrict misfires on " " + std::string at -O3
      out += action_name(a, spec.chunks > 1);
    }
    out += "\n";
  }
  return out;
}

Result<Schedule> make_schedule(const ScheduleSpec& spec) {
  const int p = spec.stages, m = spec.micro_batches, v = spec.chunks;
  if (p < 1)
    return Status::error(fmt::format(
        "--pipeline-model-parallel-size must be at least 1, got {} -- pass e.g. 4", p));
  if (m < 1)
    return Status::error(fmt::format(
        "{} micro-batches per iteration: --global-batch-size must be at least --micro-batch-size "
        "times the data-parallel size -- raise --global-batch-size or lower --micro-batch-size",
        m));
  if (spec.type == ScheduleType::interleaved && v < 2)
    return Status::error(fmt::format(
        "--pipeline-schedule interleaved needs --virtual-pipeline-model-parallel-size of at least "
        "2, got {} -- pass e.g. 2, or use --pipeline-schedule 1f1b",
        v));
  if (spec.type != ScheduleType::interleaved && v != 1)
    return Status::error(fmt::format(
        "--virtual-pipeline-model-parallel-size {} needs --pipeline-schedule interleaved; {} "
        "runs one chunk per stage -- drop the flag or switch schedule",
        v, schedule_name(spec.type)));

  Schedule sc;
  sc.spec = spec;
  sc.split_backward = spec.type == ScheduleType::zb_h1;
  for (int s = 0; s < p; ++s) {
    switch (spec.type) {
      case ScheduleType::gpipe:
        sc.stages.push_back(warmup_then_alternate(micro_order(m), micro_order(m), m));
        break;
      case ScheduleType::one_f_one_b:
        // Enough forwards in flight that the first backward from the last stage arrives just as
        // the last warm-up forward completes; more would only hold memory.
        sc.stages.push_back(
            warmup_then_alternate(micro_order(m), micro_order(m), std::min(p - s - 1, m)));
        break;
      case ScheduleType::interleaved: {
        // Megatron's warm-up: (v-1)*p forwards bring the first group to its last chunk; 2*(p-s-1)
        // more cover the first backward's way back from the last stage to stage s.
        const int warmup = (p - s - 1) * 2 + (v - 1) * p;
        // The m % p micro-batches left over join the last group rather than form a shorter one.
        // After a short group, stage 0 needs chunk-c outputs the last stage computes only after a
        // backward that waits on stage 0: with Megatron's warm-up, p = 4, m = 5, v = 3 deadlocks.
        // (Dropping padding micro-batches from a table for m rounded up to a multiple of p is also
        // safe, but leaves their slots idle: p = 4, m = 9, v = 3 had bubble 0.21 against 0.11.)
        // A last group of r > p needs (v-1)*(r-p) more forwards ahead of its backwards on the last
        // stage; every stage takes that extra from the group's first backward on, which keeps the
        // stage-to-stage offsets the warm-up was built on and costs memory only in that group.
        // For m < p the one group is short, but every forward stage 0 needs from the last stage
        // lies in that stage's warm-up, so nothing waits on a backward.
        std::vector<int> groups(std::max(m / p, 1), p);
        groups.back() += m - p * static_cast<int>(groups.size());
        const int last = groups.back();
        const int extra = (v - 1) * std::max(last - p, 0);
        const int extra_from = (m - last) * v;  // first backward of the last group
        sc.stages.push_back(warmup_then_alternate(grouped_order(groups, v, false),
                                                  grouped_order(groups, v, true), warmup,
                                                  extra_from, extra));
        break;
      }
      case ScheduleType::zb_h1:
        sc.stages.push_back(zb_h1_stage(p, m, s));
        break;
    }
  }
  // A generator bug, not bad input: every table built here must run.
  const Status st = validate(sc);
  TROUPE_CHECK(st.is_ok(), st.message());
  return sc;
}

Status validate(const Schedule& schedule) {
  TROUPE_RETURN_IF_ERROR(check_contents(schedule));
  return execute(schedule, [](int, const Action&) { return 1.0; }, 0.0).status;
}

SimResult simulate(const Schedule& schedule, double f, double b, double w) {
  TROUPE_CHECK(f >= 0 && b >= 0 && w >= 0, "action costs are durations, never negative");
  const Status contents = check_contents(schedule);
  TROUPE_CHECK(contents.is_ok(), contents.message());
  const auto cost = [&](int, const Action& a) { return a.kind == Kind::forward ? f : a.kind == Kind::backward ? b : w; };
  Execution ex = execute(schedule, cost, 0.0);
  TROUPE_CHECK(ex.status.is_ok(), ex.status.message());
  return std::move(ex.result);
}

SimResult simulate(const Schedule& schedule, const StageCosts& costs) {
  const ScheduleSpec& spec = schedule.spec;
  const size_t n = static_cast<size_t>(spec.stages) * spec.chunks;
  TROUPE_CHECK(costs.forward.size() == n && costs.backward.size() == n && costs.weight.size() == n,
               "StageCosts holds one figure per (stage, chunk) of each kind");
  TROUPE_CHECK(costs.hop >= 0, "the hop is a duration, never negative");
  for (size_t i = 0; i < n; ++i)
    TROUPE_CHECK(costs.forward[i] >= 0 && costs.backward[i] >= 0 && costs.weight[i] >= 0,
                 "action costs are durations, never negative");
  const Status contents = check_contents(schedule);
  TROUPE_CHECK(contents.is_ok(), contents.message());
  const auto cost = [&](int s, const Action& a) {
    const size_t i = static_cast<size_t>(s) * spec.chunks + a.chunk;
    return a.kind == Kind::forward ? costs.forward[i] : a.kind == Kind::backward ? costs.backward[i] : costs.weight[i];
  };
  Execution ex = execute(schedule, cost, costs.hop);
  TROUPE_CHECK(ex.status.is_ok(), ex.status.message());
  return std::move(ex.result);
}

double theoretical_bubble(const ScheduleSpec& spec, double f, double b, double w) {
  const double p = spec.stages, m = spec.micro_batches, v = spec.chunks;
  TROUPE_CHECK(p >= 1 && m >= 1 && v >= 1, "p, m and v are at least 1");
  switch (spec.type) {
    case ScheduleType::gpipe:
    case ScheduleType::one_f_one_b:
      return (p - 1) / (m + p - 1);
    case ScheduleType::interleaved:
      return (p - 1) / (v * m + p - 1);
    case ScheduleType::zb_h1: {
      const double idle = (p - 1) * (f + b - w);
      return idle / (m * (f + b + w) + idle);
    }
  }
  TROUPE_CHECK(false, "ScheduleType has four values");
  return 0;
}

std::vector<int> engine_slots(const Schedule& table, int stage, const std::vector<int>& fewer) {
  const int chunks = std::max(1, table.spec.chunks);
  std::vector<int> slots(static_cast<size_t>(chunks), 1);
  auto take = [&](const Schedule& t) {
    for (int c = 0; c < chunks; ++c)
      slots[static_cast<size_t>(c)] = std::max(slots[static_cast<size_t>(c)], t.slots_held(stage, c, stage > 0 || c > 0));
  };
  take(table);
  for (int m : fewer) {
    if (m < 1 || m == table.spec.micro_batches) continue;
    ScheduleSpec smaller = table.spec;
    smaller.micro_batches = m;
    auto made = make_schedule(smaller);
    if (made.is_ok()) take(made.value());
  }
  return slots;
}

}  // namespace troupe::sched
