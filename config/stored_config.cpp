#include "config/stored_config.hpp"

#include <map>

#include "model/params.hpp"
#include "storage/checkpoint.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {

Result<TrainConfig> stored_config(const std::string& dir, int64_t iteration) {
  if (iteration < 0) {
    auto it = latest_iteration(dir);
    if (!it) return it.status().as_bad_input();
    iteration = it.value();
  }
  const std::string where = iteration_dir(dir, iteration);
  auto meta = read_checkpoint_meta(dir, iteration);
  if (!meta) return meta.status().as_bad_input();
  auto cfg = TrainConfig::from_json(meta.value().config_json);
  if (!cfg) return cfg.status().with_context("the config stored in " + where + ": ").as_bad_input();
  if (Status st = cfg.value().model.validate(); !st)
    return st.with_context("the config stored in " + where + ": ").as_bad_input();
  auto tensors = list_checkpoint_tensors(dir, iteration);
  if (!tensors) return tensors.status().as_bad_input();
  std::map<std::string, Shape> model;
  for (const CheckpointTensorInfo& t : tensors.value())
    if (t.path.rfind("model/", 0) == 0) model.emplace(t.path.substr(6), t.shape);
  // Count first: a config claiming a million layers is refused before its specs are even listed.
  GptConfig one = cfg.value().model, two = one;
  one.num_layers = 1;
  two.num_layers = 2;
  const int64_t per_layer = static_cast<int64_t>(gpt2_param_specs(two).size() - gpt2_param_specs(one).size());
  const int64_t expected = static_cast<int64_t>(gpt2_param_specs(one).size()) - per_layer +
                           per_layer * static_cast<int64_t>(cfg.value().model.num_layers);
  if (expected > static_cast<int64_t>(model.size()))
    return Status::bad_input("the config stored in " + where + " describes " +
                             std::to_string(cfg.value().model.num_layers) + " layers (" + std::to_string(expected) +
                             " tensors) but the checkpoint holds " + std::to_string(model.size()) +
                             " model tensors -- the metadata does not belong to these shards; restore the checkpoint "
                             "from a copy");
  for (const ParamSpec& spec : gpt2_param_specs(cfg.value().model)) {
    auto found = model.find(spec.name);
    if (found == model.end())
      return Status::bad_input("the config stored in " + where + " describes a model with tensor " + spec.name +
                               ", which the checkpoint does not hold -- the metadata does not belong to these shards; "
                               "restore the checkpoint from a copy");
    if (!(found->second == spec.global_shape))
      return Status::bad_input("the config stored in " + where + " gives " + spec.name + " the shape " +
                               spec.global_shape.str() + " but the checkpoint holds " + found->second.str() +
                               " -- the metadata does not belong to these shards; restore the checkpoint from a copy");
  }
  return cfg;
}

}  // namespace troupe
