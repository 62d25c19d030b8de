// Straggler scores (engine/stragglers.hpp): a rank is compared with the ranks of its own pipeline
// stage (another stage does other work), scored by the fastest peer's compute time over its own,
// named with the section where its time goes, and against its own recent best.
#include <catch2/catch.hpp>

#include "engine/stragglers.hpp"

namespace troupe {

TEST_CASE("stragglers: the slow rank of a stage is named with its section; other stages are not compared",
          "[stragglers]") {
  // 4 ranks, 2 stages (ranks 0-1: stage 0, 2-3: stage 1); stage 1 does more work than stage 0.
  StragglerTracker t({0, 0, 1, 1}, /*history=*/3, /*threshold=*/0.75);
  CHECK_FALSE(t.has_scores());
  t.add(std::vector<double>(12, 0.0));  // the first step: nothing measured yet
  CHECK_FALSE(t.has_scores());
  // forward, backward, optimizer per rank.
  t.add({10, 20, 5, 10.5, 20, 5, 30, 60, 5, 31, 59, 5});
  CHECK(t.stragglers().empty());  // stage 1 is slower than stage 0, but its ranks are alike
  t.add({10, 20, 5, 40, 20, 5, 30, 60, 5, 31, 59, 5});  // rank 1's forward takes 30 ms more
  const auto slow = t.stragglers();
  REQUIRE(slow.size() == 1);
  CHECK(slow[0].rank == 1);
  CHECK(slow[0].stage == 0);
  CHECK(slow[0].relative == Approx(35.0 / 65.0));
  CHECK(slow[0].section == "forward-compute");
  CHECK(slow[0].section_ms == 40);
  CHECK(slow[0].fastest_section_ms == 10);
  CHECK(slow[0].individual == Approx(35.5 / 65.0));  // its best of the history (35.5 ms) over now
  const auto all = t.scores();
  REQUIRE(all.size() == 4);
  CHECK(all.front().rank == 1);  // lowest first
  for (const StragglerScore& s : all)
    if (s.rank != 1) CHECK(s.relative > 0.95);
  CHECK(describe_straggler(slow[0]).find("rank 1 (stage 0)") != std::string::npos);
  // The slow section moves to the optimizer: named there.
  t.add({10, 20, 5, 10, 20, 50, 30, 60, 5, 31, 59, 5});
  REQUIRE(t.stragglers().size() == 1);
  CHECK(t.stragglers()[0].section == "optimizer");
  // Back to normal: nobody.
  t.add({10, 20, 5, 10, 20, 5, 30, 60, 5, 31, 59, 5});
  CHECK(t.stragglers().empty());
}

TEST_CASE("stragglers: the individual score follows the rank's own history", "[stragglers]") {
  StragglerTracker t({0, 0}, /*history=*/2, 0.75);
  t.add({10, 10, 0, 10, 10, 0});
  t.add({10, 10, 0, 10, 10, 0});
  // Both ranks slow down alike: relative stays 1, individual drops to 20 / 40.
  t.add({20, 20, 0, 20, 20, 0});
  for (const StragglerScore& s : t.scores()) {
    CHECK(s.relative == Approx(1.0));
    CHECK(s.individual == Approx(0.5));
  }
  CHECK(t.stragglers().empty());
}

}  // namespace troupe
