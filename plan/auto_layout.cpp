#include "plan/auto_layout.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "plan/host.hpp"

namespace troupe::plan {

namespace {

std::string prediction_text(const Candidate& c, int64_t world) {
  const Prediction& p = c.prediction;
  return fmt::format("{}: predicted {:.3f} s per iteration, {:.4g} tokens/s, {:.1f} MiB per rank, bubble {:.0f}%",
                     layout_text(c.layout, world), p.iteration_seconds, p.tokens_per_second,
                     p.memory_per_rank_bytes / (1024.0 * 1024.0), 100 * p.bubble_fraction);
}

}  // namespace

Result<AutoLayout> choose_layout(const TrainConfig& base, const Fixed& fixed, int world_size, int local_world) {
  const HostFigures& host = this_host();
  std::vector<std::pair<Candidate, int>> found;  // (candidate, its world)
  std::vector<std::string> failures;
  const int local = std::max(1, local_world);
  std::vector<int> worlds;
  if (world_size > 1) worlds = {world_size};
  else
    for (int w = 1; w <= host.cores; ++w) worlds.push_back(w);
  for (int w : worlds) {
    const int on_host = world_size > 1 ? local : w;  // ranks sharing this host
    Cluster c = this_host_cluster(on_host);
    if (world_size > 1) c.nodes = std::max(1, world_size / local);
    // The cores the ranks compute on: --num-threads per process (all cores when 0), at most the host's;
    // this_host_cluster shares all of them among the host's ranks.
    const int processes = world_size > 1 ? local : 1;
    const int threads = base.num_threads > 0 ? std::min(host.cores, base.num_threads * processes) : host.cores;
    const double share = static_cast<double>(threads) / host.cores;
    c.device.peak_flops *= share;
    c.device.peak_flops_fp32 *= share;
    const Profile profile = profile_named("troupe", c).value();
    auto r = search_layouts(base, fixed, c, profile, 10);
    if (!r) {
      failures.push_back(fmt::format("{} rank(s): {}", w, r.status().message()));
      continue;
    }
    for (Candidate& k : r.value().best) found.emplace_back(std::move(k), w);
    if (r.value().best.empty() && !r.value().not_fitting.empty())
      failures.push_back(fmt::format("{} rank(s): the closest, {}: {}", w, layout_text(r.value().not_fitting[0].layout, w),
                                     r.value().not_fitting[0].prediction.why_not));
  }
  if (found.empty()) {
    std::string message = "--auto-layout found no layout that fits and runs here";
    for (const std::string& f : failures) message += "\n  - " + f;
    message += "\n  -- lower --micro-batch-size or --seq-length, leave more sizes out of the command line so that they "
               "are searched, or run on more hosts";
    return Status::bad_input(message);
  }
  // Faster first; the search ranked each world's ties by simplicity, and fewer ranks win a tie.
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    const double x = a.first.prediction.iteration_seconds, y = b.first.prediction.iteration_seconds;
    return std::abs(x - y) > 1e-9 * std::max(x, y) ? x < y : a.second < b.second;
  });
  AutoLayout out;
  out.best = found[0].first;
  out.ranks = found[0].second;
  out.lines.push_back(fmt::format("auto-layout (troupe plan's model of this host: {} cores, sgemm peak {:.1f} GFLOP/s): {}",
                                  host.cores, host.sgemm_peak_gflops, prediction_text(out.best, out.ranks)));
  // The runner-up is the best layout that runs differently: not the same sizes under another ZeRO
  // stage or offload, which on one replica change nothing.
  const TrainConfig& b = out.best.layout;
  for (size_t i = 1; i < found.size(); ++i) {
    const TrainConfig& l = found[i].first.layout;
    if (found[i].second == out.ranks && l.tensor_model_parallel_size == b.tensor_model_parallel_size &&
        l.pipeline_model_parallel_size == b.pipeline_model_parallel_size && l.micro_batch_size == b.micro_batch_size &&
        l.recompute_granularity == b.recompute_granularity && l.pipeline_schedule == b.pipeline_schedule &&
        l.num_layers_per_virtual_pipeline_stage == b.num_layers_per_virtual_pipeline_stage &&
        l.context_parallel_size == b.context_parallel_size && l.sequence_parallel == b.sequence_parallel)
      continue;
    out.runner_up = found[i].first;
    out.lines.push_back("runner-up: " + prediction_text(*out.runner_up, found[i].second));
    break;
  }
  return out;
}

}  // namespace troupe::plan
