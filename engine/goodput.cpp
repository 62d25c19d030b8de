// engine/goodput.hpp.
#include "engine/goodput.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace troupe {

GoodputLedger::GoodputLedger(double start, bool restarted)
    : start_(start), restarted_(restarted), attempt_origin_(start), last_mark_(start) {}

void GoodputLedger::attempt_started(double now) {
  const double waited = std::max(0.0, now - attempt_origin_);
  if (first_attempt_ && !restarted_) startup_ += waited;
  else recovery_ += waited;
  first_attempt_ = false;
  in_attempt_ = true;
  last_mark_ = now;
}

void GoodputLedger::step(double now, int64_t iteration, double seconds, double bubble, double straggler) {
  seconds = std::max(0.0, seconds);
  bubble = std::clamp(bubble, 0.0, seconds);
  straggler = std::clamp(straggler, 0.0, seconds - bubble);
  if (auto it = steps_.find(iteration); it != steps_.end()) {  // computed before and not undone: lost
    failures_ += it->second.seconds;
    ++iterations_lost_;
  }
  steps_[iteration] = {seconds, bubble, straggler};
  last_mark_ = now;
}

void GoodputLedger::save(double now, double seconds) {
  saves_ += std::max(0.0, seconds);
  last_mark_ = now;
}

void GoodputLedger::evaluation(double now, double seconds) {
  evaluation_ += std::max(0.0, seconds);
  last_mark_ = now;
}

void GoodputLedger::failed(double now, int64_t resume_from) {
  for (auto it = steps_.upper_bound(resume_from); it != steps_.end();) {
    failures_ += it->second.seconds;
    ++iterations_lost_;
    it = steps_.erase(it);
  }
  if (in_attempt_) {
    failures_ += std::max(0.0, now - last_mark_);  // the interrupted step
    attempt_origin_ = now;
  }
  // A start-up that failed before its first step stays with the next attempt's start-up.
  in_attempt_ = false;
}

GoodputReport GoodputLedger::report(double now) const {
  GoodputReport g;
  g.wall_seconds = std::max(0.0, now - start_);
  double startup = startup_, recovery = recovery_, bubble = 0, straggler = 0, productive = 0;
  if (!in_attempt_) {  // still starting
    if (first_attempt_ && !restarted_) startup += std::max(0.0, now - attempt_origin_);
    else recovery += std::max(0.0, now - attempt_origin_);
  }
  for (const auto& [iteration, s] : steps_) {
    bubble += s.bubble;
    straggler += s.straggler;
    productive += s.seconds - s.bubble - s.straggler;
  }
  g.productive_seconds = productive;
  g.iterations_lost = iterations_lost_;
  g.lost_seconds = {{"startup", startup},       {"failures", failures_}, {"recovery", recovery},
                    {"saves", saves_},          {"evaluation", evaluation_}, {"stragglers", straggler},
                    {"pipeline bubble", bubble}};
  double lost = 0;
  for (const auto& [cause, seconds] : g.lost_seconds) lost += seconds;
  g.lost_seconds.emplace_back("other", std::max(0.0, g.wall_seconds - productive - lost));
  g.goodput = g.wall_seconds > 0 ? std::clamp(productive / g.wall_seconds, 0.0, 1.0) : 0.0;
  return g;
}

double GoodputLedger::bubble_seconds(const IterationStats& s, int pipeline_stages) {
  if (pipeline_stages <= 1 || s.busy_fraction_max < 0) return 0;
  return s.ms_per_iter / 1e3 * std::clamp(1.0 - s.busy_fraction_max, 0.0, 1.0);
}

double GoodputLedger::straggler_seconds(const IterationStats& s) {
  double wait = 0;
  for (const StragglerScore& r : s.rank_scores)
    if (r.relative < s.straggler_threshold) wait = std::max(wait, r.compute_ms * (1.0 - r.relative) / 1e3);
  return std::min(wait, s.ms_per_iter / 1e3);
}

std::string format_goodput(const GoodputReport& g) {
  std::string out = fmt::format("goodput {:.1f}% of {:.1f} s", 100.0 * g.goodput, g.wall_seconds);
  std::string lost;
  for (const auto& [cause, seconds] : g.lost_seconds)
    if (seconds >= 0.005) lost += fmt::format("{}{:.2f} s {}", lost.empty() ? "" : ", ", seconds, cause);
  if (!lost.empty()) out += ": lost " + lost;
  if (g.iterations_lost > 0) out += fmt::format(" ({} iteration(s) computed again after failures)", g.iterations_lost);
  return out;
}

std::string goodput_json(const GoodputReport& g) {
  nlohmann::json lost = nlohmann::json::object();
  for (const auto& [cause, seconds] : g.lost_seconds) lost[cause] = seconds;
  return nlohmann::json{{"type", "goodput"},
                        {"wall_seconds", g.wall_seconds},
                        {"productive_seconds", g.productive_seconds},
                        {"goodput", g.goodput},
                        {"iterations_lost", g.iterations_lost},
                        {"lost_seconds", lost}}
      .dump();
}

}  // namespace troupe
