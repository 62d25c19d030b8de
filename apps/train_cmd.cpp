// troupe train: Megatron-style flags (+ DeepSpeed JSON) -> validated TrainConfig -> a training job in
// the actor system, with live progress, --metrics-file lines and checkpoints.
#include <chrono>
#include <sys/resource.h>

#include <csignal>
#include <pthread.h>
#include <signal.h>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "apps/cli/megatron_compat.hpp"
#include "apps/cli/train_options.hpp"
#include "apps/commands.hpp"
#include "apps/plan_flags.hpp"
#include "apps/report.hpp"
#include "engine/goodput.hpp"
#include "engine/lifecycle.hpp"
#include "apps/tensorboard_log.hpp"
#include "api/setup.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "config/memory_estimate.hpp"
#include "config/validate.hpp"
#include "plan/auto_layout.hpp"
#include "storage/tokenizer.hpp"
#include "troupe/train.hpp"

namespace troupe::apps {

namespace {

std::atomic<bool> g_stop{false};
std::vector<std::string> g_flag_notes;  // screen_train_command's, for the start-up lines
std::atomic<int> g_signal{0};
std::atomic<bool> g_regroup{false};  // SIGUSR2 under an elastic launch: a node asks to join

extern "C" void on_regroup_signal(int) { g_regroup.store(true); }

// SIGINT (Ctrl-C) and SIGTERM (SLURM before a time limit, on preemption; troupe launch passing one
// on) both stop the job gracefully: the current iteration finishes, a checkpoint is saved with
// --save, and the process exits 128 + the signal (130, 143). A second signal ends it at once.
extern "C" void on_stop_signal(int sig) {
  g_signal.store(sig);
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

// --dry-run: everything troupe::train checks before it starts (the vocabulary from the tokenizer,
// the model, the memory), then the plan, and no training. The plan is printed even when the memory
// check fails, so that the numbers say what to change.
int dry_run(TrainConfig& cfg, const comm::LaunchEnv& env) {
  const Status st = resolve_config(cfg, env.world_size, env.local_world_size);
  const bool planned = cfg.model.vocab_size > 0 && cfg.model.validate().is_ok();
  if (planned && env.rank == 0) {
    const GptConfig& m = cfg.model;
    std::printf("troupe train --dry-run: %s %d layers, hidden %d, %d heads (%d key/value groups, head dimension %d), "
                "MLP %d (%s), %s positions, %s, vocabulary %lld (padded to %lld)\n",
                m.family_name(), m.num_layers, m.hidden_size, m.num_attention_heads, m.query_groups(), m.head_size(),
                m.ffn_hidden_size(), to_string(m.activation), to_string(m.position_embedding), to_string(m.normalization),
                static_cast<long long>(m.vocab_size), static_cast<long long>(m.padded_vocab_size(1)));
    for (const std::string& note : g_flag_notes) std::printf("  note: %s\n", note.c_str());
    for (const std::string& line : memory_plan_lines(cfg, env.world_size, resident_bytes_now()))
      std::printf("  %s\n", line.c_str());
    std::fflush(stdout);
  }
  if (!st) {
    print_error("train", st);
    return kExitUsage;
  }
  return kExitOk;
}

// --auto-layout: troupe plan's choice for `world` ranks, `local` on each host (this one measured),
// replaces the sizes the command line left out (plan/auto_layout.hpp); its lines join the start-up
// notes. In one process the ranks are chosen too; under a launcher with several processes rank 0
// chooses once the ranks met (RunOptions::choose_layout) and every rank takes its choice.
Status auto_layout(const CLI::App& cmd, TrainConfig& cfg, int world, int local) {
  if (cfg.device != "cpu")
    return Status::bad_input("--auto-layout plans CPU jobs for now -- run troupe plan --gpu NAME and pass its sizes");
  auto tokenizer = make_tokenizer(cfg.tokenizer_type, cfg.vocab_file, cfg.merge_file, cfg.tokenizer_model);
  if (!tokenizer) return tokenizer.status().as_bad_input();
  TrainConfig base = cfg;
  base.model.vocab_size = tokenizer.value()->vocab_size();
  if (Status st = base.model.validate(); !st) return st.as_bad_input();
  auto chosen = plan::choose_layout(base, fixed_sizes(cmd, cfg), world, local);
  if (!chosen) return chosen.status();
  const TrainConfig& l = chosen.value().best.layout;
  cfg.tensor_model_parallel_size = l.tensor_model_parallel_size;
  cfg.pipeline_model_parallel_size = l.pipeline_model_parallel_size;
  cfg.data_parallel_size = l.data_parallel_size;
  cfg.context_parallel_size = l.context_parallel_size;
  cfg.ds_sequence_parallel_size = l.ds_sequence_parallel_size;
  cfg.cp_comm_type = l.cp_comm_type;
  cfg.micro_batch_size = l.micro_batch_size;
  cfg.zero_stage = l.zero_stage;
  cfg.pipeline_schedule = l.pipeline_schedule;
  cfg.num_layers_per_virtual_pipeline_stage = l.num_layers_per_virtual_pipeline_stage;
  cfg.recompute_granularity = l.recompute_granularity;
  cfg.sequence_parallel = l.sequence_parallel;
  cfg.offload_optimizer = l.offload_optimizer;
  for (const std::string& line : chosen.value().lines) g_flag_notes.push_back(line);
  return validate_train_config(cfg, nullptr, {}, world).as_bad_input();
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
  // With --auto-layout the flags are checked as for one rank (the sizes are not chosen yet: troupe
  // plan checks them so too); the chosen layout is validated for the job's world.
  const bool auto_layout_flag = cmd.get_option("--auto-layout")->count() > 0;
  if (Status st = finalize_train_config(cmd, &cfg, auto_layout_flag ? 1 : env->world_size, &g_flag_notes); !st) {
    print_error(name, st);
    return kExitUsage;
  }
  if (auto_layout_flag && env->world_size == 1)
    if (Status st = auto_layout(cmd, cfg, 1, 1); !st) {
      print_error(name, st);
      return exit_code_for(st);
    }
  if (cmd.get_option("--dry-run")->count() > 0) {
    // A dry run trains nothing: each process shows the layout its own host's plan chooses.
    if (auto_layout_flag && env->world_size > 1)
      if (Status st = auto_layout(cmd, cfg, env->world_size, env->local_world_size); !st) {
        print_error(name, st);
        return exit_code_for(st);
      }
    return dry_run(cfg, *env);
  }
  // Set up by troupe::train (include/troupe/train.hpp), which calls on_start once the ranks met:
  // rank 0 prints and writes the metrics; the others stay quiet.
  std::unique_ptr<std::ofstream> metrics;
  std::unique_ptr<TensorBoardLog> tensorboard;
  std::unique_ptr<ProgressPrinter> printer;
  TrainCallbacks cb;
  cb.on_start = [&](const TrainConfig& c, const DataSource& data, int rank, int world) -> Status {
    const bool reporter = rank == 0;
    if (reporter && !c.metrics_file.empty()) {
      metrics = std::make_unique<std::ofstream>(c.metrics_file, std::ios::app);
      if (!*metrics)
        return Status::bad_input("--metrics-file " + c.metrics_file + " cannot be opened for appending -- check the path");
    }
    printer = std::make_unique<ProgressPrinter>(c.log_interval, reporter, c.timing_log_option);
    if (reporter && !c.tensorboard.dir.empty())
      tensorboard = std::make_unique<TensorBoardLog>(
          c.tensorboard, c.log_interval,
          c.tensor_model_parallel_size * c.pipeline_model_parallel_size * c.sequence_ranks() * c.resolved_dp(world),
          c.model.seq_length,
          [&](const std::string& warning) { printer->line("  warning: " + warning); }, c.model.moe);
    const GptConfig& m = c.model;
    printer->line(fmt::format(
        "troupe train: {} {} layers, hidden {}, {} heads, seq {}, vocabulary {} (padded to {}), {:.2f}M parameters",
        m.family_name(), m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length, m.vocab_size,
        m.padded_vocab_size(1), m.num_parameters() / 1e6));
    for (const std::string& line : memory_plan_lines(c, world, resident_bytes_now())) printer->line("  " + line);
    const int dp = c.resolved_dp(world);
    printer->line(fmt::format("  batch: micro {} x {} accumulation steps x {} data-parallel = global {} ({} tokens/iteration); "
                              "layout tp {}, pp {}, dp {}{}{}",
                              c.micro_batch_size, c.grad_accumulation_steps(world), dp, c.global_batch_size,
                              int64_t{c.global_batch_size} * m.seq_length, c.tensor_model_parallel_size,
                              c.pipeline_model_parallel_size, dp,
                              c.ds_sequence_parallel_size > 1
                                  ? fmt::format(", Ulysses {} ({} tokens of each sequence per rank, attention by heads "
                                                "after an all-to-all)",
                                                c.ds_sequence_parallel_size, m.seq_length / c.ds_sequence_parallel_size)
                              : c.context_parallel_size > 1
                                  ? fmt::format(", cp {} ({} tokens of each sequence per rank, {})",
                                                c.context_parallel_size, m.seq_length / c.context_parallel_size,
                                                c.cp_comm_type == "p2p"          ? "p2p ring"
                                                : c.cp_comm_type == "all_gather" ? "all-gathered keys and values"
                                                                                 : "attention by heads after an all-to-all")
                                  : std::string(),
                              c.parallel() || world > 1 ? "" : " (one shard)"));
    printer->line("  data: " + data.describe());
    if (tensorboard) printer->line("  tensorboard: event files in " + c.tensorboard.dir + " (Megatron's tags)");
    for (const std::string& note : g_flag_notes) printer->line("  note: " + note);
    return Status::ok();
  };
  cb.on_note = [&](const std::string& s) { printer->line("  " + s); };
  cb.on_log_interval = [&](int64_t n) {
    printer->set_log_interval(n);
    if (tensorboard) tensorboard->set_log_interval(n);
    printer->line(fmt::format("  log interval set to {} by the inspector", n));
  };
  cb.on_iteration = [&](const IterationStats& s) {
    printer->iteration(s);
    if (metrics) *metrics << iteration_json(s) << "\n" << std::flush;
    if (tensorboard) tensorboard->iteration(s);
  };
  cb.on_eval = [&](const EvalStats& e) {
    printer->line(format_eval(e));
    if (metrics) *metrics << eval_json(e) << "\n" << std::flush;
    if (tensorboard) tensorboard->eval(e);
  };
  cb.on_saved = [&](const SavedCheckpoint& c) {
    if (c.memory) {  // every few iterations: the metrics file only
      if (metrics && c.committed)
        *metrics << fmt::format(
                        R"({{"type":"memory_snapshot_committed","iteration":{},"seconds":{},"writer_cpu_seconds":{},"shards_in_place":{}}})",
                        c.iteration, c.seconds, c.writer_cpu_seconds, c.shards_in_place)
                 << "\n" << std::flush;
      else if (metrics)
        *metrics << fmt::format(R"({{"type":"memory_snapshot","iteration":{},"seconds":{}}})", c.iteration, c.seconds)
                 << "\n" << std::flush;
      return;
    }
    if (c.committed)
      printer->line(fmt::format("  checkpoint of iteration {} in {} complete on disk (written in the background in {:.2f} s)",
                                c.iteration, c.path, c.seconds));
    else
      printer->line(fmt::format("  saved checkpoint at iteration {} to {} ({:.2f} s)", c.iteration, c.path, c.seconds));
    if (metrics)
      *metrics << fmt::format(R"({{"type":"{}","iteration":{},"seconds":{}}})",
                              c.committed ? "checkpoint_committed" : "checkpoint_snapshot", c.iteration, c.seconds)
               << "\n" << std::flush;
  };
  cb.on_phase = [&](const PhaseChange& c) {  // the metrics file only: the notes say what happens
    if (metrics) *metrics << phase_json(c) << "\n" << std::flush;
  };
  RunOptions options;
  options.stop = &g_stop;
  // troupe launch --nnodes MIN:MAX (apps/launch_elastic.hpp): the rounds' host sends SIGUSR2 when a
  // node asks to join; the job stops at its next snapshot and exits kExitRegroup for the next round.
  const char* elastic = std::getenv("TROUPE_ELASTIC");
  if (elastic != nullptr && *elastic != '\0') {
    std::signal(SIGUSR2, on_regroup_signal);
    sigset_t usr2;
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    pthread_sigmask(SIG_UNBLOCK, &usr2, nullptr);  // the launcher starts the ranks with it blocked
    options.regroup = &g_regroup;
  }
  if (auto_layout_flag && env->world_size > 1) {
    if (cfg.device != "cpu") {
      print_error(name, Status::bad_input("--auto-layout plans CPU jobs for now -- run troupe plan --gpu NAME and pass "
                                          "its sizes"));
      return kExitUsage;
    }
    options.choose_layout = [&cmd](const TrainConfig& c, int world, int local) -> Result<TrainConfig> {
      TrainConfig chosen = c;
      TROUPE_RETURN_IF_ERROR(auto_layout(cmd, chosen, world, local));
      return chosen;
    };
  }
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
  auto result = troupe::train(cfg, nullptr, cb, options);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (!result) {
    print_error(name, result.status());
    if (job_given_up(result.status())) return kExitGivenUp;  // the launchers restart nothing
    return result.status().is_bad_input() ? kExitUsage : kExitFailure;
  }
  const TrainSummary& s = result.value();
  if (s.spare_unused) {
    std::fprintf(stderr, "troupe train: the job finished without needing this spare\n");
    return kExitOk;
  }
  std::string final_line = fmt::format("troupe train: finished at iteration {}/{} | final lm loss: {:.6f}", s.iteration,
                                       cfg.train_iters, s.last_loss);
  if (s.last_eval_loss >= 0) final_line += fmt::format(" | last validation loss: {:.6f}", s.last_eval_loss);
  if (!s.last_checkpoint.empty()) final_line += " | checkpoint: " + s.last_checkpoint;
  if (s.stopped_early) final_line += " (stopped early)";
  printer->line(final_line);
  printer->line("  " + format_goodput(s.goodput));
  if (metrics) *metrics << goodput_json(s.goodput) << "\n" << std::flush;
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0)  // ru_maxrss: KiB on Linux
    printer->line(fmt::format("  peak resident memory of this process: {:.0f} MiB", usage.ru_maxrss / 1024.0));
  if (const int sig = g_signal.load(); sig != 0) return 128 + sig;  // stopped (and saved) on a signal
  if (s.regrouped) {
    printer->line(fmt::format("troupe train: stopped at iteration {} for a node that asks to join: the launchers start "
                              "the next round (exit code {})",
                              s.iteration, kExitRegroup));
    return kExitRegroup;
  }
  return kExitOk;
}

}  // namespace

bool screen_train_command(std::vector<std::string>& args, bool for_plan) {
  auto env = comm::detect_launch_env();
  auto screened = screen_train_args(args, env ? env->world_size : 1, for_plan ? ScreenFor::plan : ScreenFor::train);
  if (!screened) {
    print_error(for_plan ? "plan" : "train", screened.status());
    return false;
  }
  args = std::move(screened.value().args);
  g_flag_notes = std::move(screened.value().notes);
  return true;
}

void add_train_command(CLI::App& app, int* exit_code) {
  auto cfg = std::make_shared<TrainConfig>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT model (Megatron-LM flags, DeepSpeed JSON config)");
  add_train_options(cmd, cfg.get());
  cmd->callback([cmd, cfg, exit_code] { *exit_code = run_train(*cmd, *cfg); });
}

}  // namespace troupe::apps
