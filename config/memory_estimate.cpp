#include "config/memory_estimate.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

namespace troupe {

namespace {

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

// A number from a one-value file (cgroup v2: "max" means no limit); negative when unreadable.
double read_number(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return -1;
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  return end != nullptr && *end == '\0' ? v : -1;
}

}  // namespace

MemoryEstimate estimate_memory(const TrainConfig& c, int world_size) {
  const GptConfig& m = c.model;
  const double tp = std::max(1, c.tensor_model_parallel_size), pp = std::max(1, c.pipeline_model_parallel_size);
  const double dp = std::max(1, c.resolved_dp(std::max(1, world_size)));
  const double C = m.hidden_size, L = m.num_layers, H = m.num_attention_heads, T = m.seq_length;
  const double V = static_cast<double>(m.vocab_size), P = m.max_position_embeddings;
  const double params = V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C;
  const double psi = params / (tp * pp);
  double states = 0;
  switch (c.zero_stage) {
    case 0: states = 16 * psi; break;
    case 1: states = 8 * psi + 8 * psi / dp; break;
    case 2: states = 4 * psi + 12 * psi / dp; break;
    default: states = 16 * psi / dp; break;
  }
  if (c.offload_optimizer == "nvme") states -= 8 * psi / dp;  // the moments live in swap files

  const double micro = std::max(1, c.micro_batch_size);
  const double micro_batches = std::max(1.0, static_cast<double>(c.global_batch_size) / (micro * dp));
  const double in_flight = c.pipeline_schedule == "gpipe" ? micro_batches : std::min(pp, micro_batches);
  const double layers = std::max(1.0, L / pp);
  const double tokens = micro * T;
  const double full_layer = 4 * C + (12 * C + H * T) / tp;  // floats per token
  double per_micro = 0;
  if (c.recompute_granularity == "full")
    per_micro = tokens * (layers * C + full_layer);
  else if (c.recompute_granularity == "selective")
    per_micro = tokens * (layers * (4 * C + 12 * C / tp) + H * T / tp);
  else
    per_micro = tokens * layers * full_layer;

  MemoryEstimate e;
  e.ranks_in_process = world_size > 1 ? 1 : static_cast<int>(std::min(1e6, tp * pp * dp));
  e.model_state_bytes = states * e.ranks_in_process;
  e.activation_bytes = 4 * per_micro * in_flight * e.ranks_in_process;
  return e;
}

double available_memory_bytes() {
  double available = -1;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kib = 0;
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) {
        available = static_cast<double>(kib) * 1024;
        break;
      }
    std::fclose(f);
  }
  const double limit = read_number("/sys/fs/cgroup/memory.max");
  const double used = read_number("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0) {
    const double left = std::max(0.0, limit - used);
    available = available < 0 ? left : std::min(available, left);
  }
  return available;
}

Status check_memory(const TrainConfig& c, int world_size, int local_ranks, double available) {
  if (const char* off = std::getenv("TROUPE_MEMORY_CHECK"); off != nullptr && std::strcmp(off, "off") == 0)
    return Status::ok();
  if (!(available > 0)) return Status::ok();  // nothing to compare with
  const MemoryEstimate e = estimate_memory(c, world_size);
  const double share = available / std::max(1, local_ranks);
  if (e.total() <= share) return Status::ok();
  const bool activations = e.activation_bytes >= e.model_state_bytes;
  const std::string fix =
      activations ? "lower --micro-batch-size or --seq-length, or use --recompute-granularity full, more "
                    "--pipeline-model-parallel-size or --tensor-model-parallel-size"
                  : "lower --hidden-size or --num-layers, or spread the model states: --zero-stage 1-3 with more "
                    "data-parallel ranks, more --tensor-model-parallel-size / --pipeline-model-parallel-size, "
                    "--offload-optimizer nvme";
  return Status::bad_input(fmt::format(
      "this configuration needs at least {:.3g} GiB per process ({:.3g} GiB of parameters, gradients and Adam "
      "moments, {:.3g} GiB of activations, over {} rank(s) in the process) but {:.3g} GiB are available{} -- {} "
      "(TROUPE_MEMORY_CHECK=off skips this check)",
      gib(e.total()), gib(e.model_state_bytes), gib(e.activation_bytes), e.ranks_in_process, gib(share),
      local_ranks > 1 ? fmt::format(" to each of the {} processes on this host", local_ranks) : std::string(), fix));
}

}  // namespace troupe
