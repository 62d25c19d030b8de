// The checks a TrainConfig passes before anything runs: every setting and the files it names, and
// the layout against the ranks started. Used by the flag parser (apps/cli/train_options.hpp) and by
// troupe::train and spawn_training (api/) for configs built in code.
#pragma once
#include <optional>
#include <string>
#include "config/deepspeed_config.hpp"
#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// What a program handed troupe::train or spawn_training besides the config, which changes what the
// config itself must say.
struct GivenInCode {
  // A DataSource (troupe::train's data argument), or batches sent as messages (spawn_training): the
  // config then names no data (no --mock-data, no data paths; naming some is refused as ambiguous),
  // and the tokenizer only sets the vocabulary.
  bool data = false;
  // A model given in code (RunOptions::model) without GPT layers: GPT's architecture rules (heads,
  // hidden size, MLP, rotary, ...) do not apply; --seq-length still sets the samples' length.
  bool model_without_gpt_layers = false;
};

// Checks every setting and the files they name (all except model.vocab_size, which the tokenizer
// sets later), with the data-parallel size of one process (resolved_dp(1)), and reports every
// problem at once ("N problems:" and one "\n  - " line each; a check whose arithmetic needs another
// setting runs once that one is valid). Each message names the flag and the fix; origins: where
// values came from (the DeepSpeed keys, added to their messages). world_size: the ranks troupe
// launch starts (1 in one process), for the one rule that needs the derived data-parallel size
// before validate_world runs (the expert-parallel size divides it). Reads the filesystem, writes
// nothing.
Status validate_train_config(const TrainConfig& cfg, const FlagOrigins* origins = nullptr,
                             const GivenInCode& given = {}, int world_size = 1);

// --inspect's "[HOST:]PORT" (HOST 127.0.0.1 when absent; "[::1]:PORT" for IPv6), or nothing when it
// is not one (port outside 0..65535, empty host, stray characters).
struct InspectAddress {
  std::string host;
  int port = 0;
};
std::optional<InspectAddress> parse_inspect_address(const std::string& text);

// The checks that need the ranks `troupe launch` started (world_size): tensor x pipeline x
// data-parallel size (derived: world_size / (tensor x pipeline)) must equal world_size, and the
// global batch must split into whole micro-batches on each data-parallel replica. Call after
// validate_train_config succeeded (finalize_train_config does, when given world_size > 1).
Status validate_world(const TrainConfig& cfg, int world_size);

}  // namespace troupe
