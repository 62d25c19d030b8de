#include "engine/span_ring.hpp"

#include <algorithm>
#include <utility>

#include "troupe/check.hpp"

namespace troupe {

namespace {
constexpr SpanKind kKinds[] = {SpanKind::forward, SpanKind::backward, SpanKind::weight,
                               SpanKind::wait,    SpanKind::reduce,   SpanKind::optimizer};
}

const char* span_kind_name(SpanKind kind) {
  switch (kind) {
    case SpanKind::forward: return "forward";
    case SpanKind::backward: return "backward";
    case SpanKind::weight: return "weight";
    case SpanKind::wait: return "wait";
    case SpanKind::reduce: return "reduce";
    case SpanKind::optimizer: return "optimizer";
  }
  return "?";
}

std::optional<SpanKind> span_kind_from_name(std::string_view name) {
  for (SpanKind k : kKinds)
    if (name == span_kind_name(k)) return k;
  return std::nullopt;
}

bool computes(SpanKind kind) {
  return kind == SpanKind::forward || kind == SpanKind::backward || kind == SpanKind::weight;
}

SpanRing::SpanRing(int steps) : ring_(static_cast<size_t>(std::max(steps, 1))) {
  TROUPE_CHECK(steps >= 1, "SpanRing keeps at least one step");
}

void SpanRing::begin_step(int64_t iteration, double start_us) {
  current_.iteration = iteration;
  current_.start_us = start_us;
  current_.dur_us = 0;
  current_.spans.clear();  // keeps its capacity
  open_ = true;
}

void SpanRing::add(SpanKind kind, int micro, int chunk, double start_us, double dur_us) {
  if (!open_) return;
  current_.spans.push_back({kind, micro, chunk, start_us - current_.start_us, dur_us});
}

void SpanRing::end_step(double end_us) {
  if (!open_) return;
  open_ = false;
  current_.dur_us = end_us - current_.start_us;
  std::lock_guard<std::mutex> lock(mu_);
  std::swap(ring_[next_], current_);  // current_ now holds the oldest step's storage
  next_ = (next_ + 1) % ring_.size();
  filled_ = std::min(filled_ + 1, ring_.size());
}

std::vector<StepRecord> SpanRing::snapshot(int last, int64_t since) const {
  std::lock_guard<std::mutex> lock(mu_);
  // The newest `n` steps after `since` (iterations grow along the ring).
  size_t n = 0;
  const size_t most = std::min(filled_, static_cast<size_t>(std::max(last, 0)));
  while (n < most && ring_[(next_ + ring_.size() - 1 - n) % ring_.size()].iteration > since) ++n;
  std::vector<StepRecord> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(ring_[(next_ + ring_.size() - n + i) % ring_.size()]);
  return out;
}

}  // namespace troupe
