// troupe plan's model (plan/): the cluster file, the alpha-beta collectives against their formulas,
// the groups' placement on nodes, the GEMM waves, the simulator with unequal stages and hops, the
// memory half against the memory plan, and the search against an exhaustive costing of every layout.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "config/memory_estimate.hpp"
#include "config/validate.hpp"
#include "plan/goodput.hpp"
#include "plan/host.hpp"
#include "plan/search.hpp"
#include "troupe/schedule.hpp"

namespace troupe::plan {
namespace {

using Catch::Contains;

Cluster a100(int nodes, int per_node) {
  Cluster c = cluster_preset("A100-80GB").value();
  c.nodes = nodes;
  c.devices_per_node = per_node;
  return c;
}

// A small GPT that every layout of a few devices can run; bf16 as large runs train.
TrainConfig small_job() {
  TrainConfig c;
  c.model.num_layers = 8;
  c.model.hidden_size = 256;
  c.model.num_attention_heads = 8;
  c.model.seq_length = 512;
  c.model.max_position_embeddings = 512;
  c.model.vocab_size = 1000;
  c.tokenizer_type = "NullTokenizer";
  c.tokenizer_model = "1000";
  c.mock_data = true;
  c.train_iters = 1;
  c.micro_batch_size = 1;
  c.global_batch_size = 16;
  c.precision.dtype = PrecisionDType::bf16;
  return c;
}

// small_job() on 8 data-parallel replicas of one device each, micro-batch 2.
TrainConfig replicated_job() {
  TrainConfig c = small_job();
  c.tensor_model_parallel_size = 1;
  c.pipeline_model_parallel_size = 1;
  c.data_parallel_size = 8;
  c.micro_batch_size = 2;
  return c;
}

TEST_CASE("plan: a cluster file reads on top of its preset, every problem at once", "[plan]") {
  auto c = parse_cluster_json(R"({"gpu": "H100-80GB", "nodes": 4, "network_gbps": 100})", "c.json");
  REQUIRE(c.is_ok());
  CHECK(c.value().device.name == "H100-80GB");
  CHECK(c.value().nodes == 4);
  CHECK(c.value().devices_per_node == 8);
  CHECK(c.value().inter_node_bandwidth == Approx(100e9));
  CHECK(c.value().device.peak_flops == Approx(989e12));
  CHECK(c.value().world() == 32);

  auto bad = parse_cluster_json(
      R"({"gpu": "A100", "nodes": 0, "gpus_per_node": 2.5, "memory_gib": "80", "nvlnk_gbps": 300})", "c.json");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().is_bad_input());
  const std::string m = bad.status().message();
  CHECK_THAT(m, Contains("5 problems"));
  CHECK_THAT(m, Contains("A100 is not a preset"));
  CHECK_THAT(m, Contains("\"nodes\" is 0"));
  CHECK_THAT(m, Contains("\"gpus_per_node\" is 2.5 -- give a whole number"));
  CHECK_THAT(m, Contains("\"memory_gib\" is not a number"));
  CHECK_THAT(m, Contains("did you mean \"nvlink_gbps\""));

