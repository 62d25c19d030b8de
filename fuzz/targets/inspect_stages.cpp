// What another process's inspector answers rank 0's `stages` ("local stages": its ranks' recent
// steps, rank_steps_from_json, engine/stages.hpp). Properties: accepted steps, written back by
// rank_steps_json, read back to the same steps; the stages arithmetic and its JSON on them (against
// a 1F1B table of 2 stages) neither crash nor produce a share outside what the figures allow.
#include <cmath>

#include "engine/stages.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "troupe/check.hpp"

namespace troupe::fuzz {

Status inspect_stages(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto ranks = rank_steps_from_json(text);
  if (!ranks) return ranks.status();
  auto again = rank_steps_from_json(rank_steps_json(ranks.value()));
  TROUPE_CHECK(again.is_ok() && again->size() == ranks->size(), "accepted steps do not read back after rank_steps_json");
  for (size_t i = 0; i < ranks->size(); ++i) {
    const RankSteps &a = (*ranks)[i], &b = (*again)[i];
    TROUPE_CHECK(a.rank == b.rank && a.stage == b.stage && a.steps.size() == b.steps.size(),
                 "a rank's steps do not read back to themselves");
    for (size_t k = 0; k < a.steps.size(); ++k) {
      TROUPE_CHECK(a.steps[k].iteration == b.steps[k].iteration && a.steps[k].spans.size() == b.steps[k].spans.size(),
                   "a step does not read back to itself");
      for (size_t s = 0; s < a.steps[k].spans.size(); ++s)
        TROUPE_CHECK(a.steps[k].spans[s].kind == b.steps[k].spans[s].kind &&
                         a.steps[k].spans[s].dur_us == b.steps[k].spans[s].dur_us,
                     "a span does not read back to itself");
    }
  }
  sched::ScheduleSpec spec;
  spec.stages = 2;
  spec.micro_batches = 2;
  const sched::Schedule sc = sched::make_schedule(spec).value();
  const StagesReport report = stage_figures(ranks.value(), sc, false, 8);
  for (const RankFigures& r : report.ranks)
    TROUPE_CHECK(!(r.busy < 0) && !(r.bubble > 1) && (r.steps.empty() || std::abs(r.busy + r.idle - 1) < 1e-9),
                 "busy and idle of a rank do not add up to its steps");
  (void)stages_json(report, sc, false, ranks.value(), 8);
  return Status::ok();
}

}  // namespace troupe::fuzz
