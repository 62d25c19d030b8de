// Megatron's timers of one step of one rank, from the spans the rank engine records
// (engine/rank_engine.hpp), and the levels Megatron shows them at (--timing-log-level):
//   level 0  forward-backward  the schedule's passes and waits, from the step's start to its last pass
//            optimizer         AdamW on this rank's parameters (or its optimizer partition)
//   level 1  forward-compute   the forward passes
//            backward-compute  the backward passes (zb-h1's weight passes included)
//            all-grads-sync    the data-parallel gradient reduction, the tied embedding's, the
//                              world's norm reduction and the clipping
//            params-all-gather ZeRO's parameter gather after the step (ZeRO 0: nothing to gather)
//   level 2  forward-recv      waiting for activations from the previous pipeline stage
//            backward-recv     waiting for gradients from the next pipeline stage
// Waits shorter than 20 us are not recorded as spans, so the recv timers leave them out.
#pragma once
#include <span>
#include <string_view>
#include <vector>

#include "engine/rank_engine.hpp"

namespace troupe {

// The timers above, in that order, for one step's spans; schedule_us: forward-backward's time.
std::vector<TimerReading> step_timers(std::span<const Span> step, double schedule_us);

// The level of a timer name above; 3 for a name that is none of them.
int timer_level(std::string_view name);

// Over the ranks of a process, one reading per timer name (in the first rank's order): ms the
// largest, min_ms the smallest, ranks_ms each rank's, of the timers at `level` or below.
std::vector<TimerReading> combine_rank_timers(const std::vector<std::vector<TimerReading>>& ranks, int level);

}  // namespace troupe
