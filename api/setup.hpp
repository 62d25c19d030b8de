// What troupe::train and troupe::spawn_training check before anything runs (api/train.cpp).
#pragma once
#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// Validates `cfg` for a job of `world` processes (`local_world` of them on this host), sets the
// vocabulary from the tokenizer and checks the memory estimate. Every failure is bad input naming
// the setting and the fix.
Status resolve_config(TrainConfig& cfg, int world, int local_world);

// Until the model of the other families is built (issue 14: the ops, the chunk, the reference),
// a config whose family is not GPT-2's is refused (bad input) instead of training a GPT-2 in its
// place. Temporary: removed when the family model lands.
Status refuse_unbuilt_family(const GptConfig& model);

}  // namespace troupe
