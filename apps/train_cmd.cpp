// troupe train: Megatron-style flags (+ DeepSpeed JSON) -> validated TrainConfig -> a training job in
// the actor system, with live progress, --metrics-file lines and checkpoints.
#include <chrono>
#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "storage/data_source.hpp"
#include "actors/job.hpp"
#include "config/memory_estimate.hpp"
#include "apps/cli/train_options.hpp"
#include "comm/bootstrap/caf_bootstrap.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "comm/ucx/ucx_world.hpp"
#include "apps/commands.hpp"
#include "apps/report.hpp"
#include "storage/checkpoint.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::apps {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

// SIGINT (Ctrl-C) and SIGTERM (SLURM before a time limit, on preemption; troupe launch passing one
// on) both stop the job gracefully: the current iteration finishes, a checkpoint is saved with
// --save, and the process exits 128 + the signal (130, 143). A second signal ends it at once.
extern "C" void on_stop_signal(int sig) {
  g_signal.store(sig);
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

// The bootstrap reports that the job failed: another rank died, or stopped answering (no heartbeat
// for its connection timeout). A rank blocked on a dead peer's data fails by itself (comm/ reports
// it); one waiting for a hung peer would wait for ever, so this rank gives the ordinary failure path
// a few seconds and then ends the process, naming the cause. The latest checkpoint stays intact
// (it only moves once a save is complete), and troupe launch --max-restarts restarts from it.
void on_job_failed(int rank, const std::string& why) {
  std::thread([rank, why] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::fprintf(stderr, "troupe train: error: rank %d: the job failed (%s) -- stopping this rank; restart the job "
                 "from its latest checkpoint (troupe launch --max-restarts N does it)\n", rank, why.c_str());
    std::fflush(stderr);
    std::_Exit(kExitFailure);
  }).detach();
}

