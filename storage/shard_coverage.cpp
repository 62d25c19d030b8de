// storage/shard_coverage.hpp.
#include "storage/shard_coverage.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "base/strict_text.hpp"

namespace troupe {

namespace {

constexpr int64_t kLimit = int64_t{1} << 62;  // every element index and group end below it
using i128 = __int128;

// floor(n / d) for d > 0.
i128 floor_div(i128 n, i128 d) { return n >= 0 ? n / d : -((-n + d - 1) / d); }

// Whether runs a + iS (length la, i < ca) and b + jS (length lb, j < cb), one stride S > 0 for
// both, share an element: for some k = j - i in [-(ca - 1), cb - 1], a - b - lb < kS < a - b + la.
bool same_stride_intersect(i128 a, i128 la, i128 ca, i128 b, i128 lb, i128 cb, i128 s) {
  const i128 k = std::max<i128>(floor_div(a - b - lb, s) + 1, -(ca - 1));
  return k <= cb - 1 && k * s < a - b + la;
}

bool parse_number(std::string_view s, int64_t* out) { return parse_strict_count(s, kLimit - 1, out); }

}  // namespace

std::vector<RunGroup> group_runs(const std::vector<GlobalRun>& runs) {
  std::vector<RunGroup> out;
  for (const GlobalRun& r : runs) {
    if (!out.empty()) {
      RunGroup& g = out.back();
      if (g.length == r.length) {
        if (g.count == 1 && r.start >= g.start + g.length) {
          g.stride = r.start - g.start;
          g.count = 2;
          continue;
        }
        if (g.count > 1 && r.start == g.start + g.count * g.stride) {
          ++g.count;
          continue;
        }
      }
    }
    out.push_back({r.start, r.length, 0, 1});
  }
  return out;
}

bool groups_intersect(const RunGroup& a, const RunGroup& b) {
  if (a.count == 1 && b.count == 1)
    return a.start < b.start + b.length && b.start < a.start + a.length;
  // One stride for both: a single run has any stride.
  if (a.count == 1 || b.count == 1 || a.stride == b.stride) {
    const int64_t s = a.count > 1 ? a.stride : b.stride;
    return same_stride_intersect(a.start, a.length, a.count, b.start, b.length, b.count, s);
  }
  // Different strides (two layouts' slices): each run of the shorter group against the other.
  const RunGroup& few = a.count <= b.count ? a : b;
  const RunGroup& many = a.count <= b.count ? b : a;
  for (int64_t i = 0; i < few.count; ++i)
    if (same_stride_intersect(few.start + i * few.stride, few.length, 1, many.start, many.length, many.count,
                              many.stride))
      return true;
  return false;
}

std::string encode_coverage(const ShardCoverage& coverage) {
  std::string s = "coverage 1\n";
  for (const CoverageEntry& e : coverage) {
    s += fmt::format("T {} {}\n", static_cast<int>(e.section), e.name);
    for (const RunGroup& g : e.groups) s += fmt::format("G {} {} {} {}\n", g.start, g.length, g.stride, g.count);
  }
  return s;
}

Result<ShardCoverage> parse_coverage(std::string_view text) {
  auto bad = [](size_t line, const std::string& why) {
    return Status::bad_input(fmt::format("a process's report of what its snapshot shard holds is malformed (line {}: {}) "
                                         "-- every process of the job must run the same troupe",
                                         line, why));
  };
  if (text.empty() || text.back() != '\n') return bad(0, "not newline-terminated");
  ShardCoverage out;
  size_t line = 0, at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    const std::string_view l = text.substr(at, end - at);
    at = end + 1;
    if (++line > kMaxCoverageLines) return bad(line, "too many lines");
    if (line == 1) {
      if (l != "coverage 1") return bad(line, "unknown first line");
      continue;
    }
    if (l.size() > 4 && l.substr(0, 2) == "T " && l[2] >= '0' && l[2] <= '2' && l[3] == ' ') {
      const std::string_view name = l.substr(4);
      if (name.size() > 512) return bad(line, "a name longer than 512 bytes");
      if (std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
        return bad(line, "a control character in a name");
      out.push_back({static_cast<ShardSection>(l[2] - '0'), std::string(name), {}});
      continue;
    }
    if (l.size() > 2 && l.substr(0, 2) == "G ") {
      if (out.empty()) return bad(line, "a group before any tensor");
      int64_t v[4];
      std::string_view rest = l.substr(2);
      for (int i = 0; i < 4; ++i) {
        const size_t sp = i < 3 ? rest.find(' ') : rest.size();
        if (sp == std::string_view::npos || !parse_number(rest.substr(0, sp), &v[i]))
          return bad(line, "a group needs four numbers below 2^62");
        rest = i < 3 ? rest.substr(sp + 1) : std::string_view();
      }
      const RunGroup g{v[0], v[1], v[2], v[3]};
      if (g.length < 1 || g.count < 1) return bad(line, "a group of no element");
      if (g.count == 1 && g.stride != 0) return bad(line, "a single run's stride is not 0");
      if (g.count > 1 && g.stride < g.length) return bad(line, "a group's runs overlap");
      // Its last element below 2^62, computed without overflow.
      if (g.count > 1 && (g.count - 1) > (kLimit - g.start - g.length) / g.stride) return bad(line, "a group past 2^62");
      if (g.count == 1 && g.length > kLimit - g.start) return bad(line, "a group past 2^62");
      out.back().groups.push_back(g);
      continue;
    }
    return bad(line, "neither a tensor nor a group");
  }
  if (line == 0) return bad(0, "empty");
  return out;
}

std::vector<int> shards_read(const ShardCoverage& reads, const std::vector<ShardCoverage>& writes) {
  std::map<std::pair<ShardSection, std::string_view>, std::vector<std::pair<int, const CoverageEntry*>>> writers;
  for (size_t w = 0; w < writes.size(); ++w)
    for (const CoverageEntry& e : writes[w]) writers[{e.section, e.name}].push_back({static_cast<int>(w), &e});
  std::set<int> out;
  for (const CoverageEntry& r : reads) {
    auto it = writers.find({r.section, r.name});
    if (it == writers.end()) continue;
    for (const auto& writer : it->second) {
      if (out.count(writer.first) != 0) continue;
      const std::vector<RunGroup>& held = writer.second->groups;
      const bool hit = std::any_of(r.groups.begin(), r.groups.end(), [&held](const RunGroup& a) {
        return std::any_of(held.begin(), held.end(), [&a](const RunGroup& b) { return groups_intersect(a, b); });
      });
      if (hit) out.insert(writer.first);
    }
  }
  return {out.begin(), out.end()};
}

}  // namespace troupe
