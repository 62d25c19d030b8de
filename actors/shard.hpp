// The shard actor (see shard_actor in actors/messages.hpp): owns a GptModel, its AdamW state and
// its compute threads. Spawned detached, so its heavy work never runs on CAF's scheduler threads.
// Failures reply with an error (actors/errors.hpp); a non-finite gradient norm replies
// ActorErrc::diverged and leaves the parameters untouched.
#pragma once
#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "model/config.hpp"

namespace troupe {

struct ShardSpec {
  GptConfig model;
  int max_micro_batch = 1;
  int num_threads = 1;  // size of the shard's compute pool
};

shard_actor spawn_shard(caf::actor_system& system, const ShardSpec& spec);

}  // namespace troupe
