#include "config/stored_config.hpp"

#include <map>

#include "model/params.hpp"
#include "storage/checkpoint.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {

Result<TrainConfig> stored_config(const std::string& dir, int64_t iteration, bool model_in_code, bool gpt_blocks) {
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
  auto tensors = list_checkpoint_tensors(dir, iteration);
  if (!tensors) return tensors.status().as_bad_input();
  std::map<std::string, Shape> model;
  for (const CheckpointTensorInfo& t : tensors.value())
    if (t.path.rfind("model/", 0) == 0) model.emplace(t.path.substr(6), t.shape);
  if (!model_in_code)
    for (const auto& [name, shape] : model)
      if (name.rfind("transformer.", 0) != 0 && name.rfind("lm_head.", 0) != 0)
        return Status::bad_input(
            "the checkpoint in " + where + " holds a model given in code (its tensor " + name +
            " is none of GPT's): troupe eval, ckpt convert and ckpt export read GPT's models -- evaluate it from the "
            "program that defines the model, with troupe::evaluate(dir, data, samples, micro_batch, threads, model), "
            "or with its training actor's eval_batch_atom");
  if (!gpt_blocks) return cfg;  // a model without GPT blocks: the stored GPT sizes describe no tensor
  if (Status st = cfg.value().model.validate(); !st)
    return st.with_context("the config stored in " + where + ": ").as_bad_input();
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
