// troupe plan: the best layouts of a model on a cluster, predicted (plan/). It takes troupe train's
// flags for the model, batch and precision (Megatron's names, screened like train's), any parallel
// size given is fixed and the rest searched, and the cluster from --gpu/--nodes/--gpus-per-node, a
// --cluster file, or this machine (the default, measured on the spot). docs/PLAN.md.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/cli/train_options.hpp"
#include "apps/commands.hpp"
#include "apps/cli/megatron_compat.hpp"
#include "apps/plan_flags.hpp"
#include "plan/auto_layout.hpp"
#include "apps/report.hpp"
#include "config/memory_estimate.hpp"
#include "plan/goodput.hpp"
#include "plan/host.hpp"
#include "plan/search.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::apps {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct PlanOptions {
  std::string cluster_file, gpu, profile = "troupe";
  // -1: not given (the preset's or the file's value); a given value is checked by validate_cluster.
  int nodes = -1, gpus_per_node = -1;
  double gpu_memory_gib = -1, peak_tflops = -1, memory_bandwidth_gbps = -1, nvlink_gbps = -1, network_gbps = -1;
  double failures_per_gpu_hour = -1, storage_gbps = -1;
  int top = 5;
  bool json = false;
};

// The flags `plan` adds to train's, with whether each takes a value.
constexpr std::pair<const char*, bool> kPlanFlags[] = {
    {"--cluster", true},        {"--gpu", true},          {"--nodes", true},
    {"--gpus-per-node", true},  {"--gpu-memory-gib", true}, {"--peak-tflops", true},
    {"--memory-bandwidth-gbps", true}, {"--nvlink-gbps", true}, {"--network-gbps", true},
    {"--profile", true},        {"--top", true},          {"--json", false},
    {"--failures-per-gpu-hour", true}, {"--storage-gbps", true},
};

Result<plan::Cluster> make_cluster(const PlanOptions& o) {
  auto measured_cpu = [](int ranks) { return plan::this_host_cluster(ranks); };
  plan::Cluster c;
  if (!o.cluster_file.empty()) {
    std::ifstream in(o.cluster_file, std::ios::binary);
    if (!in) return Status::bad_input("--cluster " + o.cluster_file + " cannot be read -- check the path");
    std::string text;
    char buf[65536];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
      text.append(buf, static_cast<size_t>(in.gcount()));
      if (text.size() > (size_t{1} << 20))
        return Status::bad_input("--cluster " + o.cluster_file + " is over 1 MiB -- a cluster file is a small JSON object");
    }
    auto parsed = plan::parse_cluster_json(text, o.cluster_file);
    if (!parsed) return parsed.status();
    if (parsed.value().is_cpu()) {
      const plan::Cluster base = measured_cpu(std::max(1, o.gpus_per_node));
      parsed = plan::parse_cluster_json(text, o.cluster_file, &base);
      if (!parsed) return parsed.status();
    }
    c = parsed.value();
  } else {
    auto preset = plan::cluster_preset(o.gpu.empty() ? "cpu" : o.gpu);
    if (!preset) return preset.status();
    c = preset.value();
    if (c.is_cpu()) c = measured_cpu(std::max(1, o.gpus_per_node));
  }
  auto given = [](double v) { return v != -1; };
  if (given(o.nodes)) c.nodes = o.nodes;
  if (given(o.gpus_per_node)) c.devices_per_node = o.gpus_per_node;
  if (given(o.gpu_memory_gib)) c.device.memory_bytes = o.gpu_memory_gib * kGiB;
  if (given(o.peak_tflops)) c.device.peak_flops = o.peak_tflops * 1e12;
  if (given(o.memory_bandwidth_gbps)) c.device.memory_bandwidth = o.memory_bandwidth_gbps * 1e9;
  if (given(o.nvlink_gbps)) c.intra_node_bandwidth = o.nvlink_gbps * 1e9;
  if (given(o.network_gbps)) c.inter_node_bandwidth = o.network_gbps * 1e9;
  if (given(o.failures_per_gpu_hour)) c.failures_per_device_hour = o.failures_per_gpu_hour;
  if (given(o.storage_gbps)) c.storage_bandwidth = o.storage_gbps * 1e9;
  if (Status st = plan::validate_cluster(c); !st) return st;
  return c;
}

std::string gib_text(double bytes) { return fmt::format("{:.1f}", bytes / kGiB); }

