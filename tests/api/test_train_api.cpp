// troupe::train and spawn_training as a program calls them (include/troupe/train.hpp, actors.hpp):
// what a config must name when the program gives its own data, and that on_start sees only runs
// that start.
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <memory>
#include <random>

#include <catch2/catch.hpp>

#include "troupe/actors.hpp"
#include "troupe/train.hpp"

namespace {

using Catch::Matchers::Contains;

// Random tokens of the byte-level vocabulary, a pure function of (split, sample).
class RandomTokens final : public troupe::DataSource {
 public:
  explicit RandomTokens(int64_t seq_length) : seq_length_(seq_length) {}
  int64_t seq_length() const override { return seq_length_; }
  int64_t num_windows(troupe::DataSplit split) const override { return split == troupe::DataSplit::train ? 512 : 32; }
  troupe::Status read(troupe::DataSplit split, int64_t sample, int32_t* out) const override {
    std::mt19937 rng(static_cast<uint32_t>(sample * 3 + static_cast<int64_t>(split)));
    for (int64_t i = 0; i <= seq_length_; ++i) out[i] = static_cast<int32_t>(rng() % 250);
    return troupe::Status::ok();
  }
  std::string describe() const override { return "random tokens (test)"; }

 private:
  int64_t seq_length_;
};

// One layer, hidden 32, 16-token windows; names no data.
troupe::TrainConfig tiny(int iterations) {
  troupe::TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 2;
  c.model.seq_length = c.model.max_position_embeddings = 16;
  c.tokenizer_type = "ByteLevelTokenizer";
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = iterations;
  c.eval_interval = 1000;
  c.log_interval = 1;
  c.num_threads = 1;
  return c;
}

troupe::RunOptions quick() {
  troupe::RunOptions o;
  o.measure_peak = false;
  return o;
}

}  // namespace

TEST_CASE("train api: a DataSource given in code is the run's data: a config that names none trains", "[api]") {
  const troupe::TrainConfig cfg = tiny(2);
  REQUIRE(!cfg.mock_data);
  REQUIRE(cfg.data_path.empty());
  int iterations = 0;
  troupe::TrainCallbacks cb;
  cb.on_iteration = [&](const troupe::IterationStats&) { ++iterations; };
  auto r = troupe::train(cfg, std::make_shared<RandomTokens>(16), cb, quick());
  INFO((r ? std::string("ok") : r.status().message()));
  REQUIRE(r);
  CHECK(iterations == 2);
  CHECK(r.value().iteration == 2);
}

TEST_CASE("train api: a DataSource beside data the config names is refused, naming both", "[api]") {
  auto data = std::make_shared<RandomTokens>(16);
  troupe::TrainConfig named = tiny(1);
  named.data_path = {"my_text_document"};
  auto r = troupe::train(named, data, {}, quick());
  REQUIRE(!r);
  CHECK(r.status().is_bad_input());
  CHECK_THAT(r.status().message(), Contains("--data-path") && Contains("DataSource"));

  troupe::TrainConfig mock = tiny(1);
  mock.mock_data = true;
  r = troupe::train(mock, data, {}, quick());
  REQUIRE(!r);
  CHECK(r.status().is_bad_input());
  CHECK_THAT(r.status().message(), Contains("--mock-data") && Contains("DataSource"));

  // Without a DataSource the config must name its data, as troupe train's flags must.
  r = troupe::train(tiny(1), nullptr, {}, quick());
  REQUIRE(!r);
  CHECK_THAT(r.status().message(), Contains("--data-path is required"));
}

