// The job's lifecycle (engine/lifecycle.hpp): which phases lead where, the attempts counted at each
// start, and the history an observer sees.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <random>
#include <set>

#include "engine/lifecycle.hpp"

namespace troupe {

namespace {
const std::vector<JobPhase> kPhases = {JobPhase::resolving, JobPhase::starting, JobPhase::training,
                                       JobPhase::recovering, JobPhase::stopping, JobPhase::finished,
                                       JobPhase::failed};
std::vector<JobPhase> next_of(JobPhase from) {
  std::vector<JobPhase> out;
  for (JobPhase to : kPhases)
    if (phase_transition_allowed(from, to)) out.push_back(to);
  return out;
}
bool terminal(JobPhase p) { return p == JobPhase::finished || p == JobPhase::failed; }
}  // namespace

TEST_CASE("lifecycle: every phase is reachable, the ends are final, and each phase has its only ways in", "[lifecycle]") {
  std::set<JobPhase> seen{JobPhase::resolving};
  std::vector<JobPhase> todo{JobPhase::resolving};
  while (!todo.empty()) {
    const JobPhase p = todo.back();
    todo.pop_back();
    for (JobPhase q : next_of(p))
      if (seen.insert(q).second) todo.push_back(q);
  }
  CHECK(seen.size() == kPhases.size());
  for (JobPhase p : kPhases) {
    INFO(phase_name(p));
    CHECK(terminal(p) == next_of(p).empty());
    CHECK_FALSE(phase_transition_allowed(p, p));                          // no phase re-enters itself
    CHECK_FALSE(phase_transition_allowed(p, JobPhase::resolving));        // resolved once
    if (!terminal(p)) CHECK(phase_transition_allowed(p, JobPhase::failed));  // anything can fail
    // Training starts only from a started attempt; finishing only after stopping; an attempt
    // starts only from resolving or a recovery.
    CHECK(phase_transition_allowed(p, JobPhase::training) == (p == JobPhase::starting));
    CHECK(phase_transition_allowed(p, JobPhase::finished) == (p == JobPhase::stopping));
    CHECK(phase_transition_allowed(p, JobPhase::starting) == (p == JobPhase::resolving || p == JobPhase::recovering));
  }
  CHECK(std::string(phase_name(JobPhase::recovering)) == "recovering");
}

TEST_CASE("lifecycle: random runs count their attempts, and the observer sees the history", "[lifecycle]") {
  std::mt19937 rng(20261206);
  for (int run = 0; run < 200; ++run) {
    std::vector<PhaseChange> observed;
    JobLifecycle life([&](const PhaseChange& c) { observed.push_back(c); });
    CHECK(life.phase() == JobPhase::resolving);
    int starts = 0;
    while (!terminal(life.phase())) {
      const std::vector<JobPhase> next = next_of(life.phase());
      const JobPhase to = next[std::uniform_int_distribution<size_t>(0, next.size() - 1)(rng)];
      starts += to == JobPhase::starting;
      life.enter(to, "step " + std::to_string(observed.size()));
      CHECK(life.phase() == to);
      CHECK(life.attempt() == starts);
    }
    const std::vector<PhaseChange> h = life.history();
    REQUIRE(h.size() == observed.size());
    JobPhase at = JobPhase::resolving;
    int attempt = 0;
    double t = 0;
    std::string words = "resolving";
    for (size_t i = 0; i < h.size(); ++i) {
      CHECK(h[i].from == at);
      CHECK(h[i].to == observed[i].to);
      CHECK(h[i].why == "step " + std::to_string(i));
      attempt += h[i].to == JobPhase::starting;
      CHECK(h[i].attempt == attempt);
      CHECK(h[i].seconds >= t);
      t = h[i].seconds;
      at = h[i].to;
      words += std::string(" -> ") + phase_name(at);
    }
    CHECK(describe_phases(h) == words);
  }
}

TEST_CASE("lifecycle: a change as the metrics file's line", "[lifecycle]") {
  PhaseChange c;
  c.from = JobPhase::training;
  c.to = JobPhase::recovering;
  c.seconds = 12.5;
  c.attempt = 2;
  c.why = "rank 0 threw \"x\"\n\xff";  // quotes, a newline, a byte that is not UTF-8
  const auto j = nlohmann::json::parse(phase_json(c));
  CHECK(j["type"] == "phase");
  CHECK(j["phase"] == "recovering");
  CHECK(j["from"] == "training");
  CHECK(j["attempt"] == 2);
  CHECK(j["seconds"] == 12.5);
  CHECK(j["why"].get<std::string>().rfind("rank 0 threw \"x\"\n", 0) == 0);
}

}  // namespace troupe
