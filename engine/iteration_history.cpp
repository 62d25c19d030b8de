#include "engine/iteration_history.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "troupe/check.hpp"

namespace troupe {

IterationHistory::IterationHistory(size_t capacity) : ring_(std::max<size_t>(capacity, 1)) {
  TROUPE_CHECK(capacity >= 1, "IterationHistory keeps at least one iteration");
}

void IterationHistory::add(const IterationStats& s) {
  std::lock_guard<std::mutex> lock(mu_);
  ring_[next_] = {s.iteration, s.lm_loss, s.lr, s.grad_norm, s.ms_per_iter};
  next_ = (next_ + 1) % ring_.size();
  filled_ = std::min(filled_ + 1, ring_.size());
  if (!s.moe.empty()) moe_ = {s.iteration, s.moe_loss, s.moe};
  if (!s.rank_scores.empty()) stragglers_ = {s.iteration, s.straggler_threshold, s.rank_scores};
}

MoeSnapshot IterationHistory::last_moe() const {
  std::lock_guard<std::mutex> lock(mu_);
  return moe_;
}

StragglerSnapshot IterationHistory::last_stragglers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stragglers_;
}

std::string stragglers_json(const StragglerSnapshot& snapshot) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const StragglerScore& r : snapshot.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"stage", r.stage},
                     {"relative_score", r.relative},
                     {"individual_score", r.individual},
                     {"straggler", r.relative < snapshot.threshold},
                     {"section", r.section},
                     {"section_ms", r.section_ms},
                     {"fastest_section_ms", r.fastest_section_ms},
                     {"compute_ms", r.compute_ms}});
  return nlohmann::json{{"iteration", snapshot.iteration}, {"threshold", snapshot.threshold}, {"ranks", ranks}}.dump();
}

std::vector<HistoryPoint> IterationHistory::points(int64_t since, size_t last) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<HistoryPoint> out;
  for (size_t i = 0; i < filled_; ++i) {
    const HistoryPoint& p = ring_[(next_ + ring_.size() - filled_ + i) % ring_.size()];
    if (p.iteration > since) out.push_back(p);
  }
  if (out.size() > last) out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(last));
  return out;
}

std::string history_json(const std::vector<HistoryPoint>& points, size_t kept) {
  nlohmann::json it = nlohmann::json::array(), loss = it, lr = it, norm = it, ms = it;
  for (const HistoryPoint& p : points) {
    it.push_back(p.iteration);
    loss.push_back(p.loss);
    lr.push_back(p.lr);
    norm.push_back(p.grad_norm);
    ms.push_back(p.ms);
  }
  return nlohmann::json{{"kept", kept}, {"iteration", it}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm}, {"ms", ms}}
             .dump() +
         "\n";
}

std::string moe_json(const MoeSnapshot& snapshot) {
  nlohmann::json layers = nlohmann::json::array();
  for (const MoeLayerLoad& l : snapshot.layers)
    layers.push_back({{"layer", l.layer},
                      {"experts", l.routed.size()},
                      {"micro_batches", l.micro_batches},
                      {"routed", l.routed},
                      {"kept", l.kept},
                      {"dropped", l.dropped},
                      {"lb_loss", l.lb_loss},
                      {"z_loss", l.z_loss}});
  return nlohmann::json{{"iteration", snapshot.iteration}, {"moe_loss", snapshot.moe_loss}, {"layers", layers}}.dump() +
         "\n";
}

}  // namespace troupe