int run_train(const CLI::App& cmd, TrainConfig& cfg) {
  const std::string name = "train";
  // Under troupe launch (or srun / mpirun) every process holds one rank; the ranks started decide
  // the data-parallel size when --data-parallel-size is left out.
  auto env = comm::detect_launch_env();
  if (!env) {
    print_error(name, env.status());
    return kExitUsage;
  }
  if (Status st = finalize_train_config(cmd, &cfg, env->world_size); !st) {
    print_error(name, st);
    return kExitUsage;
  }
  // Restarts of a multi-process job are the launcher's (every process anew); a restarted process
  // resumes from the latest checkpoint in --save.
  if (env->world_size > 1 && cfg.max_restarts > 0) {
    print_error(name, "--max-restarts " + std::to_string(cfg.max_restarts) +
                          " restarts the actors of one process, but this job has " + std::to_string(env->world_size) +
                          " -- pass --max-restarts to troupe launch, which restarts every process");
    return kExitUsage;
  }
  auto tokenizer = make_tokenizer(cfg.tokenizer_type, cfg.vocab_file, cfg.merge_file);
  if (!tokenizer) {
    print_error(name, tokenizer.status());
    return kExitUsage;
  }
  cfg.model.vocab_size = tokenizer.value()->vocab_size();
  if (Status st = cfg.model.validate(); !st) {
    print_error(name, st);
    return kExitUsage;
  }
  // Before anything is allocated: a configuration that cannot fit is refused naming the flag to lower.
  if (Status st = check_memory(cfg, env->world_size, env->local_world_size, available_memory_bytes()); !st) {
    print_error(name, st);
    return kExitUsage;
  }
  auto data = cfg.mock_data ? Result<std::shared_ptr<DataSource>>(
                                  make_mock_data(cfg.model.vocab_size, cfg.model.seq_length, cfg.seed))
                            : open_indexed_data(cfg.data_path, cfg.split, cfg.model.seq_length, cfg.seed,
                                                cfg.no_shuffle, cfg.model.vocab_size);
  if (!data) {
    print_error(name, data.status().with_context("--data-path " + cfg.data_path + ": "));
    return kExitUsage;
  }
  // The ranks meet at the rendezvous and build the UCX world before anything is printed.
  std::unique_ptr<comm::CafBootstrap> bootstrap;
  JobOptions options;
  if (env->world_size > 1) {
    comm::CafBootstrapOptions boot_options;
    boot_options.on_job_failed = [rank = env->rank](const std::string& why) { on_job_failed(rank, why); };
    // A peer that stops answering (hung, or its host cut off) is noticed within the heartbeat's
    // connection timeout: 15 s, or a third of --distributed-timeout-minutes when that is shorter
    // (the process then ends 5 s later, on_job_failed), at least 2 s.
    const auto third_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(cfg.distributed_timeout_minutes * 20'000));
    if (third_timeout < boot_options.connection_timeout) {
      boot_options.connection_timeout = std::max(third_timeout, std::chrono::milliseconds(2000));
      boot_options.heartbeat_interval = boot_options.connection_timeout / 5;
    }
    auto b = comm::create_caf_bootstrap(*env, boot_options);
    if (!b) {
      print_error(name, b.status());
      return b.status().is_bad_input() ? kExitUsage : kExitFailure;  // MASTER_ADDR unusable: 2
    }
    bootstrap = std::move(b).value();
    auto w = comm::create_ucx_world(*bootstrap);
    if (!w) {
      print_error(name, w.status().with_context("rank " + std::to_string(env->rank) + ": "));
      return kExitFailure;
    }
    options.world = std::shared_ptr<comm::CommWorld>(std::move(w).value());
    options.bootstrap = bootstrap.get();
  }
  // Ranks sharing a host share its cores: by default each takes its share.
  if (cfg.num_threads == 0 && env->local_world_size > 1)
    cfg.num_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / env->local_world_size);
  const bool reporter = env->rank == 0;  // rank 0 prints and writes the metrics; the others stay quiet

  std::unique_ptr<std::ofstream> metrics;
  if (reporter && !cfg.metrics_file.empty()) {
    metrics = std::make_unique<std::ofstream>(cfg.metrics_file, std::ios::app);
    if (!*metrics) {
      print_error(name, "--metrics-file " + cfg.metrics_file + " cannot be opened for appending -- check the path");
      return kExitUsage;
    }
  }

  ProgressPrinter printer(cfg.log_interval, reporter);
  const GptConfig& m = cfg.model;
  printer.line(fmt::format(
      "troupe train: GPT-2 {} layers, hidden {}, {} heads, seq {}, vocabulary {} (padded to {}), {:.2f}M parameters",
      m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length, m.vocab_size, m.padded_vocab_size(1),
      m.num_parameters() / 1e6));
  const int dp = cfg.resolved_dp(env->world_size);
  printer.line(fmt::format("  batch: micro {} x {} accumulation steps x {} data-parallel = global {} ({} tokens/iteration); "
                           "layout tp {}, pp {}, dp {}{}",
                           cfg.micro_batch_size, cfg.grad_accumulation_steps(env->world_size), dp,
                           cfg.global_batch_size, int64_t{cfg.global_batch_size} * m.seq_length,
                           cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, dp,
                           cfg.parallel() || env->world_size > 1 ? "" : " (one shard)"));
  printer.line("  data: " + data.value()->describe());

  JobCallbacks cb;
  cb.on_note = [&](const std::string& s) { printer.line("  " + s); };
  cb.on_iteration = [&](const IterationStats& s) {
    printer.iteration(s);
    if (metrics) *metrics << iteration_json(s) << "\n" << std::flush;
  };
  cb.on_eval = [&](const EvalStats& e) {
    printer.line(fmt::format(" validation loss at iteration {} | lm loss: {:.6E} | lm loss PPL: {:.6E} | tokens: {}",
                             e.iteration, e.loss, e.perplexity, e.tokens));
    if (metrics) *metrics << eval_json(e) << "\n" << std::flush;
  };
  cb.on_saved = [&](const SavedCheckpoint& c) {
    if (c.committed)
      printer.line(fmt::format("  checkpoint of iteration {} in {} complete on disk (written in the background in {:.2f} s)",
                               c.iteration, c.path, c.seconds));
    else
      printer.line(fmt::format("  saved checkpoint at iteration {} to {} ({:.2f} s)", c.iteration, c.path, c.seconds));
    if (metrics)
      *metrics << fmt::format(R"({{"type":"{}","iteration":{},"seconds":{}}})",
                              c.committed ? "checkpoint_committed" : "checkpoint_snapshot", c.iteration, c.seconds)
               << "\n" << std::flush;
  };
  options.stop = &g_stop;
  // A process troupe launch restarted resumes this run's latest checkpoint in --save (run_training
  // decides, config/run_identity.hpp); the launcher names the run in TROUPE_RUN_ID.
  const char* restart_count = std::getenv("TROUPE_RESTART_COUNT");
  options.restarted = restart_count != nullptr && std::atoi(restart_count) > 0;
  if (const char* run = std::getenv("TROUPE_RUN_ID")) options.launch_run_id = run;
  // A stuck rank's actor cannot be torn down, so the process ends here (troupe launch --max-restarts
  // starts it again).
  options.on_stuck = [&](const std::string& message) {
    print_error(name, message);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(kExitFailure);
  };
  // Before training starts a signal ends the process at once (nothing to save yet).
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  auto result = run_training(cfg, data.value(), cb, options);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!result) {
    print_error(name, result.status());
    return result.status().is_bad_input() ? kExitUsage : kExitFailure;
  }
  const TrainSummary& s = result.value();
  std::string final_line = fmt::format("troupe train: finished at iteration {}/{} | final lm loss: {:.6f}", s.iteration,
                                       cfg.train_iters, s.last_loss);
  if (s.last_eval_loss >= 0) final_line += fmt::format(" | last validation loss: {:.6f}", s.last_eval_loss);
  if (!s.last_checkpoint.empty()) final_line += " | checkpoint: " + s.last_checkpoint;
  if (s.stopped_early) final_line += " (stopped early)";
  printer.line(final_line);
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0)  // ru_maxrss: KiB on Linux
    printer.line(fmt::format("  peak resident memory of this process: {:.0f} MiB", usage.ru_maxrss / 1024.0));
  if (const int sig = g_signal.load(); sig != 0) return 128 + sig;  // stopped (and saved) on a signal
  return kExitOk;
}

}  // namespace

void add_train_command(CLI::App& app, int* exit_code) {
  auto cfg = std::make_shared<TrainConfig>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT model (Megatron-LM flags, DeepSpeed JSON config)");
  add_train_options(cmd, cfg.get());
  cmd->callback([cmd, cfg, exit_code] { *exit_code = run_train(*cmd, *cfg); });
}

}  // namespace troupe::apps
