// troupe inside your own CAF actor system: a feeder actor of yours makes the batches itself, sends
// them to troupe's training actor as typed messages, receives each IterationStats as a reply, then
// asks for an evaluation and a checkpoint. The same batches through troupe::train (as a DataSource)
// give the same losses, and the checkpoint loads with troupe::evaluate.
#include <filesystem>
#include <memory>

#include <troupe/actors.hpp>

#include "example_util.hpp"

namespace {

// Window k: 33 tokens counting up from a start that depends on k (a pattern the model learns).
std::vector<int32_t> window(int64_t k, int seq_length) {
  std::vector<int32_t> w(seq_length + 1);
  for (int i = 0; i <= seq_length; ++i) w[i] = static_cast<int32_t>(10 + (k * 7919 + i) % 40);
  return w;
}

troupe::TokenBatch batch(int64_t first, int count, int seq_length) {
  troupe::TokenBatch b;
  b.sequences = count;
  for (int64_t k = first; k < first + count; ++k) {
    const auto w = window(k, seq_length);
    b.tokens.insert(b.tokens.end(), w.begin(), w.end());
  }
  return b;
}

// The same windows as a DataSource, for troupe::train.
class Windows : public troupe::DataSource {
 public:
  explicit Windows(int seq_length) : seq_(seq_length) {}
  int64_t seq_length() const override { return seq_; }
  int64_t num_windows(troupe::DataSplit) const override { return 1 << 20; }
  troupe::Status read(troupe::DataSplit, int64_t sample, int32_t* out) const override {
    const auto w = window(sample, seq_);
    std::copy(w.begin(), w.end(), out);
    return troupe::Status::ok();
  }
  std::string describe() const override { return "counting windows"; }

 private:
  int seq_;
};

using go_atom = caf::atom_constant<caf::atom("go")>;
using result_atom = caf::atom_constant<caf::atom("result")>;

struct FeederState {
  troupe::training_actor training;
  caf::actor reporter;
  int steps = 0, global = 0, seq = 0;
  std::vector<double> losses;
};

// Sends batch after batch, each when the previous step has answered; then evaluation, then a save;
// reports (result_atom, losses, eval loss, checkpoint iteration) to `reporter`.
caf::behavior feeder(caf::stateful_actor<FeederState>* self, troupe::training_actor training, caf::actor reporter,
                     int steps, int global, int seq) {
  self->state.training = training;
  self->state.reporter = reporter;
  self->state.steps = steps;
  self->state.global = global;
  self->state.seq = seq;
  return {
      [self](go_atom) {
        auto& s = self->state;
        if (static_cast<int>(s.losses.size()) < s.steps) {
          const int64_t first = static_cast<int64_t>(s.losses.size()) * s.global;
          self->request(s.training, caf::infinite, troupe::train_batch_atom::value, batch(first, s.global, s.seq))
              .then([self](const troupe::IterationStats& it) {
                self->state.losses.push_back(it.lm_loss);
                self->send(self, go_atom::value);
              });
          return;
        }
        self->request(s.training, caf::infinite, troupe::eval_batch_atom::value, batch(1000, 16, s.seq))
            .then([self](const troupe::EvalStats& e) {
              const std::string dir = (std::filesystem::temp_directory_path() / "troupe_example_actor").string();
              std::filesystem::remove_all(dir);
              self->request(self->state.training, caf::infinite, troupe::save_to_atom::value, dir)
                  .then([self, e](const troupe::SavedCheckpoint& c) {
                    self->send(self->state.reporter, result_atom::value, self->state.losses, e.loss, c.iteration);
                    self->quit();
                  });
            });
      },
  };
}

}  // namespace

int main() {
  using namespace example;
  troupe::TrainConfig cfg = small_gpt(30);
  cfg.lr = 3e-3;
  cfg.tensor_model_parallel_size = 2;  // four rank actors in your actor system
  cfg.pipeline_model_parallel_size = 2;
  const int steps = 30;

  caf::actor_system_config system_config;
  caf::actor_system system{system_config};
  auto training = troupe::spawn_training(system, cfg);
  if (!training) fail(training.status().message());
  caf::scoped_actor self{system};
  auto state = self->request(*training, caf::infinite, troupe::state_atom::value);
  state.receive([](const troupe::TrainingState& s) { std::printf("training actor: %s, iteration %lld\n", s.layout.c_str(), (long long)s.iteration); },
                [](caf::error& e) { fail(caf::to_string(e)); });

  // A batch of the wrong shape is answered with an error, and the actor goes on.
  troupe::TokenBatch wrong = batch(0, cfg.global_batch_size, cfg.model.seq_length);
  wrong.tokens.pop_back();
  bool refused = false;
  self->request(*training, caf::infinite, troupe::train_batch_atom::value, wrong)
      .receive([](const troupe::IterationStats&) {}, [&](caf::error& e) {
        refused = true;
        std::printf("refused: %s\n", system.render(e).c_str());
      });
  check(refused, "a batch of the wrong shape is refused with an error message");

  auto mine = self->spawn(feeder, *training, caf::actor_cast<caf::actor>(self), steps, cfg.global_batch_size,
                          cfg.model.seq_length);
  self->send(mine, go_atom::value);
  std::vector<double> losses;
  double eval_loss = 0;
  int64_t saved_iteration = -1;
  self->receive([&](result_atom, std::vector<double>& l, double e, int64_t it) {
    losses = std::move(l);
    eval_loss = e;
    saved_iteration = it;
  });
  check(static_cast<int>(losses.size()) == steps && saved_iteration == steps,
        "the feeder trained " + std::to_string(steps) + " steps through messages and saved iteration " +
            std::to_string(saved_iteration));
  std::printf("loss: first %.4f, last %.4f, eval %.4f\n", losses.front(), losses.back(), eval_loss);
  check(losses.back() < 0.5 * losses.front(), "the model learns from the feeder's batches");
  self->send_exit(*training, caf::exit_reason::user_shutdown);

  // The same windows through troupe::train: the same losses.
  check(same_losses(losses, losses_of(cfg, std::make_shared<Windows>(cfg.model.seq_length))),
        "troupe::train on the same windows gives the same losses within 1e-5");
  // The checkpoint is an ordinary troupe checkpoint.
  const std::string dir = (std::filesystem::temp_directory_path() / "troupe_example_actor").string();
  auto eval = troupe::evaluate(dir, std::make_shared<Windows>(cfg.model.seq_length), 16, 2, 2);
  if (!eval) fail(eval.status().message());
  check(eval.value().iteration == steps, "troupe::evaluate loads the checkpoint the training actor saved");
  std::filesystem::remove_all(dir);
  return 0;
}
