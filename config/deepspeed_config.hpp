// The --deepspeed-config file of `troupe train`: DeepSpeed's JSON keys merged into a TrainConfig
// under the flags given on the command line. Its user is apps/cli/train_options.cpp;
// what each key does in DeepSpeed and what troupe makes of it is documented in the .cpp.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "troupe/train_config.hpp"
#include "troupe/status.hpp"

namespace troupe {

// Flag -> where the file set it ("\"key\" in FILE"), for validation messages.
using FlagOrigins = std::map<std::string, std::string>;
// Whether a flag (its long name) was given on the command line.
using FlagGivenFn = std::function<bool(const char* flag)>;

// Reads `file` and sets each field of `*cfg` whose flag `given` says was not given, recording the
// key in `*origins`. dp (>= 1): the data-parallel size of DeepSpeed's batch rule. Sets
// `*set_global_batch` when the file decided the global batch size. Appends to `*notes` (if given)
// one start-up line per key accepted without effect and per "auto" value. Fails with every
// problem of the file at once ("FILE has N problems:\n  - ..."), each naming the file and the key
// path and saying how to fix it; `*cfg` may then be partly merged. Not thread-safe.
Status merge_deepspeed_config(const std::string& file, int dp, const FlagGivenFn& given,
                              TrainConfig* cfg, FlagOrigins* origins, bool* set_global_batch,
                              std::vector<std::string>* notes = nullptr);

}  // namespace troupe