// "bubble 12%" or "communication 8%": what the layout loses most to.
std::string loss_text(const plan::Prediction& p) {
  double comm = 0;
  for (const auto& c : p.collectives) comm += c.exposed;
  const double comm_share = p.iteration_seconds > 0 ? comm / p.iteration_seconds : 0;
  if (p.bubble_fraction >= comm_share) return fmt::format("bubble {:.0f}%", 100 * p.bubble_fraction);
  return fmt::format("communication {:.0f}%", 100 * comm_share);
}

nlohmann::json layout_json(const plan::Candidate& c, const plan::Cluster& cluster) {
  const int64_t world = cluster.world();
  const TrainConfig& l = c.layout;
  const plan::Prediction& p = c.prediction;
  const int v = l.pipeline_schedule == "interleaved" && l.num_layers_per_virtual_pipeline_stage > 0
                    ? l.model.num_layers / (l.pipeline_model_parallel_size * l.num_layers_per_virtual_pipeline_stage)
                    : 1;
  nlohmann::json j;
  j["tp"] = l.tensor_model_parallel_size;
  j["pp"] = l.pipeline_model_parallel_size;
  j["vpp"] = v;
  j["dp"] = l.resolved_dp(static_cast<int>(std::min<int64_t>(world, 1 << 30)));
  j["cp"] = l.context_parallel_size;
  j["ulysses"] = l.ds_sequence_parallel_size;
  j["ep"] = l.expert_model_parallel_size;
  j["zero_stage"] = l.zero_stage;
  j["micro_batch_size"] = l.micro_batch_size;
  j["recompute"] = l.recompute_granularity;
  j["offload"] = l.offload_optimizer;
  j["schedule"] = l.pipeline_schedule;
  j["sequence_parallel"] = l.sequence_parallel;
  j["fits"] = p.fits;
  if (!p.fits) j["why_not"] = p.why_not;
  j["memory_per_rank_bytes"] = p.memory_per_rank_bytes;
  j["memory"] = {{"weights_bytes", p.weight_bytes},       {"gradients_bytes", p.gradient_bytes},
                 {"optimizer_bytes", p.optimizer_bytes},  {"activations_bytes", p.activation_bytes},
                 {"capacity_bytes", p.memory_capacity_bytes}};
  j["bubble_fraction"] = p.bubble_fraction;
  j["bubble_simulated"] = p.simulated;
  j["iteration_seconds"] = p.iteration_seconds;
  j["tokens_per_second"] = p.tokens_per_second;
  j["model_tflops_per_gpu"] = p.model_tflops_per_gpu;
  j["hardware_tflops_per_gpu"] = p.hardware_tflops_per_gpu;
  j["mfu"] = p.mfu;
  j["forward_seconds"] = p.forward_seconds;
  j["backward_seconds"] = p.backward_seconds;
  j["optimizer_seconds"] = p.optimizer_seconds;
  nlohmann::json colls = nlohmann::json::array();
  for (const auto& c2 : p.collectives)
    colls.push_back({{"name", c2.name}, {"group_size", c2.group_size}, {"crosses_nodes", c2.crosses_nodes},
                     {"bytes", c2.bytes}, {"seconds", c2.seconds}, {"exposed_seconds", c2.exposed}});
  j["collectives"] = colls;
  const plan::SavePlan save = plan::plan_saves(l, p, cluster);
  j["save_interval"] = save.save_interval;
  j["goodput"] = save.goodput;
  j["save_memory_interval"] = save.save_memory_interval;
  j["goodput_in_job"] = save.memory_goodput;
  j["checkpoint_bytes"] = save.checkpoint_bytes;
  j["mtbf_seconds"] = std::isfinite(save.mtbf_seconds) ? nlohmann::json(save.mtbf_seconds) : nlohmann::json(nullptr);
  return j;
}

