// The parallel sizes a `troupe plan` or `troupe train --auto-layout` command line fixed: every one of
// train's layout flags that was given (a DeepSpeed file fixes the ZeRO stage); the rest are searched.
#pragma once

#include "plan/search.hpp"
#include "troupe/train_config.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace troupe::apps {

plan::Fixed fixed_sizes(const CLI::App& cmd, const TrainConfig& cfg);

}  // namespace troupe::apps
