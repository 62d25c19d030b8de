// The long-sequence flags as troupe train reads them (--context-parallel-size, --cp-comm-type,
// --ds-sequence-parallel-size): the sizes they set, the world size they take part in, and every bad
// combination refused at once, before anything runs, each with its fix.
#include <catch2/catch.hpp>

#include "troupe/flags.hpp"

namespace troupe {
namespace {

using Catch::Contains;

std::vector<std::string> base(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--num-layers",          "2",
                                "--hidden-size",         "48",
                                "--num-attention-heads", "4",
                                "--seq-length",          "24",
                                "--micro-batch-size",    "2",
                                "--train-iters",         "5",
                                "--mock-data",           "--tokenizer-type",
                                "ByteLevelTokenizer"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::string problems(const std::vector<std::string>& args, int world = 1) {
  auto s = parse_train_flags(args, world);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.status().is_bad_input());
  return s.status().message();
}

}  // namespace

TEST_CASE("cp flags: the sizes and the ring's type; the ranks are tp x cp x pp x dp", "[compat][cp]") {
  auto one = parse_train_flags(base({"--context-parallel-size", "4"}));
  INFO((one.is_ok() ? "" : one.status().message()));
  REQUIRE(one.is_ok());
  CHECK(one.value().context_parallel_size == 4);
  CHECK(one.value().cp_comm_type == "p2p");  // Megatron's default
  CHECK(one.value().resolved_dp(1) == 1);
  // Under troupe launch the data-parallel size is what the other sizes leave: 16 / (2 x 4 x 1).
  auto launched =
      parse_train_flags(base({"--context-parallel-size", "4", "--tensor-model-parallel-size", "2",
                              "--cp-comm-type", "all_gather", "all_gather", "--global-batch-size", "4"}),
                        16);
  INFO((launched.is_ok() ? "" : launched.status().message()));
  REQUIRE(launched.is_ok());
  CHECK(launched.value().resolved_dp(16) == 2);
  CHECK(launched.value().cp_comm_type == "all_gather");
}

TEST_CASE("Ulysses flags: the size, the ranks, and what the all-to-all needs", "[compat][cp]") {
  auto u = parse_train_flags(base({"--ds-sequence-parallel-size", "2", "--tensor-model-parallel-size", "2",
                                   "--pipeline-model-parallel-size", "2", "--global-batch-size", "4"}),
                             16);
  INFO((u.is_ok() ? "" : u.status().message()));
  REQUIRE(u.is_ok());
  CHECK(u.value().ds_sequence_parallel_size == 2);
  CHECK(u.value().sequence_ranks() == 2);
  CHECK(u.value().resolved_dp(16) == 2);  // 16 / (tp 2 x pp 2 x Ulysses 2)
  // Heads per tensor-parallel rank (4 / 2 = 2) not divisible by 4; a sequence 4 does not divide (26);
  // both ways at once; and with cp's all-to-all, the key/value groups.
  const std::string all = problems(base({"--ds-sequence-parallel-size", "4", "--tensor-model-parallel-size", "2",
                                         "--seq-length", "26", "--context-parallel-size", "2"}));
  CHECK_THAT(all, Contains("--ds-sequence-parallel-size 4 with --context-parallel-size 2: troupe splits a sequence one "
                           "way at a time"));
  const std::string heads =
      problems(base({"--ds-sequence-parallel-size", "4", "--tensor-model-parallel-size", "2", "--seq-length", "26"}));
  CHECK_THAT(heads, Contains("--seq-length 26 is not divisible by --ds-sequence-parallel-size 4 -- each Ulysses rank "
                             "holds an equal, contiguous part of every sequence: use a multiple of 4, or "
                             "--ds-sequence-parallel-size 2, 13 or 26"));
  CHECK_THAT(heads, Contains("--ds-sequence-parallel-size 4 does not divide the 2 attention heads of each "
                             "tensor-parallel rank (4 / --tensor-model-parallel-size 2)"));
  CHECK_THAT(problems(base({"--context-parallel-size", "2", "--cp-comm-type", "a2a", "--group-query-attention",
                            "--num-query-groups", "1"})),
             Contains("--context-parallel-size 2 does not divide the 1 key/value groups of each tensor-parallel rank"));
  auto a2a = parse_train_flags(base({"--context-parallel-size", "2", "--cp-comm-type", "a2a"}));
  REQUIRE(a2a.is_ok());
  CHECK(a2a.value().cp_comm_type == "a2a");
}

TEST_CASE("cp flags: every problem at once, each with its fix", "[compat][cp]") {
  // Sequence 24 over cp 5: not 10 equal chunks; the GPU; a type troupe does not know. MoE layers are
  // no problem for context parallelism (only for the GPU).
  const std::string all = problems(base({"--context-parallel-size", "5", "--num-experts", "4", "--device", "cuda",
                                         "--cp-comm-type", "ring"}));
  CHECK_THAT(all, Contains("--seq-length 24 is not divisible by 2 x --context-parallel-size 5 = 10"));
  CHECK_THAT(all, Contains("use a multiple of 10, or --context-parallel-size 2, 3, 4, 6 or 12"));
  CHECK_THAT(all, !Contains("--context-parallel-size 5 with MoE"));
  CHECK_THAT(all, Contains("--context-parallel-size 5 runs on the CPU only so far"));
  CHECK_THAT(all, Contains("--cp-comm-type is \"ring\" -- use p2p"));
  // One type per layer.
  CHECK_THAT(problems(base({"--context-parallel-size", "2", "--cp-comm-type", "p2p", "all_gather"})),
             Contains("gives p2p and all_gather for different layers"));
  CHECK_THAT(problems(base({"--context-parallel-size", "0"})),
             Contains("--context-parallel-size must be positive, got 0"));
  // A world the sizes do not divide: 6 ranks for tp 2 x cp 4.
  CHECK_THAT(problems(base({"--context-parallel-size", "4", "--tensor-model-parallel-size", "2"}), 6),
             Contains("--tensor-model-parallel-size 2 x --pipeline-model-parallel-size 1 x --context-parallel-size 4 "
                      "x data-parallel 1 (derived from the ranks) = 8 ranks, but troupe launch started 6"));
  // Sequence parallelism with fewer tokens per cp rank than tensor-parallel ranks: 1 x 24/12 = 2 < 4.
  CHECK_THAT(problems(base({"--context-parallel-size", "12", "--tensor-model-parallel-size", "4",
                            "--sequence-parallel", "--micro-batch-size", "1"})),
             Contains("--sequence-parallel splits a context-parallel rank's 2 tokens of a micro-batch over "
                      "--tensor-model-parallel-size 4 ranks"));
}

}  // namespace troupe
