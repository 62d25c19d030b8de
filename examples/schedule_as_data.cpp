// A pipeline schedule given as data: per stage, the ordered list of forward and backward actions.
// troupe checks it for completeness and deadlock before anything runs, then every rank executes
// its stage's list. Here: GPipe written by hand (all forwards, then the backwards in reverse), equal
// to the generated 1F1B run; then two broken schedules, refused with the reason.
#include <memory>

#include "example_util.hpp"

namespace {

using troupe::sched::Action;
using troupe::sched::Kind;

// p stages, m micro-batches: forwards 0..m-1, then backwards m-1..0, on every stage.
troupe::sched::Schedule hand_written_gpipe(int p, int m) {
  troupe::sched::Schedule s;
  s.spec.type = troupe::sched::ScheduleType::gpipe;
  s.spec.stages = p;
  s.spec.micro_batches = m;
  s.stages.resize(p);
  for (auto& stage : s.stages) {
    for (int i = 0; i < m; ++i) stage.push_back(Action{Kind::forward, i, 0});
    for (int i = m - 1; i >= 0; --i) stage.push_back(Action{Kind::backward, i, 0});
  }
  return s;
}

}  // namespace

int main() {
  using namespace example;
  troupe::TrainConfig cfg = with_mock_data(small_gpt(4));
  cfg.pipeline_model_parallel_size = 2;  // 8 / 2 = 4 micro-batches per iteration
  const std::vector<double> generated = losses_of(cfg);

  auto mine = std::make_shared<troupe::sched::Schedule>(hand_written_gpipe(2, 4));
  check(troupe::sched::validate(*mine).is_ok(), "the hand-written schedule is complete and deadlock-free");
  std::printf("%s", mine->to_string().c_str());
  troupe::RunOptions options;
  options.schedule = mine;
  check(same_losses(generated, losses_of(cfg, nullptr, options)),
        "it trains to the generated 1F1B schedule's losses within 1e-5");

  // Broken: stage 1 waits for the gradient of micro-batch 0 before it has run its forward.
  auto deadlock = std::make_shared<troupe::sched::Schedule>(hand_written_gpipe(2, 4));
  std::swap(deadlock->stages[1][0], deadlock->stages[1][7]);
  options.schedule = deadlock;
  options.measure_peak = false;
  auto refused = troupe::train(cfg, nullptr, {}, options);
  check(!refused && refused.status().is_bad_input(), "a deadlocking schedule is refused: " + refused.status().message());

  // Broken: micro-batch 3 never runs backward on stage 0.
  auto incomplete = std::make_shared<troupe::sched::Schedule>(hand_written_gpipe(2, 4));
  incomplete->stages[0].erase(incomplete->stages[0].begin() + 4);
  options.schedule = incomplete;
  refused = troupe::train(cfg, nullptr, {}, options);
  check(!refused && refused.status().is_bad_input(), "an incomplete schedule is refused: " + refused.status().message());

  // Built for another job: 3 stages where the job has 2.
  options.schedule = std::make_shared<troupe::sched::Schedule>(hand_written_gpipe(3, 4));
  refused = troupe::train(cfg, nullptr, {}, options);
  check(!refused && refused.status().is_bad_input(), "a schedule of another shape is refused: " + refused.status().message());
  return 0;
}