void print_text(const TrainConfig& cfg, const plan::Cluster& cluster, const plan::Profile& profile,
                const plan::SearchResult& r, double seconds) {
  const GptConfig& m = cfg.model;
  const int64_t world = cluster.world();
  std::printf("troupe plan: %s %d layers, hidden %d, %d heads, seq %d, %.2f B parameters; global batch %d (%.3g M tokens), %s\n",
              m.family_name(), m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length, m.num_parameters() / 1e9,
              cfg.global_batch_size, static_cast<double>(cfg.global_batch_size) * m.seq_length / 1e6,
              cfg.precision.sixteen_bit() ? (cfg.precision.dtype == PrecisionDType::bf16 ? "bf16" : "fp16") : "fp32");
  std::printf("  cluster: %s; profile %s\n", plan::describe(cluster).c_str(), profile.name.c_str());
  std::printf("  searched %lld layouts in %.2f s: %lld out of memory, %lld not runnable by troupe, %lld costed, %lld simulated\n",
              static_cast<long long>(r.considered), seconds, static_cast<long long>(r.out_of_memory),
              static_cast<long long>(r.not_runnable), static_cast<long long>(r.costed), static_cast<long long>(r.simulated));
  if (!r.not_runnable_example.empty()) std::printf("    not runnable, e.g. %s\n", r.not_runnable_example.c_str());
  std::printf("\n  %2s  %-84s %9s %11s %15s %5s %18s %9s\n", "#", "layout", "iter (s)", "tokens/s", "TFLOP/s mdl/hw",
              "MFU", "loses most to", "GiB/rank");
  for (size_t i = 0; i < r.best.size(); ++i) {
    const plan::Prediction& p = r.best[i].prediction;
    std::printf("  %2zu  %-84s %9.3f %11.4g %7.1f/%-7.1f %4.0f%% %18s %9s\n", i + 1,
                plan::layout_text(r.best[i].layout, world).c_str(), p.iteration_seconds, p.tokens_per_second,
                p.model_tflops_per_gpu, p.hardware_tflops_per_gpu, 100 * p.mfu, loss_text(p).c_str(),
                gib_text(p.memory_per_rank_bytes).c_str());
  }
  if (!r.best.empty()) {
    const plan::Prediction& p = r.best[0].prediction;
    std::printf("\n  the best in detail:\n");
    std::printf("    memory per rank: %s GiB of %s (weights %s, gradients %s, optimizer %s, activations %s)\n",
                gib_text(p.memory_per_rank_bytes).c_str(), gib_text(p.memory_capacity_bytes).c_str(),
                gib_text(p.weight_bytes).c_str(), gib_text(p.gradient_bytes).c_str(), gib_text(p.optimizer_bytes).c_str(),
                gib_text(p.activation_bytes).c_str());
    std::printf("    one micro-batch on the busiest stage: forward %.2f ms, backward %.2f ms; pipeline %.3f s, bubble %.1f%%%s\n",
                1e3 * p.forward_seconds, 1e3 * p.backward_seconds, p.pipeline_seconds, 100 * p.bubble_fraction,
                p.simulated ? " (simulated on the schedule's action list)" : " (theory)");
    for (const auto& c : p.collectives)
      std::printf("    %-32s group %-5d %-13s %9.3g GB %9.4f s, exposed %.4f s\n", c.name.c_str(), c.group_size,
                  c.crosses_nodes ? "across nodes" : "in a node", c.bytes / 1e9, c.seconds, c.exposed);
    std::printf("    optimizer step %.4f s; data-parallel time exposed %.4f s\n", p.optimizer_seconds, p.dp_exposed_seconds);
    const plan::SavePlan save = plan::plan_saves(r.best[0].layout, p, cluster);
    if (std::isfinite(save.mtbf_seconds))
      std::printf("    failures: one every %.2f h (%.3g per GPU-hour x %lld devices); a save stalls %.2f s and writes %.3g GB in "
                  "%.1f s, a restart and load take %.0f s; best --save-interval %lld (every %.0f s, Young/Daly): goodput "
                  "%.1f%%\n",
                  save.mtbf_seconds / 3600, cluster.failures_per_device_hour, static_cast<long long>(world),
                  save.save_stall_seconds, save.checkpoint_bytes / 1e9, save.save_write_seconds, save.recovery_seconds,
                  static_cast<long long>(save.save_interval), save.interval_seconds, 100 * save.goodput);
    if (std::isfinite(save.mtbf_seconds))
      std::printf("    with in-memory snapshots and in-job recovery instead: a snapshot's copy %s takes %.1f s, a "
                  "recovery %.0f s (rejoin %.0f s); best --save-memory-interval %lld (every %.0f s) with --in-job-recovery: "
                  "goodput %.1f%%\n",
                  cluster.nodes > 1 ? "to the next node" : "into host memory", save.memory_write_seconds,
                  save.memory_recovery_seconds, cluster.rejoin_seconds, static_cast<long long>(save.save_memory_interval),
                  save.memory_interval_seconds, 100 * save.memory_goodput);
  }
  if (!r.not_fitting.empty()) {
    std::printf("\n  rejected for memory (%lld layouts), the closest:\n", static_cast<long long>(r.out_of_memory));
    for (const auto& c : r.not_fitting)
      std::printf("    %s: %s\n", plan::layout_text(c.layout, world).c_str(), c.prediction.why_not.c_str());
  }
}

