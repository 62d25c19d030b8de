// Offline resharding (`troupe ckpt convert`): loads a checkpoint (version 1 or 2, any layout) into the
// target layout's ranks, in this process, and saves it as a version-2 checkpoint of that layout, with
// the optimizer state. Training never needs it (--load reshards by itself); it is for handing a
// checkpoint to a job that should start reading only its own shards, and for inspecting a layout.
#pragma once
#include <cstdint>
#include <string>

#include "engine/rank_engine.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct ConvertTarget {
  int tp = 1, pp = 1, dp = 1, zero_stage = 0;
  int virtual_chunks = 1;
  // Expert parallelism (a model with MoE layers): ep consecutive dp ranks split the experts (ep
  // divides dp and every MoE layer's experts); 0: the checkpoint's own, if dp allows, else 1.
  int ep = 0;
};

// iteration < 0: the latest. `out` gets DIR/iter_N/ with the same iteration, samples and config (its
// parallel fields set to the target) and its own latest pointer.
// Returns the expert-parallel size the shards were written for (1 without experts).
Result<int> convert_checkpoint(const std::string& in, int64_t iteration, const std::string& out,
                               const ConvertTarget& target);

}  // namespace troupe
