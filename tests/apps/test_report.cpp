// What `troupe train` prints and writes per iteration (apps/report.hpp): Megatron's progress line
// and the --metrics-file JSON. A dense model's are what they were; an MoE model's line adds
// Megatron-DeepSpeed's "moe loss" right after "lm loss" (averaged over the logged iterations like
// the lm loss), and its JSON the moe loss and each MoE layer's load.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "apps/report.hpp"

using namespace troupe;
using namespace troupe::apps;

namespace {

IterationStats iteration(int64_t i, double loss, double moe_loss, bool moe) {
  IterationStats s;
  s.iteration = i;
  s.train_iters = 10;
  s.consumed_samples = 4 * i;
  s.ms_per_iter = 10;
  s.lr = 1e-3;
  s.global_batch_size = 4;
  s.lm_loss = loss;
  s.grad_norm = 0.5;
  s.tokens_per_sec = 100;
  if (moe) {
    s.moe_loss = moe_loss;
    s.moe = {MoeLayerLoad{1, 4, {20, 4, 8}, {16, 4, 8}, 4, 1.5, 2.5}};
  }
  return s;
}

}  // namespace

TEST_CASE("report: a dense model's line and JSON have no MoE fields", "[apps][report]") {
  const IterationStats s = iteration(3, 5.0, 0, false);
  const std::string line = format_iteration(s);
  CHECK_THAT(line, Catch::Contains("| lm loss: 5.000000E+00 | loss scale: 1.0 | grad norm: 0.500 |"));
  CHECK_THAT(line, !Catch::Contains("moe"));
  const auto j = nlohmann::json::parse(iteration_json(s));
  CHECK_FALSE(j.contains("moe"));
  CHECK_FALSE(j.contains("moe_loss"));
}

TEST_CASE("report: an MoE model's line shows the moe loss after the lm loss, averaged like it", "[apps][report][moe]") {
  const IterationStats s = iteration(3, 5.0, 0.0125, true);
  CHECK_THAT(format_iteration(s),
             Catch::Contains("| lm loss: 5.000000E+00 | moe loss: 1.250000E-02 | loss scale: 1.0 | grad norm: 0.500 |"));
  IntervalAverage avg;
  avg.add(iteration(1, 5.0, 0.01, true));
  IterationStats skipped = iteration(2, 9.0, 0.5, true);
  skipped.skipped = true;  // as the lm loss: a skipped iteration does not count
  avg.add(skipped);
  avg.add(iteration(3, 4.0, 0.02, true));
  const IterationStats mean = avg.mean();
  CHECK(mean.lm_loss == Approx(4.5));
  CHECK(mean.moe_loss == Approx(0.015));
  CHECK(mean.moe.size() == 1);  // the loads are the last iteration's
  CHECK_THAT(format_iteration(mean, avg.skipped(), avg.nan()),
             Catch::Contains("| lm loss: 4.500000E+00 | moe loss: 1.500000E-02 | loss scale: 1.0 |"));
}

TEST_CASE("report: an MoE model's JSON line has the moe loss and each layer's load", "[apps][report][moe]") {
  const auto j = nlohmann::json::parse(iteration_json(iteration(3, 5.0, 0.0125, true)));
  CHECK(j["moe_loss"] == 0.0125);
  REQUIRE(j["moe"].size() == 1);
  CHECK(j["moe"][0] == nlohmann::json::parse(R"({"layer": 1, "micro_batches": 4, "routed": [20, 4, 8],
      "kept": [16, 4, 8], "dropped": 4, "lb_loss": 1.5, "z_loss": 2.5})"));
}
