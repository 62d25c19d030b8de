// The rows of apps/cli/megatron_table.hpp whose decision depends on values or on other flags: the
// layout sizes at 1 and above, a dense model's mixture-of-experts flags (accepted with a note),
// --reset-iteration with and without a checkpoint, --split as Megatron-LM reads it, the tokenizer
// flags (NullTokenizer, HFTokenizer, --vocab-size), --apply-layernorm-1p by precision, and the
// nearest-spelling hint that never offers a flag's opposite.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "apps/cli/megatron_compat.hpp"
#include "apps/cli/train_options.hpp"
#include "tests/test_util.hpp"
#include "troupe/flags.hpp"

namespace troupe {
namespace {

using Catch::Contains;

std::vector<std::string> base(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--num-layers",          "2",
                                "--hidden-size",         "48",
                                "--num-attention-heads", "4",
                                "--seq-length",          "16",
                                "--micro-batch-size",    "2",
                                "--train-iters",         "5",
                                "--mock-data",           "--tokenizer-type",
                                "ByteLevelTokenizer"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::string problems(const std::vector<std::string>& args) {
  auto s = parse_train_flags(args);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.status().is_bad_input());
  return s.status().message();
}

bool has_note(const std::vector<std::string>& notes, const std::string& start) {
  return std::any_of(notes.begin(), notes.end(), [&](const std::string& n) { return n.rfind(start, 0) == 0; });
}

TEST_CASE("values: layout sizes of 1 are no-ops, larger ones are refused naming the issue", "[compat]") {
  std::vector<std::string> notes;
  auto ones = parse_train_flags(base({"--context-parallel-size", "1", "--cp-comm-type", "p2p",
                                      "--ds-sequence-parallel-size", "1", "--expert-model-parallel-size", "1",
                                      "--expert-tensor-parallel-size", "1"}),
                                1, &notes);
  REQUIRE(ones.is_ok());
  for (const char* f : {"--expert-model-parallel-size 1: no effect", "--expert-tensor-parallel-size 1: no effect"})
    CHECK(has_note(notes, f));
  // Context parallelism and Ulysses are troupe's own (tests/apps/test_context_parallel_flags.cpp).
  auto cp = parse_train_flags(base({"--context-parallel-size", "2", "--cp-comm-type", "all_gather"}));
  REQUIRE(cp.is_ok());
  CHECK(cp.value().context_parallel_size == 2);
  CHECK(cp.value().cp_comm_type == "all_gather");
  auto sp = parse_train_flags(base({"--ds-sequence-parallel-size", "4"}));
  REQUIRE(sp.is_ok());
  CHECK(sp.value().ds_sequence_parallel_size == 4);
  // FPDT is not: the flag is refused, --ds-sequence-parallel-size alone named as what runs.
  CHECK_THAT(problems(base({"--ds-sequence-parallel-size", "2", "--ds-sequence-parallel-fpdt"})),
             Contains("--ds-sequence-parallel-fpdt: FPDT (DeepSpeed's chunked, offloaded Ulysses) is not in troupe"));
  // Expert parallelism without experts: Megatron-LM asserts the same.
  const std::string ep = problems(base({"--expert-model-parallel-size", "8"}));
  CHECK_THAT(ep, Contains("--expert-model-parallel-size 8 splits experts over ranks, but the model has none"));
}

// Megatron-DeepSpeed's dense scripts (MoE/ds_pretrain_gpt_1.3B_dense.sh and others) pass
// --num-experts 1 with the whole DeepSpeed-MoE flag set: its transformer builds the dense MLP then.
// (Real experts: tests/apps/test_moe_flags.cpp.)
TEST_CASE("values: a dense model's MoE flags are no-ops", "[compat]") {
  const std::vector<std::string> moe_set = {"--moe-expert-parallel-size",
                                            "1",
                                            "--moe-loss-coeff",
                                            "0.01",
                                            "--moe-train-capacity-factor",
                                            "1.0",
                                            "--moe-eval-capacity-factor",
                                            "1.0",
                                            "--moe-min-capacity",
                                            "4",
                                            "--create-moe-param-group",
                                            "--mlp-type",
                                            "standard",
                                            "--topk",
                                            "1"};
  std::vector<std::string> dense = {"--num-experts", "1"};
  dense.insert(dense.end(), moe_set.begin(), moe_set.end());
  std::vector<std::string> notes;
  auto ok = parse_train_flags(base(dense), 1, &notes);
  REQUIRE(ok.is_ok());
  CHECK_FALSE(ok.value().model.moe.enabled());
  CHECK(has_note(notes, "--num-experts 1: no effect"));
  CHECK(has_note(notes, "--moe-loss-coeff 0.01: no effect"));
  CHECK(has_note(notes, "--moe-expert-parallel-size 1: no effect"));
  CHECK(has_note(notes, "--moe-min-capacity 4: no effect"));
  CHECK(has_note(notes, "--create-moe-param-group: no effect"));
  // A list of one expert per MoE layer (Megatron-DeepSpeed's nargs='+') is dense too.
  REQUIRE(parse_train_flags(base({"--num-experts", "1", "1", "--moe-loss-coeff", "0.1"})).is_ok());
  // Without --num-experts, Megatron-DeepSpeed's default is [1].
  REQUIRE(parse_train_flags(base({"--moe-loss-coeff", "0.1", "--moe-min-capacity", "4"})).is_ok());
  // Megatron-LM's dispatch and kernel flags change nothing, with or without experts.
  notes.clear();
  REQUIRE(parse_train_flags(base({"--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall"}), 1, &notes).is_ok());
  CHECK(has_note(notes, "--moe-grouped-gemm: no effect"));
  CHECK(has_note(notes, "--moe-token-dispatcher-type alltoall: no effect"));
}

TEST_CASE("values: --reset-iteration with nothing to load is a no-op; with a checkpoint it is refused", "[compat]") {
  test::TempDir dir;
  std::vector<std::string> notes;
  auto fresh =
      parse_train_flags(base({"--load", dir.str("none"), "--reset-iteration", "--no-load-lr-state"}), 1, &notes);
  REQUIRE(fresh.is_ok());
  CHECK(has_note(notes, "--reset-iteration: no effect"));
  CHECK(has_note(notes,
                 "--no-load-lr-state: no effect -- defined in Megatron-DeepSpeed's arguments.py but read nowhere"));
  std::filesystem::create_directories(dir.str("ck"));
  std::ofstream(dir.str("ck/latest_checkpointed_iteration.txt")) << "5";
  const std::string m = problems(base({"--load", dir.str("ck"), "--reset-iteration"}));
  CHECK_THAT(m, Contains("--reset-iteration: restarting the iteration and data position of a loaded checkpoint"));
}

// detxoify_lm's scripts pass --data-path2 ${DATA_BLEND} with DATA_BLEND never set.
TEST_CASE("values: --data-path2 without a value is a no-op, with one refused", "[compat]") {
  std::vector<std::string> notes;
  REQUIRE(parse_train_flags(base({"--data-path2", "--seed", "3"}), 1, &notes).is_ok());
  CHECK(has_note(notes, "--data-path2: no effect"));
  CHECK_THAT(problems(base({"--data-path2", "0.5", "a", "0.5", "b"})),
             Contains("--data-path2 0.5 a 0.5 b: finetune_gpt.py's second validation blend"));
}

TEST_CASE("values: no-ops for their default values, refused for others", "[compat]") {
  std::vector<std::string> notes;
  auto ok = parse_train_flags(
      base({"--softmax-type", "vanilla", "--glu-linear-offset", "0.0", "--rope-type", "rope", "--exp-avg-dtype", "fp32",
            "--optimizer-offload-fraction", "1.0", "--null-tokenizer-pad-id", "-1", "--weight-decay-incr-style",
            "constant", "--activations-checkpoint-method", "uniform"}),
      1, &notes);
  REQUIRE(ok.is_ok());
  CHECK(has_note(notes,
                 "--activations-checkpoint-method uniform: no effect -- Megatron's 2021 name of --recompute-method"));
  const std::string m = problems(base({"--softmax-type", "learnable", "--rope-type", "yarn", "--exp-avg-dtype", "bf16",
                                       "--optimizer-offload-fraction", "0.5", "--activations-checkpoint-method", "x"}));
  INFO(m);
  CHECK_THAT(m, Contains("--softmax-type learnable: attention with an off-by-one or learnable softmax"));
  CHECK_THAT(m, Contains("--rope-type yarn: YaRN rotary scaling is not in troupe"));
  CHECK_THAT(
      m, Contains("--exp-avg-dtype bf16: troupe keeps the master weights, main gradients and Adam moments in fp32"));
  CHECK_THAT(m, Contains("--optimizer-offload-fraction 0.5: a partial optimizer offload"));
  CHECK_THAT(m, Contains("--activations-checkpoint-method x: Megatron knew uniform and block"));
  CHECK_THAT(m, Contains("5 problems with the flags"));
}

// The flags of one refused row come in one problem; the features are named.
TEST_CASE("values: refused features name themselves, one problem per row", "[compat]") {
  const std::string m = problems(
      base({"--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--kd", "--kd-beta-ce", "1", "--load-teacher",
            "t", "--qk-layernorm", "--decoupled-lr", "5e-4", "--decoupled-min-lr", "4.5e-5", "--random-ltd"}));
  INFO(m);
  CHECK_THAT(m, Contains("--fp8-format hybrid, --fp8-amax-history-len 1024: FP8 and FP4 training"));
  CHECK_THAT(m, Contains("--kd, --kd-beta-ce 1, --load-teacher t: knowledge distillation from a teacher model"));
  CHECK_THAT(m, Contains("--qk-layernorm: query/key normalisation"));
  CHECK_THAT(m, Contains("--decoupled-lr 5e-4, --decoupled-min-lr 4.5e-5: a separate learning rate"));
  CHECK_THAT(m, Contains("--random-ltd: random layer-token drop"));
  CHECK_THAT(m, Contains("5 problems with the flags"));
}

TEST_CASE("values: plain no-ops of the real scripts", "[compat]") {
  std::vector<std::string> notes;
  auto ok = parse_train_flags(base({"--calculate-per-token-loss",
                                    "--no-check-for-nan-in-loss-and-grad",
                                    "--cross-entropy-loss-fusion",
                                    "--logging-level",
                                    "40",
                                    "--init-model-with-meta-device",
                                    "--data-cache-path",
                                    "cache",
                                    "--no-create-attention-mask-in-dataloader",
                                    "--no-mmap-bin-files",
                                    "--ckpt-format",
                                    "torch_dist",
                                    "--auto-detect-ckpt-format",
                                    "--universal-checkpoint",
                                    "--repeated-dataloader",
                                    "--recompute-modules",
                                    "mlp",
                                    "moe",
                                    "layernorm",
                                    "--cross-entropy-fusion-impl",
                                    "te",
                                    "--manual-gc-interval",
                                    "10"}),
                              1, &notes);
  REQUIRE(ok.is_ok());
  CHECK(has_note(notes, "--calculate-per-token-loss: no effect -- the loss is the sum over the global batch's tokens"));
  CHECK(has_note(notes,
                 "--no-check-for-nan-in-loss-and-grad: no effect -- Megatron would train on past a NaN; troupe "
                 "still stops"));
  CHECK(has_note(notes, "--recompute-modules mlp moe layernorm: no effect"));
  CHECK(has_note(notes, "--universal-checkpoint: no effect"));
}

TEST_CASE("values: the nearest-spelling hint never offers a flag's opposite", "[compat]") {
  // Unknown flags one negation away from a flag troupe has (the report's --no-check-for-nan case).
  const std::string a = problems(base({"--no-override-opt-param-scheduler"}));
  CHECK_THAT(a, Contains("--no-override-opt-param-scheduler: not a flag of troupe train"));
  CHECK_THAT(a, !Contains("did you mean --override-opt-param-scheduler"));
  const std::string b = problems(base({"--enable-log-loss-scale-to-tensorboard"}));
  CHECK_THAT(b, !Contains("--disable-log-loss-scale-to-tensorboard"));
  // A plain misspelling still gets its hint.
  CHECK_THAT(problems(base({"--overide-opt-param-scheduler"})),
             Contains("did you mean --override-opt-param-scheduler"));
}

TEST_CASE("values: --tokenizer-type NullTokenizer takes its vocabulary from --vocab-size", "[compat]") {
  std::vector<std::string> args = base({"--tokenizer-type", "NullTokenizer", "--vocab-size", "500"});
  auto ok = parse_train_flags(args);
  REQUIRE(ok.is_ok());
  CHECK(ok.value().tokenizer_type == "NullTokenizer");
  CHECK(ok.value().tokenizer_model == "500");
  CHECK_THAT(problems(base({"--tokenizer-type", "NullTokenizer"})), Contains("NullTokenizer needs --vocab-size N"));
  CHECK_THAT(problems(base({"--tokenizer-type", "NullTokenizer", "--vocab-size", "ten"})),
             Contains("--vocab-size ten is not a vocabulary size"));
  // Other tokenizers take the size from their files, as Megatron does: a note.
  std::vector<std::string> notes;
  REQUIRE(parse_train_flags(base({"--vocab-size", "128256"}), 1, &notes).is_ok());
  CHECK(has_note(notes, "--vocab-size 128256: no effect -- Megatron reads it for NullTokenizer only"));
}

TEST_CASE("values: --apply-layernorm-1p trains the same in float32 and is refused in 16 bits", "[compat]") {
  std::vector<std::string> notes;
  REQUIRE(parse_train_flags(base({"--apply-layernorm-1p"}), 1, &notes).is_ok());
  CHECK(has_note(notes, "--apply-layernorm-1p: no effect -- Megatron stores the norm weights as gamma - 1"));
  auto bf16 = parse_train_flags(base({"--apply-layernorm-1p", "--bf16"}));
  REQUIRE_FALSE(bf16.is_ok());
  CHECK_THAT(bf16.status().message(), Contains("--apply-layernorm-1p with a 16-bit run"));
}

}  // namespace
}  // namespace troupe
