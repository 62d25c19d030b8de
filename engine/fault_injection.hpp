// Fault injection for the supervision and durability tests, switched on by environment variables
// (never by a flag: a user cannot turn it on by accident). Each fault fires at most once per
// process, and never in a process that troupe launch restarted (TROUPE_RESTART_COUNT > 0), so a
// restarted job runs through.
//   TROUPE_FAULT_THROW=ACTOR@ITERATION   the chosen actor throws std::runtime_error when it handles
//       that iteration. ACTOR: rankN (the rank actor of global rank N), optimizerN (its optimizer
//       partition), trainer, offload (while writing that iteration's checkpoint shard).
//   TROUPE_FAULT_HANG=ACTOR@ITERATION    the chosen actor (rankN) never returns from that
//       iteration: a stuck rank whose process stays alive.
//   TROUPE_FAULT_SLOW=rankN:MS           rank N (global) sleeps MS milliseconds inside each of its
//       forward passes, every iteration: a slow rank for the straggler scores (engine/stragglers.hpp).
//       Unlike the others it fires on every pass.
//   TROUPE_FAULT_KILL_AFTER_SHARD=N      the process kills itself (SIGKILL: no clean-up of any
//       kind) right after a shard of checkpoint iteration N was written, in the middle of the save.
//   TROUPE_FAULT_NAN=[rankN/]WHERE:TENSOR[:forward|:backward|:weight]@ITERATION[/MICRO]
//       writes a NaN into element 0 of that tensor each time the op that computes it runs for
//       micro-batch MICRO (default 0) of that iteration, on global rank N (default: every rank that
//       computes it), deterministically, so a replay of the iteration (engine/nan_watch.hpp) hits it
//       again. WHERE: layerN (a transformer layer, global index), embedding, head, custom.BLOCK (a
//       custom block by name); TENSOR: an op's name (model/op_probe.hpp lists them and what each
//       direction means; a custom block's: its output and input tensors' names, loss, params).
//       [rankN/]optimizer@ITERATION: a NaN in the first parameter the rank's optimizer step updated.
//       Unlike the others it fires in every iteration that matches (the replay needs it), and a
//       malformed spec is bad input (exit 2) naming the valid tensors.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "model/op_probe.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct NanFault {
  std::string text;  // as given
  int rank = -1;     // global rank; -1: every rank
  bool optimizer = false;
  int layer = 0;     // a ProbePoint's layer (kEmbeddingProbe, kHeadProbe, kCustomProbe or >= 0)
  std::string block; // kCustomProbe
  std::string tensor;
  ProbeDir dir = ProbeDir::forward;
  int64_t iteration = 0;
  int micro_batch = 0;
  bool matches(const ProbePoint& at) const;
};
Result<NanFault> parse_nan_fault(const std::string& text);
// TROUPE_FAULT_NAN: nothing when unset or in a restarted process; bad input when malformed.
Result<std::optional<NanFault>> nan_fault_from_env();
// The fault fits a job of `num_layers` layers and `world_size` ranks (bad input otherwise).
Status check_nan_fault(const NanFault& fault, int num_layers, int world_size);

// Throws when TROUPE_FAULT_THROW names this actor (kind + index, e.g. "rank" 3 -> "rank3"; index <
// 0: kind alone) and iteration.
void throw_if_asked(const std::string& kind, int index, int64_t iteration);
// Sleeps for ever when TROUPE_FAULT_HANG names this actor and iteration.
void hang_if_asked(const std::string& kind, int index, int64_t iteration);
void crash_if_asked(int64_t iteration);
// TROUPE_FAULT_SLOW's milliseconds for global rank `rank` (0: none; a malformed value: none).
double slow_forward_ms(int rank);

}  // namespace troupe
