// The layout of a job as text: what rank 0 sends the other ranks when it chooses the layout for all
// of them (RunOptions::choose_layout, troupe train --auto-layout over several hosts). One "key value"
// line per setting: tp, pp, dp, cp, ulysses, cp_comm, micro, zero, schedule, vpp, recompute, sp,
// offload.
#pragma once
#include <string>

#include "troupe/status.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

std::string layout_text(const TrainConfig& config);

// Reads layout_text's lines into `config`'s layout settings (every key exactly once, integers in
// 0..2^24, one word each; anything else: an error naming it, `config` then partly written). The job's
// validation checks the layout as a whole afterwards.
Status apply_layout_text(const std::string& text, TrainConfig& config);

}  // namespace troupe