int run_plan(const CLI::App& cmd, TrainConfig& cfg, const PlanOptions& o) {
  const std::string name = "plan";
  // The plan reads no files but the tokenizer's (for the vocabulary) and the cluster's.
  waive_run_inputs_for_plan(&cfg);
  std::vector<std::string> notes;
  std::vector<std::string> problems;
  if (cmd.get_option("--global-batch-size")->count() == 0 && cfg.deepspeed_config.empty())
    problems.push_back("--global-batch-size is not given -- troupe plan searches the data-parallel size, so give the "
                       "global batch in sequences (e.g. --global-batch-size 1536)");
  // The flags are checked as for one rank of each size given; an expert-parallel size needs as many
  // data-parallel ranks (every layout the search builds has a multiple of it), so it is checked on
  // the smallest world that has them.
  TrainConfig checked = cfg;
  Status finalized = finalize_train_config(cmd, &checked, 1, &notes);
  if (!finalized && checked.expert_model_parallel_size > 1) {
    const int64_t smallest = int64_t{std::max(1, checked.tensor_model_parallel_size)} *
                             std::max(1, checked.pipeline_model_parallel_size) * std::max(1, checked.sequence_ranks()) *
                             checked.expert_model_parallel_size;
    checked = cfg;
    notes.clear();
    finalized = finalize_train_config(cmd, &checked, static_cast<int>(std::min<int64_t>(smallest, 1 << 30)), &notes);
  }
  cfg = checked;
  if (!finalized) problems.push_back(finalized.message());
  if (!problems.empty()) {
    std::string message = problems.size() == 1 ? problems[0] : fmt::format("{} problems:", problems.size());
    if (problems.size() > 1)
      for (const auto& p : problems) message += "\n  - " + p;
    print_error(name, message);
    return kExitUsage;
  }
  auto tokenizer = make_tokenizer(cfg.tokenizer_type, cfg.vocab_file, cfg.merge_file, cfg.tokenizer_model);
  if (!tokenizer) {
    print_error(name, tokenizer.status());
    return kExitUsage;
  }
  cfg.model.vocab_size = tokenizer.value()->vocab_size();
  if (Status st = cfg.model.validate(); !st) {
    print_error(name, st);
    return kExitUsage;
  }
  auto cluster = make_cluster(o);
  if (!cluster) {
    print_error(name, cluster.status());
    return kExitUsage;
  }
  auto profile = plan::profile_named(o.profile, cluster.value());
  if (!profile) {
    print_error(name, profile.status());
    return kExitUsage;
  }
  const plan::Fixed fixed = fixed_sizes(cmd, cfg);
  const auto t0 = std::chrono::steady_clock::now();
  auto result = plan::search_layouts(cfg, fixed, cluster.value(), profile.value(), std::max(1, o.top));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!result) {
    print_error(name, result.status());
    return kExitUsage;
  }
  const plan::SearchResult& r = result.value();
  if (o.json) {
    nlohmann::json j;
    j["cluster"] = {{"device", cluster.value().device.name},
                    {"nodes", cluster.value().nodes},
                    {"gpus_per_node", cluster.value().devices_per_node},
                    {"memory_bytes", cluster.value().device.memory_bytes},
                    {"peak_flops", cluster.value().device.peak_flops}};
    j["profile"] = profile.value().name;
    j["searched"] = {{"layouts", r.considered}, {"out_of_memory", r.out_of_memory}, {"not_runnable", r.not_runnable},
                     {"costed", r.costed},      {"simulated", r.simulated},         {"seconds", seconds}};
    nlohmann::json layouts = nlohmann::json::array(), over = nlohmann::json::array();
    for (const auto& c : r.best) layouts.push_back(layout_json(c, cluster.value()));
    for (const auto& c : r.not_fitting) over.push_back(layout_json(c, cluster.value()));
    j["layouts"] = layouts;
    j["not_fitting"] = over;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_text(cfg, cluster.value(), profile.value(), r, seconds);
  }
  if (r.best.empty()) {
    const int nodes = plan::smallest_fitting_nodes(cfg, fixed, cluster.value(), 1 << 16);
    std::string message = fmt::format("the model fits no layout of {} devices", cluster.value().world());
    if (!r.not_fitting.empty()) message += " (the closest: " + r.not_fitting[0].prediction.why_not + ")";
    message += nodes > 0 ? fmt::format(" -- it fits on {} nodes of {} (--nodes {}), or lower --micro-batch-size, or "
                                       "allow recompute and ZeRO (leave them out to search them)",
                                       nodes, cluster.value().devices_per_node, nodes)
                         : " -- no cluster of this kind up to 65536 nodes fits it with these fixed sizes: leave sizes "
                           "out so that they are searched, or use devices with more memory";
    print_error(name, message);
    return kExitUsage;
  }
  return kExitOk;
}

}  // namespace

