// The troupe CLI's subcommands. Each add_*_command registers one CLI11 subcommand whose callback runs
// the command and stores its exit status in *exit_code. apps/ only parses, wires and prints.
//
// Exit codes: 0 success; 1 the command failed at run time (I/O, data, a peer); 2 bad usage (a flag, a
// config file, an input that cannot be used). Errors print "troupe <command>: error: <what> -- <fix>".
#pragma once
#include <CLI/CLI.hpp>
#include <set>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::apps {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
// troupe train under troupe launch --nnodes MIN:MAX stopped for a node that asks to join; the
// launchers start the next round (not a failure: no restart is counted). EX_TEMPFAIL's number.
inline constexpr int kExitRegroup = 75;
// troupe train under in-job recovery: the job failed once more after --max-restarts recoveries, and
// every rank of it ends so at the same failure (api/setup.hpp, job_given_up); launchers restart nothing.
inline constexpr int kExitGivenUp = 76;
// 128 + the signal after a graceful stop on SIGINT (130) or SIGTERM (143).

// The exit code of a failed Status: 2 when it is bad input (troupe/status.hpp), else 1.
inline int exit_code_for(const troupe::Status& st) { return st.is_bad_input() ? kExitUsage : kExitFailure; }

void add_preprocess_command(CLI::App& app, int* exit_code);
void add_train_command(CLI::App& app, int* exit_code);
// Before the parse: the `troupe train` flags screened for Megatron's and DeepSpeed's
// (apps/cli/megatron_compat.hpp). Rewrites `args` (the flags after "train") and keeps the notes for
// the start-up lines; false (the problems printed, exit 2) when any flag is refused or unknown.
bool screen_train_command(std::vector<std::string>& args, bool for_plan = false);
void add_eval_command(CLI::App& app, int* exit_code);
void add_generate_command(CLI::App& app, int* exit_code);
void add_serve_command(CLI::App& app, int* exit_code);
void add_ckpt_command(CLI::App& app, int* exit_code);
void add_bench_command(CLI::App& app, int* exit_code);
void add_bench_comm_subcommand(CLI::App* bench, int* exit_code);  // troupe bench comm
void add_info_command(CLI::App& app, int* exit_code);
void add_plot_command(CLI::App& app, int* exit_code);
void add_launch_command(CLI::App& app, int* exit_code);  // launch and its companion comm-check
// `troupe launch ARGS...` (what follows "launch"), torchrun's grammar (apps/cli/launch_options.hpp):
// main() calls it before CLI11 parses. subcommands: troupe's subcommand names. Returns the exit code.
int run_launch_command(const std::vector<std::string>& args, const std::set<std::string>& subcommands);
void add_inspect_command(CLI::App& app, int* exit_code);
// troupe plan (apps/plan_cmd.cpp): train's flags for the model and batch plus the cluster's. Before
// the parse main() takes plan's own flags out of `args` (returned), screens the rest as train's and
// puts them back together.
void add_plan_command(CLI::App& app, int* exit_code);
std::vector<std::string> split_plan_args(std::vector<std::string>& args);

}  // namespace troupe::apps
