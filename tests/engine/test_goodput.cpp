// Goodput (engine/goodput.hpp): a run's wall time split into the productive steps and the time lost
// by cause, from the events the job feeds it; the parts always add up to the wall time, a failure
// moves the steps past the checkpoint resumed from into `failures`, and a restarted process's
// start-up is recovery.
#include <catch2/catch.hpp>

#include <random>

#include "engine/goodput.hpp"

namespace troupe {

namespace {
double sum_of_parts(const GoodputReport& g) {
  double s = g.productive_seconds;
  for (const auto& [cause, seconds] : g.lost_seconds) s += seconds;
  return s;
}
}  // namespace

TEST_CASE("goodput: startup, steps, saves, evaluation, bubble and stragglers add up to the wall time", "[goodput]") {
  GoodputLedger g(100.0);
  CHECK_FALSE(g.in_attempt());
  g.attempt_started(103.0);  // 3 s of start-up
  CHECK(g.in_attempt());
  double now = 103.0;
  for (int64_t it = 1; it <= 10; ++it) {
    now += 0.5;
    g.step(now, it, 0.5, 0.1, it == 4 ? 0.2 : 0.0);
  }
  g.save(now + 0.25, 0.25);
  g.evaluation(now + 1.25, 1.0);
  now += 2.0;  // 0.75 s of "other"
  const GoodputReport r = g.report(now);
  CHECK(r.wall_seconds == Approx(now - 100.0));
  CHECK(r.lost("startup") == Approx(3.0));
  CHECK(r.lost("saves") == Approx(0.25));
  CHECK(r.lost("evaluation") == Approx(1.0));
  CHECK(r.lost("pipeline bubble") == Approx(1.0));
  CHECK(r.lost("stragglers") == Approx(0.2));
  CHECK(r.lost("other") == Approx(0.75));
  CHECK(r.lost("failures") == 0.0);
  CHECK(r.productive_seconds == Approx(10 * 0.4 - 0.2));
  CHECK(r.goodput == Approx(r.productive_seconds / r.wall_seconds));
  CHECK(sum_of_parts(r) == Approx(r.wall_seconds));
  CHECK(r.iterations_lost == 0);
  const std::string line = format_goodput(r);
  CHECK(line.find("startup") != std::string::npos);
  CHECK(line.find("failures") == std::string::npos);  // nothing lost to it: left out
}

TEST_CASE("goodput: a failure undoes the steps after the checkpoint resumed from; the restart is recovery", "[goodput]") {
  GoodputLedger g(0.0);
  g.attempt_started(1.0);
  double now = 1.0;
  for (int64_t it = 1; it <= 7; ++it) g.step(now += 1.0, it, 1.0, 0, 0);  // 1..7, ends at 8
  g.failed(8.5, /*resume_from=*/5);  // iterations 6 and 7 lost, and half a step
  CHECK_FALSE(g.in_attempt());
  const GoodputReport mid = g.report(9.0);  // restarting: the half second since is recovery so far
  CHECK(mid.lost("recovery") == Approx(0.5));
  g.attempt_started(10.0);  // 1.5 s of recovery
  now = 10.0;
  for (int64_t it = 6; it <= 8; ++it) g.step(now += 1.0, it, 1.0, 0, 0);
  const GoodputReport r = g.report(now);
  CHECK(r.iterations_lost == 2);
  CHECK(r.lost("failures") == Approx(2.5));
  CHECK(r.lost("recovery") == Approx(1.5));
  CHECK(r.lost("startup") == Approx(1.0));
  CHECK(r.productive_seconds == Approx(8.0));  // iterations 1..8 once each
  CHECK(sum_of_parts(r) == Approx(r.wall_seconds));
}

TEST_CASE("goodput: a restarted process's start-up is recovery; a failed start-up stays start-up", "[goodput]") {
  GoodputLedger restarted(0.0, /*restarted=*/true);
  restarted.attempt_started(4.0);
  restarted.step(5.0, 11, 1.0, 0, 0);
  CHECK(restarted.report(5.0).lost("recovery") == Approx(4.0));
  CHECK(restarted.report(5.0).lost("startup") == 0.0);

  GoodputLedger g(0.0);
  g.failed(2.0, 0);  // failed before any step: no step interrupted
  g.attempt_started(3.0);
  g.step(4.0, 1, 1.0, 0, 0);
  const GoodputReport r = g.report(4.0);
  CHECK(r.lost("startup") == Approx(3.0));
  CHECK(r.lost("failures") == 0.0);
}

TEST_CASE("goodput: random event sequences always add up and stay within [0, 1]", "[goodput]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    GoodputLedger g(0.0, trial % 5 == 0);
    double now = u(rng);
    int64_t it = 0, saved = 0;
    for (int e = 0; e < 60; ++e) {
      const double r = u(rng);
      now += u(rng);
      if (!g.in_attempt() && r < 0.9) g.attempt_started(now);
      if (r < 0.6 && g.in_attempt()) {
        const double secs = 0.2 + u(rng);
        now += secs;
        g.step(now, ++it, secs, secs * u(rng) * 0.5, secs * u(rng) * 0.5);
      } else if (r < 0.7) {
        g.save(now, u(rng) * 0.1);
        saved = it;
      } else if (r < 0.8) {
        g.evaluation(now, u(rng) * 0.1);
      } else if (r < 0.85) {
        g.failed(now, saved);
        it = saved;
      }
    }
    const GoodputReport rep = g.report(now + 1.0);
    REQUIRE(sum_of_parts(rep) >= rep.wall_seconds - 1e-9);
    for (const auto& [cause, seconds] : rep.lost_seconds) REQUIRE(seconds >= 0.0);
    REQUIRE(rep.goodput >= 0.0);
    REQUIRE(rep.goodput <= 1.0);
  }
}

TEST_CASE("goodput: a step's bubble needs a pipeline; its straggler wait is the named straggler's excess", "[goodput]") {
  IterationStats s;
  s.ms_per_iter = 200;
  s.busy_fraction_max = 0.8;
  CHECK(GoodputLedger::bubble_seconds(s, 1) == 0.0);
  CHECK(GoodputLedger::bubble_seconds(s, 2) == Approx(0.04));
  s.busy_fraction_max = -1;  // not measured
  CHECK(GoodputLedger::bubble_seconds(s, 4) == 0.0);
  s.straggler_threshold = 0.75;
  StragglerScore fast, slow, mild;
  fast.rank = 0;
  fast.compute_ms = 50;
  slow.rank = 1;
  slow.relative = 0.5;  // 100 ms where the fastest took 50
  slow.compute_ms = 100;
  mild.rank = 2;
  mild.relative = 0.9;  // not a straggler: not counted
  mild.compute_ms = 55;
  s.rank_scores = {slow, mild, fast};
  CHECK(GoodputLedger::straggler_seconds(s) == Approx(0.05));
  s.ms_per_iter = 20;  // never more than the step
  CHECK(GoodputLedger::straggler_seconds(s) == Approx(0.02));
}

}  // namespace troupe
