#include "plan/cluster.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/spelling.hpp"

namespace troupe::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGB = 1e9;

// The data sheets' figures (docs/PLAN.md, "Presets", has the sources). Bandwidths are one direction:
// NVLink 3 is 600 GB/s per A100 in both directions together, 300 each way; a DGX A100 has eight
// 200 Gb/s HDR adapters for the compute network (200 GB/s per node), a DGX H100/H200 eight 400 Gb/s
// NDR ones. Memory is what nvidia-smi reports (81,920 MiB on an A100-80GB).
struct Preset {
  const char* name;
  double memory_mib, peak_tflops, peak_tflops_fp32, hbm_gbps;
  int sms;
  double nvlink_gbps, network_gbps, pcie_gbps, host_gbps;
};
constexpr Preset kPresets[] = {
    {"A100-40GB", 40960, 312, 19.5, 1555, 108, 300, 200, 25, 409.6},
    {"A100-80GB", 81920, 312, 19.5, 2039, 108, 300, 200, 25, 409.6},
    {"H100-80GB", 81559, 989, 67, 3350, 132, 450, 400, 50, 614.4},
    {"H200", 143771, 989, 67, 4800, 132, 450, 400, 50, 614.4},
};

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

Cluster from_preset(const Preset& p) {
  Cluster c;
  c.device.name = p.name;
  c.device.memory_bytes = p.memory_mib * kMiB;
  c.device.memory_reserve_bytes = 2 * kGiB;
  c.device.peak_flops = p.peak_tflops * 1e12;
  c.device.peak_flops_fp32 = p.peak_tflops_fp32 * 1e12;
  c.device.memory_bandwidth = p.hbm_gbps * kGB;
  c.device.compute_units = p.sms;
  c.nodes = 1;
  c.devices_per_node = 8;
  c.intra_node_bandwidth = p.nvlink_gbps * kGB;
  c.inter_node_bandwidth = p.network_gbps * kGB;
  c.pcie_bandwidth = p.pcie_gbps * kGB;
  c.host_memory_bandwidth = p.host_gbps * kGB;
  c.intra_node_latency = 5e-6;
  c.inter_node_latency = 10e-6;
  return c;
}

// The JSON keys: each reads one number into the cluster (after a range check).
struct Key {
  const char* name;
  double lo, hi;  // the accepted range, both ends included
  bool integer;
  std::function<void(Cluster&, double)> set;
};

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"nodes", 1, 1e6, true, [](Cluster& c, double v) { c.nodes = static_cast<int>(v); }},
      {"gpus_per_node", 1, 4096, true, [](Cluster& c, double v) { c.devices_per_node = static_cast<int>(v); }},
      {"memory_gib", 1.0 / 1024, 1e6, false, [](Cluster& c, double v) { c.device.memory_bytes = v * kGiB; }},
      {"memory_reserve_gib", 0, 1e6, false, [](Cluster& c, double v) { c.device.memory_reserve_bytes = v * kGiB; }},
      {"peak_tflops", 1e-6, 1e6, false, [](Cluster& c, double v) { c.device.peak_flops = v * 1e12; }},
      {"peak_tflops_fp32", 1e-6, 1e6, false, [](Cluster& c, double v) { c.device.peak_flops_fp32 = v * 1e12; }},
      {"memory_bandwidth_gbps", 1e-3, 1e6, false, [](Cluster& c, double v) { c.device.memory_bandwidth = v * kGB; }},
      {"compute_units", 1, 1e6, true, [](Cluster& c, double v) { c.device.compute_units = static_cast<int>(v); }},
      {"nvlink_gbps", 1e-3, 1e6, false, [](Cluster& c, double v) { c.intra_node_bandwidth = v * kGB; }},
      {"network_gbps", 1e-3, 1e6, false, [](Cluster& c, double v) { c.inter_node_bandwidth = v * kGB; }},
      {"pcie_gbps", 1e-3, 1e6, false, [](Cluster& c, double v) { c.pcie_bandwidth = v * kGB; }},
      {"host_memory_bandwidth_gbps", 1e-3, 1e6, false, [](Cluster& c, double v) { c.host_memory_bandwidth = v * kGB; }},
      {"intra_node_latency_us", 0, 1e6, false, [](Cluster& c, double v) { c.intra_node_latency = v * 1e-6; }},
      {"inter_node_latency_us", 0, 1e6, false, [](Cluster& c, double v) { c.inter_node_latency = v * 1e-6; }},
      {"failures_per_gpu_hour", 0, 1, false, [](Cluster& c, double v) { c.failures_per_device_hour = v; }},
      {"storage_gbps", 1e-3, 1e6, false, [](Cluster& c, double v) { c.storage_bandwidth = v * kGB; }},
      {"restart_seconds", 0, 1e6, false, [](Cluster& c, double v) { c.restart_seconds = v; }},
      {"rejoin_seconds", 0, 1e6, false, [](Cluster& c, double v) { c.rejoin_seconds = v; }},
  };
  return k;
}

