// The machine `troupe plan` plans for: `nodes` nodes of `devices_per_node` identical devices (GPUs, or
// on the CPU the ranks of one host), the links between them, and what one device computes at.
//
// A cluster starts from a preset (cluster_preset: A100-40GB, A100-80GB, H100-80GB, H200 with their
// DGX nodes, or `cpu`, this machine measured by the caller), then a JSON file's keys (parse_cluster_json)
// and then the command line's overrides change single values. docs/PLAN.md lists every preset value
// and where it comes from (the vendors' data sheets); nothing in them is fitted to a measured run.
//
// Units: bytes, bytes per second, FLOP/s and seconds in the structs; the JSON file and the flags use
// GiB for memory, GB/s (1e9 bytes/s) for bandwidths, TFLOP/s and microseconds.
//
// The file (all keys optional; "gpu" names the preset the others change, default A100-80GB):
//   {"gpu": "A100-80GB", "nodes": 16, "gpus_per_node": 8,
//    "memory_gib": 80, "memory_reserve_gib": 2, "peak_tflops": 312, "memory_bandwidth_gbps": 2039,
//    "compute_units": 108, "nvlink_gbps": 300, "network_gbps": 200, "pcie_gbps": 25,
//    "host_memory_bandwidth_gbps": 200, "intra_node_latency_us": 5, "inter_node_latency_us": 10,
//    "failures_per_gpu_hour": 1.97e-5, "storage_gbps": 5, "restart_seconds": 120, "rejoin_seconds": 30}
// Every problem (an unknown key with its nearest spelling, a value of the wrong type or out of
// range) is reported at once; the reader never allocates beyond what the text holds.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::plan {

struct Device {
  std::string name;                 // the preset's name, or the file's "gpu"
  double memory_bytes = 0;          // device memory (GPU: HBM; cpu: this host's memory for all ranks)
  double memory_reserve_bytes = 0;  // what the runtime keeps (CUDA context, allocator slack, the OS)
  double peak_flops = 0;            // dense FLOP/s of the training type's GEMMs (16-bit tensor cores)
  double peak_flops_fp32 = 0;       // the same for fp32 runs (TF32 is not used: troupe trains in fp32)
  double memory_bandwidth = 0;      // bytes/s of device memory
  int compute_units = 0;            // SMs (GEMM tiles run in waves of this many); cpu: cores
};

struct Cluster {
  Device device;
  int nodes = 1;
  int devices_per_node = 1;
  // One direction, per device: NVLink (NVSwitch: any pair at full rate); on the CPU the shared
  // memory copy between ranks of one host.
  double intra_node_bandwidth = 0;
  // One direction, per node: all its network adapters together (DGX A100: 8 x 200 Gb/s HDR).
  double inter_node_bandwidth = 0;
  double pcie_bandwidth = 0;          // host <-> device per device, one direction (optimizer offload)
  double host_memory_bandwidth = 0;   // per node, for the offloaded optimizer's step
  double intra_node_latency = 0;      // seconds per step of a collective inside a node
  double inter_node_latency = 0;      // ... across nodes
  // Failures and checkpoints (plan/goodput.hpp): failures per device and hour (Meta's LLaMA 3 405B
  // run: 419 unexpected interruptions in 54 days on 16,384 GPUs, 1.97e-5), the bytes/s one node
  // writes to and reads from the checkpoint storage, and what a restart costs before loading.
  double failures_per_device_hour = 1.97e-5;
  double storage_bandwidth = 5e9;
  double restart_seconds = 120;
  // In-job recovery (troupe launch --in-job-recovery): the surviving processes rejoin and rebuild
  // their communicators, a spare or restarted process takes the lost place. An assumption, not a
  // measurement at scale (docs/PLAN.md): troupe's own rejoin of 4 processes takes 0.3 s here.
  double rejoin_seconds = 30;
  int64_t world() const { return static_cast<int64_t>(nodes) * devices_per_node; }
  bool is_cpu() const { return device.name == "cpu"; }
};

// The names of the presets, for messages: "A100-40GB, A100-80GB, H100-80GB, H200, cpu".
std::string cluster_preset_names();

// A preset by name (case-insensitive; "A100" alone is not a name: the memory decides too much). `cpu`
// needs the caller's measurements (measured_cpu_cluster); here it has only its name. Unknown names are
// bad input listing the presets.
Result<Cluster> cluster_preset(const std::string& name);

// This host as a cluster of one node: `ranks` devices sharing its `cores` cores, its memory and its
// measured sgemm peak (GFLOP/s, all cores) and memory bandwidth (bytes/s).
Cluster measured_cpu_cluster(int ranks, int cores, double sgemm_peak_gflops, double memory_bandwidth,
                             double memory_bytes);

// Reads a cluster file's text (see the header) on top of its "gpu" preset. `origin` names the file in
// messages. A `cpu` file takes its figures from `cpu_base` (the caller's measurements).
Result<Cluster> parse_cluster_json(const std::string& text, const std::string& origin, const Cluster* cpu_base = nullptr);

// Every problem of a cluster built by hand or by overrides (counts >= 1, sizes and rates > 0, within
// the bounds the JSON reader enforces), each naming `source`'s spelling of the setting.
Status validate_cluster(const Cluster& c);

// One line: "16 x 8 A100-80GB (80 GiB, 312 TFLOP/s, NVLink 300 GB/s, network 200 GB/s per node)".
std::string describe(const Cluster& c);

}  // namespace troupe::plan
