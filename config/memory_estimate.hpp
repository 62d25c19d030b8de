// What a training configuration needs in host memory, computed before anything is allocated, so that
// a configuration that cannot fit is refused with the flag to lower (exit 2) instead of dying of an
// allocation failure or the OOM killer half-way through setup.
//
// The estimate is a lower bound of what the job will hold per process (fp32, CPU backend):
//   model states per rank   ZeRO's formula over this rank's share of the parameters,
//                           Psi = parameters / (tp x pp): stage 0 16 Psi, 1 8 Psi + 8 Psi/dp,
//                           2 4 Psi + 12 Psi/dp, 3 16 Psi/dp bytes (the Adam moments, 8 Psi/dp of them,
//                           are on disk with --offload-optimizer nvme)
//   activations per rank    per token and layer 4C + (12C + H T) / tp floats (layer norms, residuals;
//                           qkv, attention output, MLP, attention probabilities split by tensor
//                           parallelism), for the micro-batches a stage holds at once (1F1B and the
//                           interleaved and zero-bubble schedules min(pp, m), GPipe m), over the
//                           stage's L / pp layers; full recompute keeps only each layer's input
//                           (C floats per token) plus one layer's activations, selective recompute
//                           drops the attention probabilities
// times the ranks this process runs (all of them in one process, one under troupe launch). It is
// compared with the memory this process can have: MemAvailable (/proc/meminfo), and the cgroup's
// memory.max minus its current use when lower, divided among the ranks started on the host.
// TROUPE_MEMORY_CHECK=off skips the comparison (the estimate is still printed by callers).
//
// Every product is computed in double: absurd flag values (--hidden-size 2147483644) give a huge
// estimate, never an integer overflow.
#pragma once
#include <cstdint>
#include <string>

#include "troupe/train_config.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct MemoryEstimate {
  double model_state_bytes = 0;  // per process
  double activation_bytes = 0;   // per process
  double total() const { return model_state_bytes + activation_bytes; }
  int ranks_in_process = 1;
};

// world_size: ranks started (1: every rank of the layout runs in this process).
MemoryEstimate estimate_memory(const TrainConfig& config, int world_size);

// Bytes this process may still use: min(MemAvailable, cgroup memory.max - memory.current); a
// negative value when neither can be read.
double available_memory_bytes();

// Bad input when the estimate exceeds `available` / local_ranks (ranks sharing this host), naming
// the figures and the flags that lower the biggest part.
Status check_memory(const TrainConfig& config, int world_size, int local_ranks, double available);

}  // namespace troupe
