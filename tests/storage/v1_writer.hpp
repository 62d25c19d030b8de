// Version-1 checkpoints for the tests (tests/storage/v1_writer.cpp): troupe reads them, never writes
// them.
#pragma once
#include <string>

#include "storage/checkpoint.hpp"
#include "troupe/status.hpp"

namespace troupe::test {

// Writes checkpoint_file(dir, meta.iteration) (replacing an existing one atomically), then points
// latest_checkpointed_iteration.txt at it. Names must be non-empty, without '/', unique per
// section. The optimizer group is written only when exp_avg or exp_avg_sq is non-empty. On failure
// the previous files are untouched (a temporary file may remain; it is overwritten by the next
// save).
Status save_v1_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                       const CheckpointContents& contents);

}  // namespace troupe::test
