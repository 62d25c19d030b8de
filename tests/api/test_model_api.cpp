// Models given in code as first-class citizens of the public API (include/troupe/stage.hpp,
// train.hpp, actors.hpp): the training actor runs them, evaluate() evaluates their checkpoints from
// any layout, GPT's rules and GPT's memory estimate do not apply to blocks that are not GPT's, and
// what a model cannot do is refused with the reason.
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <type_traits>

#include <catch2/catch.hpp>

#include "actors/job.hpp"
#include "config/memory_estimate.hpp"
#include "examples/mlp_stages.hpp"
#include "model/pipeline_model.hpp"
#include "tests/test_util.hpp"
#include "troupe/actors.hpp"
#include "troupe/train.hpp"

namespace {

using Catch::Matchers::Contains;

// A stage's inputs and output gradients are read-only views: writing through them does not compile.
static_assert(std::is_same_v<decltype(troupe::ForwardArgs{}.inputs[0].f32().data), const float*>);
static_assert(std::is_same_v<decltype(troupe::ForwardArgs{}.inputs[0].data), const void*>);
static_assert(std::is_same_v<decltype(troupe::BackwardArgs{}.output_grads[0].i32().data), const int32_t*>);
static_assert(std::is_same_v<decltype(troupe::ForwardArgs{}.outputs[0].f32().data), float*>);

constexpr int64_t kFeatures = 7, kHidden = 8, kClasses = 5;

// Samples of kFeatures values 0..255 followed by a label < kClasses, a pure function of (split, sample).
class Labelled final : public troupe::DataSource {
 public:
  int64_t seq_length() const override { return kFeatures; }
  int64_t num_windows(troupe::DataSplit split) const override { return split == troupe::DataSplit::train ? 256 : 16; }
  troupe::Status read(troupe::DataSplit split, int64_t sample, int32_t* out) const override {
    std::mt19937 rng(static_cast<uint32_t>(sample * 7 + static_cast<int64_t>(split)));
    for (int64_t f = 0; f < kFeatures; ++f) out[f] = static_cast<int32_t>(rng() % 256);
    out[kFeatures] = static_cast<int32_t>(sample % kClasses);
    return troupe::Status::ok();
  }
  std::string describe() const override { return "labelled features (test)"; }
};

// The MLP of examples/mlp_stages.hpp. Its GPT sizes are ones GPT's rules refuse (5 heads do not
// divide 64): nothing of GPT runs, so nothing of GPT is checked.
troupe::TrainConfig mlp_config(int iterations) {
  troupe::TrainConfig c;
  c.model.seq_length = c.model.max_position_embeddings = kFeatures;
  c.model.hidden_size = 64;
  c.model.num_attention_heads = 5;
  c.tokenizer_type = "ByteLevelTokenizer";
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = iterations;
  c.lr = 1e-2;
  c.lr_decay_style = "constant";
  c.eval_interval = 1000;
  c.log_interval = 1;
  c.num_threads = 1;
  return c;
}

std::shared_ptr<const troupe::Model> mlp(int virtual_stages) {
  return std::make_shared<troupe::Model>(example::mlp_model({kFeatures, kHidden, kClasses}, 2, virtual_stages));
}

troupe::TokenBatch batch_of(const troupe::DataSource& data, int64_t first, int64_t count) {
  troupe::TokenBatch b;
  b.sequences = count;
  const int64_t row = data.seq_length() + 1;
  b.tokens.resize(static_cast<size_t>(count * row));
  for (int64_t i = 0; i < count; ++i) REQUIRE(data.read(troupe::DataSplit::train, first + i, b.tokens.data() + i * row));
  return b;
}

}  // namespace

TEST_CASE("model api: a model without GPT blocks trains whatever GPT's sizes say, on any layout", "[api][model]") {
  auto data = std::make_shared<Labelled>();
  std::vector<double> single, split;
  for (auto* out : {&single, &split}) {
    troupe::TrainConfig cfg = mlp_config(4);
    troupe::RunOptions run;
    run.measure_peak = false;
    if (out == &split) cfg.pipeline_model_parallel_size = cfg.data_parallel_size = 2;
    run.model = mlp(out == &split ? 2 : 1);
    troupe::TrainCallbacks cb;
    cb.on_iteration = [out](const troupe::IterationStats& s) { out->push_back(s.lm_loss); };
    auto r = troupe::train(cfg, data, cb, run);
    INFO((r ? std::string("ok") : r.status().message()));
    REQUIRE(r);
  }
  REQUIRE(single.size() == 4);
  REQUIRE(split.size() == 4);
  for (size_t i = 0; i < single.size(); ++i) CHECK(split[i] == Approx(single[i]).epsilon(1e-5));
  // The same heads with GPT's own model: refused by GPT's rules.
  troupe::TrainConfig gpt = mlp_config(1);
  gpt.mock_data = true;
  auto refused = troupe::train(gpt, nullptr);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.status().message(), Contains("--num-attention-heads"));
}

