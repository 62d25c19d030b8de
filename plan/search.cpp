#include "plan/search.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>

#include <fmt/format.h>

#include "config/validate.hpp"

namespace troupe::plan {

namespace {

std::vector<int> divisors(int64_t n, int64_t at_most) {
  std::vector<int> out;
  for (int64_t k = 1; k <= std::min(n, at_most); ++k)
    if (n % k == 0) out.push_back(static_cast<int>(k));
  return out;
}

template <class T>
std::vector<T> either(const std::optional<T>& fixed, std::vector<T> searched) {
  if (fixed) return {*fixed};
  return searched;
}

// Calls `each` with every layout of `base` on `world` devices that the sizes allow (divisibility
// only; troupe's validation and the memory plan come later). Returns the layouts built.
int64_t enumerate(const TrainConfig& base, const Fixed& fixed, const Cluster& cluster,
                  const std::function<void(TrainConfig&)>& each) {
  const GptConfig& m = base.model;
  const int64_t world = cluster.world();
  const int heads = m.num_attention_heads, groups = m.query_groups(), layers = m.num_layers;
  const int64_t node = cluster.devices_per_node;
  int64_t built = 0;
  // Tensor parallelism inside a node (it talks in every layer); it divides the heads and the groups.
  std::vector<int> tps;
  for (int t : divisors(node, node))
    if (heads % t == 0 && groups % t == 0) tps.push_back(t);
  // Sequences split over ranks: context parallelism (p2p ring) for long sequences, at most 8.
  std::vector<int> cps{1};
  if (m.seq_length >= 16384)
    for (int c : {2, 4, 8})
      if (m.seq_length % (2 * c) == 0) cps.push_back(c);
  const std::vector<std::string> recomputes = either<std::string>(fixed.recompute, {"none", "selective", "full"});
  const std::vector<std::string> offloads = either<std::string>(fixed.offload, {"none", "cpu"});
  const std::vector<int> zeros = either<int>(fixed.zero, {0, 1, 2, 3});
  for (int t : either<int>(fixed.tp, tps)) {
    for (int q : fixed.ulysses ? std::vector<int>{*fixed.ulysses} : either<int>(fixed.cp, cps)) {
      if (t < 1 || q < 1 || world % (int64_t{t} * q) != 0) continue;
      for (int p : either<int>(fixed.pp, divisors(world / (int64_t{t} * q), layers))) {
        if (p < 1 || world % (int64_t{t} * q * p) != 0) continue;
        const int64_t d = world / (int64_t{t} * q * p);
        if (fixed.dp && *fixed.dp != d) continue;
        if (base.global_batch_size % d != 0) continue;
        const int64_t per_replica = base.global_batch_size / d;
        // Schedules: 1F1B (Megatron's default), interleaved with each number of layers per chunk
        // that leaves at least 2 chunks, zb-h1; GPipe only when asked (1F1B holds less at the same time).
        std::vector<std::pair<std::string, int>> schedules;
        if (fixed.schedule) {
          if (*fixed.schedule == "interleaved") {
            for (int n : fixed.layers_per_virtual_stage ? std::vector<int>{*fixed.layers_per_virtual_stage}
                                                        : divisors(layers / p, layers))
              if (layers % p == 0 && (layers / p) % n == 0 && layers / p / n >= 2) schedules.emplace_back("interleaved", n);
          } else {
            schedules.emplace_back(*fixed.schedule, 0);
          }
        } else if (fixed.layers_per_virtual_stage) {
          schedules.emplace_back("interleaved", *fixed.layers_per_virtual_stage);
        } else {
          schedules.emplace_back("1f1b", 0);
          if (p > 1) {
            if (layers % p == 0)
              for (int n : divisors(layers / p, layers))
                if (layers / p / n >= 2 && layers / p / n <= 8) schedules.emplace_back("interleaved", n);
            schedules.emplace_back("zb-h1", 0);
          }
        }
        // Expert parallelism (MoE models): sizes dividing dp and every MoE layer's experts.
        std::vector<int> eps{1};
        if (m.moe.enabled()) {
          eps.clear();
          for (int e : divisors(d, d)) {
            bool splits = true;
            for (int l = 0; l < layers && splits; ++l) {
              const int experts = m.moe.experts_of(l, layers);
              splits = experts == 0 || experts % e == 0;
            }
            if (splits) eps.push_back(e);
          }
        }
        for (int ep : either<int>(fixed.ep, eps))
        for (int mbs : either<int>(fixed.micro_batch, divisors(per_replica, 64))) {
          if (mbs < 1 || per_replica % mbs != 0) continue;
          for (const auto& [schedule, chunk_layers] : schedules) {
            for (bool sp : fixed.sequence_parallel ? std::vector<bool>{*fixed.sequence_parallel && t > 1}
                                                   : (t > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})) {
              for (int z : zeros)
                for (const std::string& r : recomputes)
                  for (const std::string& o : offloads) {
                    TrainConfig c = base;
                    c.tensor_model_parallel_size = t;
                    c.pipeline_model_parallel_size = p;
                    c.data_parallel_size = static_cast<int>(d);
                    c.context_parallel_size = fixed.ulysses ? 1 : q;
                    c.ds_sequence_parallel_size = fixed.ulysses ? *fixed.ulysses : 1;
                    if (fixed.cp_comm_type) c.cp_comm_type = *fixed.cp_comm_type;
                    c.micro_batch_size = mbs;
                    c.pipeline_schedule = schedule;
                    c.num_layers_per_virtual_pipeline_stage = chunk_layers;
                    c.sequence_parallel = sp;
                    c.zero_stage = z;
                    c.recompute_granularity = r;
                    c.offload_optimizer = o;
                    c.expert_model_parallel_size = ep;
                    ++built;
                    each(c);
                  }
            }
          }
        }
      }
    }
  }
  return built;
}

// The first line of validation's message ("N problems:" lists them on the next lines).
std::string first_problem(const std::string& message) {
  const size_t nl = message.find('\n');
  if (nl == std::string::npos) return message;
  const size_t next = message.find("- ", nl);
  const size_t end = message.find('\n', nl + 1);
  return next == std::string::npos ? message.substr(0, nl) : message.substr(next + 2, end == std::string::npos ? std::string::npos : end - next - 2);
}

// The fixed sizes' own problems, each naming its flag and the sizes that would do, all at once.
Status check_fixed(const TrainConfig& base, const Fixed& f, const Cluster& cluster) {
  std::vector<std::string> problems;
  const GptConfig& m = base.model;
  const int64_t world = cluster.world(), node = cluster.devices_per_node;
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (size_t i = 0; i < v.size() && i < 12; ++i) out += (i ? ", " : "") + std::to_string(v[i]);
    return out;
  };
  if (f.tp) {
    std::vector<int> ok;
    for (int t : divisors(node, node))
      if (m.num_attention_heads % t == 0 && m.query_groups() % t == 0) ok.push_back(t);
    if (std::find(ok.begin(), ok.end(), *f.tp) == ok.end())
      problems.push_back(fmt::format("--tensor-model-parallel-size {}: tensor parallelism stays inside a node ({} devices) and "
                                     "divides the heads ({}) and key/value groups ({}) -- use one of {}",
                                     *f.tp, node, m.num_attention_heads, m.query_groups(), list(ok)));
  }
  const int t = f.tp.value_or(1), q = f.ulysses.value_or(f.cp.value_or(1));
  if (f.pp && (*f.pp < 1 || *f.pp > m.num_layers))
    problems.push_back(fmt::format("--pipeline-model-parallel-size {}: a stage needs a layer and there are {} -- use 1 to {}",
                                   *f.pp, m.num_layers, m.num_layers));
  const int64_t fixed_product = int64_t{t} * q * f.pp.value_or(1) * f.dp.value_or(1);
  if (fixed_product > 0 && world % fixed_product != 0)
    problems.push_back(fmt::format("the fixed sizes (tensor {} x sequence {} x pipeline {} x data {}) do not divide the {} "
                                   "devices -- tensor x context x pipeline x data-parallel must equal the devices",
                                   t, q, f.pp.value_or(1), f.dp.value_or(1), world));
  else if (f.tp && f.pp && f.dp && (f.cp || f.ulysses || m.seq_length < 16384) && fixed_product != world)
    problems.push_back(fmt::format("tensor {} x sequence {} x pipeline {} x data {} = {} devices, but the cluster has {} -- "
                                   "leave --data-parallel-size out (it is what the others leave) or change --nodes",
                                   t, q, *f.pp, *f.dp, fixed_product, world));
  if (q > 1 && m.seq_length % (2 * q) != 0)
    problems.push_back(fmt::format("--seq-length {} is not divisible by 2 x the sequence-parallel size {} -- use a multiple "
                                   "of {}", m.seq_length, q, 2 * q));
  if (f.dp && base.global_batch_size % *f.dp != 0)
    problems.push_back(fmt::format("--global-batch-size {} does not split over --data-parallel-size {} -- use a multiple of {}",
                                   base.global_batch_size, *f.dp, *f.dp));
  if (f.micro_batch && f.dp && base.global_batch_size % (int64_t{*f.micro_batch} * *f.dp) != 0)
    problems.push_back(fmt::format("--global-batch-size {} is not a whole number of micro-batches of {} on {} data-parallel "
                                   "replicas -- use a multiple of {}", base.global_batch_size, *f.micro_batch, *f.dp,
                                   int64_t{*f.micro_batch} * *f.dp));
  if (problems.empty()) return Status::ok();
  if (problems.size() == 1) return Status::bad_input(problems[0]);
  std::string message = fmt::format("{} problems:", problems.size());
  for (const std::string& p : problems) message += "\n  - " + p;
  return Status::bad_input(message);
}

