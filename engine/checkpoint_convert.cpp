#include "engine/checkpoint_convert.hpp"

#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/stored_config.hpp"
#include "troupe/train_config.hpp"
#include "comm/local/local_world.hpp"
#include "comm/topology.hpp"
#include "storage/checkpoint.hpp"
#include "storage/shard_file.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {

Result<int> convert_checkpoint(const std::string& in, int64_t iteration, const std::string& out,
                               const ConvertTarget& target) {
  if (iteration < 0) {
    auto it = latest_iteration(in);
    if (!it) return it.status();
    iteration = it.value();
  }
  auto checkpoint = Checkpoint::open(in, iteration);  // any version
  if (!checkpoint) return checkpoint.status().as_bad_input();
  const CheckpointMeta* meta = &checkpoint->meta();
  auto config = stored_config(in, iteration);  // only a config the checkpoint's tensors vouch for
  if (!config) return config.status();
  TrainConfig cfg = config.value();
  const GptConfig& m = cfg.model;
  if (target.tp < 1 || target.pp < 1 || target.dp < 1 || target.zero_stage < 0 || target.zero_stage > 3 ||
      target.ep < 0)
    return Status::bad_input("target sizes must be >= 1 and the ZeRO stage 0..3");
  // The expert-parallel size: given, or the checkpoint's where the target's dp holds it.
  int ep = 1;
  if (m.moe.enabled()) {
    const int stored = std::max(1, cfg.expert_model_parallel_size);
    ep = target.ep > 0 ? target.ep : (target.dp % stored == 0 ? stored : 1);
  }
  // Every problem of the target at once. The tensor-parallel size splits the heads, the key/value
  // groups (grouped-query attention) and the MLP's hidden size (GptChunk's preconditions).
  std::vector<std::string> problems;
  const std::string tp_flag = "--target-tensor-parallel-size " + std::to_string(target.tp);
  if (m.num_attention_heads % target.tp != 0)
    problems.push_back(tp_flag + " does not divide the " + std::to_string(m.num_attention_heads) +
                       " attention heads -- pick a divisor of " + std::to_string(m.num_attention_heads));
  if (m.query_groups() != m.num_attention_heads && m.query_groups() % target.tp != 0)
    problems.push_back(tp_flag + " does not divide the " + std::to_string(m.query_groups()) +
                       " query groups (--num-query-groups) -- pick a divisor of " + std::to_string(m.query_groups()));
  if (m.ffn_hidden_size() % target.tp != 0)
    problems.push_back(tp_flag + " does not divide the MLP's hidden size " + std::to_string(m.ffn_hidden_size()) +
                       " (--ffn-hidden-size) -- pick a divisor of it");
  if (m.num_layers < target.pp * target.virtual_chunks)
    problems.push_back("--target-pipeline-parallel-size " + std::to_string(target.pp) + " exceeds the " +
                       std::to_string(m.num_layers) + " layers -- use at most " + std::to_string(m.num_layers));
  const bool expert_split = cfg.expert_tensor_parallel_size != 1 || target.tp == 1;
  if (m.moe.enabled()) {
    const std::string ep_flag = "--target-expert-model-parallel-size " + std::to_string(ep);
    if (target.dp % ep != 0)
      problems.push_back(ep_flag + " does not divide --target-data-parallel-size " + std::to_string(target.dp) +
                         " (expert parallelism is carved out of data parallelism) -- pick a divisor of it");
    for (int l = 0; l < m.num_layers; ++l) {
      const int experts = m.moe.experts_of(l, m.num_layers);
      if (experts > 1 && experts % ep != 0) {
        problems.push_back(ep_flag + " does not divide layer " + std::to_string(l) + "'s " + std::to_string(experts) +
                           " experts -- pick a divisor of every MoE layer's expert count");
        break;
      }
    }
    if (expert_split && m.expert_ffn_hidden_size() % target.tp != 0)
      problems.push_back(tp_flag + " does not divide the experts' hidden size " +
                         std::to_string(m.expert_ffn_hidden_size()) + " -- pick a divisor of it");
  } else if (target.ep > 1) {
    problems.push_back("--target-expert-model-parallel-size " + std::to_string(target.ep) +
                       " is for a model with experts, and this checkpoint's has none -- drop it");
  }
  if (!problems.empty()) {
    std::string all = problems.front();
    for (size_t i = 1; i < problems.size(); ++i) all += "; " + problems[i];
    return Status::bad_input(all);
  }
  cfg.tensor_model_parallel_size = target.tp;
  cfg.pipeline_model_parallel_size = target.pp;
  cfg.data_parallel_size = target.dp;
  cfg.zero_stage = target.zero_stage;
  if (m.moe.enabled()) cfg.expert_model_parallel_size = ep;

  ParallelConfig par;
  par.tp = target.tp;
  par.pp = target.pp;
  par.dp = target.dp;
  par.zero_stage = target.zero_stage;
  par.virtual_chunks = target.virtual_chunks;
  if (target.virtual_chunks > 1) par.schedule = sched::ScheduleType::interleaved;
  par.ep = ep;
  par.expert_tensor_parallel = expert_split;
  const int world = par.world_size();
  comm::ParallelSizes sizes;
  sizes.tp = par.tp;
  sizes.pp = par.pp;
  sizes.dp = par.dp;
  auto topo = comm::Topology::create(sizes, world);
  if (!topo) return topo.status();
  auto fabric = comm::LocalFabric::create(world);
  if (!fabric) return fabric.status();

  auto listed = checkpoint->files();
  if (!listed) return listed.status();
  const std::vector<std::string> files = std::move(listed).value();
  TROUPE_RETURN_IF_ERROR(prepare_iteration_dir(out, iteration));

  RankSpec spec;
  spec.model = m;
  spec.par = par;
  spec.micro_batch_size = 1;
  spec.micro_batches = 1;
  spec.num_threads = 1;
  std::mutex mu;
  Status failure;
  auto body = [&](int rank) {
    auto record = [&](const Status& st) {
      std::lock_guard<std::mutex> lock(mu);
      if (failure.is_ok()) failure = st.with_context("rank " + std::to_string(rank) + ": ");
      fabric.value().abort(rank, st.message());  // ranks waiting on this one give up too
    };
    auto w = fabric.value().world(rank);
    auto group = [&](const std::vector<int>& members) { return w->group(members); };
    auto tp = group(topo.value().tp_group(rank));
    auto dp = group(topo.value().dp_group(rank));
    auto pp = group(topo.value().pp_group(rank));
    if (!tp || !dp || !pp) return record(Status::error("cannot create the rank's groups"));
    const auto emb_members = topo.value().embedding_group(rank);
    Result<std::unique_ptr<comm::Communicator>> emb = emb_members.empty()
                                                          ? Result<std::unique_ptr<comm::Communicator>>(nullptr)
                                                          : group(emb_members);
    Result<std::unique_ptr<comm::Communicator>> epg(nullptr), expert_dp(nullptr);
    if (ep > 1) {
      epg = group(topo.value().expert_parallel_group(rank, ep));
      expert_dp = group(topo.value().expert_data_parallel_group(rank, ep));
    }
    auto all = w->everyone();
    if (!emb || !all || !epg || !expert_dp) return record(Status::error("cannot create the rank's groups"));
    RankComms comms;
    comms.tp = tp.value().get();
    comms.pp = pp.value().get();
    comms.dp = dp.value().get();
    comms.embedding = emb.value().get();
    comms.world = all.value().get();
    comms.ep = epg.value().get();
    comms.expert_dp = expert_dp.value().get();
    RankEngine engine(spec, topo.value(), rank, comms);
    auto reader = ShardSetReader::open(files);
    if (!reader) return record(reader.status());
    if (Status st = engine.load_own_shards(**reader); !st) return record(st);
    if (Status st = write_shard_file(shard_file_path(out, iteration, rank), rank, engine.own_shard_contents()); !st)
      return record(st);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  if (!failure.is_ok()) return failure;

  CheckpointMeta saved = *meta;
  saved.config_json = cfg.to_json();
  TROUPE_RETURN_IF_ERROR(commit_sharded_checkpoint(out, saved, par.to_json(), shard_file_names(world)));
  return ep;
}

}  // namespace troupe
