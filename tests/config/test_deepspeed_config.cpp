// The DeepSpeed JSON reader on hostile numbers: each is a message naming the file, the key path and
// the allowed range (issue 10: 1e400 ended in std::terminate, exit 134), never an exception, a
// narrowed value or a signed overflow.
#include <algorithm>
#include <fstream>
#include <string>

#include "config/deepspeed_config.hpp"
#include "config/deepspeed_keys.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

using Catch::Contains;

struct Merged {
  Status status;
  TrainConfig config;
  std::vector<std::string> notes;
};

Merged merge(const std::string& text, int dp = 1) {
  test::TempDir dir;
  const std::string file = dir.str("ds.json");
  std::ofstream(file) << text;
  Merged m;
  FlagOrigins origins;
  bool global = false;
  m.status = merge_deepspeed_config(
      file, dp, [](const char*) { return false; }, &m.config, &origins, &global, &m.notes);
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

namespace troupe {
namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("deepspeed config: every problem of the file at once, unknown keys with their nearest spelling",
          "[deepspeed]") {
  // Five problems in four blocks: two misspelt keys, a wrong type, a gradient accumulation type troupe
  // lacks, a ZeRO++ switch that would change the results.
  const Merged m = merge(R"({
    "train_batch_sise": 8,
    "zero_optimization": {"stage": 2, "overlap_com": true, "zero_quantized_gradients": true},
    "gradient_clipping": "one",
    "data_types": {"grad_accum_dtype": "bf16"}
  })");
  REQUIRE_FALSE(m.status.is_ok());
  const std::string& text = m.status.message();
  CHECK_THAT(text, Contains("has 5 problems:"));
  CHECK(count_of(text, "\n  - ") == 5);
  CHECK_THAT(text, Contains("\"train_batch_sise\" is not a key") && Contains("did you mean \"train_batch_size\"?"));
  CHECK_THAT(text, Contains("\"zero_optimization.overlap_com\"") && Contains("did you mean \"overlap_comm\"?"));
  CHECK_THAT(text, Contains("\"zero_optimization.zero_quantized_gradients\" is true"));
  CHECK_THAT(text, Contains("\"gradient_clipping\" must be a number"));
  CHECK_THAT(text, Contains("\"data_types.grad_accum_dtype\" is \"bf16\""));
  // A key near nothing lists what is accepted there instead.
  CHECK_THAT(merge(R"({"zzzzzzzzzzzzzzzz": 1})").status.message(), Contains("accepted keys at the top level"));
}

TEST_CASE("deepspeed config: keys that change nothing are accepted with one note each", "[deepspeed]") {
  // Megatron-DeepSpeed's examples_deepspeed/rebase/ds_config_gbs256_mbs8_log1_zero1.json with fp16
  // off, and the tuning knobs of its ZeRO-3 examples.
  const Merged m = merge(R"({
    "train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "steps_per_print": 1,
    "zero_optimization": {"stage": 1, "overlap_comm": true, "contiguous_gradients": true,
                          "reduce_bucket_size": 5e8, "sub_group_size": 1e9, "elastic_checkpoint": false,
                          "zero_quantized_weights": false, "mics_shard_size": -1},
    "gradient_clipping": 1.0, "prescale_gradients": false, "zero_allow_untested_optimizer": true,
    "fp16": {"enabled": false, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2,
             "min_loss_scale": 1, "initial_scale_power": 11},
    "flops_profiler": {"enabled": true, "profile_step": 1},
    "tensorboard": {"enabled": false},
    "wall_clock_breakdown": false
  })", 2);
  REQUIRE(m.status.is_ok());
  CHECK(m.config.zero_stage == 1);
  CHECK(m.config.global_batch_size == 16);
  CHECK(m.config.micro_batch_size == 8);
  // One note per accepted key that does nothing: 7 in zero_optimization, 2 top-level switches, 5
  // fp16 settings, the profiler, the switched-off monitor.
  CHECK(m.notes.size() == 7 + 2 + 5 + 1 + 1);
  for (const std::string& n : m.notes) CHECK_THAT(n, Contains(" in ") && Contains(": "));
  auto has = [&](const std::string& what) {
    return std::any_of(m.notes.begin(), m.notes.end(), [&](const std::string& n) { return n.find(what) != std::string::npos; });
  };
  CHECK(has("\"prescale_gradients\""));
  CHECK(has("\"zero_optimization.sub_group_size\""));
  CHECK(has("\"fp16.hysteresis\""));
  CHECK(has("\"tensorboard\""));
  // The same keys with values that would change the results are refused.
  CHECK_THAT(merge(R"({"zero_optimization": {"mics_shard_size": 8}})").status.message(), Contains("MiCS"));
  CHECK_THAT(merge(R"({"communication_data_type": "fp16"})").status.message(), Contains("float32"));
  CHECK_THAT(merge(R"({"curriculum_learning": {"enabled": true}})").status.message(),
             Contains("\"curriculum_learning.enabled\" is true") && Contains("legacy curriculum learning") &&
                 Contains("fixed_linear, fixed_root or fixed_discrete") && Contains("\"enabled\": false"));
  CHECK_THAT(merge(R"({"zero_optimization": {"reduce_bucket_size": -5}})").status.message(),
             Contains("must be a number of elements"));
}