TEST_CASE("model api: the training actor runs a model given in code, as troupe::train does", "[api][model]") {
  auto data = std::make_shared<Labelled>();
  troupe::TrainConfig cfg = mlp_config(3);
  cfg.pipeline_model_parallel_size = 2;
  std::vector<double> trained;
  {
    troupe::RunOptions run;
    run.measure_peak = false;
    run.model = mlp(2);
    troupe::TrainCallbacks cb;
    cb.on_iteration = [&](const troupe::IterationStats& s) { trained.push_back(s.lm_loss); };
    auto r = troupe::train(cfg, data, cb, run);
    REQUIRE(r);
  }
  caf::actor_system_config sys_cfg;
  caf::actor_system system{sys_cfg};
  troupe::TrainingOptions options;
  options.model = mlp(2);
  auto training = troupe::spawn_training(system, cfg, options);
  INFO((training ? std::string("ok") : training.status().message()));
  REQUIRE(training);
  caf::scoped_actor self{system};
  // troupe::train's trainer reads the windows in its shuffled order only from an indexed dataset: a
  // DataSource's windows come in order, global batch after global batch.
  std::vector<double> sent;
  for (int step = 0; step < 3; ++step)
    self->request(*training, caf::infinite, troupe::train_batch_atom::value, batch_of(*data, step * 4, 4))
        .receive([&](const troupe::IterationStats& s) { sent.push_back(s.lm_loss); },
                 [&](caf::error& e) { FAIL(caf::to_string(e)); });
  REQUIRE(sent.size() == trained.size());
  for (size_t i = 0; i < sent.size(); ++i) CHECK(sent[i] == Approx(trained[i]).epsilon(1e-6));
  // The loss is per the model's loss terms (one per sample), not per token: a classifier's loss
  // starts near ln(classes).
  CHECK(std::abs(sent[0] - std::log(static_cast<double>(kClasses))) < 1.0);
  self->send_exit(*training, caf::exit_reason::user_shutdown);
}

TEST_CASE("model api: evaluate() takes the checkpoint of a model given in code from any layout", "[api][model]") {
  troupe::test::TempDir dir;
  auto data = std::make_shared<Labelled>();
  troupe::TrainConfig cfg = mlp_config(3);
  cfg.pipeline_model_parallel_size = 2;
  cfg.save = dir.str("ck");
  troupe::RunOptions run;
  run.measure_peak = false;
  run.model = mlp(2);
  REQUIRE(troupe::train(cfg, data, {}, run));

  // The same windows through the training actor on the layout that saved it (pp 2), loaded from the
  // checkpoint: its eval_batch_atom is the oracle.
  double expected = 0;
  {
    caf::actor_system_config sys_cfg;
    caf::actor_system system{sys_cfg};
    troupe::TrainConfig load = cfg;
    load.load = cfg.save;
    load.save.clear();
    troupe::TrainingOptions options;
    options.model = mlp(2);
    auto training = troupe::spawn_training(system, load, options);
    REQUIRE(training);
    caf::scoped_actor self{system};
    self->request(*training, caf::infinite, troupe::eval_batch_atom::value, batch_of(*data, 0, 12))
        .receive([&](const troupe::EvalStats& e) { expected = e.loss; }, [&](caf::error& e) { FAIL(caf::to_string(e)); });
    self->send_exit(*training, caf::exit_reason::user_shutdown);
  }
  auto got = troupe::evaluate(cfg.save, data, 12, 5, 1, mlp(2));  // the pp 2 model, on one rank
  INFO((got ? std::string("ok") : got.status().message()));
  REQUIRE(got);
  CHECK(got.value().iteration == 3);
  CHECK(got.value().samples == 12);
  CHECK(got.value().tokens == 12);  // one loss term per sample
  CHECK(got.value().loss == Approx(expected).epsilon(1e-6));
  CHECK(std::isfinite(got.value().loss));

  // Without the model: refused, naming a tensor GPT does not have and the way to evaluate it.
  auto refused = troupe::evaluate(cfg.save, data, 12, 2, 1);
  REQUIRE_FALSE(refused);
  CHECK(refused.status().is_bad_input());
  CHECK_THAT(refused.status().message(), Contains("holds a model given in code") && Contains("mlp.") &&
                                             Contains("troupe::evaluate(dir, data, samples, micro_batch, threads, model)"));
}

