// What each process of a job over several hosts sends at its first in-memory snapshot: what its
// shard holds (storage/shard_coverage.hpp), read by every other process. Property: what it accepts
// is within its bounds (every group inside [0, 2^62), runs that do not overlap), writes back to
// the very bytes it was read from, and shards_read over it agrees with itself read twice.
#include <string>

#include "fuzz/fuzz_targets.hpp"
#include "storage/shard_coverage.hpp"

namespace troupe::fuzz {

Status shard_coverage(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto coverage = parse_coverage(text);
  if (!coverage) return coverage.status();
  for (const CoverageEntry& e : coverage.value())
    for (const RunGroup& g : e.groups) {
      TROUPE_CHECK(g.start >= 0 && g.length >= 1 && g.count >= 1, "an empty or negative group accepted");
      TROUPE_CHECK(g.count == 1 ? g.stride == 0 : g.stride >= g.length, "overlapping runs accepted");
      const __int128 last = static_cast<__int128>(g.start) + static_cast<__int128>(g.count - 1) * g.stride + g.length;
      TROUPE_CHECK(last <= (static_cast<__int128>(1) << 62), "a group past 2^62 accepted");
    }
  TROUPE_CHECK(encode_coverage(coverage.value()) == text, "a coverage has one spelling");
  // A shard holding it is read by a rank reading it, wherever it is non-empty.
  const auto read = shards_read(coverage.value(), {coverage.value(), {}});
  bool any = false;
  for (const CoverageEntry& e : coverage.value()) any = any || !e.groups.empty();
  TROUPE_CHECK(read == (any ? std::vector<int>{0} : std::vector<int>{}), "a shard does not cover itself");
  return Status::ok();
}

}  // namespace troupe::fuzz
