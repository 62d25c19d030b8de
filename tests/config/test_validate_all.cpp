// validate_train_config reports every problem of every area at once (config/validate.hpp): several
// problems of one area come together, each naming its flag, where validation used to stop at the
// first of each area.
#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "config/validate.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

using Catch::Contains;

TrainConfig valid() {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden_size = 48;
  c.model.num_attention_heads = 4;
  c.model.seq_length = 16;
  c.model.max_position_embeddings = 16;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = 5;
  c.mock_data = true;
  c.tokenizer_type = "ByteLevelTokenizer";
  return c;
}

// The problem lines of a failed validation ("N problems:\n  - a\n  - b", or one message).
std::vector<std::string> lines(const Status& st) {
  REQUIRE_FALSE(st.is_ok());
  const std::string m = st.message();
  std::vector<std::string> out;
  const std::string sep = "\n  - ";
  if (m.find(" problems:" + sep) == std::string::npos) return {m};
  for (size_t at = m.find(sep); at != std::string::npos;) {
    const size_t next = m.find(sep, at + sep.size());
    out.push_back(m.substr(at + sep.size(), next == std::string::npos ? next : next - at - sep.size()));
    at = next;
  }
  CHECK_THAT(m, Contains(std::to_string(out.size()) + " problems:"));
  return out;
}

// Each of `flags` starts one of the lines, in order, and nothing else is there.
void expect(const Status& st, const std::vector<std::string>& flags) {
  const std::vector<std::string> got = lines(st);
  INFO(st.message());
  REQUIRE(got.size() == flags.size());
  for (size_t i = 0; i < flags.size(); ++i) CHECK(got[i].rfind(flags[i] + " ", 0) == 0);
}

TEST_CASE("validate: a valid config passes", "[validate]") {
  CHECK(validate_train_config(valid()).is_ok());
}

TEST_CASE("validate: every problem of the optimizer at once", "[validate]") {
  TrainConfig c = valid();
  c.adam_beta1 = 1;
  c.adam_beta2 = -0.5;
  c.adam_eps = 0;
  c.weight_decay = -1;
  c.clip_grad = -2;
  expect(validate_train_config(c), {"--adam-beta1", "--adam-beta2", "--adam-eps", "--weight-decay", "--clip-grad"});
}

TEST_CASE("validate: every problem of the model's sizes and of the layout at once", "[validate]") {
  TrainConfig c = valid();
  c.model.num_layers = 0;
  c.model.hidden_size = -4;
  c.zero_stage = 7;
  c.recompute_granularity = "some";
  expect(validate_train_config(c), {"--num-layers", "--hidden-size", "--zero-stage", "--recompute-granularity"});
  TrainConfig p = valid();
  p.tensor_model_parallel_size = 0;
  p.pipeline_model_parallel_size = -1;
  p.data_parallel_size = -2;
  expect(validate_train_config(p),
         {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--data-parallel-size"});
}

TEST_CASE("validate: every problem of the schedule, precision, checkpoints and logging at once", "[validate]") {
  TrainConfig s = valid();
  s.lr_decay_style = "step";
  s.lr_warmup_style = "square";
  s.lr_warmup_iters = -1;
  s.lr_decay_iters = -3;
  expect(validate_train_config(s), {"--lr-decay-style", "--lr-warmup-style", "--lr-warmup-iters", "--lr-decay-iters"});
  TrainConfig p = valid();
  p.precision.loss_scale = -1;
  p.precision.loss_scale_window = 0;
  p.precision.hysteresis = 0;
  expect(validate_train_config(p), {"--loss-scale", "--loss-scale-window", "--hysteresis"});
  TrainConfig k = valid();
  k.save_interval = -1;
  k.exit_interval = -1;
  k.max_saves_in_flight = 0;
  k.save_memory_interval = -1;
  expect(validate_train_config(k), {"--save-interval", "--exit-interval", "--save-memory-interval", "--max-saves-in-flight"});
  TrainConfig m = valid();
  m.save_memory_dir = "/dev/shm";  // without an interval
  m.max_restarts = 2;              // with neither --save nor snapshots
  m.save.clear();
  expect(validate_train_config(m), {"--save-memory-dir", "--max-restarts"});
  m.save_memory_interval = 5;  // snapshots are something to restart from
  CHECK(validate_train_config(m).is_ok());
  TrainConfig l = valid();
  l.eval_iters = -1;
  l.log_interval = 0;
  l.num_threads = -1;
  l.tensorboard.log_interval = 0;
  expect(validate_train_config(l), {"--eval-iters", "--log-interval", "--num-threads", "--tensorboard-log-interval"});
  TrainConfig o = valid();
  o.max_restarts = -1;
  o.distributed_timeout_minutes = 0;
  o.inspect = "host:port";
  o.inspect_stall_seconds = -1;
  expect(validate_train_config(o),
         {"--max-restarts", "--distributed-timeout-minutes", "--inspect", "--inspect-stall-seconds"});
}

TEST_CASE("validate: every problem of the data and the tokenizer at once", "[validate]") {
  test::TempDir dir;
  TrainConfig c = valid();
  c.mock_data = false;
  c.data_path = {dir.str("a"), dir.str("b")};
  c.split = "1,2,3,4";
  c.tokenizer_type = "GPT2BPETokenizer";
  c.vocab_file = "";
  c.merge_file = dir.str("missing.txt");
  const std::vector<std::string> got = lines(validate_train_config(c));
  INFO(validate_train_config(c).message());
  REQUIRE(got.size() == 5);
  CHECK_THAT(got[0], Contains(dir.str("a") + ".bin and "));
  CHECK_THAT(got[1], Contains(dir.str("b") + ".bin and "));
  CHECK_THAT(got[2], Contains("--split '1,2,3,4' has 4 weights"));
  CHECK(got[3].rfind("--vocab-file is required", 0) == 0);
  CHECK(got[4].rfind("--merge-file " + dir.str("missing.txt") + " not found", 0) == 0);
}

// Areas still come together, as before; and a check that needs another setting waits for it.
TEST_CASE("validate: several areas at once, dependent checks only once their inputs hold", "[validate]") {
  TrainConfig c = valid();
  c.micro_batch_size = 0;  // the batch rules divide by it: only this one of the batch area
  c.global_batch_size = 7;
  c.lr = -1;  // --min-lr is not checked against a negative --lr
  c.min_lr = 5;
  c.eval_interval = 0;
  expect(validate_train_config(c), {"--micro-batch-size", "--lr", "--eval-interval"});
}

}  // namespace
}  // namespace troupe