// Two layouts that differ only in what does not change the memory story much (offload, schedule,
// sequence parallelism): the rejected list shows one of them.
bool same_shape(const TrainConfig& a, const TrainConfig& b) {
  return a.tensor_model_parallel_size == b.tensor_model_parallel_size &&
         a.pipeline_model_parallel_size == b.pipeline_model_parallel_size &&
         a.data_parallel_size == b.data_parallel_size && a.micro_batch_size == b.micro_batch_size &&
         a.context_parallel_size == b.context_parallel_size;
}

}  // namespace

std::string layout_text(const TrainConfig& c, int64_t world) {
  std::string s = fmt::format("tp {}", c.tensor_model_parallel_size);
  if (c.ds_sequence_parallel_size > 1) s += fmt::format(", Ulysses {}", c.ds_sequence_parallel_size);
  if (c.context_parallel_size > 1) s += fmt::format(", cp {} ({})", c.context_parallel_size, c.cp_comm_type);
  s += fmt::format(", pp {}", c.pipeline_model_parallel_size);
  if (c.pipeline_model_parallel_size > 1) {
    if (c.pipeline_schedule == "interleaved" && c.num_layers_per_virtual_pipeline_stage > 0)
      s += fmt::format(" (interleaved, {} chunks)",
                       c.model.num_layers / (c.pipeline_model_parallel_size * c.num_layers_per_virtual_pipeline_stage));
    else
      s += " (" + c.pipeline_schedule + ")";
  }
  s += fmt::format(", dp {}, mbs {}, ZeRO-{}, recompute {}", c.resolved_dp(static_cast<int>(std::min<int64_t>(world, 1 << 30))),
                   c.micro_batch_size, c.zero_stage, c.recompute_granularity);
  if (c.expert_model_parallel_size > 1) s += fmt::format(", ep {}", c.expert_model_parallel_size);
  if (c.sequence_parallel) s += ", sp";
  if (c.offload_optimizer != "none") s += ", offload " + c.offload_optimizer;
  return s;
}