TEST_CASE("deepspeed config: \"auto\" leaves the value of the flags, with a note", "[deepspeed]") {
  // Hugging Face's Trainer-style file: every value "auto".
  const Merged m = merge(R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                       "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}
  })");
  REQUIRE(m.status.is_ok());
  const TrainConfig defaults;
  CHECK(m.config.zero_stage == 2);
  CHECK(m.config.micro_batch_size == defaults.micro_batch_size);
  CHECK(m.config.global_batch_size == defaults.global_batch_size);
  CHECK(m.config.clip_grad == defaults.clip_grad);
  // Not FusedAdam's defaults (lr 1e-3, weight decay 0) nor WarmupDecayLR's (max lr 1e-3, 1000 steps).
  CHECK(m.config.lr == defaults.lr);
  CHECK(m.config.weight_decay == defaults.weight_decay);
  CHECK(m.config.adam_beta2 == defaults.adam_beta2);
  CHECK(m.config.adam_eps == defaults.adam_eps);
  CHECK(m.config.lr_warmup_iters == defaults.lr_warmup_iters);
  CHECK(m.config.lr_decay_iters == defaults.lr_decay_iters);
  CHECK(m.config.lr_warmup_init == defaults.lr_warmup_init);
  CHECK(m.config.lr_decay_style == defaults.lr_decay_style);
  // One note per "auto" (4 top-level, 1 ZeRO knob) and one per block Megatron-DeepSpeed ignores.
  CHECK(m.notes.size() == 7);
}

// Megatron-DeepSpeed's pretrain_gpt.py hands deepspeed.initialize its own optimizer and scheduler, so
// DeepSpeed builds neither block: the flags (and Megatron's defaults) decide, as in
// curriculum_learning/ds_zero_stage_1_config_*.json, whose betas [0.9, 0.95] and max_grad_norm
// Megatron-DeepSpeed never uses.
TEST_CASE("deepspeed config: the optimizer and scheduler blocks are Megatron-DeepSpeed's to ignore", "[deepspeed]") {
  const Merged m = merge(R"({
    "train_batch_size": 8, "gradient_clipping": 0.5,
    "optimizer": {"type": "Adam", "params": {"lr": 0.00015, "max_grad_norm": 1.0, "betas": [0.9, 0.95], "eps": 1e-8}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.1, "warmup_num_steps": 100}}
  })");
  REQUIRE(m.status.is_ok());
  const TrainConfig defaults;
  CHECK(m.config.lr == defaults.lr);
  CHECK(m.config.adam_beta2 == defaults.adam_beta2);  // Megatron's 0.999, not the file's 0.95
  CHECK(m.config.weight_decay == defaults.weight_decay);
  CHECK(m.config.lr_warmup_iters == defaults.lr_warmup_iters);
  CHECK(m.config.lr_decay_style == defaults.lr_decay_style);
  CHECK(m.config.lr_warmup_style == "linear");
  CHECK(m.config.clip_grad == 0.5);  // the keys DeepSpeed honours with a client optimizer stay
  CHECK(m.config.global_batch_size == 8);
  REQUIRE(m.notes.size() == 2);
  CHECK_THAT(m.notes[0], Contains("\"optimizer\" in") &&
                             Contains("ignored (with its params betas, eps, lr, max_grad_norm)") &&
                             Contains("passes its own optimizer to deepspeed.initialize"));
  CHECK_THAT(m.notes[1], Contains("\"scheduler\" in") && Contains("learning-rate scheduler"));
  // A type or key troupe would not build is no problem either: DeepSpeed never reads them there.
  CHECK(merge(R"({"optimizer": {"type": "Lamb", "params": {"amsgrad": true}}})").status.is_ok());
  CHECK_THAT(merge(R"({"optimizer": 3})").status.message(), Contains("\"optimizer\" must be an object"));
}