  CHECK_THAT(parse_cluster_json("{", "c.json").status().message(), Contains("not valid JSON"));
  CHECK_THAT(parse_cluster_json("[1]", "c.json").status().message(), Contains("not an object"));
  auto reserve = parse_cluster_json(R"({"memory_gib": 8, "memory_reserve_gib": 9})", "c.json");
  CHECK_THAT(reserve.status().message(), Contains("reserve"));
  auto preset = cluster_preset("H300");
  REQUIRE_FALSE(preset.is_ok());
  CHECK_THAT(preset.status().message(), Contains("A100-40GB, A100-80GB, H100-80GB, H200, cpu"));
}

TEST_CASE("plan: groups lie on nodes in Megatron's rank order", "[plan]") {
  const Cluster c = a100(4, 8);
  const GroupPlacement tp = place_group(1, 8, c);
  CHECK_FALSE(tp.crosses_nodes);
  CHECK(tp.bandwidth == c.intra_node_bandwidth);
  // dp with tp 8: one member per node, each with its node's network shared by 8 devices.
  const GroupPlacement dp = place_group(8, 4, c);
  CHECK(dp.crosses_nodes);
  CHECK(dp.per_node == 1);
  CHECK(dp.bandwidth == Approx(c.inter_node_bandwidth / 8));
  CHECK(dp.latency == c.inter_node_latency);
  // dp with tp 2 over 32 devices: 4 members on each node carry 4/8 of its network.
  const GroupPlacement dp2 = place_group(2, 16, c);
  CHECK(dp2.per_node == 4);
  CHECK(dp2.bandwidth == Approx(std::min(c.intra_node_bandwidth, c.inter_node_bandwidth / 2)));
  // A group that fits in a node does not cross.
  CHECK_FALSE(place_group(2, 4, c).crosses_nodes);
}

TEST_CASE("plan: collectives follow the ring's alpha-beta formulas", "[plan]") {
  const Cluster c = a100(2, 8);
  Profile p = profile_named("troupe", c).value();
  const GroupPlacement g = place_group(1, 8, c);
  const double bytes = 123456789, bw = g.bandwidth * p.link_efficiency, a = g.latency;
  CHECK(collective_seconds(Collective::all_reduce, bytes, g, p) == Approx(2.0 * 7 / 8 * bytes / bw + 14 * a));
  CHECK(collective_seconds(Collective::all_gather, bytes, g, p) == Approx(7.0 / 8 * bytes / bw + 7 * a));
  CHECK(collective_seconds(Collective::reduce_scatter, bytes, g, p) ==
        collective_seconds(Collective::all_gather, bytes, g, p));
  CHECK(collective_seconds(Collective::send, bytes, g, p) == Approx(bytes / bw + a));
  // An all-reduce is a reduce-scatter and an all-gather.
  CHECK(collective_seconds(Collective::all_reduce, bytes, g, p) ==
        Approx(2 * collective_seconds(Collective::all_gather, bytes, g, p)));
  CHECK(collective_seconds(Collective::all_reduce, bytes, place_group(1, 1, c), p) == 0);
}

TEST_CASE("plan: a GEMM one tile over the compute units runs a second wave", "[plan]") {
  const Cluster c = a100(1, 8);
  Profile p = profile_named("troupe", c).value();
  p.kernel_seconds = 0;
  const double peak = c.device.peak_flops;
  // 1080 tiles of 128 x 128 (compute-bound): 10 full waves on 108 SMs; 1090 tiles: 11 waves, the
  // last one nearly empty, so 109/108 of the work takes 11/10 of the time.
  const double n = 1280, k = 8192;
  const double one = gemm_seconds(128 * 108, n, k, 1, 2, peak, c, p);
  const double two = gemm_seconds(128 * 109, n, k, 1, 2, peak, c, p);
  CHECK(one == Approx(2 * 128.0 * 108 * n * k / (peak * p.gemm_efficiency)));
  CHECK(two == Approx(1.1 * one).epsilon(1e-9));
  // A thin GEMM is memory-bound: its operands' bytes over the bandwidth.
  const double thin = gemm_seconds(4096, 1, 1, 1, 2, peak, c, p);
  CHECK(thin == Approx(2.0 * (4096 + 1 + 4096) / (c.device.memory_bandwidth * p.memory_efficiency)));
}

TEST_CASE("plan: on the CPU a GEMM's efficiency is measured by shape, once per bucket", "[plan]") {
  const double e = measured_gemm_efficiency(1, 300, 500, 700);
  CHECK(e > 0);
  CHECK(e <= 1);
  CHECK(measured_gemm_efficiency(1, 256, 512, 640) == e);  // the same power-of-two bucket: kept, not measured again
  const Cluster c = this_host_cluster(1);
  const Profile p = profile_named("troupe", c).value();
  REQUIRE(p.measured_gemm);
  CHECK(gemm_seconds(256, 512, 512, 1, 4, c.device.peak_flops, c, p) ==
        Approx(2.0 * 256 * 512 * 512 / (c.device.peak_flops * measured_gemm_efficiency(c.device.compute_units, 256, 512, 512)) +
               p.kernel_seconds));
}

TEST_CASE("plan: the simulator takes each stage's own costs and a hop between stages", "[plan]") {
  using namespace sched;
  for (ScheduleType type : {ScheduleType::one_f_one_b, ScheduleType::gpipe, ScheduleType::zb_h1}) {
    const int p = 4, m = 7;
    const Schedule s = make_schedule({type, p, m, 1}).value();
    StageCosts equal;
    equal.forward.assign(p, 1.0);
    equal.backward.assign(p, 2.0);
    equal.weight.assign(p, type == ScheduleType::zb_h1 ? 0.5 : 0.0);
    const SimResult a = simulate(s, equal), b = simulate(s, 1.0, 2.0, type == ScheduleType::zb_h1 ? 0.5 : 0);
    CHECK(a.makespan == Approx(b.makespan));
    CHECK(a.bubble == Approx(b.bubble));
    // A hop delays every dependency across stages: never faster, and at least micro-batch 0's way
    // down and back up.
    StageCosts hop = equal;
    hop.hop = 0.25;
    const SimResult h = simulate(s, hop);
    CHECK(h.makespan >= a.makespan + 2 * (p - 1) * 0.25 - 1e-12);
  }
  // Two stages, one micro-batch: F0, hop, F1, B1, hop, B0 in a row.
  const Schedule two = make_schedule({ScheduleType::one_f_one_b, 2, 1, 1}).value();
  StageCosts c;
  c.forward = {1.0, 3.0};
  c.backward = {2.0, 5.0};
  c.weight = {0.0, 0.0};
  c.hop = 0.5;
  CHECK(simulate(two, c).makespan == Approx(1.0 + 0.5 + 3.0 + 5.0 + 0.5 + 2.0));
}

TEST_CASE("plan: the memory half is the memory plan's largest rank", "[plan]") {
  const Cluster c = a100(1, 8);
  TrainConfig job = small_job();
  job.tensor_model_parallel_size = 2;
  job.pipeline_model_parallel_size = 2;
  job.data_parallel_size = 2;
  job.zero_stage = 1;
  job.recompute_granularity = "selective";
  const Prediction p = predict_memory(job, c);
  TrainConfig gpu = job;
  gpu.device = "cuda";
  const MemoryEstimate e = estimate_memory(gpu, 8);
  const StageMemory& s = e.largest_stage();
  CHECK(p.memory_per_rank_bytes == Approx(s.total()));
  CHECK(p.weight_bytes + p.gradient_bytes + p.optimizer_bytes == Approx(s.model_state_bytes));
  CHECK(p.activation_bytes == Approx(s.activation_bytes));
  // bf16 under ZeRO-1 over 2 ranks: 2-byte weights, 4-byte gradients (Megatron's fp32 main
  // gradients) and the half the reduce-scatter writes, 12 bytes of optimizer states halved.
  CHECK(p.weight_bytes == Approx(2 * s.parameters));
  CHECK(p.gradient_bytes == Approx(6 * s.parameters));
  CHECK(p.optimizer_bytes == Approx(12 * s.parameters / 2));
  CHECK(p.fits);
  Cluster tiny = c;
  tiny.device.memory_bytes = 2.01 * 1024 * 1024 * 1024.0;  // 10 MiB beside the reserve
  tiny.device.memory_reserve_bytes = 2 * 1024 * 1024 * 1024.0;
  const Prediction q = predict_memory(job, tiny);
  CHECK_FALSE(q.fits);
  CHECK_THAT(q.why_not, Contains("out of memory"));
}

TEST_CASE("plan: FLOP counts and the pipeline's time are consistent", "[plan]") {
  const Cluster c = a100(1, 8);
  const Profile p = profile_named("troupe", c).value();
  TrainConfig job = replicated_job();
  job.recompute_granularity = "full";
  const Prediction r = predict(job, c, p).value();
  const double tokens = 16.0 * 512;
  CHECK(r.model_tflops_per_gpu * 1e12 * r.iteration_seconds * 8 == Approx(job.model.flops_per_iteration(16 * 512)));
  // Full recomputation adds the layers' forward: a third of their model FLOPs.
  const double head = 6 * tokens * 256 * static_cast<double>(job.model.padded_vocab_size(1));
  const double model = job.model.flops_per_iteration(16 * 512);
  CHECK(r.hardware_tflops_per_gpu / r.model_tflops_per_gpu == Approx((model + (model - head) / 3) / model));
  CHECK(r.tokens_per_second == Approx(tokens / r.iteration_seconds));
  // One stage: the micro-batches one after another, no bubble.
  CHECK(r.bubble_fraction == 0);
  CHECK(r.pipeline_seconds == Approx(1 * (r.forward_seconds + r.backward_seconds)));
  CHECK(r.iteration_seconds == Approx(r.pipeline_seconds + r.dp_exposed_seconds + r.optimizer_seconds));
  // A slower network never makes a layout faster; a faster device never slower.
  Cluster slow = a100(2, 4);
  TrainConfig spread = job;
  const double base = predict(spread, slow, p).value().iteration_seconds;
  slow.inter_node_bandwidth /= 10;
  CHECK(predict(spread, slow, p).value().iteration_seconds >= base);
  Cluster fast = a100(2, 4);
  fast.device.peak_flops *= 2;
  CHECK(predict(spread, fast, p).value().iteration_seconds <= base);
}

// Mixture of experts: one expert of the MLP's width that every token takes costs the dense MLP plus
// the router and the gathers; k experts of width F / k cost about the dense layer too (the same
// FLOPs); expert parallelism adds its all-to-alls, 4 n k C bytes per MoE layer and micro-batch; and
// the search tries ep.
TEST_CASE("plan: an MoE layer costs its experts' share, the router and the all-to-alls", "[plan][moe]") {
  const Cluster c = a100(1, 8);
  const Profile p = profile_named("troupe", c).value();
  TrainConfig dense = replicated_job();
  dense.model.hidden_size = 1024;
  dense.model.num_attention_heads = 16;
  const Prediction d = predict(dense, c, p).value();
  TrainConfig one = dense;
  one.model.moe.num_experts = {1};
  one.model.moe.topk = 1;
  const Prediction e1 = predict(one, c, p).value();
  INFO("dense " << d.forward_seconds << " + " << d.backward_seconds << ", one expert " << e1.forward_seconds << " + "
                << e1.backward_seconds);
  CHECK(e1.forward_seconds > d.forward_seconds);
  CHECK(e1.forward_seconds < 1.15 * d.forward_seconds);
  CHECK(e1.backward_seconds < 1.15 * d.backward_seconds);
  TrainConfig eight = dense;
  eight.model.moe.num_experts = {8};
  eight.model.moe.topk = 2;
  eight.model.moe.ffn_hidden = dense.model.ffn_hidden_size() / 2;  // top-2 of width F / 2: the dense FLOPs
  const Prediction e8 = predict(eight, c, p).value();
  CHECK(e8.forward_seconds == Approx(e1.forward_seconds).epsilon(0.25));
  REQUIRE(e8.collectives.end() == std::find_if(e8.collectives.begin(), e8.collectives.end(),
                                               [](const CollectiveCost& x) { return x.name == "ep all-to-all"; }));
  eight.expert_model_parallel_size = 4;
  const Prediction ep4 = predict(eight, c, p).value();
  auto a2a = std::find_if(ep4.collectives.begin(), ep4.collectives.end(),
                          [](const CollectiveCost& x) { return x.name == "ep all-to-all"; });
  REQUIRE(a2a != ep4.collectives.end());
  CHECK(a2a->group_size == 4);
  CHECK_FALSE(a2a->crosses_nodes);
  const double n = 2 * 512, micro_batches = 16 / (2 * 8);
  CHECK(a2a->bytes == Approx(4 * n * 2 * 1024 * 2 * 8 * micro_batches));  // 8 MoE layers, bf16
  CHECK(ep4.forward_seconds > e8.forward_seconds);
  // The search tries each expert-parallel size that divides dp and the experts.
  Fixed fixed;
  fixed.tp = 1;
  fixed.pp = 1;
  fixed.micro_batch = 2;
  fixed.zero = 1;
  fixed.recompute = "none";
  fixed.offload = "none";
  const SearchResult r = search_layouts(eight, fixed, c, p, 100).value();
  std::vector<int> eps;
  for (const Candidate& k : r.best) eps.push_back(k.layout.expert_model_parallel_size);
  std::sort(eps.begin(), eps.end());
  eps.erase(std::unique(eps.begin(), eps.end()), eps.end());
  CHECK(eps == std::vector<int>{1, 2, 4, 8});
}

TEST_CASE("plan: 1F1B's simulated bubble on equal stages is theory's", "[plan]") {
  // Without the embedding's and head's extra work (a model whose head is tiny against its layers),
  // the simulated bubble approaches (p - 1) / (m + p - 1).
  Cluster c = a100(1, 8);
  c.intra_node_bandwidth *= 1e6;  // sends take no time
  c.intra_node_latency = 0;
  Profile p = profile_named("troupe", c).value();
  TrainConfig job = small_job();
  job.model.vocab_size = 8;
  job.tokenizer_model = "8";
  job.model.num_layers = 16;
  job.model.hidden_size = 2048;
  job.model.num_attention_heads = 16;
  job.pipeline_model_parallel_size = 4;
  job.data_parallel_size = 2;
  job.global_batch_size = 16;  // 8 micro-batches per replica
  const Prediction r = predict(job, c, p).value();
  REQUIRE(r.simulated);
  CHECK(r.bubble_fraction == Approx(3.0 / (8 + 3)).epsilon(0.02));
}

// Every layout the search may consider, costed one by one with the simulator: the search's best must
// be the fastest of them (its first pass ranks by theory's bubble, only the best are simulated).
TEST_CASE("plan: the search finds the layout an exhaustive costing finds", "[plan]") {
  Cluster c = a100(2, 4);
  c.device.memory_bytes = 3.0 * 1024 * 1024 * 1024;  // some layouts do not fit
  c.device.memory_reserve_bytes = 0.5 * 1024 * 1024 * 1024;
  const Profile p = profile_named("troupe", c).value();
  TrainConfig base = small_job();
  base.model.hidden_size = 1024;
  base.model.num_attention_heads = 16;
  base.model.seq_length = 1024;
  base.model.max_position_embeddings = 1024;
  base.model.vocab_size = 32000;
  base.tokenizer_model = "32000";
  base.global_batch_size = 32;
  const SearchResult r = search_layouts(base, {}, c, p, 5).value();
  REQUIRE(!r.best.empty());
  CHECK(r.out_of_memory > 0);
  double best = 1e300;
  int64_t fitting = 0;
  for (int t : {1, 2, 4})
    for (int pp : {1, 2, 4, 8}) {
      if (8 % (t * pp) != 0) continue;
      const int d = 8 / (t * pp);
      for (int mbs : {1, 2, 4, 8, 16, 32})
        for (const char* sched : {"1f1b", "interleaved", "zb-h1"})
          for (int chunk : {0, 1, 2, 4})
            for (bool sp : {false, true})
              for (int z : {0, 1, 2, 3})
                for (const char* rc : {"none", "selective", "full"})
                  for (const char* off : {"none", "cpu"}) {
                    if (32 % (mbs * d) != 0 || (sp && t == 1)) continue;
                    if ((std::string(sched) == "interleaved") != (chunk > 0)) continue;
                    if (pp == 1 && std::string(sched) != "1f1b") continue;
                    if (chunk > 0 && (8 % pp != 0 || (8 / pp) % chunk != 0 || 8 / pp / chunk < 2)) continue;
                    TrainConfig l = base;
                    l.tensor_model_parallel_size = t;
                    l.pipeline_model_parallel_size = pp;
                    l.data_parallel_size = d;
                    l.micro_batch_size = mbs;
                    l.pipeline_schedule = sched;
                    l.num_layers_per_virtual_pipeline_stage = chunk;
                    l.sequence_parallel = sp;
                    l.zero_stage = z;
                    l.recompute_granularity = rc;
                    l.offload_optimizer = off;
                    if (!predict_memory(l, c).fits) continue;
                    if (!validate_train_config(l, nullptr, {}, 8).is_ok() || !validate_world(l, 8).is_ok()) continue;
                    ++fitting;
                    best = std::min(best, predict(l, c, p, true).value().iteration_seconds);
                  }
    }
  CHECK(r.costed == fitting);
  CHECK(r.best[0].prediction.iteration_seconds == Approx(best).epsilon(1e-12));
  for (size_t i = 1; i < r.best.size(); ++i)
    CHECK(r.best[i - 1].prediction.iteration_seconds <= r.best[i].prediction.iteration_seconds);
  for (const Candidate& k : r.best) {
    CHECK(k.prediction.fits);
    CHECK(k.layout.tensor_model_parallel_size * k.layout.pipeline_model_parallel_size * k.layout.data_parallel_size == 8);
  }
}

TEST_CASE("plan: fixed sizes stay fixed, and an impossible one names the constraint", "[plan]") {
  const Cluster c = a100(2, 8);
  const Profile p = profile_named("troupe", c).value();
  TrainConfig base = small_job();
  Fixed f;
  f.tp = 2;
  f.recompute = "full";
  f.micro_batch = 1;
  const SearchResult r = search_layouts(base, f, c, p, 20).value();
  REQUIRE(!r.best.empty());
  for (const Candidate& k : r.best) {
    CHECK(k.layout.tensor_model_parallel_size == 2);
    CHECK(k.layout.recompute_granularity == "full");
    CHECK(k.layout.micro_batch_size == 1);
  }
  Fixed impossible;
  impossible.tp = 3;  // divides no node of 8 and not the 8 heads
  impossible.pp = 5;
  auto none = search_layouts(base, impossible, c, p, 5);
  REQUIRE_FALSE(none.is_ok());
  CHECK(none.status().is_bad_input());
  CHECK_THAT(none.status().message(), Contains("2 problems"));
  CHECK_THAT(none.status().message(), Contains("--tensor-model-parallel-size 3: tensor parallelism stays inside a node "
                                               "(8 devices) and divides the heads (8) and key/value groups (8) -- use one "
                                               "of 1, 2, 4, 8"));
  CHECK_THAT(none.status().message(), Contains("must equal the devices"));
  Fixed wrong_world;
  wrong_world.tp = 2;
  wrong_world.pp = 2;
  wrong_world.dp = 2;  // 8 of the 16 devices
  CHECK_THAT(search_layouts(base, wrong_world, c, p, 5).status().message(), Contains("but the cluster has 16"));
}

TEST_CASE("plan: a model too large for the cluster names the nodes it needs", "[plan]") {
  const Cluster c = a100(1, 8);
  TrainConfig big = small_job();
  big.model.num_layers = 96;
  big.model.hidden_size = 12288;
  big.model.num_attention_heads = 96;
  big.model.seq_length = 2048;
  big.model.max_position_embeddings = 2048;
  big.model.vocab_size = 51200;
  big.tokenizer_model = "51200";
  big.global_batch_size = 1536;
  const Profile p = profile_named("troupe", c).value();
  const SearchResult r = search_layouts(big, {}, c, p, 5).value();
  CHECK(r.best.empty());
  REQUIRE(!r.not_fitting.empty());
  CHECK_THAT(r.not_fitting[0].prediction.why_not, Contains("out of memory"));
  // 175B parameters' states alone (16 bytes each over ZeRO-3) need about 2.8 TB: more than 30 nodes
  // of 640 GB.
  const int nodes = smallest_fitting_nodes(big, {}, c, 1024);
  CHECK(nodes > 4);
  CHECK(nodes <= 64);
  Cluster enough = c;
  enough.nodes = nodes;
  CHECK_FALSE(search_layouts(big, {}, enough, p, 1).value().best.empty());
  Cluster fewer = c;
  fewer.nodes = nodes - 1;
  auto less = search_layouts(big, {}, fewer, p, 1);  // bad input when no layout divides at all
  CHECK((!less.is_ok() || less.value().best.empty()));
}

TEST_CASE("plan: the save interval is Daly's optimum and the goodput its expected loss", "[plan]") {
  Cluster c = a100(64, 8);
  const Profile p = profile_named("troupe", c).value();
  TrainConfig job = small_job();
  job.model.num_layers = 32;
  job.model.hidden_size = 4096;
  job.model.num_attention_heads = 32;
  job.global_batch_size = 512;
  job.tensor_model_parallel_size = 8;
  job.data_parallel_size = 64;
  job.zero_stage = 1;
  job.recompute_granularity = "selective";
  const Prediction r = predict(job, c, p).value();
  const SavePlan s = plan_saves(job, r, c);
  const double M = 3600 / (c.failures_per_device_hour * 512);
  CHECK(s.mtbf_seconds == Approx(M));
  CHECK(s.checkpoint_bytes == Approx(12.0 * job.model.num_parameters()));
  // ZeRO-1: every rank snapshots its 1/512 over PCIe; 64 nodes write their shares.
  CHECK(s.save_stall_seconds == Approx(s.checkpoint_bytes / 512 / c.pcie_bandwidth));
  CHECK(s.save_write_seconds == Approx(s.checkpoint_bytes / (64 * c.storage_bandwidth)));
  const double d = s.save_stall_seconds;
  const double daly = std::sqrt(2 * d * M) * (1 + std::sqrt(d / (2 * M)) / 3 + d / (18 * M)) - d;
  const double want = std::max({daly, s.save_write_seconds, r.iteration_seconds});
  CHECK(s.save_interval == static_cast<int64_t>(std::ceil(want / r.iteration_seconds)));
  // The expected loss is smallest near the chosen interval: halving or doubling it loses more.
  auto loss = [&](double tau) { return d / tau + (tau / 2 + s.recovery_seconds) / M; };
  CHECK(1 - s.goodput == Approx(loss(s.interval_seconds)));
  if (daly > s.save_write_seconds && daly > 4 * r.iteration_seconds) {
    CHECK(loss(s.interval_seconds) < loss(s.interval_seconds / 2));
    CHECK(loss(s.interval_seconds) < loss(s.interval_seconds * 2));
  }
  // More failures, less goodput; none, all of it.
  Cluster worse = c;
  worse.failures_per_device_hour *= 10;
  CHECK(plan_saves(job, r, worse).goodput < s.goodput);
  Cluster never = c;
  never.failures_per_device_hour = 0;
  CHECK(plan_saves(job, r, never).goodput == 1);
  CHECK(plan_saves(job, r, never).memory_goodput == 1);

  // In-memory snapshots with in-job recovery: the same stall; each node's share copied to the next
  // node over its network; a failure costs the rejoin, the share back into the device and a
  // replaced node's share from its buddy -- not the restart and the load from storage.
  const double node_share = s.checkpoint_bytes / 64;
  CHECK(s.memory_write_seconds == Approx(node_share / c.inter_node_bandwidth));
  CHECK(s.memory_recovery_seconds == Approx(c.rejoin_seconds + d + node_share / c.inter_node_bandwidth));
  const double want_m = std::max({daly, s.memory_write_seconds, r.iteration_seconds});
  CHECK(s.save_memory_interval == static_cast<int64_t>(std::ceil(want_m / r.iteration_seconds)));
  CHECK(1 - s.memory_goodput ==
        Approx(d / s.memory_interval_seconds + (s.memory_interval_seconds / 2 + s.memory_recovery_seconds) / M));
  CHECK(s.memory_recovery_seconds < s.recovery_seconds);
  CHECK(s.memory_goodput > s.goodput);
  // A slower rejoin costs goodput; one node copies into its own memory.
  Cluster slow = c;
  slow.rejoin_seconds = 600;
  CHECK(plan_saves(job, r, slow).memory_goodput < s.memory_goodput);
  Cluster one = a100(1, 8);
  TrainConfig small = job;
  small.data_parallel_size = 1;
  const SavePlan one_node = plan_saves(small, predict(small, one, profile_named("troupe", one).value()).value(), one);
  CHECK(one_node.memory_write_seconds == Approx(one_node.checkpoint_bytes / one.host_memory_bandwidth));
  CHECK(one_node.memory_recovery_seconds == Approx(one.rejoin_seconds + one_node.save_stall_seconds));
}

}  // namespace
}  // namespace troupe::plan
