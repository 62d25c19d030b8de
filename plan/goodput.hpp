// Failures at scale in `troupe plan`: how often the job fails, what a checkpoint costs, the save
// interval that loses the least (Young 1974, Daly 2006) and the goodput it leaves.
//
//   M  the job's mean time between failures: 3600 / (failures per device-hour x devices) seconds
//   d  what a save stalls training: the rank's share of the checkpoint copied out of the device (over
//      PCIe on a GPU, through memory on the CPU); troupe writes it to storage in the background
//   W  that background write: the checkpoint's bytes per node over the storage bandwidth (a save
//      interval shorter than W would queue saves, so the interval is at least W)
//   R  what a failure costs besides the lost work: the restart and the load (bytes per node over the
//      storage bandwidth)
//   interval  Daly's optimum sqrt(2 d M) (1 + sqrt(d / 2M) / 3 + d / 18M) - d (for d < 2M; else M),
//             at least W, rounded up to whole iterations
//   goodput   1 - d / interval - (interval / 2 + R) / M (the first-order expected loss), at least 0
// With in-memory snapshots and in-job recovery (--save-memory-interval, --in-job-recovery; docs/
// RESILIENCE.md) the same formulas with: the same stall d (the copy out of the device is what a
// snapshot costs the training), Wm the background copy of a node's share to its buddy node over the
// network (within one node: through host memory), and Rm = the rejoin (Cluster::rejoin_seconds) +
// the rank's share back into the device + a replaced node's share fetched from its buddy.
// The checkpoint holds, per parameter, the fp32 weights and Adam's two moments: 12 bytes (the
// 16-bit working copy is not saved), each parameter once (ZeRO partitions or the first data-parallel
// replica), spread over the nodes.
#pragma once
#include <cstdint>

#include "plan/cost_model.hpp"

namespace troupe::plan {

struct SavePlan {
  double mtbf_seconds = 0;          // M (infinite when the failure rate is 0)
  double checkpoint_bytes = 0;      // the whole job's
  double save_stall_seconds = 0;    // d
  double save_write_seconds = 0;    // W
  double recovery_seconds = 0;      // R
  double interval_seconds = 0;      // the save interval, in seconds of training
  int64_t save_interval = 0;        // ... in iterations (--save-interval)
  double goodput = 1;               // the fraction of time that trains
  // In-memory snapshots with in-job recovery instead of saves to storage and restarts.
  double memory_write_seconds = 0;     // Wm
  double memory_recovery_seconds = 0;  // Rm
  double memory_interval_seconds = 0;
  int64_t save_memory_interval = 0;    // --save-memory-interval
  double memory_goodput = 1;
};

SavePlan plan_saves(const TrainConfig& layout, const Prediction& prediction, const Cluster& cluster);

}  // namespace troupe::plan
