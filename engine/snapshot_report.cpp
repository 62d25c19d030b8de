// engine/snapshot_copies.hpp: the report each process gives at a start, and its strict reader.
#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "base/strict_text.hpp"
#include "engine/snapshot_copies.hpp"

namespace troupe {

std::string encode_snapshot_report(const SnapshotReport& r) {
  // The newest kMaxHeldReported iterations (a folder holds one or two), counted in the first line.
  const size_t first = r.held.size() > kMaxHeldReported ? r.held.size() - kMaxHeldReported : 0;
  std::string s = fmt::format("snapshots 1 {} {} {} {}\n", r.restarted ? 1 : 0,
                              r.expected_run.empty() ? "-" : r.expected_run, r.disk_latest, r.held.size() - first);
  for (size_t i = first; i < r.held.size(); ++i) {
    const HeldIteration& h = r.held[i];
    std::string present;
    for (int p : h.present) {
      if (!present.empty()) present += ',';
      present += std::to_string(p);
    }
    s += fmt::format("{} {} {} {}\n", h.iteration, h.run_id.empty() ? "-" : h.run_id, h.shards,
                     present.empty() ? "-" : present);
  }
  return s;
}

Result<SnapshotReport> parse_snapshot_report(std::string_view text) {
  auto bad = [](const std::string& why) {
    return Status::bad_input("a process's report of its in-memory snapshots is malformed (" + why +
                             ") -- every process of the job must run the same troupe");
  };
  if (text.size() > (size_t{1} << 24)) return bad("larger than 16 MiB");
  if (text.empty() || text.back() != '\n') return bad("not newline-terminated");
  std::vector<std::string_view> lines = split_fields(text.substr(0, text.size() - 1), '\n');
  if (lines.size() > kMaxHeldReported + 1) return bad("more than " + std::to_string(kMaxHeldReported) + " iterations");
  SnapshotReport r;
  const auto head = split_fields(lines[0], ' ');
  int64_t v = 0;
  if (head.size() != 6 || head[0] != "snapshots" || head[1] != "1") return bad("unknown first line");
  if (!parse_strict_count(head[5], kMaxHeldReported, &v) || static_cast<size_t>(v) != lines.size() - 1)
    return bad("the count of iterations is not the number of iteration lines");
  if (head[2] != "0" && head[2] != "1") return bad("restarted is neither 0 nor 1");
  r.restarted = head[2] == "1";
  if (head[3] != "-") {
    if (!is_lower_hex(head[3], 1, 64)) return bad("the run id is not hex");
    r.expected_run = std::string(head[3]);
  }
  if (head[4] == "-1") {
    r.disk_latest = -1;
  } else if (parse_strict_count(head[4], std::numeric_limits<int64_t>::max() / 2, &v)) {
    r.disk_latest = v;
  } else {
    return bad("the latest save is not a number");
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const auto f = split_fields(lines[i], ' ');
    if (f.size() != 4) return bad("an iteration line has " + std::to_string(f.size()) + " fields, not 4");
    HeldIteration h;
    int64_t shards = 0;
    if (!parse_strict_count(f[0], 9'999'999, &v)) return bad("an iteration is not a number of at most 7 digits");
    h.iteration = v;
    if (!r.held.empty() && h.iteration <= r.held.back().iteration) return bad("iterations not ascending");
    if (f[1] != "-") {
      if (!is_lower_hex(f[1], 1, 64)) return bad("a run id is not hex");
      h.run_id = std::string(f[1]);
    }
    if (!parse_strict_count(f[2], kMaxSnapshotShards, &shards)) return bad("a shard count is out of range");
    h.shards = static_cast<int>(shards);
    if (f[3] != "-") {
      const auto list = split_fields(f[3], ',');
      if (static_cast<int64_t>(list.size()) > shards) return bad("more shards present than the iteration has");
      for (std::string_view p : list) {
        if (!parse_strict_count(p, shards - 1, &v)) return bad("a shard index is out of range");
        if (!h.present.empty() && v <= h.present.back()) return bad("shard indices not ascending");
        h.present.push_back(static_cast<int>(v));
      }
    }
    r.held.push_back(std::move(h));
  }
  return r;
}

}  // namespace troupe
