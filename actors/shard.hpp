// The shard actor (see shard_actor in actors/messages.hpp): owns a GptModel, its AdamW state and
// its compute threads. Spawned detached, so its heavy work never runs on CAF's scheduler threads.
// Failures reply with an error (actors/errors.hpp); a non-finite gradient norm replies
// ActorErrc::diverged and leaves the parameters untouched. Checkpoints: it saves its one shard in
// format version 2 (whole tensors; storage/sharded_checkpoint.hpp) and loads any version written by
// any layout.
#pragma once
#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "actors/offload_actor.hpp"
#include "model/config.hpp"

namespace troupe {

struct ShardSpec {
  GptConfig model;
  int max_micro_batch = 1;
  int num_threads = 1;  // size of the shard's compute pool
};

// offload: the process's offload actor, which writes checkpoint shards in the background (default:
// the shard writes its file itself before replying; the caller commits the save either way).
shard_actor spawn_shard(caf::actor_system& system, const ShardSpec& spec, offload_actor offload = {});

}  // namespace troupe
