// Which elements of which tensors a shard holds, or a rank reads, in a form small enough to send
// to every process: each tensor's global runs (storage/shard_file.hpp's GlobalRun) folded into
// arithmetic groups -- `count` runs of `length` elements, `stride` apart -- so a tensor-parallel
// slice of a matrix (one run per row) is one group, not one run per row.
//
// The in-memory snapshots of a job over several hosts use it (engine/snapshot_copies.hpp): at a
// generation's first snapshot every process sends what its shard holds, each works out which
// shards its rank reads when it resumes that layout (its own and those holding the replicated
// parts it does not write), and the snapshot's metadata.json records the lists ("reads"), so a
// host that recovers fetches only the shards its ranks read instead of the whole snapshot.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "storage/shard_file.hpp"
#include "troupe/status.hpp"

namespace troupe {

// Runs start, start + stride, ..., start + (count - 1) stride, each `length` elements long.
// count 1: one run (stride 0). Otherwise stride >= length (the runs do not overlap).
struct RunGroup {
  int64_t start = 0, length = 0, stride = 0, count = 1;
  bool operator==(const RunGroup&) const = default;
};
// The runs, in their order, folded into groups; the groups cover exactly the runs' elements.
std::vector<RunGroup> group_runs(const std::vector<GlobalRun>& runs);
// Whether two groups share an element (exact, for any strides).
bool groups_intersect(const RunGroup& a, const RunGroup& b);

struct CoverageEntry {
  ShardSection section = ShardSection::model;
  std::string name;
  std::vector<RunGroup> groups;
};
using ShardCoverage = std::vector<CoverageEntry>;

// What a rank's shard holds (writes) and what its load reads (reads), same layout.
struct RankCoverage {
  ShardCoverage reads, writes;
};

// A rank's coverage handed from the rank actor, which works it out once the rank is built, to
// the offload actor's commit, which sends it at the first snapshot.
class CoverageSlot {
 public:
  void set(RankCoverage coverage) {
    std::lock_guard lock(mutex_);
    value_ = std::make_shared<const RankCoverage>(std::move(coverage));
  }
  std::shared_ptr<const RankCoverage> get() const {  // null until set
    std::lock_guard lock(mutex_);
    return value_;
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const RankCoverage> value_;
};

// One line per entry ("T SECTION NAME") and group ("G START LENGTH STRIDE COUNT"), after a
// "coverage 1" line. The parser is strict and bounded: numbers below 2^62, every group inside
// [0, 2^62), names of 1-512 bytes without control characters, at most kMaxCoverageLines lines; what
// it allocates is proportional to the text (the fuzz target shard_coverage's entry).
inline constexpr size_t kMaxCoverageLines = size_t{1} << 24;
std::string encode_coverage(const ShardCoverage& coverage);
Result<ShardCoverage> parse_coverage(std::string_view text);

// The shards (indices into `writes`, ascending) that hold an element `reads` names.
std::vector<int> shards_read(const ShardCoverage& reads, const std::vector<ShardCoverage>& writes);

}  // namespace troupe