TEST_CASE("train api: on_start runs once for a run that starts, never for one refused", "[api]") {
  auto data = std::make_shared<RandomTokens>(16);
  int started = 0, iterations_before_start = 0, iterations = 0;
  troupe::TrainCallbacks cb;
  cb.on_start = [&](const troupe::TrainConfig&, const troupe::DataSource&, int, int) {
    ++started;
    iterations_before_start = iterations;
    return troupe::Status::ok();
  };
  cb.on_iteration = [&](const troupe::IterationStats&) { ++iterations; };

  SECTION("a model given in code that does not fit the job") {
    troupe::TrainConfig cfg = tiny(1);
    troupe::RunOptions run = quick();
    troupe::Model m = troupe::gpt_model(cfg);
    m.stages.push_back(m.stages.back());  // two virtual stages for a one-stage pipeline
    run.model = std::make_shared<troupe::Model>(m);
    auto r = troupe::train(cfg, data, cb, run);
    REQUIRE(!r);
    CHECK(r.status().is_bad_input());
    CHECK_THAT(r.status().message(), Contains("virtual stages"));
    CHECK(started == 0);
  }
  SECTION("a schedule given as data that does not fit the job") {
    troupe::TrainConfig cfg = tiny(1);
    troupe::RunOptions run = quick();
    troupe::sched::ScheduleSpec spec;
    spec.stages = 2;  // the job has one pipeline stage
    spec.micro_batches = 2;
    auto s = troupe::sched::make_schedule(spec);
    REQUIRE(s);
    run.schedule = std::make_shared<troupe::sched::Schedule>(s.value());
    auto r = troupe::train(cfg, data, cb, run);
    REQUIRE(!r);
    CHECK(r.status().is_bad_input());
    CHECK(started == 0);
  }
  SECTION("a run that starts") {
    auto r = troupe::train(tiny(2), data, cb, quick());
    REQUIRE(r);
    CHECK(started == 1);
    CHECK(iterations_before_start == 0);
    CHECK(iterations == 2);
  }
}

TEST_CASE("train api: the training actor takes a config that names no data (its batches are the data)", "[api]") {
  caf::actor_system_config sys_cfg;
  caf::actor_system system{sys_cfg};
  const troupe::TrainConfig cfg = tiny(4);
  auto training = troupe::spawn_training(system, cfg);
  INFO((training ? std::string("ok") : training.status().message()));
  REQUIRE(training);
  troupe::TokenBatch b;
  b.sequences = cfg.global_batch_size;
  RandomTokens data(cfg.model.seq_length);
  b.tokens.resize(static_cast<size_t>(b.sequences * (cfg.model.seq_length + 1)));
  for (int64_t i = 0; i < b.sequences; ++i)
    REQUIRE(data.read(troupe::DataSplit::train, i, b.tokens.data() + i * (cfg.model.seq_length + 1)));
  caf::scoped_actor self{system};
  double loss = 0;
  self->request(*training, caf::infinite, troupe::train_batch_atom::value, b)
      .receive([&](const troupe::IterationStats& s) { loss = s.lm_loss; },
               [&](caf::error& e) { FAIL(caf::to_string(e)); });
  CHECK(std::isfinite(loss));
  CHECK(loss > 0);
  self->send_exit(*training, caf::exit_reason::user_shutdown);
}

