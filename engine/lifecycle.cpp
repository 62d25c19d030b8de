// engine/lifecycle.hpp.
#include "engine/lifecycle.hpp"

#include <nlohmann/json.hpp>

#include "troupe/check.hpp"

namespace troupe {

bool phase_transition_allowed(JobPhase from, JobPhase to) {
  using P = JobPhase;
  switch (from) {
    case P::resolving: return to == P::starting || to == P::failed;
    case P::starting: return to == P::training || to == P::recovering || to == P::failed;
    case P::training: return to == P::stopping || to == P::recovering || to == P::failed;
    case P::recovering: return to == P::starting || to == P::failed;
    case P::stopping: return to == P::finished || to == P::recovering || to == P::failed;  // a last save failed
    case P::finished:
    case P::failed: return false;
  }
  return false;
}

JobLifecycle::JobLifecycle(Observer observer)
    : observer_(std::move(observer)), began_(std::chrono::steady_clock::now()) {}

void JobLifecycle::enter(JobPhase to, std::string why) {
  PhaseChange change;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TROUPE_CHECK(phase_transition_allowed(phase_, to), std::string("the job's lifecycle cannot go from ") +
                                                           phase_name(phase_) + " to " + phase_name(to));
    if (to == JobPhase::starting) ++attempt_;
    change.from = phase_;
    change.to = to;
    change.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
    change.attempt = attempt_;
    change.why = std::move(why);
    phase_ = to;
    history_.push_back(change);
  }
  if (observer_) observer_(change);
}

JobPhase JobLifecycle::phase() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return phase_;
}

int JobLifecycle::attempt() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return attempt_;
}

std::vector<PhaseChange> JobLifecycle::history() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return history_;
}

std::string describe_phases(const std::vector<PhaseChange>& history) {
  std::string out = history.empty() ? phase_name(JobPhase::resolving) : phase_name(history.front().from);
  for (const PhaseChange& c : history) out += std::string(" -> ") + phase_name(c.to);
  return out;
}

std::string phase_json(const PhaseChange& change) {
  nlohmann::json j = {{"type", "phase"},           {"phase", phase_name(change.to)}, {"from", phase_name(change.from)},
                      {"attempt", change.attempt}, {"seconds", change.seconds},      {"why", change.why}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace troupe
