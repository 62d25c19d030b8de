// What troupe::train and troupe::spawn_training check before anything runs (api/train.cpp).
#pragma once
#include "troupe/stage.hpp"
#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// What the caller gave besides the config: data of its own (a DataSource, or batches as messages),
// and a model given in code (null: GPT's own).
struct GivenToRun {
  bool data = false;
  const Model* model = nullptr;
};

// Validates `cfg` for a job of `world` processes (`local_world` of them on this host), sets the
// vocabulary from the tokenizer and checks the memory estimate. Every failure is bad input naming
// the setting and the fix.
Status resolve_config(TrainConfig& cfg, int world, int local_world, const GivenToRun& given = {});

}  // namespace troupe