TEST_CASE("model api: the memory estimate of a model given in code comes from its declarations", "[api][model]") {
  troupe::TrainConfig cfg;
  cfg.model.num_layers = 4;
  cfg.model.hidden_size = 64;
  cfg.model.num_attention_heads = 4;
  cfg.model.seq_length = cfg.model.max_position_embeddings = 32;
  cfg.model.vocab_size = 257;
  cfg.micro_batch_size = 2;
  cfg.global_batch_size = 8;
  cfg.pipeline_model_parallel_size = 2;
  // GPT's own model given in code: the same estimate as GPT's.
  std::vector<troupe::StageFootprint> gpt;
  REQUIRE(troupe::check_model_for_job(troupe::gpt_model(cfg), cfg, 1, &gpt));
  const troupe::MemoryEstimate plain = troupe::estimate_memory(cfg, 1), given = troupe::estimate_memory(cfg, 1, &gpt);
  CHECK(given.model_state_bytes == Approx(plain.model_state_bytes));
  CHECK(given.activation_bytes == Approx(plain.activation_bytes));
  // The MLP: its declared parameters (W_in 8x7 + 8, two hidden 8x8 + 8, W_out 5x8 + 5) and boundary tensors.
  std::vector<troupe::StageFootprint> mlp_print;
  troupe::TrainConfig one = mlp_config(1);
  REQUIRE(troupe::check_model_for_job(*mlp(1), one, 1, &mlp_print));
  REQUIRE(mlp_print.size() == 1);
  CHECK(mlp_print[0].custom_parameters == 8 * 7 + 8 + 2 * (8 * 8 + 8) + 5 * 8 + 5);
  CHECK(mlp_print[0].gpt_layers == 0);
  const troupe::MemoryEstimate e = troupe::estimate_memory(one, 1, &mlp_print);
  CHECK(e.model_state_bytes == Approx(16.0 * mlp_print[0].custom_parameters));  // ZeRO 0: 16 bytes each
  // A declared parameter too large for this machine is refused before anything is allocated.
  troupe::Model huge = *mlp(1);
  huge.stages[0].insert(huge.stages[0].begin() + 1, troupe::Block::custom("huge", [](const troupe::StagePlace& at) {
    struct Huge final : troupe::Stage {
      explicit Huge(const troupe::StagePlace& p) : B(p.micro_batch) {}
      int64_t B;
      std::vector<troupe::TensorDecl> inputs() const override { return example::mlp_boundary(B, {kFeatures, kHidden, kClasses}); }
      std::vector<troupe::TensorDecl> outputs() const override { return inputs(); }
      std::vector<troupe::ParamDecl> parameters() const override { return {{"huge.weight", {1 << 20, 1 << 20}}}; }
      double forward(troupe::StageContext&, const troupe::ForwardArgs&) override { return 0; }
      void backward(troupe::StageContext&, const troupe::BackwardArgs&) override {}
    };
    return std::make_unique<Huge>(at);
  }));
  troupe::RunOptions run;
  run.measure_peak = false;
  run.model = std::make_shared<troupe::Model>(huge);
  auto refused = troupe::train(mlp_config(1), std::make_shared<Labelled>(), {}, run);
  REQUIRE_FALSE(refused);
  CHECK(refused.status().is_bad_input());
  CHECK_THAT(refused.status().message(), Contains("declare fewer or smaller parameters in the model given in code"));
}

TEST_CASE("model api: custom blocks on --device cuda are refused with the reason; GPT's blocks are not", "[api][model]") {
  troupe::TrainConfig cfg = mlp_config(1);
  cfg.device = "cuda";
  const troupe::Status custom = troupe::check_model_for_job(*mlp(1), cfg, 1);
  CHECK(custom.is_bad_input());
  CHECK_THAT(custom.message(), Contains("custom block \"mlp.in\" on --device cuda") && Contains("host memory"));
  troupe::TrainConfig gpt;
  gpt.model.vocab_size = 257;
  gpt.device = "cuda";
  CHECK(troupe::check_model_for_job(troupe::gpt_model(gpt), gpt, 1).is_ok());
}
