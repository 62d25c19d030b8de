#include "plan/goodput.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace troupe::plan {

SavePlan plan_saves(const TrainConfig& layout, const Prediction& prediction, const Cluster& cluster) {
  SavePlan s;
  const double devices = static_cast<double>(cluster.world());
  s.checkpoint_bytes = 12.0 * static_cast<double>(layout.model.num_parameters());
  // Each rank holds its share when ZeRO partitions the states; without ZeRO the first replica's
  // ranks hold it all (the others snapshot nothing).
  const int world = static_cast<int>(std::min<int64_t>(cluster.world(), 1 << 30));
  const double holders = layout.zero_stage >= 1 ? devices : devices / std::max(1, layout.resolved_dp(world));
  const double per_rank = s.checkpoint_bytes / std::max(1.0, holders);
  const double out_of_device = cluster.is_cpu() ? cluster.device.memory_bandwidth / 2 : cluster.pcie_bandwidth;
  s.save_stall_seconds = per_rank / out_of_device;
  const double writers = std::max(1.0, std::min<double>(cluster.nodes, std::ceil(holders / cluster.devices_per_node)));
  s.save_write_seconds = s.checkpoint_bytes / (cluster.storage_bandwidth * writers);
  s.recovery_seconds = cluster.restart_seconds + s.save_write_seconds;
  const double node_share = s.checkpoint_bytes / writers;
  const double to_buddy = cluster.nodes > 1 ? node_share / cluster.inter_node_bandwidth
                                            : node_share / cluster.host_memory_bandwidth;
  s.memory_write_seconds = to_buddy;
  s.memory_recovery_seconds = cluster.rejoin_seconds + s.save_stall_seconds + (cluster.nodes > 1 ? to_buddy : 0);
  const double rate = cluster.failures_per_device_hour * devices / 3600;  // failures per second
  const double iteration = std::max(1e-12, prediction.iteration_seconds);
  if (rate <= 0) {
    s.mtbf_seconds = std::numeric_limits<double>::infinity();
    s.interval_seconds = std::numeric_limits<double>::infinity();
    s.save_interval = 0;  // never needed for failures
    s.goodput = 1;
    s.memory_interval_seconds = s.interval_seconds;
    s.save_memory_interval = 0;
    s.memory_goodput = 1;
    return s;
  }
  const double M = 1 / rate, d = s.save_stall_seconds;
  const double daly = d < 2 * M ? std::sqrt(2 * d * M) * (1 + std::sqrt(d / (2 * M)) / 3 + d / (18 * M)) - d : M;
  // Daly's interval at least `floor` (the background work of one) and one iteration, in whole
  // iterations: the interval in seconds and the goodput a failure costing `recovery` leaves.
  auto choose = [&](double floor, double recovery, int64_t* iterations, double* seconds, double* goodput) {
    const double interval = std::max({daly, floor, iteration});
    *iterations = static_cast<int64_t>(std::min(1e15, std::ceil(interval / iteration)));
    *seconds = static_cast<double>(*iterations) * iteration;
    *goodput = std::max(0.0, 1 - d / *seconds - (*seconds / 2 + recovery) / M);
  };
  choose(s.save_write_seconds, s.recovery_seconds, &s.save_interval, &s.interval_seconds, &s.goodput);
  choose(s.memory_write_seconds, s.memory_recovery_seconds, &s.save_memory_interval, &s.memory_interval_seconds,
         &s.memory_goodput);
  s.mtbf_seconds = M;
  return s;
}

}  // namespace troupe::plan
