// The DeepSpeed JSON reader on hostile numbers: each is a message naming the file, the key path and
// the allowed range (issue 10: 1e400 ended in std::terminate, exit 134), never an exception, a
// narrowed value or a signed overflow.
#include <fstream>
#include <string>

#include "config/deepspeed_config.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

using Catch::Contains;

struct Merged {
  Status status;
  TrainConfig config;
};

Merged merge(const std::string& text, int dp = 1) {
  test::TempDir dir;
  const std::string file = dir.str("ds.json");
  std::ofstream(file) << text;
  Merged m;
  FlagOrigins origins;
  bool global = false;
  m.status = merge_deepspeed_config(
      file, dp, [](const char*) { return false; }, &m.config, &origins, &global);
  if (!m.status.is_ok()) {
    CHECK_THAT(m.status.message(), Contains(file) && Contains(" -- "));
    CHECK(m.status.is_bad_input());  // exit 2
  }
  return m;
}

TEST_CASE("deepspeed config: out-of-range numbers name the key and the range", "[deepspeed]") {
  CHECK_THAT(
      merge(R"({"train_batch_size": 8, "gradient_clipping": 1e400})").status.message(),
      Contains("key \"gradient_clipping\"") && Contains("1e400") && Contains("range of a double"));
  CHECK_THAT(merge(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1e999]}}})")
                 .status.message(),
             Contains("key \"optimizer.params.betas[1]\""));
  // Integers: 1e19 does not fit int64, 2^32 + 7 does not fit the int flags, -1 is not a size.
  CHECK_THAT(merge(R"({"train_batch_size": 10000000000000000000})").status.message(),
             Contains("\"train_batch_size\" must be an integer in [1, 2147483647]") &&
                 Contains("got 10000000000000000000"));
  CHECK_THAT(merge(R"({"train_micro_batch_size_per_gpu": 4294967303})").status.message(),
             Contains("\"train_micro_batch_size_per_gpu\" must be an integer in [1, 2147483647]"));
  CHECK_THAT(merge(R"({"gradient_accumulation_steps": -1})").status.message(),
             Contains("\"gradient_accumulation_steps\" must be positive, got -1") &&
                 Contains("[1, 2147483647]"));
  CHECK_THAT(merge(R"({"zero_optimization": {"stage": 18446744073709551615}})").status.message(),
             Contains("\"zero_optimization.stage\" must be an integer in"));
  CHECK_THAT(merge(R"({"steps_per_print": 0})").status.message(),
             Contains("\"steps_per_print\" must be positive"));
  CHECK_THAT(merge(R"({"zero_optimization": {"offload_optimizer": {"buffer_count": 1e400}}})")
                 .status.message(),
             Contains("zero_optimization.offload_optimizer.buffer_count"));
  CHECK_THAT(merge(std::string(5000, '{')).status.message(), Contains("nested deeper than"));
}

TEST_CASE("deepspeed config: the batch rule cannot overflow", "[deepspeed]") {
  // micro * gas * dp = (2^31 - 1)^2 * 3 overflows int64: a mismatch message, not wrapped
  // arithmetic.
  const auto m = merge(R"({"train_batch_size": 2147483647,
                           "train_micro_batch_size_per_gpu": 2147483647,
                           "gradient_accumulation_steps": 2147483647})",
                       3);
  CHECK_THAT(m.status.message(), Contains("is 2147483647, but train_micro_batch_size_per_gpu") &&
                                     Contains("= more than 2^63"));
  // The global batch a large gradient_accumulation_steps implies does not fit the int flag.
  const auto g = merge(R"({"train_micro_batch_size_per_gpu": 2147483647,
                           "gradient_accumulation_steps": 2147483647})",
                       2);
  CHECK_THAT(g.status.message(), Contains("overflows the global batch size"));
  // Within range the rule still applies exactly.
  const auto ok = merge(R"({"train_batch_size": 24, "gradient_accumulation_steps": 3})", 2);
  REQUIRE(ok.status.is_ok());
  CHECK(ok.config.micro_batch_size == 4);
  CHECK(ok.config.global_batch_size == 24);
}

}  // namespace
}  // namespace troupe
