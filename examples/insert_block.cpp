// Blocks of your own inside GPT: troupe::gpt_model(config, insertions) places a bottleneck adapter
// (examples/adapter_block.hpp) between GPT's layers 0 and 1, and a second one right after the last
// layer, before GPT's own tied head, which stays. The same model trains on tensor 2 x pipeline 2 with
// ZeRO-1 to the 1x1x1 losses within 1e-5, and under the zero-bubble schedule with the adapters' weight
// gradients in the W pass (SplitAdapter); troupe::evaluate takes its checkpoint (saved by the 4-rank
// layout) with the model given; the training actor runs the same model in your actor system; an
// insertion outside the model is refused.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>

#include <troupe/actors.hpp>

#include "adapter_block.hpp"
#include "example_util.hpp"

namespace {

// GPT's layers with an adapter after layer 0 and one after the last layer: the insertion points
// follow the config's pipeline split, so the same call serves every layout.
template <class AdapterType>
std::shared_ptr<const troupe::Model> with_adapters(const troupe::TrainConfig& cfg) {
  auto adapter = [](int index) {
    return troupe::Block::custom("adapter" + std::to_string(index), [index](const troupe::StagePlace& at) {
      return std::make_unique<AdapterType>(at, index, /*rank=*/4);
    });
  };
  auto m = troupe::gpt_model(cfg, {{0, adapter(0)}, {cfg.model.num_layers - 1, adapter(1)}});
  if (!m) example::fail(m.status().message());
  return std::make_shared<troupe::Model>(std::move(m).value());
}

}  // namespace

int main() {
  using namespace example;
  troupe::TrainConfig cfg = with_mock_data(small_gpt(6));
  troupe::RunOptions run;
  run.model = with_adapters<example::Adapter>(cfg);
  const std::vector<double> single = losses_of(cfg, nullptr, run);

  troupe::TrainConfig par = cfg;
  par.tensor_model_parallel_size = 2;
  par.pipeline_model_parallel_size = 2;
  par.zero_stage = 1;
  par.data_parallel_size = 1;
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-insert-" + std::to_string(::getpid()));
  par.save = dir.string();
  run.model = with_adapters<example::Adapter>(par);
  check(same_losses(single, losses_of(par, nullptr, run)), "tp 2 x pp 2 with ZeRO-1 gives the 1x1x1 losses within 1e-5");
  check(!same_losses(single, losses_of(cfg)), "the adapters change the model (GPT alone trains other losses)");

  troupe::TrainConfig zb = par;
  zb.save.clear();
  zb.pipeline_schedule = "zb-h1";
  run.model = with_adapters<example::SplitAdapter>(zb);
  const std::vector<double> split = losses_of(zb, nullptr, run);
  check(same_losses(single, split) && example::SplitAdapter::weight_passes.load() > 0,
        "ZB-H1 runs the adapters' weight gradients in the W pass (" +
            std::to_string(example::SplitAdapter::weight_passes.load()) + " weight passes), same losses");

  // The checkpoint of the 4-rank run, evaluated on one rank with the model given.
  troupe::TrainConfig sized = cfg;
  sized.model.vocab_size = 257;  // the byte-level tokenizer's (troupe::train sets it itself)
  auto data = troupe::open_data(sized);
  if (!data) fail(data.status().message());
  auto eval = troupe::evaluate(dir.string(), data.value(), 16, 2, 2, with_adapters<example::Adapter>(par));
  check(eval && std::isfinite(eval.value().loss) && eval.value().iteration == 6,
        "evaluate() takes the adapters' checkpoint: loss " + (eval ? std::to_string(eval.value().loss) : eval.status().message()));
  auto gpt_only = troupe::evaluate(dir.string(), data.value(), 16, 2, 2);
  check(!gpt_only && gpt_only.status().message().find("adapter.") != std::string::npos,
        "without the model it is refused, naming a tensor GPT does not have");

  // The training actor runs the same model.
  caf::actor_system_config system_config;
  caf::actor_system system{system_config};
  troupe::TrainingOptions options;
  options.model = with_adapters<example::Adapter>(par);
  troupe::TrainConfig actor_cfg = par;
  actor_cfg.save.clear();
  actor_cfg.mock_data = false;  // the batches it gets are its data
  auto training = troupe::spawn_training(system, actor_cfg, options);
  check(static_cast<bool>(training), "the training actor takes the model given in code");
  caf::scoped_actor self{system};
  troupe::TokenBatch batch;
  batch.sequences = actor_cfg.global_batch_size;
  for (int64_t i = 0; i < batch.sequences * (actor_cfg.model.seq_length + 1); ++i)
    batch.tokens.push_back(static_cast<int32_t>((i * 7) % 200));
  double loss = 0;
  self->request(*training, caf::infinite, troupe::train_batch_atom::value, batch)
      .receive([&](const troupe::IterationStats& s) { loss = s.lm_loss; }, [&](caf::error& e) { fail(caf::to_string(e)); });
  check(std::isfinite(loss) && loss > 0, "one step of the adapters' model in your actor system: loss " + std::to_string(loss));
  self->send_exit(*training, caf::exit_reason::user_shutdown);

  // A place outside the model is refused.
  auto refused = troupe::gpt_model(cfg, {{cfg.model.num_layers, troupe::Block::custom("late", nullptr)}});
  check(!refused && refused.status().is_bad_input(), "an insertion after a layer the model has not is refused: " +
                                                         (refused ? std::string() : refused.status().message()));
  std::filesystem::remove_all(dir);
  return 0;
}