Result<SearchResult> search_layouts(const TrainConfig& base, const Fixed& fixed, const Cluster& cluster,
                                    const Profile& profile, int keep) {
  TROUPE_RETURN_IF_ERROR(check_fixed(base, fixed, cluster));
  SearchResult out;
  const int world = static_cast<int>(std::min<int64_t>(cluster.world(), 1 << 30));
  std::vector<Candidate> fitting;
  std::vector<Candidate> over;
  auto note_over = [&](Candidate&& c) {
    // Keep the few that miss by the least memory, of different sizes: what to say when nothing fits.
    for (Candidate& o : over)
      if (same_shape(o.layout, c.layout)) {
        if (c.prediction.memory_per_rank_bytes < o.prediction.memory_per_rank_bytes) o = std::move(c);
        std::sort(over.begin(), over.end(), [](const Candidate& a, const Candidate& b) {
          return a.prediction.memory_per_rank_bytes < b.prediction.memory_per_rank_bytes;
        });
        return;
      }
    over.push_back(std::move(c));
    std::sort(over.begin(), over.end(), [](const Candidate& a, const Candidate& b) {
      return a.prediction.memory_per_rank_bytes < b.prediction.memory_per_rank_bytes;
    });
    if (over.size() > 3) over.pop_back();
  };
  out.considered = enumerate(base, fixed, cluster, [&](TrainConfig& c) {
    Prediction mem = predict_memory(c, cluster);
    if (!mem.fits) {
      ++out.out_of_memory;
      if (over.size() < 3 || mem.memory_per_rank_bytes < over.back().prediction.memory_per_rank_bytes)
        note_over(Candidate{c, mem});
      return;
    }
    Status ok = validate_train_config(c, nullptr, {}, world);
    if (ok) ok = validate_world(c, world);
    if (!ok) {
      ++out.not_runnable;
      if (out.not_runnable_example.empty())
        out.not_runnable_example = layout_text(c, world) + ": " + first_problem(ok.message());
      return;
    }
    auto p = predict(c, cluster, profile, /*simulate=*/false);
    if (!p) return;
    ++out.costed;
    fitting.push_back(Candidate{c, std::move(p.value())});
  });
  if (out.considered == 0)
    return Status::bad_input(fmt::format(
        "no layout of {} devices has the sizes given: tensor x context x pipeline x data-parallel must equal the devices, "
        "the global batch ({}) must split into micro-batches on every data-parallel replica, and tensor parallelism "
        "stays in a node ({} devices) and divides the heads ({}) -- change the fixed sizes or the cluster",
        cluster.world(), base.global_batch_size, cluster.devices_per_node, base.model.num_attention_heads));
  // Faster first; at the same predicted time (ZeRO's stages on one replica, say) the simpler layout:
  // the lower ZeRO stage, no offload, less recomputation.
  auto faster = [](const Candidate& a, const Candidate& b) {
    const double x = a.prediction.iteration_seconds, y = b.prediction.iteration_seconds;
    if (std::abs(x - y) > 1e-9 * std::max(x, y)) return x < y;
    auto rank = [](const TrainConfig& c) {
      const int r = c.recompute_granularity == "none" ? 0 : c.recompute_granularity == "selective" ? 1 : 2;
      return std::make_tuple(c.zero_stage, c.offload_optimizer != "none", r, c.sequence_parallel);
    };
    return rank(a.layout) < rank(b.layout);
  };
  std::sort(fitting.begin(), fitting.end(), faster);
  // The best by theory's bubble, run through the simulator and ranked again.
  const size_t simulate = std::min(fitting.size(), static_cast<size_t>(std::max(3 * keep, 30)));
  for (size_t i = 0; i < simulate; ++i) {
    auto p = predict(fitting[i].layout, cluster, profile, /*simulate=*/true);
    if (!p) return p.status();
    fitting[i].prediction = std::move(p.value());
    ++out.simulated;
  }
  fitting.resize(simulate);
  std::sort(fitting.begin(), fitting.end(), faster);
  if (fitting.size() > static_cast<size_t>(std::max(1, keep))) fitting.resize(static_cast<size_t>(std::max(1, keep)));
  out.best = std::move(fitting);
  for (Candidate& c : over) {
    auto p = predict(c.layout, cluster, profile, /*simulate=*/false);
    if (p) {
      const std::string why = c.prediction.why_not;
      c.prediction = std::move(p.value());
      c.prediction.why_not = why;
    }
  }
  out.not_fitting = std::move(over);
  return out;
}

int smallest_fitting_nodes(const TrainConfig& base, const Fixed& fixed, const Cluster& cluster, int max_nodes) {
  auto fits_on = [&](int nodes) {
    Cluster c = cluster;
    c.nodes = nodes;
    const int world = static_cast<int>(std::min<int64_t>(c.world(), 1 << 30));
    bool any = false;
    TrainConfig b = base;
    // A smaller global batch than the world would leave devices idle: plan with at least one sample each.
    enumerate(b, fixed, c, [&](TrainConfig& l) {
      if (any || !predict_memory(l, c).fits) return;
      Status ok = validate_train_config(l, nullptr, {}, world);
      if (ok) ok = validate_world(l, world);
      any = ok.is_ok();
    });
    return any;
  };
  int lo = 0;
  for (int nodes = std::max(1, cluster.nodes * 2); nodes <= max_nodes; nodes *= 2) {
    if (fits_on(nodes)) {
      // Bisect between the last that did not fit and this one.
      int hi = nodes;
      lo = std::max(lo, nodes / 2);
      while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        if (fits_on(mid)) hi = mid;
        else lo = mid;
      }
      return hi;
    }
    lo = nodes;
  }
  return 0;
}

}  // namespace troupe::plan
