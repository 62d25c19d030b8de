// A `troupe plan --cluster FILE` (parse_cluster_json, plan/cluster.hpp): what it accepts is a cluster
// the cost model can divide by (every count >= 1, every size and rate positive and finite, the
// reserve below the memory), and it describes it without failing.
#include <cmath>
#include <string>

#include "fuzz/fuzz_targets.hpp"
#include "plan/cluster.hpp"

namespace troupe::fuzz {

Status cluster_json(const uint8_t* data, size_t size) {
  auto c = plan::parse_cluster_json(std::string(reinterpret_cast<const char*>(data), size), "cluster.json");
  if (!c) return c.status();
  const plan::Cluster& k = c.value();
  TROUPE_CHECK(k.nodes >= 1 && k.devices_per_node >= 1 && k.world() >= 1, "accepted counts are >= 1");
  for (double v : {k.device.memory_bytes, k.device.peak_flops, k.device.peak_flops_fp32, k.device.memory_bandwidth,
                   k.intra_node_bandwidth, k.inter_node_bandwidth, k.pcie_bandwidth, k.host_memory_bandwidth})
    TROUPE_CHECK(std::isfinite(v) && v > 0, "accepted sizes and rates are positive and finite");
  TROUPE_CHECK(k.device.memory_reserve_bytes >= 0 && k.device.memory_reserve_bytes < k.device.memory_bytes,
               "the accepted reserve is below the memory");
  TROUPE_CHECK(!plan::describe(k).empty(), "an accepted cluster describes itself");
  return Status::ok();
}

}  // namespace troupe::fuzz
