// The flags of `troupe launch`: torchrun's (torch/distributed/run.py) and troupe's own, read into
// LaunchOptions before anything starts. docs/COMPAT.md ("troupe launch vs torchrun") lists each
// torchrun flag and what troupe does with it.
//
// Grammar, as torchrun's argparse reads it: flags until `--` or the first word that is not a flag;
// that word and everything after it is the command each rank runs. Every flag has its dash and
// underscore spellings (--nproc-per-node, --nproc_per_node); `--flag=value` works; a unique prefix
// of a flag is that flag (argparse's abbreviations); -r, -t and -m are the short forms. A flag not
// on the command line is read from torchrun's PET_<NAME> variable (PET_NPROC_PER_NODE=4), as
// torchrun does; switches there read 1 / 0.
//
// Every problem is reported at once (bad input, one per line, each with the fix), and nothing is
// started. What is accepted without effect (--start-method, --monitor-interval, ...) comes back as
// one note each, printed at start-up.
//
// Thread safety: pure functions of their arguments.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

// Which of a rank's streams go to its log file: torchrun's Std (0 none, 1 stdout, 2 stderr, 3
// both), one value for every local rank ("3") or one per local rank ("0:1,1:2"; ranks left out: 0).
struct StdStreams {
  int all = 0;
  std::map<int, int> per_rank;  // used when not empty
  int of(int local_rank) const {
    if (per_rank.empty()) return all;
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? 0 : it->second;
  }
  bool any() const { return all != 0 || !per_rank.empty(); }
};
inline constexpr int kStdOut = 1;
inline constexpr int kStdErr = 2;

// "0".."3" or "0:1,1:2" -> StdStreams; errors name the flag and the accepted forms.
Result<StdStreams> parse_std_streams(const std::string& flag, const std::string& text);

// What the launcher needs to know of this host to resolve --nproc-per-node auto|cpu|gpu.
struct HostFacts {
  int cpus = 1;            // os.cpu_count(): online CPUs
  int gpus = 0;            // CUDA devices visible to this process (CUDA_VISIBLE_DEVICES applied)
  std::string gpu_detail;  // why none, when gpus == 0 (for the refusal of "gpu")
  // A program's path on PATH, "" when there is none; unset: not checked.
  std::function<std::string(const std::string& name)> which;
};

// How each rank's command is run.
enum class CommandKind {
  troupe,   // a troupe subcommand: this binary runs it
  program,  // a program of its own: exec'd as given (PATH lookup when it has no '/')
};

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;      // MAX of --nnodes MIN:MAX
  int min_nnodes = 1;  // MIN (= nnodes unless a range: elastic membership, apps/launch_elastic.hpp)
  int spares = 0;      // --spares K: nodes nnodes .. nnodes+K-1 wait to replace a lost one
  // --in-job-recovery: a failed rank's process alone is started again; the others stay and rejoin.
  bool in_job_recovery = false;
  int node_rank = 0;
  bool node_rank_given = false;
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false;  // --master-addr or --rdzv-endpoint
  int master_port = 29500;
  bool master_port_given = false;  // a port from --master-port or --rdzv-endpoint
  std::string rdzv_backend = "static";
  std::string rdzv_id;              // empty: not given (children see TORCHELASTIC_RUN_ID=none)
  double join_timeout_s = 600;      // --rdzv-conf join_timeout (torchrun's default 600 s)
  bool join_timeout_given = false;
  double last_call_s = 30;          // --rdzv-conf last_call_timeout (elastic: torchrun's default 30 s)
  bool last_call_given = false;
  bool standalone = false;
  int max_restarts = 0;
  std::string role = "default";
  bool no_python = false;
  bool run_path = false;
  std::string log_dir;  // empty: none (a temporary one is made when --redirects/--tee need it)
  StdStreams redirects, tee;
  std::set<int> local_ranks_filter;  // empty: every local rank on the console
  std::string local_addr;
  std::vector<int> signals;  // forwarded to the ranks; default SIGINT, SIGTERM, SIGHUP
  // troupe's own
  bool prefix_output = false;
  double stop_grace = 3.0;
  bool stop_grace_given = false;
  bool new_token = false;
  bool help = false;
  std::vector<std::string> command;  // what each rank runs (the "troupe" word dropped)
  std::vector<std::string> notes;    // one line per flag accepted without effect, or resolved

  bool elastic() const { return min_nnodes < nnodes; }
  // Rounds formed by node 0's launcher (apps/launch_elastic.hpp): an elastic size or spare nodes.
  bool rounds() const { return elastic() || (spares > 0 && !in_job_recovery); }
  // --in-job-recovery --spares K: the spare nodes' launchers start warm spare processes, which take
  // lost ranks' places in the running job (no rounds).
  bool warm_spares() const { return in_job_recovery && spares > 0 && !elastic(); }
  bool spare_node() const { return warm_spares() && node_rank >= nnodes; }
};

using LaunchEnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// args: what follows `troupe launch`. env: the launcher's environment (PET_* variables).
// subcommands: troupe's subcommand names (the command's first word is one of them, or a program).
Result<LaunchOptions> parse_launch_args(const std::vector<std::string>& args, const HostFacts& host,
                                        const LaunchEnvLookup& env,
                                        const std::set<std::string>& subcommands);

// How the command runs: a troupe subcommand, or a program (never a troupe subcommand with
// --no-python or --run-path).
CommandKind command_kind(const LaunchOptions& o, const std::set<std::string>& subcommands);

// The help text of `troupe launch --help`.
std::string launch_usage();

// torchrun's flags and what troupe does with each, for docs/COMPAT.md and its test: the flag (dash
// spelling) and one sentence.
struct LaunchFlagRow {
  std::string flag, text;
};
std::vector<LaunchFlagRow> launch_flag_table();

}  // namespace troupe