plan::Fixed fixed_sizes(const CLI::App& cmd, const TrainConfig& cfg) {
  plan::Fixed fixed;
  auto given = [&](const char* flag) {
    const CLI::Option* o = cmd.get_option_no_throw(flag);
    return o != nullptr && o->count() > 0;
  };
  if (given("--tensor-model-parallel-size")) fixed.tp = cfg.tensor_model_parallel_size;
  if (given("--pipeline-model-parallel-size")) fixed.pp = cfg.pipeline_model_parallel_size;
  if (given("--data-parallel-size")) fixed.dp = cfg.data_parallel_size;
  if (given("--context-parallel-size")) fixed.cp = cfg.context_parallel_size;
  if (given("--ds-sequence-parallel-size")) fixed.ulysses = cfg.ds_sequence_parallel_size;
  if (given("--cp-comm-type")) fixed.cp_comm_type = cfg.cp_comm_type;
  if (given("--micro-batch-size")) fixed.micro_batch = cfg.micro_batch_size;
  if (given("--expert-model-parallel-size") || given("--moe-expert-parallel-size"))
    fixed.ep = cfg.expert_model_parallel_size;
  // A DeepSpeed file names the ZeRO stage (and with it the micro-batch) as a choice already made.
  if (given("--zero-stage") || !cfg.deepspeed_config.empty()) fixed.zero = cfg.zero_stage;
  if (given("--num-layers-per-virtual-pipeline-stage"))
    fixed.layers_per_virtual_stage = cfg.num_layers_per_virtual_pipeline_stage;
  if (given("--sequence-parallel")) fixed.sequence_parallel = cfg.sequence_parallel;
  if (given("--recompute-granularity")) fixed.recompute = cfg.recompute_granularity;
  if (given("--offload-optimizer")) fixed.offload = cfg.offload_optimizer;
  if (given("--pipeline-schedule")) fixed.schedule = cfg.pipeline_schedule;
  return fixed;
}

Result<std::vector<std::string>> resolve_auto_layout(const std::vector<std::string>& train_args, int world, int local,
                                                     std::vector<std::string>* lines) {
  // The flags as `troupe train` reads them: screened, parsed, finalized for the world.
  auto screened = screen_train_args(train_args, world);
  if (!screened) return screened.status();
  CLI::App app;
  TrainConfig cfg;
  CLI::App* cmd = app.add_subcommand("train");
  add_train_options(cmd, &cfg);
  std::vector<std::string> argv{"train"};
  argv.insert(argv.end(), screened.value().args.begin(), screened.value().args.end());
  try {
    std::vector<std::string> reversed(argv.rbegin(), argv.rend());
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return Status::bad_input(std::string("train: ") + e.what());
  }
  if (Status st = finalize_train_config(*cmd, &cfg, world); !st) return st.as_bad_input();
  auto tokenizer = make_tokenizer(cfg.tokenizer_type, cfg.vocab_file, cfg.merge_file, cfg.tokenizer_model);
  if (!tokenizer) return tokenizer.status().as_bad_input();
  cfg.model.vocab_size = tokenizer.value()->vocab_size();
  if (Status st = cfg.model.validate(); !st) return st.as_bad_input();
  const plan::Fixed fixed = fixed_sizes(*cmd, cfg);
  auto chosen = plan::choose_layout(cfg, fixed, world, local);
  if (!chosen) return chosen.status();
  if (lines != nullptr) *lines = chosen.value().lines;
  const TrainConfig& l = chosen.value().best.layout;
  // The sizes the command line left open, as flags; the ones it gave stay as they are.
  std::vector<std::string> out;
  for (const std::string& a : train_args)
    if (a != "--auto-layout") out.push_back(a);
  auto add = [&](bool given, const char* flag, const std::string& value) {
    if (!given) {
      out.push_back(flag);
      out.push_back(value);
    }
  };
  add(fixed.tp.has_value(), "--tensor-model-parallel-size", std::to_string(l.tensor_model_parallel_size));
  add(fixed.pp.has_value(), "--pipeline-model-parallel-size", std::to_string(l.pipeline_model_parallel_size));
  add(fixed.dp.has_value(), "--data-parallel-size", std::to_string(l.data_parallel_size));
  add(fixed.micro_batch.has_value(), "--micro-batch-size", std::to_string(l.micro_batch_size));
  add(fixed.zero.has_value(), "--zero-stage", std::to_string(l.zero_stage));
  add(fixed.recompute.has_value(), "--recompute-granularity", l.recompute_granularity);
  add(fixed.offload.has_value(), "--offload-optimizer", l.offload_optimizer);
  add(fixed.schedule.has_value() || fixed.layers_per_virtual_stage.has_value(), "--pipeline-schedule", l.pipeline_schedule);
  if (l.num_layers_per_virtual_pipeline_stage > 0)
    add(fixed.layers_per_virtual_stage.has_value(), "--num-layers-per-virtual-pipeline-stage",
        std::to_string(l.num_layers_per_virtual_pipeline_stage));
  if (l.context_parallel_size > 1) add(fixed.cp.has_value(), "--context-parallel-size", std::to_string(l.context_parallel_size));
  if (l.sequence_parallel && !fixed.sequence_parallel.has_value()) out.push_back("--sequence-parallel");
  return out;
}

