// engine/stragglers.hpp.
#include "engine/stragglers.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "troupe/check.hpp"

namespace troupe {

const std::array<const char*, kStragglerSections> kStragglerSectionNames = {"forward-compute", "backward-compute",
                                                                            "optimizer"};

StragglerTracker::StragglerTracker(std::vector<int> stage_of, int history, double threshold, int window, int min_steps)
    : stage_of_(std::move(stage_of)), history_(std::max(1, history)), threshold_(threshold),
      window_(std::max(1, window)), min_steps_(std::max(1, min_steps)), past_(stage_of_.size()) {}

void StragglerTracker::add(const std::vector<double>& sections) {
  TROUPE_CHECK(sections.size() == stage_of_.size() * kStragglerSections,
               "StragglerTracker::add: one row of sections per rank");
  if (std::all_of(sections.begin(), sections.end(), [](double v) { return v == 0; })) return;
  ++steps_;
  recent_.push_back(sections);
  if (static_cast<int>(recent_.size()) > window_) recent_.pop_front();
  for (int r = 0; r < ranks(); ++r) {
    double total = 0;
    for (int k = 0; k < kStragglerSections; ++k) total += sections[static_cast<size_t>(r * kStragglerSections + k)];
    auto& past = past_[static_cast<size_t>(r)];
    past.push_back(total);
    if (static_cast<int>(past.size()) > history_) past.pop_front();
  }
}

std::vector<StragglerScore> StragglerTracker::scores() const {
  std::vector<StragglerScore> out;
  if (!has_scores()) return out;
  // Each rank's sections: the medians over the window.
  std::vector<double> med(static_cast<size_t>(ranks() * kStragglerSections));
  std::vector<double> column;
  for (size_t i = 0; i < med.size(); ++i) {
    column.clear();
    for (const auto& step : recent_) column.push_back(step[i]);
    std::sort(column.begin(), column.end());
    const size_t n = column.size();
    med[i] = n % 2 == 1 ? column[n / 2] : (column[n / 2 - 1] + column[n / 2]) / 2;
  }
  auto at = [&](int r, int k) { return med[static_cast<size_t>(r * kStragglerSections + k)]; };
  auto total = [&](int r) {
    double t = 0;
    for (int k = 0; k < kStragglerSections; ++k) t += at(r, k);
    return t;
  };
  // Each stage's fastest rank, in one pass (a job of thousands of ranks scores every step).
  std::map<int, int> fastest_of;
  for (int r = 0; r < ranks(); ++r) {
    auto [it, fresh] = fastest_of.try_emplace(stage_of_[static_cast<size_t>(r)], r);
    if (!fresh && total(r) < total(it->second)) it->second = r;
  }
  for (int r = 0; r < ranks(); ++r) {
    StragglerScore s;
    s.rank = r;
    s.stage = stage_of_[static_cast<size_t>(r)];
    s.compute_ms = total(r);
    const int fastest = fastest_of.at(s.stage);
    s.relative = s.compute_ms > 0 ? total(fastest) / s.compute_ms : 1.0;
    double excess = 0;
    for (int k = 0; k < kStragglerSections; ++k)
      if (at(r, k) - at(fastest, k) > excess) {
        excess = at(r, k) - at(fastest, k);
        s.section = kStragglerSectionNames[static_cast<size_t>(k)];
        s.section_ms = at(r, k);
        s.fastest_section_ms = at(fastest, k);
      }
    const auto& past = past_[static_cast<size_t>(r)];
    if (!past.empty() && s.compute_ms > 0)
      s.individual = std::min(1.0, *std::min_element(past.begin(), past.end()) / s.compute_ms);
    out.push_back(std::move(s));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const StragglerScore& a, const StragglerScore& b) { return a.relative < b.relative; });
  return out;
}

std::vector<StragglerScore> StragglerTracker::stragglers() const {
  std::vector<StragglerScore> out;
  for (StragglerScore& s : scores())
    if (s.relative < threshold_) out.push_back(std::move(s));
  return out;
}

std::string describe_straggler(const StragglerScore& s) {
  std::string out = fmt::format("rank {} (stage {}): {:.2f} of its stage's fastest", s.rank, s.stage, s.relative);
  if (!s.section.empty())
    out += fmt::format(", {} {:.1f} ms against {:.1f} ms", s.section, s.section_ms, s.fastest_section_ms);
  out += fmt::format("; {:.2f} of its own best", s.individual);
  return out;
}

}  // namespace troupe
