// What another process's inspector answers to "local" (activities_from_status_json,
// engine/activity.hpp): read by rank 0's inspector. Property: the ranks it accepts, written back by
// status_json, read back to the same ranks.
#include "engine/activity.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "troupe/check.hpp"

namespace troupe::fuzz {

Status inspect_status(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto ranks = activities_from_status_json(text);
  if (!ranks) return ranks.status();
  auto again = activities_from_status_json(status_json(ranks.value(), 0));
  TROUPE_CHECK(again.is_ok() && again->size() == ranks->size(), "accepted ranks do not read back after status_json");
  for (size_t i = 0; i < ranks->size(); ++i) {
    const Activity &a = (*ranks)[i], &b = (*again)[i];
    TROUPE_CHECK(a.rank == b.rank && a.step == b.step && a.doing == b.doing && a.waiting.ranks == b.waiting.ranks &&
                     a.waiting.what == b.waiting.what,
                 "a rank's activity does not read back to itself");
  }
  (void)wait_graph(ranks.value());  // any accepted ranks make a graph without crashing
  return Status::ok();
}

}  // namespace troupe::fuzz
