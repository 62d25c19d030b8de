// What each process of a job over several hosts reports at a start about the in-memory snapshots
// its host's folder holds (engine/snapshot_copies.hpp), read by every other process. Property: what
// it accepts is within its bounds (ascending iterations and shard indices below each iteration's
// count), and writes back to the very bytes it was read from (one spelling).
#include <string>

#include "engine/snapshot_copies.hpp"
#include "fuzz/fuzz_targets.hpp"

namespace troupe::fuzz {

Status snapshot_report(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto report = parse_snapshot_report(text);
  if (!report) return report.status();
  TROUPE_CHECK(report->held.size() <= kMaxHeldReported, "too many iterations accepted");
  for (size_t i = 0; i < report->held.size(); ++i) {
    const HeldIteration& h = report->held[i];
    TROUPE_CHECK(i == 0 || h.iteration > report->held[i - 1].iteration, "iterations not ascending");
    TROUPE_CHECK(h.shards >= 0 && h.shards <= kMaxSnapshotShards, "a shard count out of range");
    for (size_t k = 0; k < h.present.size(); ++k)
      TROUPE_CHECK(h.present[k] >= 0 && h.present[k] < h.shards && (k == 0 || h.present[k] > h.present[k - 1]),
                   "a shard index out of range or order");
  }
  TROUPE_CHECK(encode_snapshot_report(report.value()) == text, "a report has one spelling");
  return Status::ok();
}

}  // namespace troupe::fuzz
