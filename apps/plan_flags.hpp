// The parallel sizes a `troupe plan` or `troupe train --auto-layout` command line fixed: every one of
// train's layout flags that was given (a DeepSpeed file fixes the ZeRO stage); the rest are searched.
#pragma once

#include <string>
#include <vector>

#include "plan/search.hpp"
#include "troupe/train_config.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace troupe::apps {

plan::Fixed fixed_sizes(const CLI::App& cmd, const TrainConfig& cfg);

// troupe launch's side of `train --auto-layout` on one host: the train flags (what follows "train")
// with --auto-layout replaced by the sizes troupe plan chooses for `world` processes, `local` on this
// host (the flags given stay as they are), so that every process runs the same layout. `*lines`: what
// to print (the choice and the runner-up). Bad input as train would report it.
Result<std::vector<std::string>> resolve_auto_layout(const std::vector<std::string>& train_args, int world, int local,
                                                     std::vector<std::string>* lines);

}  // namespace troupe::apps
