// Fault injection for the supervision and durability tests, switched on by environment variables
// (never by a flag: a user cannot turn it on by accident). Each fault fires at most once per
// process, and never in a process that troupe launch restarted (TROUPE_RESTART_COUNT > 0), so a
// restarted job runs through.
//   TROUPE_FAULT_THROW=ACTOR@ITERATION   the chosen actor throws std::runtime_error when it handles
//       that iteration. ACTOR: rankN (the rank actor of global rank N), optimizerN (its optimizer
//       partition), trainer, offload (while writing that iteration's checkpoint shard).
//   TROUPE_FAULT_HANG=ACTOR@ITERATION    the chosen actor (rankN) never returns from that
//       iteration: a stuck rank whose process stays alive.
//   TROUPE_FAULT_KILL_AFTER_SHARD=N      the process kills itself (SIGKILL: no clean-up of any
//       kind) right after a shard of checkpoint iteration N was written, in the middle of the save.
#pragma once
#include <cstdint>
#include <string>

namespace troupe {

// Throws when TROUPE_FAULT_THROW names this actor (kind + index, e.g. "rank" 3 -> "rank3"; index <
// 0: kind alone) and iteration.
void throw_if_asked(const std::string& kind, int index, int64_t iteration);
// Sleeps for ever when TROUPE_FAULT_HANG names this actor and iteration.
void hang_if_asked(const std::string& kind, int index, int64_t iteration);
void crash_if_asked(int64_t iteration);

}  // namespace troupe
