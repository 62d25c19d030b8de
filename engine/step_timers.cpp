#include "engine/step_timers.hpp"

#include <algorithm>
#include <array>

namespace troupe {
namespace {

struct TimerName {
  const char* name;
  int level;
};
constexpr std::array<TimerName, 8> kTimers = {{{"forward-backward", 0},
                                               {"forward-compute", 1},
                                               {"backward-compute", 1},
                                               {"forward-recv", 2},
                                               {"backward-recv", 2},
                                               {"all-grads-sync", 1},
                                               {"params-all-gather", 1},
                                               {"optimizer", 0}}};

bool starts_with(const std::string& s, std::string_view prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

int timer_level(std::string_view name) {
  for (const TimerName& t : kTimers)
    if (name == t.name) return t.level;
  return 3;
}

std::vector<TimerReading> step_timers(std::span<const Span> step, double schedule_us) {
  std::array<double, kTimers.size()> us{};
  us[0] = std::max(0.0, schedule_us);
  for (const Span& s : step) {
    if (s.cat == "forward") us[1] += s.dur_us;
    else if (s.cat == "backward" || s.cat == "weight") us[2] += s.dur_us;
    else if (s.cat == "wait") us[starts_with(s.name, "wait F") ? 3 : 4] += s.dur_us;  // "wait B3", "wait W3"
    else if (s.cat == "reduce") us[s.name == "param gather" ? 6 : 5] += s.dur_us;
    else if (s.cat == "optimizer") us[7] += s.dur_us;
  }
  std::vector<TimerReading> out;
  out.reserve(kTimers.size());
  for (size_t k = 0; k < kTimers.size(); ++k) out.push_back({kTimers[k].name, us[k] / 1e3, us[k] / 1e3, {}});
  return out;
}

std::vector<TimerReading> combine_rank_timers(const std::vector<std::vector<TimerReading>>& ranks, int level) {
  std::vector<TimerReading> out;
  if (ranks.empty()) return out;
  for (const TimerReading& first : ranks[0]) {
    if (timer_level(first.name) > level) continue;
    TimerReading r{first.name, 0, 0, {}};
    for (const auto& rank : ranks) {
      double ms = 0;
      for (const TimerReading& t : rank)
        if (t.name == first.name) ms = t.ms;
      r.ranks_ms.push_back(ms);
    }
    r.ms = *std::max_element(r.ranks_ms.begin(), r.ranks_ms.end());
    r.min_ms = *std::min_element(r.ranks_ms.begin(), r.ranks_ms.end());
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace troupe
