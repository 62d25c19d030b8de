// The supervisor actor (actors/supervisor.hpp) with scripted attempts: it restarts what may be
// restarted from where restart_from says, fails what may not (or what cannot be restarted), treats an
// attempt that throws as a failed one, runs every attempt off the caller's thread, and moves the
// lifecycle only through its allowed transitions (JobLifecycle checks each).
#include <catch2/catch.hpp>

#include <atomic>
#include <random>
#include <stdexcept>
#include <thread>

#include "actors/supervisor.hpp"

namespace troupe {

namespace {

// An attempt as run_attempt moves the lifecycle: training once started, stopping when it succeeded.
struct Script {
  JobLifecycle* lifecycle = nullptr;
  std::vector<int> outcomes;  // per attempt: 0 succeeds, 1 fails (restartable), 2 fails (bad input), 3 throws
  std::vector<std::thread::id> threads;
  AttemptOutcome operator()(int n) {
    threads.push_back(std::this_thread::get_id());
    const int what = outcomes.at(static_cast<size_t>(n - 1));
    if (what == 3) throw std::runtime_error("boom in attempt " + std::to_string(n));
    lifecycle->enter(JobPhase::training);
    AttemptOutcome out;
    if (what == 0) {
      lifecycle->enter(JobPhase::stopping);
      TrainSummary s;
      s.iteration = 100 + n;
      out.result = s;
    } else {
      out.result = what == 2 ? Status::bad_input("bad flag in attempt " + std::to_string(n))
                             : Status::error("rank 1 died in attempt " + std::to_string(n));
    }
    return out;
  }
};

std::vector<JobPhase> phases(const JobLifecycle& l) {
  std::vector<JobPhase> out;
  for (const PhaseChange& c : l.history()) out.push_back(c.to);
  return out;
}

SupervisorHooks hooks_for(Script& script, int max_restarts, std::vector<std::string>* log,
                          bool restart_point_fails = false) {
  SupervisorHooks h;
  h.attempt = [&script](int n) { return script(n); };
  h.may_restart = [max_restarts](const AttemptOutcome& out, int n) {
    if (n > max_restarts || out.result.status().is_bad_input()) return out.result.status();
    return Status::ok();
  };
  h.restart_from = [log, restart_point_fails](const AttemptOutcome& out, int n) -> Result<std::string> {
    log->push_back("after attempt " + std::to_string(n) + ": " + out.result.status().message());
    if (restart_point_fails) return Status::error("the checkpoint is unreadable");
    return std::string("iteration ") + std::to_string(10 * n);
  };
  h.finished = [](TrainSummary& s) { s.last_loss = 2.5; };
  return h;
}

}  // namespace

TEST_CASE("supervisor: failures restarted from where restart_from says, then finished", "[supervisor]") {
  JobLifecycle lifecycle;
  Script script{&lifecycle, {1, 3, 0}, {}};
  std::vector<std::string> log;
  auto result = supervise(lifecycle, hooks_for(script, 2, &log));
  REQUIRE(result.is_ok());
  CHECK(result.value().iteration == 103);
  CHECK(result.value().last_loss == 2.5);  // the finished hook ran on the summary returned
  using P = JobPhase;
  CHECK(phases(lifecycle) == std::vector<P>{P::starting, P::training, P::recovering, P::starting, P::recovering,
                                            P::starting, P::training, P::stopping, P::finished});
  CHECK(lifecycle.attempt() == 3);
  REQUIRE(log.size() == 2);
  CHECK(log[0] == "after attempt 1: rank 1 died in attempt 1");
  CHECK(log[1] == "after attempt 2: the attempt threw: boom in attempt 2");
  const auto history = lifecycle.history();
  CHECK(history[3].why == "restart 1: from iteration 10");
  CHECK(history[5].why == "restart 2: from iteration 20");
  for (std::thread::id id : script.threads) CHECK(id != std::this_thread::get_id());
}

TEST_CASE("supervisor: what may not be restarted, or cannot be, fails the run", "[supervisor]") {
  using P = JobPhase;
  std::vector<std::string> log;
  {  // bad input: not restarted
    JobLifecycle lifecycle;
    Script script{&lifecycle, {2}, {}};
    auto result = supervise(lifecycle, hooks_for(script, 5, &log));
    REQUIRE_FALSE(result.is_ok());
    CHECK(result.status().is_bad_input());
    CHECK(phases(lifecycle) == std::vector<P>{P::starting, P::training, P::failed});
  }
  {  // the restarts used up
    JobLifecycle lifecycle;
    Script script{&lifecycle, {1, 1}, {}};
    auto result = supervise(lifecycle, hooks_for(script, 1, &log));
    REQUIRE_FALSE(result.is_ok());
    CHECK_THAT(result.status().message(), Catch::Contains("rank 1 died in attempt 2"));
    CHECK(lifecycle.attempt() == 2);
    CHECK(lifecycle.phase() == P::failed);
  }
  {  // no restart point: failed from recovering, naming why
    JobLifecycle lifecycle;
    Script script{&lifecycle, {1}, {}};
    auto result = supervise(lifecycle, hooks_for(script, 3, &log, true));
    REQUIRE_FALSE(result.is_ok());
    CHECK_THAT(result.status().message(), Catch::Contains("the checkpoint is unreadable"));
    CHECK(phases(lifecycle) == std::vector<P>{P::starting, P::training, P::recovering, P::failed});
  }
}

TEST_CASE("supervisor: random scripts end as their attempts say", "[supervisor]") {
  std::mt19937 rng(0x5e7);
  for (int trial = 0; trial < 40; ++trial) {
    const int max_restarts = static_cast<int>(rng() % 4);
    std::vector<int> outcomes;
    for (int i = 0; i <= max_restarts; ++i) outcomes.push_back(static_cast<int>(rng() % 4));
    INFO("trial " << trial);
    JobLifecycle lifecycle;
    Script script{&lifecycle, outcomes, {}};
    std::vector<std::string> log;
    auto result = supervise(lifecycle, hooks_for(script, max_restarts, &log));
    // The first success or bad input ends it; otherwise the restarts run out.
    size_t last = 0;
    while (last + 1 < outcomes.size() && outcomes[last] != 0 && outcomes[last] != 2) ++last;
    CHECK(lifecycle.attempt() == static_cast<int>(last + 1));
    CHECK(result.is_ok() == (outcomes[last] == 0));
    CHECK(lifecycle.phase() == (outcomes[last] == 0 ? JobPhase::finished : JobPhase::failed));
    CHECK(log.size() == last);
  }
}

}  // namespace troupe
