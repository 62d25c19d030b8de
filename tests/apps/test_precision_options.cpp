// The mixed-precision settings of `troupe train` (include/troupe/precision.hpp): Megatron's flags,
// the DeepSpeed file's fp16 / bf16 blocks and communication_data_type, their defaults, precedence
// and contradictions (every problem in one message), and resuming in another precision.
// The engine runs 16-bit, so no validation problem of a 16-bit config remains beyond its own
// (is_not_wired checks that the old "does not run 16-bit yet" refusal is gone).
#include <algorithm>
#include <catch2/catch.hpp>
#include <CLI/CLI.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "apps/cli/megatron_compat.hpp"
#include "apps/cli/train_options.hpp"
#include "config/run_identity.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

using Catch::Contains;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

// What a valid run needs (validation checks that the files exist).
struct Workspace {
  test::TempDir dir;
  std::string prefix = dir.str("corpus_text_document");
  Workspace() {
    write_file(prefix + ".bin", "x");
    write_file(prefix + ".idx", "x");
    write_file(dir.str("vocab.json"), "{}");
    write_file(dir.str("merges.txt"), "#version: 0.2\n");
  }
  std::vector<std::string> args(std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {"--data-path", prefix, "--vocab-file", dir.str("vocab.json"), "--merge-file",
                                  dir.str("merges.txt"), "--train-iters", "10"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::vector<std::string> with_ds(const std::string& json_text, std::vector<std::string> extra = {}) const {
    write_file(dir.str("ds.json"), json_text);
    extra.insert(extra.begin(), {"--deepspeed-config", dir.str("ds.json")});
    return args(extra);
  }
};

struct Parsed {
  TrainConfig cfg;
  Status status;
  std::vector<std::string> notes;
  std::vector<std::string> problems;  // status's problems without PRECISION-NOT-WIRED's
  bool not_wired = false;             // whether that one was among them
};

bool is_not_wired(const std::string& p) { return p.find("does not run 16-bit yet") != std::string::npos; }

Parsed parse(std::vector<std::string> args) {
  Parsed p;
  CLI::App app{"troupe train (test)"};
  add_train_options(&app, &p.cfg);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  p.status = finalize_train_config(app, &p.cfg, 1, &p.notes);
  if (p.status.is_ok()) return p;
  // "N problems:\n  - a\n  - b", or one message.
  const std::string& m = p.status.message();
  const std::string sep = "\n  - ";
  std::vector<std::string> all;
  if (m.find(" problems:" + sep) == std::string::npos) {
    all.push_back(m);
  } else {
    for (size_t at = m.find(sep); at != std::string::npos;) {
      const size_t next = m.find(sep, at + sep.size());
      all.push_back(m.substr(at + sep.size(), next == std::string::npos ? next : next - at - sep.size()));
      at = next;
    }
  }
  for (const std::string& q : all) {
    if (is_not_wired(q)) p.not_wired = true;
    else p.problems.push_back(q);
  }
  return p;
}

// Parsed with no problem but (while the engine is not wired) the 16-bit refusal.
Parsed parse_ok(std::vector<std::string> args) {
  Parsed p = parse(std::move(args));
  INFO(p.status.message());
  REQUIRE(p.problems.empty());
  CHECK(!p.not_wired);  // the engine runs 16-bit: no refusal is left
  return p;
}

bool has_note(const Parsed& p, const std::string& text) {
  return std::any_of(p.notes.begin(), p.notes.end(), [&](const std::string& n) { return n.find(text) != n.npos; });
}

TEST_CASE("precision: fp32 by default, with Megatron's loss-scale defaults", "[precision]") {
  Workspace ws;
  Parsed p = parse_ok(ws.args());
  const PrecisionConfig& c = p.cfg.precision;
  CHECK(p.status.is_ok());
  CHECK(c.dtype == PrecisionDType::fp32);
  CHECK(c.recipe == PrecisionRecipe::megatron);
  // megatron/training/arguments.py, _add_mixed_precision_args.
  CHECK(c.loss_scale == 0);
  CHECK(c.initial_loss_scale == 4294967296.0);
  CHECK(c.min_loss_scale == 1.0);
  CHECK(c.loss_scale_window == 1000);
  CHECK(c.hysteresis == 2);
  CHECK_FALSE(c.accumulate_allreduce_grads_in_fp32);
  CHECK_FALSE(c.attention_softmax_in_fp32);
  CHECK(c == PrecisionConfig{});
  // Loss-scale flags without a 16-bit type: accepted, each noted as without effect.
  Parsed q = parse_ok(ws.args({"--loss-scale", "1024", "--hysteresis", "3", "--accumulate-allreduce-grads-in-fp32"}));
  CHECK(q.status.is_ok());
  CHECK(has_note(q, "--loss-scale 1024, --hysteresis 3: no effect"));
  CHECK(has_note(q, "--accumulate-allreduce-grads-in-fp32: no effect"));
}

TEST_CASE("precision: --fp16 and --bf16 with Megatron's flags", "[precision]") {
  Workspace ws;
  Parsed p = parse_ok(ws.args({"--fp16", "--initial-loss-scale", "65536", "--min-loss-scale", "0.5",
                               "--loss-scale-window", "250", "--hysteresis", "3",
                               "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"}));
  const PrecisionConfig& c = p.cfg.precision;
  CHECK(!p.not_wired);  // the engine runs it
  CHECK(c.dtype == PrecisionDType::fp16);
  CHECK(c.recipe == PrecisionRecipe::megatron);
  CHECK(c.dynamic_loss_scaling());
  CHECK(c.initial_loss_scale == 65536);
  CHECK(c.min_loss_scale == 0.5);
  CHECK(c.loss_scale_window == 250);
  CHECK(c.hysteresis == 3);
  CHECK(c.accumulate_allreduce_grads_in_fp32);
  CHECK(c.attention_softmax_in_fp32);
  CHECK(c.grad_dtype() == PrecisionDType::fp32);
  CHECK(parse_ok(ws.args({"--fp16"})).cfg.precision.grad_dtype() == PrecisionDType::fp16);
  CHECK_FALSE(parse_ok(ws.args({"--fp16", "--loss-scale", "128"})).cfg.precision.dynamic_loss_scaling());

  // bf16: fp32 gradients; the dynamic settings do nothing, a static --loss-scale is Megatron's
  // ConstantGradScaler.
  Parsed b = parse_ok(ws.args({"--bf16", "--loss-scale", "8", "--initial-loss-scale", "1024", "--hysteresis", "4"}));
  CHECK(b.cfg.precision.dtype == PrecisionDType::bf16);
  CHECK(b.cfg.precision.grad_dtype() == PrecisionDType::fp32);
  CHECK(b.cfg.precision.loss_scale == 8);
  CHECK(has_note(b, "--initial-loss-scale 1024, --hysteresis 4 with bf16: no effect"));
  CHECK(has_note(b, "--loss-scale 8 with --bf16: a constant loss scale"));

  // Query-key layer scaling implies the fp32 softmax, as in Megatron.
  Parsed q = parse_ok(ws.args({"--fp16", "--apply-query-key-layer-scaling"}));
  CHECK(q.cfg.precision.attention_softmax_in_fp32);
  CHECK(has_note(q, "--apply-query-key-layer-scaling: read as --attention-softmax-in-fp32"));
}

TEST_CASE("precision: --fp16, --bf16 and the file's 16-bit blocks are accepted as they stand", "[precision]") {
  Workspace ws;
  for (const char* flag : {"--fp16", "--bf16"}) {
    Parsed p = parse(ws.args({flag}));
    INFO(p.status.message());
    REQUIRE(p.status.is_ok());
    CHECK(p.cfg.precision.dtype == (flag[2] == 'f' ? PrecisionDType::fp16 : PrecisionDType::bf16));
  }
  Parsed d = parse(ws.with_ds(R"({"bf16": {"enabled": true}})"));
  INFO(d.status.message());
  REQUIRE(d.status.is_ok());
  CHECK(d.cfg.precision.dtype == PrecisionDType::bf16);
}

TEST_CASE("precision: contradictions and bad values come in one message with every other problem", "[precision]") {
  Workspace ws;
  Parsed p = parse(ws.args({"--fp16", "--bf16", "--lr", "-1", "--hysteresis", "0", "--loss-scale-window", "0",
                            "--min-loss-scale", "0"}));
  INFO(p.status.message());
  REQUIRE_FALSE(p.status.is_ok());
  const std::string& m = p.status.message();
  CHECK_THAT(m, Contains("--fp16 and --bf16 contradict each other -- keep one of them"));
  CHECK_THAT(m, Contains("--lr must be >= 0"));
  // The precision area reports every problem at once, as each area of validation does.
  CHECK_THAT(m, Contains("--min-loss-scale must be positive"));
  CHECK_THAT(m, Contains("--loss-scale-window must be at least 1"));
  CHECK_THAT(m, Contains("--hysteresis must be at least 1"));
  CHECK(p.problems.size() == 5);
  // Each bad value alone names its flag.
  CHECK_THAT(parse(ws.args({"--hysteresis", "0"})).status.message(), Contains("--hysteresis must be at least 1"));
  CHECK_THAT(parse(ws.args({"--loss-scale-window", "0"})).status.message(),
             Contains("--loss-scale-window must be at least 1"));
  CHECK_THAT(parse(ws.args({"--loss-scale", "-2"})).status.message(), Contains("--loss-scale must be >= 0"));
  CHECK_THAT(parse(ws.args({"--initial-loss-scale", "0"})).status.message(),
             Contains("--initial-loss-scale must be positive"));
  // Megatron's DynamicGradScaler asserts min <= initial.
  Parsed mi = parse(ws.args({"--fp16", "--min-loss-scale", "4096", "--initial-loss-scale", "1024"}));
  CHECK_THAT(mi.status.message(), Contains("--min-loss-scale 4096 is above --initial-loss-scale 1024"));
  CHECK(parse_ok(ws.args({"--bf16", "--min-loss-scale", "4096", "--initial-loss-scale", "1024"})).problems.empty());
}

TEST_CASE("precision: the DeepSpeed file's fp16 block, with DeepSpeed's defaults", "[precision]") {
  Workspace ws;
  // Every key given.
  Parsed p = parse_ok(ws.with_ds(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
      "loss_scale_window": 500, "hysteresis": 3, "consecutive_hysteresis": true, "min_loss_scale": 0.25,
      "auto_cast": false, "fp16_master_weights_and_grads": false}})"));
  const PrecisionConfig& c = p.cfg.precision;
  CHECK(c.dtype == PrecisionDType::fp16);
  CHECK(c.recipe == PrecisionRecipe::deepspeed);
  CHECK(c.initial_loss_scale == 4096);
  CHECK(c.loss_scale_window == 500);
  CHECK(c.hysteresis == 3);
  CHECK(c.consecutive_hysteresis);
  CHECK(c.min_loss_scale == 0.25);
  CHECK(c.grad_dtype(1) == PrecisionDType::fp16);
  // One dynamic key named: constants.py's FP16_*_DEFAULT for the rest (2^16, hysteresis 2, ...).
  const PrecisionConfig one = parse_ok(ws.with_ds(R"({"fp16": {"enabled": true, "loss_scale_window": 200}})")).cfg.precision;
  CHECK(one.initial_loss_scale == 65536);
  CHECK(one.hysteresis == 2);
  CHECK(one.loss_scale_window == 200);
  CHECK(one.min_loss_scale == 1);
  CHECK_FALSE(one.consecutive_hysteresis);
  CHECK(one.loss_scale == 0);
  // None named: DeepSpeed hands its ZeRO loss scaler no arguments, whose defaults are 2^32 and
  // hysteresis 1.
  const PrecisionConfig bare = parse_ok(ws.with_ds(R"({"fp16": {"enabled": true}})")).cfg.precision;
  CHECK(bare.initial_loss_scale == 4294967296.0);
  CHECK(bare.hysteresis == 1);
  CHECK(bare.loss_scale_window == 1000);
  CHECK(bare == deepspeed_fp16_defaults(false));
  CHECK(one.initial_loss_scale == deepspeed_fp16_defaults(true).initial_loss_scale);
  // A static scale.
  CHECK_FALSE(parse_ok(ws.with_ds(R"({"fp16": {"enabled": true, "loss_scale": 512}})")).cfg.precision.dynamic_loss_scaling());
  // Flags win over the file, key by key; --fp16 beside it keeps DeepSpeed's recipe.
  Parsed f = parse_ok(ws.with_ds(R"({"fp16": {"enabled": true, "initial_scale_power": 20, "hysteresis": 3}})",
                                 {"--fp16", "--initial-loss-scale", "1024"}));
  CHECK(f.cfg.precision.recipe == PrecisionRecipe::deepspeed);
  CHECK(f.cfg.precision.initial_loss_scale == 1024);
  CHECK(f.cfg.precision.hysteresis == 3);
  // Switched off: its keys are noted, and --fp16 gives Megatron's recipe.
  Parsed off = parse_ok(ws.with_ds(R"({"fp16": {"enabled": false, "hysteresis": 7, "loss_scale_window": 9}})",
                                   {"--fp16"}));
  CHECK(off.cfg.precision.recipe == PrecisionRecipe::megatron);
  CHECK(off.cfg.precision.hysteresis == 2);
  CHECK(has_note(off, "\"fp16.hysteresis\" in "));
  CHECK(has_note(off, "no effect -- \"fp16\" is not enabled"));
}

TEST_CASE("precision: the DeepSpeed file's bf16 block and communication_data_type", "[precision]") {
  Workspace ws;
  Parsed p = parse_ok(ws.with_ds(
      R"({"bf16": {"enabled": true, "immediate_grad_update": true, "check_grad_overflow": true},
          "communication_data_type": "FP32"})"));
  const PrecisionConfig& c = p.cfg.precision;
  CHECK(c.dtype == PrecisionDType::bf16);
  CHECK(c.recipe == PrecisionRecipe::deepspeed);
  CHECK(c.bf16_immediate_grad_update);
  CHECK(c.bf16_check_grad_overflow);
  CHECK(c.communication_data_type == "fp32");
  CHECK(c.grad_dtype(0) == PrecisionDType::fp32);
  CHECK(c.grad_reduce_dtype(0) == PrecisionDType::fp32);
  const PrecisionConfig plain = parse_ok(ws.with_ds(R"({"bf16": {"enabled": true}})")).cfg.precision;
  CHECK_FALSE(plain.bf16_check_grad_overflow);
  CHECK(plain.grad_reduce_dtype(0) == PrecisionDType::bf16);  // DeepSpeed: the model's type
  CHECK(plain.grad_dtype(2) == PrecisionDType::bf16);
  // A float32 run communicates in float32.
  CHECK(parse_ok(ws.with_ds(R"({"communication_data_type": "fp32"})")).cfg.precision.communication_data_type.empty());
  CHECK_THAT(parse(ws.with_ds(R"({"communication_data_type": "bf16"})")).status.message(),
             Contains("\"communication_data_type\"") && Contains("float32"));
  CHECK_THAT(parse(ws.with_ds(R"({"bf16": {"enabled": true}, "communication_data_type": "int8"})")).status.message(),
             Contains("DeepSpeed knows fp16, bf16 and fp32"));
}

TEST_CASE("precision: the DeepSpeed file's contradictions and refusals, every one at once", "[precision]") {
  Workspace ws;
  Parsed both = parse(ws.with_ds(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"));
  CHECK_THAT(both.status.message(), Contains("\"fp16.enabled\" and \"bf16.enabled\" are both true"));
  Parsed flag = parse(ws.with_ds(R"({"fp16": {"enabled": true}})", {"--bf16"}));
  CHECK_THAT(flag.status.message(),
             Contains("\"fp16.enabled\" is true, but --bf16 is given") && Contains("drop --bf16"));
  Parsed flag2 = parse(ws.with_ds(R"({"bf16": {"enabled": true}})", {"--fp16"}));
  CHECK_THAT(flag2.status.message(), Contains("\"bf16.enabled\" is true, but --fp16 is given"));
  Parsed many = parse(ws.with_ds(R"({"fp16": {"enabled": true, "auto_cast": true, "fp16_master_weights_and_grads": true,
      "hysteresis": "2", "initial_scale_power": 5000, "loss_scale_windows": 10}, "gradient_clipping": "x"})"));
  const std::string& m = many.status.message();
  INFO(m);
  CHECK_THAT(m, Contains("\"fp16.auto_cast\" is true"));
  CHECK_THAT(m, Contains("\"fp16.fp16_master_weights_and_grads\" is true"));
  CHECK_THAT(m, Contains("\"fp16.hysteresis\""));
  CHECK_THAT(m, Contains("\"fp16.initial_scale_power\" is 5000"));
  CHECK_THAT(m, Contains("\"fp16.loss_scale_windows\" is not a key") && Contains("did you mean \"loss_scale_window\"?"));
  CHECK_THAT(m, Contains("\"gradient_clipping\""));
  CHECK_THAT(m, Contains("6 problems"));
  // The file's values are validated with the key named.
  CHECK_THAT(parse(ws.with_ds(R"({"fp16": {"enabled": true, "min_loss_scale": -1}})")).status.message(),
             Contains("--min-loss-scale must be positive") && Contains("\"fp16.min_loss_scale\" in "));
}

TEST_CASE("precision: the Megatron flags are troupe's now, not the compatibility table's", "[precision]") {
  for (const CompatRow& r : compat_table()) {
    INFO(r.flag);
    for (const char* f : {"--fp16", "--bf16", "--loss-scale", "--initial-loss-scale", "--min-loss-scale",
                          "--loss-scale-window", "--hysteresis", "--accumulate-allreduce-grads-in-fp32",
                          "--apply-query-key-layer-scaling"})
      CHECK(r.flag != f);
  }
  auto s = screen_train_args({"--fp16", "--no-query-key-layer-scaling", "--train-iters", "1"}, 1);
  // What is left are the data problems, not the table's refusals.
  if (!s.is_ok()) CHECK_THAT(s.status().message(), !Contains("mixed precision is planned"));
}

TEST_CASE("precision: a checkpoint resumes in another precision, the change reported", "[precision]") {
  TrainConfig saved, now;
  now.precision.dtype = PrecisionDType::bf16;
  const ResumeCheck r = check_resume(now, saved);
  CHECK(r.refused.empty());
  REQUIRE(r.changed.size() == 1);
  CHECK_THAT(r.changed[0], Contains("precision") && Contains("fp32") && Contains("bf16"));
  now.precision = saved.precision;
  now.precision.hysteresis = 5;  // the loss-scale settings are this run's
  CHECK(check_resume(now, saved).changed.empty());
}

}  // namespace
}  // namespace troupe