std::string key_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

Status join(const std::vector<std::string>& problems) {
  if (problems.empty()) return Status::ok();
  if (problems.size() == 1) return Status::bad_input(problems[0]);
  std::string message = fmt::format("{} problems:", problems.size());
  for (const std::string& p : problems) message += "\n  - " + p;
  return Status::bad_input(message);
}

}  // namespace

std::string cluster_preset_names() {
  std::string names;
  for (const Preset& p : kPresets) names += std::string(p.name) + ", ";
  return names + "cpu";
}

Result<Cluster> cluster_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (lower(name) == lower(p.name)) return from_preset(p);
  if (lower(name) == "cpu") {
    Cluster c;
    c.device.name = "cpu";
    return c;
  }
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  names.emplace_back("cpu");
  const auto near = nearest_spellings(name, names, 1, 3);
  return Status::bad_input(fmt::format("--gpu {} is not a preset{} -- use one of {}, or describe the device in --cluster FILE",
                                       name.size() > 64 ? name.substr(0, 64) + "..." : name,
                                       near.empty() ? "" : " (did you mean " + near[0] + "?)", cluster_preset_names()));
}

Cluster measured_cpu_cluster(int ranks, int cores, double sgemm_peak_gflops, double memory_bandwidth,
                             double memory_bytes) {
  Cluster c;
  const double r = std::max(1, ranks);
  c.device.name = "cpu";
  // The ranks split the cores (troupe's --num-threads over the ranks of a process) and the memory.
  c.device.memory_bytes = memory_bytes / r;
  c.device.memory_reserve_bytes = 0;
  c.device.peak_flops = sgemm_peak_gflops * 1e9 / r;
  c.device.peak_flops_fp32 = c.device.peak_flops;
  c.device.memory_bandwidth = memory_bandwidth / r;
  c.device.compute_units = std::max(1, cores / std::max(1, ranks));
  c.nodes = 1;
  c.devices_per_node = std::max(1, ranks);
  // Ranks of one host exchange through shared memory: a copy, at about half the memory's bandwidth
  // (a read and a write), shared by the ranks sending at once.
  c.intra_node_bandwidth = memory_bandwidth / 2 / r;
  c.inter_node_bandwidth = 1.25e9;  // a 10 Gb/s Ethernet, if a second host is named in a file
  c.pcie_bandwidth = memory_bandwidth / 2 / r;
  c.host_memory_bandwidth = memory_bandwidth;
  c.intra_node_latency = 5e-6;
  c.inter_node_latency = 50e-6;
  return c;
}

Result<Cluster> parse_cluster_json(const std::string& text, const std::string& origin, const Cluster* cpu_base) {
  const std::string where = "--cluster " + origin;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return Status::bad_input(where + ": not valid JSON -- write one object, e.g. {\"gpu\": \"A100-80GB\", \"nodes\": 4}");
  if (!j.is_object())
    return Status::bad_input(where + ": the top level is not an object -- write {\"gpu\": \"A100-80GB\", \"nodes\": 4, ...}");
  std::vector<std::string> problems;
  Cluster c;
  std::string gpu = "A100-80GB";
  if (auto it = j.find("gpu"); it != j.end()) {
    if (!it->is_string()) problems.push_back(where + ": \"gpu\" is not a string -- name a preset: " + cluster_preset_names());
    else gpu = it->get<std::string>();
  }
  if (auto preset = cluster_preset(gpu); preset) {
    c = preset.value();
    if (c.is_cpu() && cpu_base != nullptr) c = *cpu_base;
  } else {
    problems.push_back(where + ": \"gpu\": " + preset.status().message());
  }
  std::vector<std::string> names{"gpu"};
  for (const Key& k : keys()) names.emplace_back(k.name);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "gpu") continue;
    const auto found = std::find_if(keys().begin(), keys().end(), [&](const Key& k) { return key == k.name; });
    if (found == keys().end()) {
      const auto near = nearest_spellings(key, names, 1);
      problems.push_back(fmt::format("{}: unknown key \"{}\" -- {}", where, key.size() > 64 ? key.substr(0, 64) + "..." : key,
                                     near.empty() ? "the keys are " + key_list(names)
                                                  : "did you mean \"" + near[0] + "\"?"));
      continue;
    }
    const nlohmann::json& v = it.value();
    if (!v.is_number()) {
      problems.push_back(fmt::format("{}: \"{}\" is not a number -- give one between {} and {}", where, key, found->lo, found->hi));
      continue;
    }
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < found->lo || x > found->hi || (found->integer && x != std::floor(x))) {
      problems.push_back(fmt::format("{}: \"{}\" is {} -- give {} between {} and {}", where, key, v.dump(),
                                     found->integer ? "a whole number" : "a number", found->lo, found->hi));
      continue;
    }
    found->set(c, x);
  }
  if (!problems.empty()) return join(problems);
  if (Status st = validate_cluster(c); !st) return st.with_context(where + ": ");
  return c;
}