// An MoE model through troupe::train: every iteration reports each MoE layer's load, the same on a
// pipeline 2 x data 2 layout (4 rank actors, the group answering for them) as in one rank, and the
// moe loss the objective adds; a dense model reports none.
TEST_CASE("train api: an MoE model's iterations carry each MoE layer's load, whatever the layout", "[api][moe]") {
  auto data = std::make_shared<RandomTokens>(16);
  troupe::TrainConfig cfg = tiny(3);
  cfg.micro_batch_size = 1;
  cfg.model.moe.router = troupe::MoeRouter::megatron;
  cfg.model.moe.num_experts = {4};
  cfg.model.moe.topk = 2;
  cfg.model.moe.capacity_factor = 1.0;
  cfg.model.moe.aux_loss_coeff = 0.01;
  cfg.model.moe.z_loss_coeff = 0.001;
  auto run = [&](int pp, int dp) {
    troupe::TrainConfig c = cfg;
    c.pipeline_model_parallel_size = pp;
    c.data_parallel_size = dp;
    std::vector<troupe::IterationStats> its;
    troupe::TrainCallbacks cb;
    cb.on_iteration = [&](const troupe::IterationStats& s) { its.push_back(s); };
    auto r = troupe::train(c, data, cb, quick());
    INFO((r ? std::string("ok") : r.status().message()));
    REQUIRE(r);
    return its;
  };
  const auto one = run(1, 1), four = run(2, 2);
  REQUIRE(one.size() == 3);
  REQUIRE(four.size() == 3);
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("iteration " << i + 1);
    REQUIRE(one[i].moe.size() == 2);  // both layers are MoE layers
    double expected_moe_loss = 0;
    for (size_t l = 0; l < one[i].moe.size(); ++l) {
      const troupe::MoeLayerLoad& a = one[i].moe[l];
      const troupe::MoeLayerLoad& b = four[i].moe.at(l);
      CHECK(a.layer == static_cast<int>(l));
      CHECK(a.micro_batches == cfg.global_batch_size);  // micro-batches of one window
      int64_t routed = 0, kept = 0;
      for (size_t e = 0; e < a.routed.size(); ++e) routed += a.routed[e], kept += a.kept[e];
      CHECK(routed == int64_t{cfg.global_batch_size} * cfg.model.seq_length * 2);
      CHECK(kept + a.dropped == routed);
      CHECK(b.routed == a.routed);
      CHECK(b.kept == a.kept);
      CHECK(b.dropped == a.dropped);
      CHECK(b.lb_loss == Approx(a.lb_loss).epsilon(1e-5));
      CHECK(b.z_loss == Approx(a.z_loss).epsilon(1e-5));
      expected_moe_loss += 0.01 * a.lb_loss + 0.001 * a.z_loss;
    }
    CHECK(one[i].moe_loss == Approx(expected_moe_loss).epsilon(1e-12));
    CHECK(four[i].moe_loss == Approx(one[i].moe_loss).epsilon(1e-5));
    CHECK(four[i].lm_loss == Approx(one[i].lm_loss).epsilon(1e-5));
  }
  troupe::TrainConfig dense = tiny(1);
  troupe::TrainCallbacks cb;
  std::vector<troupe::IterationStats> its;
  cb.on_iteration = [&](const troupe::IterationStats& s) { its.push_back(s); };
  REQUIRE(troupe::train(dense, data, cb, quick()));
  REQUIRE(its.size() == 1);
  CHECK(its[0].moe.empty());
  CHECK(its[0].moe_loss == 0);
}

TEST_CASE("train api: open_data without a vocabulary size is refused, not a division by zero", "[api]") {
  troupe::TrainConfig cfg = tiny(1);
  cfg.mock_data = true;  // vocab_size 0: troupe::train would have set it from the tokenizer
  auto data = troupe::open_data(cfg);
  REQUIRE_FALSE(data);
  CHECK(data.status().is_bad_input());
  CHECK_THAT(data.status().message(), Contains("vocab_size is 0"));
}

TEST_CASE("train api: a regroup (a node asks to join) stops the run at its next in-memory snapshot, or now with a save",
          "[api]") {
  auto data = std::make_shared<RandomTokens>(16);
  const std::string dir = std::filesystem::temp_directory_path() / ("troupe-regroup-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::atomic<bool> regroup{true};  // a node asks from the start
  std::vector<int64_t> seen;
  troupe::TrainCallbacks cb;
  cb.on_iteration = [&](const troupe::IterationStats& s) { seen.push_back(s.iteration); };
  troupe::RunOptions run = quick();
  run.regroup = &regroup;
  SECTION("snapshots every 5: the run stops at 5") {
    troupe::TrainConfig cfg = tiny(12);
    cfg.save_memory_interval = 5;
    cfg.save_memory_dir = dir;
    auto r = troupe::train(cfg, data, cb, run);
    REQUIRE(r);
    CHECK(r->regrouped);
    CHECK(r->stopped_early);
    CHECK(r->iteration == 5);
    CHECK(seen.back() == 5);
  }
  SECTION("a save and no snapshots: the run stops after its iteration and saves it") {
    troupe::TrainConfig cfg = tiny(12);
    cfg.save = dir + "/ck";
    cfg.save_interval = 100;
    auto r = troupe::train(cfg, data, cb, run);
    REQUIRE(r);
    CHECK(r->regrouped);
    CHECK(r->iteration == 1);
    std::ifstream latest(cfg.save + "/latest_checkpointed_iteration.txt");
    int64_t saved = -1;
    latest >> saved;
    CHECK(saved == r->iteration);
  }
  SECTION("nothing to resume from: the run goes on to its end") {
    auto r = troupe::train(tiny(6), data, cb, run);
    REQUIRE(r);
    CHECK_FALSE(r->regrouped);
    CHECK(r->iteration == 6);
  }
  std::filesystem::remove_all(dir);
}
