// Megatron-LM's command line as `troupe train` reads it: its flags (troupe train --help lists
// them), an optional --deepspeed-config JSON file merged under them, derived defaults,
// and the checks that run before anything trains (apps/cli/train_options.hpp has the precedence
// rules and every DeepSpeed key understood).
//
//   auto cfg = troupe::parse_train_flags({"--num-layers", "2", "--hidden-size", "64", ...});
//   if (!cfg) { std::fprintf(stderr, "%s\n", cfg.status().message().c_str()); return 2; }
//   troupe::train(cfg.value(), nullptr);
//
// Thread-safe (no shared state). Errors are bad input naming the flag or JSON key and the fix.
#pragma once
#include <string>
#include <vector>

#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// args: the flags alone (no program or subcommand name), in command-line order. world_size: the
// processes the job will have (1 in one process; under troupe launch the launcher's count), which
// sets the data-parallel size when --data-parallel-size is not given.
// Flags of Megatron-LM and Megatron-DeepSpeed that troupe does not register are screened first
// (docs/COMPAT.md): no-ops and other spellings are accepted, with one line each in `*notes` when
// given; refused and unknown ones fail, every problem in one message.
Result<TrainConfig> parse_train_flags(const std::vector<std::string>& args, int world_size = 1,
                                      std::vector<std::string>* notes = nullptr);

}  // namespace troupe