TEST_CASE("deepspeed config: data_types, dataloader_drop_last and offload ratios", "[deepspeed]") {
  const Merged fp32 = merge(R"({"data_types": {"grad_accum_dtype": "fp32"}, "dataloader_drop_last": true,
                                "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.0}}})");
  REQUIRE(fp32.status.is_ok());
  CHECK(fp32.config.offload_optimizer == "cpu");
  auto has = [](const Merged& m, const std::string& what) {
    return std::any_of(m.notes.begin(), m.notes.end(),
                       [&](const std::string& n) { return n.find(what) != std::string::npos; });
  };
  CHECK(has(fp32, "\"data_types.grad_accum_dtype\" in"));
  CHECK(has(fp32, "\"dataloader_drop_last\" in"));
  // bf16 accumulation, a param_dtype other than the model's, buffers cast to 16 bits: refused.
  const Merged bad = merge(R"({"bf16": {"enabled": true},
                               "data_types": {"grad_accum_dtype": "bf16", "param_dtype": "fp16", "buffer_dtype": "bf16"}})");
  REQUIRE_FALSE(bad.status.is_ok());
  CHECK_THAT(bad.status.message(),
             Contains("has 3 problems") &&
                 Contains("\"data_types.grad_accum_dtype\" is \"bf16\": DeepSpeed would accumulate") &&
                 Contains("\"data_types.param_dtype\" is \"fp16\", but the model trains in bf16") &&
                 Contains("\"data_types.buffer_dtype\" is \"bf16\""));
  CHECK(merge(R"({"bf16": {"enabled": true}, "data_types": {"param_dtype": "bf16"}})").status.is_ok());
  CHECK_THAT(merge(R"({"data_types": {"grad_accum_dtype": "fp8"}})").status.message(),
             Contains("knows fp32, bf16 and fp16"));
  // offload_pp/ds_config: a partial offload names itself.
  const Merged partial =
      merge(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})");
  CHECK_THAT(partial.status.message(), Contains("\"zero_optimization.offload_optimizer.ratio\" is 0.3: a partial "
                                                "optimizer offload") &&
                                           Contains("70%"));
  CHECK_THAT(merge(R"({"zero_optimization": {"offload_optimizer": {"ratio": 1.5}}})").status.message(),
             Contains("from 0 to 1"));
}