std::vector<std::string> split_plan_args(std::vector<std::string>& args) {
  std::vector<std::string> own, rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    bool taken = false;
    for (const auto& [flag, value] : kPlanFlags) {
      const std::string f = flag;
      if (a == f) {
        own.push_back(a);
        if (value && i + 1 < args.size()) own.push_back(args[++i]);
        taken = true;
        break;
      }
      if (value && a.rfind(f + "=", 0) == 0) {
        own.push_back(a);
        taken = true;
        break;
      }
    }
    if (!taken) rest.push_back(a);
  }
  args = std::move(rest);
  return own;
}

void add_plan_command(CLI::App& app, int* exit_code) {
  auto cfg = std::make_shared<TrainConfig>();
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Predict and rank the layouts of a model on a cluster (troupe train's model and batch flags; docs/PLAN.md)");
  add_train_options(cmd, cfg.get());
  const std::string g = "Cluster (docs/PLAN.md)";
  cmd->add_option("--cluster", o->cluster_file, "A JSON file describing the cluster (keys in docs/PLAN.md)")->group(g);
  cmd->add_option("--gpu", o->gpu, "A preset: " + plan::cluster_preset_names() + " (default: cpu, this machine, measured)")
      ->group(g);
  cmd->add_option("--nodes", o->nodes, "Nodes of the cluster")->group(g);
  cmd->add_option("--gpus-per-node", o->gpus_per_node, "Devices per node (cpu: ranks on this host, default 1)")->group(g);
  cmd->add_option("--gpu-memory-gib", o->gpu_memory_gib, "Override: device memory, GiB")->group(g);
  cmd->add_option("--peak-tflops", o->peak_tflops, "Override: dense 16-bit TFLOP/s of a device")->group(g);
  cmd->add_option("--memory-bandwidth-gbps", o->memory_bandwidth_gbps, "Override: device memory GB/s")->group(g);
  cmd->add_option("--nvlink-gbps", o->nvlink_gbps, "Override: NVLink GB/s per device, one direction")->group(g);
  cmd->add_option("--network-gbps", o->network_gbps, "Override: network GB/s per node, one direction")->group(g);
  cmd->add_option("--profile", o->profile, "Whose execution: troupe (default) or megatron (Megatron-LM as published)")
      ->group(g);
  cmd->add_option("--top", o->top, "Layouts to list (default 5)")->group(g);
  cmd->add_flag("--json", o->json, "Print {\"layouts\": [...]} as JSON, best first")->group(g);
  cmd->add_option("--failures-per-gpu-hour", o->failures_per_gpu_hour,
                  "Failures per device and hour for the save interval and goodput (default 1.97e-5, LLaMA 3's run)")
      ->group(g);
  cmd->add_option("--storage-gbps", o->storage_gbps, "Checkpoint storage GB/s per node (default 5)")->group(g);
  cmd->callback([cmd, cfg, o, exit_code] { *exit_code = run_plan(*cmd, *cfg, *o); });
}

}  // namespace troupe::apps
