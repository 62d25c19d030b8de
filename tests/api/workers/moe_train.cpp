// `troupe train` for an MoE model, until the flags of the MoE layers reach the command line: a small
// GPT whose layers 1 and 3 are Megatron-Core MoE layers (top-2 of 4 and of 6 experts, capacity
// factor 1, aux and z losses), trained through troupe::train on mock data and reported as the
// command reports (apps/report.hpp's progress line and --metrics-file JSON lines, apps/tensorboard_log's
// tags). One process runs the layout's ranks; under `troupe launch` each process one rank, rank 0
// reports. SIGINT / SIGTERM stop it after the current iteration.
//
//   moe_train METRICS.jsonl [--tp N] [--pp N] [--dp N] [--iters N] [--log-interval N]
//             [--tensorboard-dir DIR] [--dashboard] [--inspect-file FILE]
//
// tests/cli/tensorboard_moe.sh and tests/cli/dashboard.sh run it.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "apps/report.hpp"
#include "apps/tensorboard_log.hpp"
#include "troupe/train.hpp"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "moe_train: %s\nusage: moe_train METRICS.jsonl [--tp N] [--pp N] [--dp N] [--iters N] "
               "[--log-interval N] [--tensorboard-dir DIR] [--dashboard] [--inspect-file FILE]\n", why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace troupe;
  if (argc < 2) usage("no metrics file");
  const std::string metrics_path = argv[1];
  TrainConfig cfg;
  cfg.model.num_layers = 4;
  cfg.model.hidden_size = 32;
  cfg.model.num_attention_heads = 4;
  cfg.model.seq_length = cfg.model.max_position_embeddings = 16;
  cfg.model.moe.router = MoeRouter::megatron;
  cfg.model.moe.num_experts = {4, 6};
  cfg.model.moe.layer_freq = 2;  // layers 1 and 3 (0-based)
  cfg.model.moe.topk = 2;
  cfg.model.moe.capacity_factor = cfg.model.moe.eval_capacity_factor = 1.0;
  cfg.model.moe.aux_loss_coeff = 0.01;
  cfg.model.moe.z_loss_coeff = 0.001;
  cfg.tokenizer_type = "ByteLevelTokenizer";
  cfg.mock_data = true;
  cfg.micro_batch_size = 2;
  cfg.global_batch_size = 8;
  cfg.train_iters = 4;
  cfg.lr = 1e-3;
  cfg.lr_decay_style = "constant";
  cfg.log_interval = 1;
  cfg.eval_interval = 1000;
  cfg.num_threads = 1;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " takes a value");
      return argv[++i];
    };
    auto number = [&]() { return std::atoi(value().c_str()); };
    if (a == "--tp") cfg.tensor_model_parallel_size = number();
    else if (a == "--pp") cfg.pipeline_model_parallel_size = number();
    else if (a == "--dp") cfg.data_parallel_size = number();
    else if (a == "--iters") cfg.train_iters = number();
    else if (a == "--log-interval") cfg.log_interval = number();
    else if (a == "--tensorboard-dir") cfg.tensorboard.dir = value();
    else if (a == "--dashboard") cfg.dashboard = "0";
    else if (a == "--inspect-file") cfg.inspect_file = value();
    else usage("unknown argument " + a);
  }

  std::unique_ptr<apps::ProgressPrinter> printer;
  std::unique_ptr<apps::TensorBoardLog> tensorboard;
  std::ofstream metrics;
  TrainCallbacks cb;
  cb.on_start = [&](const TrainConfig& c, const DataSource&, int rank, int world) {
    const bool reporter = rank == 0;
    printer = std::make_unique<apps::ProgressPrinter>(c.log_interval, reporter);
    if (!reporter) return Status::ok();
    metrics.open(metrics_path);
    if (!metrics) return Status::bad_input("cannot write " + metrics_path);
    if (!c.tensorboard.dir.empty())
      tensorboard = std::make_unique<apps::TensorBoardLog>(
          c.tensorboard, c.log_interval,
          c.tensor_model_parallel_size * c.pipeline_model_parallel_size * c.resolved_dp(world), c.model.seq_length,
          [&](const std::string& w) { printer->line("  warning: " + w); }, c.model.moe);
    return Status::ok();
  };
  cb.on_note = [&](const std::string& s) {
    if (printer) printer->line("  " + s);
  };
  cb.on_iteration = [&](const IterationStats& s) {
    printer->iteration(s);
    if (metrics.is_open()) metrics << apps::iteration_json(s) << "\n" << std::flush;
    if (tensorboard) tensorboard->iteration(s);
  };
  RunOptions options;
  options.measure_peak = false;
  options.stop = &g_stop;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  auto result = train(cfg, nullptr, cb, options);
  if (!result) {
    std::fprintf(stderr, "moe_train: %s\n", result.status().message().c_str());
    return result.status().is_bad_input() ? 2 : 1;
  }
  if (printer)
    printer->line("moe_train: finished at iteration " + std::to_string(result.value().iteration) +
                  (result.value().stopped_early ? " (stopped early)" : ""));
  return 0;
}