// DeepSpeed's compression block has no top-level "enabled": Megatron-DeepSpeed compresses whenever it
// is there (compression/125M-Int8-test-64gpu-distilled-group48.sh's ds_config).
TEST_CASE("deepspeed config: compression_training is refused whenever present, naming its techniques", "[deepspeed]") {
  const Merged m = merge(R"({"compression_training": {
      "weight_quantization": {"shared_parameters": {"enabled": true, "quantizer_kernel": false, "schedule_offset": 50},
                              "different_groups": {"wq1": {"params": {"start_bits": 12, "target_bits": 4}}}},
      "activation_quantization": {"shared_parameters": {"enabled": true}},
      "sparse_pruning": {"shared_parameters": {"enabled": false}}}})");
  REQUIRE_FALSE(m.status.is_ok());
  CHECK_THAT(m.status.message(), Contains("\"compression_training\" is present: Megatron-DeepSpeed then trains with "
                                          "DeepSpeed's compression") &&
                                     Contains("weight_quantization (quantisation-aware training of the weights), "
                                              "activation_quantization (quantised activations))") &&
                                     Contains("remove the block"));
  CHECK_THAT(merge(R"({"compression_training": {}})").status.message(), Contains("no technique enabled in it"));
}

TEST_CASE("deepspeed config: data_efficiency with every feature off is no effect; a feature on names itself",
          "[deepspeed]") {
  // data_efficiency/gpt/pretrain's baseline setups: the block enabled, its sampling and routing off.
  const Merged off = merge(R"({"data_efficiency": {"enabled": true, "seed": 1234,
      "data_routing": {"enabled": false, "random_ltd": {"enabled": false}},
      "data_sampling": {"enabled": false, "num_workers": 0, "curriculum_learning": {"enabled": false}}}})");
  REQUIRE(off.status.is_ok());
  REQUIRE(off.notes.size() == 1);
  CHECK_THAT(off.notes[0], Contains("every feature switched off"));
  const Merged on = merge(R"({"data_efficiency": {"enabled": true,
      "data_routing": {"enabled": true, "random_ltd": {"enabled": true}},
      "data_sampling": {"enabled": true, "curriculum_learning": {"enabled": true}}}})");
  REQUIRE_FALSE(on.status.is_ok());
  CHECK_THAT(on.status.message(), Contains("has 4 problems") &&
                                      Contains("\"data_efficiency.data_sampling.curriculum_learning.enabled\" is true: "
                                               "curriculum learning by data metrics") &&
                                      Contains("\"data_efficiency.data_routing.random_ltd.enabled\" is true: random "
                                               "layer-token drop"));
}

TEST_CASE("deepspeed config: DeepSpeed's TensorBoard monitor writes to troupe's --tensorboard-dir", "[deepspeed]") {
  CHECK(merge(R"({"tensorboard": {"enabled": true, "output_path": "runs", "job_name": "gpt"}})").config.tensorboard.dir ==
        "runs/gpt");
  CHECK(merge(R"({"tensorboard": {"enabled": true}})").config.tensorboard.dir == "DeepSpeedJobName");
  CHECK(merge(R"({"tensorboard": {"enabled": false, "output_path": "runs"}})").config.tensorboard.dir.empty());
  CHECK_THAT(merge(R"({"tensorboard": {"enabled": true, "output_pth": "runs"}})").status.message(),
             Contains("did you mean \"output_path\"?"));
}

TEST_CASE("deepspeed config: wall_clock_breakdown prints every timer", "[deepspeed]") {
  CHECK(merge(R"({"wall_clock_breakdown": true})").config.timing_log_level == 2);
  CHECK(merge(R"({"wall_clock_breakdown": false})").config.timing_log_level == 0);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// docs/COMPAT.md keeps the tables: every harmless key (by its path) and every switched block.
TEST_CASE("deepspeed config: docs/COMPAT.md lists every key accepted without effect", "[deepspeed]") {
  std::ifstream in(test::source_dir() + "/docs/COMPAT.md");
  REQUIRE(in.good());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  auto listed = [&](const std::string& cell) {
    INFO(cell);
    CHECK(std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.rfind(cell, 0) == 0; }));
  };
  for (const DsHarmlessKey& h : deepspeed_harmless_keys())
    listed("| `" + (h.block.empty() ? h.key : h.block + "." + h.key) + "` |");
  for (const DsSwitchedBlock& b : deepspeed_switched_blocks()) listed("| `" + b.key + "` |");
}

}  // namespace
}  // namespace troupe
