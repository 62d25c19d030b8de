// What a shard holds and what a rank reads, as groups of runs (storage/shard_coverage.hpp): the
// groups cover exactly the runs, two groups intersect exactly when their elements do (against the
// element sets), shards_read names exactly the shards sharing an element with what is read, and
// the text sent between processes reads back as written and refuses what is malformed.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "storage/shard_coverage.hpp"

using namespace troupe;

namespace {

std::set<int64_t> elements(const std::vector<RunGroup>& groups) {
  std::set<int64_t> out;
  for (const RunGroup& g : groups)
    for (int64_t i = 0; i < g.count; ++i)
      for (int64_t k = 0; k < g.length; ++k) out.insert(g.start + i * g.stride + k);
  return out;
}

bool share(const std::set<int64_t>& a, const std::set<int64_t>& b) {
  for (int64_t x : a)
    if (b.count(x) != 0) return true;
  return false;
}

// A random group inside [0, 80): odd lengths and strides, single runs too.
RunGroup random_group(std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> start(0, 40), length(1, 5), extra(0, 6), count(1, 6);
  RunGroup g;
  g.start = start(rng);
  g.length = length(rng);
  g.count = count(rng);
  g.stride = g.count == 1 ? 0 : g.length + extra(rng);
  return g;
}

}  // namespace

TEST_CASE("shard coverage: runs fold into groups that cover exactly them", "[coverage]") {
  // A column slice of an (R, C) matrix, one run per row: one group.
  std::vector<GlobalRun> slice;
  for (int64_t r = 0; r < 9; ++r) slice.push_back({r * 12 + 4, 3});
  CHECK(group_runs(slice) == std::vector<RunGroup>{{4, 3, 12, 9}});
  // A ZeRO range of it: a partial first row, whole rows, a partial last row.
  const auto zero = group_runs({{5, 2}, {16, 3}, {28, 3}, {40, 3}, {52, 1}});
  CHECK(zero == std::vector<RunGroup>{{5, 2, 0, 1}, {16, 3, 12, 3}, {52, 1, 0, 1}});
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<GlobalRun> runs;
    std::set<int64_t> want;
    int64_t at = 0;
    std::uniform_int_distribution<int64_t> gap(0, 4), len(1, 4), n(0, 12);
    for (int64_t i = n(rng); i > 0; --i) {
      at += gap(rng);
      runs.push_back({at, len(rng)});
      for (int64_t k = 0; k < runs.back().length; ++k) want.insert(at + k);
      at += runs.back().length;
    }
    const auto groups = group_runs(runs);
    CHECK(elements(groups) == want);
    CHECK(groups.size() <= runs.size());
  }
}

TEST_CASE("shard coverage: two groups intersect exactly when their elements do", "[coverage]") {
  std::mt19937_64 rng(11);
  int hits = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const RunGroup a = random_group(rng), b = random_group(rng);
    const bool want = share(elements({a}), elements({b}));
    INFO("a " << a.start << "+" << a.length << " x" << a.count << " /" << a.stride << ", b " << b.start << "+"
              << b.length << " x" << b.count << " /" << b.stride);
    REQUIRE(groups_intersect(a, b) == want);
    REQUIRE(groups_intersect(b, a) == want);
    hits += want ? 1 : 0;
  }
  CHECK(hits > 2000);  // both answers are exercised
  CHECK(hits < 18000);
  // Near 2^62, where a product of count and stride would overflow 64 bits.
  const int64_t s = ((int64_t{1} << 62) - 10) / 3;  // runs at 0, s, 2s
  CHECK(groups_intersect({0, 1, s, 3}, {2 * s - 1, 2, 0, 1}));
  CHECK_FALSE(groups_intersect({0, 1, s, 3}, {2 * s + 1, 5, 0, 1}));
  CHECK(groups_intersect({0, 1, s, 3}, {s, 1, s + 1, 2}));
  CHECK_FALSE(groups_intersect({1, 1, s, 3}, {s + 2, 1, s + 1, 2}));
}

TEST_CASE("shard coverage: shards_read names exactly the shards holding something read", "[coverage]") {
  std::mt19937_64 rng(5);
  const std::vector<std::string> names = {"a", "b"};
  auto random_coverage = [&] {
    ShardCoverage c;
    std::uniform_int_distribution<int> n(0, 2), section(0, 2), groups(1, 2);
    for (int e = n(rng); e > 0; --e) {
      CoverageEntry entry{static_cast<ShardSection>(section(rng)), names[static_cast<size_t>(n(rng) % 2)], {}};
      for (int g = groups(rng); g > 0; --g) entry.groups.push_back(random_group(rng));
      c.push_back(entry);
    }
    return c;
  };
  for (int trial = 0; trial < 300; ++trial) {
    const ShardCoverage reads = random_coverage();
    std::vector<ShardCoverage> writes;
    for (int w = 0; w < 5; ++w) writes.push_back(random_coverage());
    std::vector<int> want;
    for (int w = 0; w < 5; ++w) {
      bool hit = false;
      for (const CoverageEntry& r : reads)
        for (const CoverageEntry& e : writes[static_cast<size_t>(w)])
          hit = hit || (r.section == e.section && r.name == e.name && share(elements(r.groups), elements(e.groups)));
      if (hit) want.push_back(w);
    }
    REQUIRE(shards_read(reads, writes) == want);
  }
}

TEST_CASE("shard coverage: the text reads back as written; malformed text is refused naming the line",
          "[coverage][hostile]") {
  const ShardCoverage c = {{ShardSection::model, "transformer.h.0.attn.c_attn.weight", {{4, 3, 12, 9}, {200, 1, 0, 1}}},
                           {ShardSection::exp_avg_sq, "name with spaces", {}},
                           {ShardSection::exp_avg, "x", {{0, 5, 0, 1}}}};
  const std::string text = encode_coverage(c);
  auto back = parse_coverage(text);
  REQUIRE(back.is_ok());
  REQUIRE(back->size() == 3);
  CHECK(back->at(0).name == c[0].name);
  CHECK(back->at(0).groups == c[0].groups);
  CHECK(back->at(1).section == ShardSection::exp_avg_sq);
  CHECK(encode_coverage(back.value()) == text);
  CHECK(parse_coverage("coverage 1\n").is_ok());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "not newline-terminated"},
      {"coverage 2\n", "unknown first line"},
      {"coverage 1\nG 0 1 0 1\n", "a group before any tensor"},
      {"coverage 1\nT 3 a\n", "neither a tensor nor a group"},
      {"coverage 1\nT 0 a\x01\n", "a control character"},
      {"coverage 1\nT 0 a\nG 0 4 2 3\n", "overlap"},
      {"coverage 1\nT 0 a\nG 0 4 5 1\n", "a single run's stride"},
      {"coverage 1\nT 0 a\nG 0 0 0 1\n", "no element"},
      {"coverage 1\nT 0 a\nG 01 1 0 1\n", "four numbers"},
      {"coverage 1\nT 0 a\nG -1 1 0 1\n", "four numbers"},
      {"coverage 1\nT 0 a\nG 1 1 0\n", "four numbers"},
      {"coverage 1\nT 0 a\nG 4611686018427387903 2 0 1\n", "past 2^62"},
      {"coverage 1\nT 0 a\nG 0 1 2305843009213693952 3\n", "past 2^62"},
      {"coverage 1\nT 0 " + std::string(513, 'n') + "\n", "longer than 512"},
  };
  for (const auto& [input, why] : bad) {
    INFO(input);
    auto r = parse_coverage(input);
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains(why));
  }
}