Status validate_cluster(const Cluster& c) {
  std::vector<std::string> problems;
  auto positive = [&](double v, const char* what, const char* fix) {
    if (!(v > 0) || !std::isfinite(v)) problems.push_back(fmt::format("{} is {} -- {}", what, v, fix));
  };
  if (c.nodes < 1) problems.push_back(fmt::format("--nodes is {} -- give at least 1", c.nodes));
  if (c.devices_per_node < 1)
    problems.push_back(fmt::format("--gpus-per-node is {} -- give at least 1", c.devices_per_node));
  if (c.world() > (int64_t{1} << 24))
    problems.push_back(fmt::format("{} devices in all -- plan for at most {} (nodes x gpus per node)", c.world(), 1 << 24));
  positive(c.device.memory_bytes, "the device memory (memory_gib, --gpu-memory-gib)", "give the device's memory in GiB");
  positive(c.device.peak_flops, "the peak (peak_tflops, --peak-tflops)", "give the dense 16-bit TFLOP/s of one device");
  positive(c.device.peak_flops_fp32, "the fp32 peak (peak_tflops_fp32)", "give the fp32 TFLOP/s of one device");
  positive(c.device.memory_bandwidth, "the memory bandwidth (memory_bandwidth_gbps)", "give the device memory's GB/s");
  if (c.device.compute_units < 1) problems.push_back("compute_units is below 1 -- give the device's SMs (cores on a CPU)");
  positive(c.intra_node_bandwidth, "the NVLink bandwidth (nvlink_gbps, --nvlink-gbps)", "give GB/s per device, one direction");
  positive(c.inter_node_bandwidth, "the network bandwidth (network_gbps, --network-gbps)", "give GB/s per node, one direction");
  positive(c.pcie_bandwidth, "the PCIe bandwidth (pcie_gbps)", "give GB/s per device, one direction");
  positive(c.host_memory_bandwidth, "the host memory bandwidth (host_memory_bandwidth_gbps)", "give GB/s per node");
  if (!(c.device.memory_reserve_bytes >= 0) || c.device.memory_reserve_bytes >= c.device.memory_bytes)
    problems.push_back("the memory reserve (memory_reserve_gib) is not below the device memory -- lower it");
  positive(c.storage_bandwidth, "the storage bandwidth (storage_gbps, --storage-gbps)", "give GB/s per node");
  if (!(c.failures_per_device_hour >= 0) || c.failures_per_device_hour > 1)
    problems.push_back("the failure rate (failures_per_gpu_hour, --failures-per-gpu-hour) is outside [0, 1] -- give failures "
                       "per device and hour, e.g. 2e-5");
  if (!(c.restart_seconds >= 0)) problems.push_back("restart_seconds is negative -- give seconds >= 0");
  if (!(c.rejoin_seconds >= 0)) problems.push_back("rejoin_seconds is negative -- give seconds >= 0");
  if (!(c.intra_node_latency >= 0) || !(c.inter_node_latency >= 0))
    problems.push_back("a latency is negative -- give microseconds >= 0");
  return join(problems);
}

std::string describe(const Cluster& c) {
  return fmt::format("{} x {} {} ({:.0f} GiB, {:.4g} TFLOP/s, {:.0f} GB/s memory; {} {:.4g} GB/s, network {:.4g} GB/s per node)",
                     c.nodes, c.devices_per_node, c.is_cpu() ? "cpu ranks" : c.device.name,
                     c.device.memory_bytes / kGiB, c.device.peak_flops / 1e12, c.device.memory_bandwidth / kGB,
                     c.is_cpu() ? "shared memory" : "NVLink", c.intra_node_bandwidth / kGB, c.inter_node_bandwidth / kGB);
}

}  // namespace troupe::plan
