// Straggler scores (engine/stragglers.hpp): a rank is compared with the ranks of its own pipeline
// stage (another stage does other work), on the medians of its last steps (one delayed step names
// nobody), scored by the fastest peer's compute time over its own, named with the section where its
// time goes, and against its own recent best.
#include <catch2/catch.hpp>

#include "engine/stragglers.hpp"

namespace troupe {

namespace {
// forward, backward, optimizer per rank: 4 ranks, stage 1 (ranks 2, 3) doing more work than stage 0.
const std::vector<double> kEven = {10, 20, 5, 10.5, 20, 5, 30, 60, 5, 31, 59, 5};
std::vector<double> with(int at, double value) {
  std::vector<double> v = kEven;
  v[static_cast<size_t>(at)] = value;
  return v;
}
}  // namespace

TEST_CASE("stragglers: the slow rank of a stage is named with its section; other stages are not compared",
          "[stragglers]") {
  StragglerTracker t({0, 0, 1, 1}, /*history=*/20, /*threshold=*/0.75, /*window=*/5, /*min_steps=*/3);
  t.add(std::vector<double>(12, 0.0));  // the first step: nothing measured yet
  t.add(kEven);
  t.add(kEven);
  CHECK_FALSE(t.has_scores());  // two steps: too few
  CHECK(t.scores().empty());
  t.add(kEven);
  REQUIRE(t.has_scores());
  CHECK(t.stragglers().empty());  // stage 1 is slower than stage 0, but its ranks are alike
  t.add(with(3, 60));  // one step of rank 1 delayed: the medians do not move
  CHECK(t.stragglers().empty());
  // Rank 1's forward takes 30 ms more from now on: named once it is the window's median.
  t.add(with(3, 40));
  CHECK(t.stragglers().empty());  // 10.5 10.5 10.5 40 60: the median is 10.5
  t.add(with(3, 40));             // 10.5 10.5 40 40 60
  const auto slow = t.stragglers();
  REQUIRE(slow.size() == 1);
  CHECK(slow[0].rank == 1);
  CHECK(slow[0].stage == 0);
  CHECK(slow[0].relative == Approx(35.0 / 65.0));
  CHECK(slow[0].section == "forward-compute");
  CHECK(slow[0].section_ms == 40);
  CHECK(slow[0].fastest_section_ms == 10);
  CHECK(slow[0].individual == Approx(35.5 / 65.0));  // its best step (35.5 ms) over its median now
  const auto all = t.scores();
  REQUIRE(all.size() == 4);
  CHECK(all.front().rank == 1);  // lowest first
  for (const StragglerScore& s : all)
    if (s.rank != 1) CHECK(s.relative > 0.95);
  CHECK(describe_straggler(slow[0]).find("rank 1 (stage 0): 0.54 of its stage's fastest, forward-compute 40.0 ms") !=
        std::string::npos);
  // Back to normal: named until the slow steps leave the median.
  for (int i = 0; i < 3; ++i) t.add(kEven);
  CHECK(t.stragglers().empty());
}

TEST_CASE("stragglers: the section is where the time goes; the individual score follows the rank's history",
          "[stragglers]") {
  StragglerTracker opt({0, 0, 1, 1}, 20, 0.75, /*window=*/1, /*min_steps=*/1);
  opt.add(with(5, 50));  // rank 1's optimizer
  REQUIRE(opt.stragglers().size() == 1);
  CHECK(opt.stragglers()[0].section == "optimizer");
  CHECK(opt.stragglers()[0].section_ms == 50);
  // Both ranks of a stage slow down alike: relative stays 1, individual drops to 20 / 40.
  StragglerTracker t({0, 0}, /*history=*/2, 0.75, /*window=*/1, /*min_steps=*/1);
  t.add({10, 10, 0, 10, 10, 0});
  t.add({10, 10, 0, 10, 10, 0});
  t.add({20, 20, 0, 20, 20, 0});
  for (const StragglerScore& s : t.scores()) {
    CHECK(s.relative == Approx(1.0));
    CHECK(s.individual == Approx(0.5));
  }
  CHECK(t.stragglers().empty());
}

}  // namespace troupe
