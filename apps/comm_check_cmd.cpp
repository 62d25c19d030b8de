// troupe comm-check: checks that the ranks of a job find each other and can talk. Run it under a
// starter: `troupe launch --nproc-per-node 4 -- comm-check`, `srun troupe comm-check`, mpirun or
// torchrun (with TROUPE_JOB_TOKEN set for the last three).
//
// Each rank detects its launch environment, joins the CAF bootstrap and runs the checks in order;
// rank 0 prints what they found. A check is a name and a function of the CheckContext: add one to
// comm_checks() (e.g. collectives over the UCX or local backend) and it runs after the others.
//
// Test hooks: --hold-seconds keeps the ranks alive afterwards (kill tests); --fail-rank R
// --fail-after S makes rank R exit with code 3 after S seconds, wherever it is;
// --ignore-stop-signals makes the ranks ignore SIGINT and SIGTERM (only SIGKILL stops them).
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apps/commands.hpp"
#include "apps/report.hpp"
#include "comm/caf_bootstrap.hpp"
#include "comm/launch_env.hpp"

namespace troupe::apps {

namespace {

struct CommCheckArgs {
  double hold_seconds = 0;
  int fail_rank = -1;
  double fail_after = 0;
  bool ignore_stop_signals = false;
  double connect_timeout = 60;
  double timeout = 120;
};

// What a check may use. Rank 0 prints; the others stay quiet unless a check fails.
struct CheckContext {
  const comm::LaunchEnv& env;
  comm::CafBootstrap& bootstrap;
  bool printer() const { return env.rank == 0; }
};

struct CommCheck {
  std::string name;
  std::function<Status(CheckContext&)> run;
};

std::string hostname() {
  char buf[256] = {0};
  return gethostname(buf, sizeof buf - 1) == 0 ? buf : "unknown";
}

// Every rank learns every rank's (host, pid) through the rendezvous, then all meet at a barrier.
Status check_bootstrap(CheckContext& ctx) {
  const std::string mine =
      hostname() + "\n" + std::to_string(getpid()) + "\n" + std::to_string(ctx.env.local_rank);
  auto all = ctx.bootstrap.all_gather("comm-check/hosts", mine);
  if (!all) return all.status();
  if (static_cast<int>(all->size()) != ctx.env.world_size)
    return Status::error("all_gather returned " + std::to_string(all->size()) + " entries for " +
                         std::to_string(ctx.env.world_size) + " ranks");
  if (ctx.printer()) {
    for (int r = 0; r < ctx.env.world_size; ++r) {
      const std::string& entry = (*all)[r];
      const size_t a = entry.find('\n'), b = entry.find('\n', a + 1);
      if (a == std::string::npos || b == std::string::npos)
        return Status::error("rank " + std::to_string(r) + " sent a malformed entry");
      std::printf("rank %d/%d on host %s (local rank %s, pid %s)\n", r, ctx.env.world_size,
                  entry.substr(0, a).c_str(), entry.substr(b + 1).c_str(),
                  entry.substr(a + 1, b - a - 1).c_str());
    }
    std::fflush(stdout);
  }
  return ctx.bootstrap.barrier("comm-check/after-hosts");
}

std::vector<CommCheck> comm_checks() {
  return {
      {"bootstrap", check_bootstrap},
  };
}

int run_comm_check(const CommCheckArgs& a) {
  auto env = comm::detect_launch_env();
  if (!env) {
    print_error("comm-check", env.status());
    return kExitUsage;
  }
  if (a.ignore_stop_signals) {
    std::signal(SIGINT, SIG_IGN);
    std::signal(SIGTERM, SIG_IGN);
  }
  if (a.fail_rank >= 0 && a.fail_rank == env->rank) {
    const auto delay = std::chrono::milliseconds(static_cast<int64_t>(a.fail_after * 1000));
    std::thread([delay, rank = env->rank] {
      std::this_thread::sleep_for(delay);
      std::fprintf(
          stderr, "troupe comm-check: rank %d fails on purpose (--fail-rank), exit code 3\n", rank);
      std::fflush(stderr);
      std::_Exit(3);
    }).detach();
  }
  comm::CafBootstrapOptions options;
  options.connect_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(a.connect_timeout * 1000));
  options.collective_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout * 1000));
  auto bootstrap = comm::create_caf_bootstrap(*env, options);
  if (!bootstrap) {
    print_error("comm-check", bootstrap.status());
    return kExitFailure;
  }
  CheckContext ctx{*env, **bootstrap};
  if (ctx.printer() && env->world_size > 1)
    std::printf("comm-check: %d ranks from %s, rendezvous on %s:%d\n", env->world_size,
                env->source.c_str(), env->master_addr.c_str(), (*bootstrap)->port());
  else if (ctx.printer())
    std::printf("comm-check: 1 rank (%s)\n", env->source.c_str());
  for (const auto& check : comm_checks()) {
    if (Status st = check.run(ctx); !st) {
      print_error("comm-check", "rank " + std::to_string(env->rank) + ", check '" + check.name +
                                    "': " + st.message());
      return kExitFailure;
    }
    if (ctx.printer()) std::printf("comm-check: %s ok\n", check.name.c_str());
    std::fflush(stdout);
  }
  if (a.hold_seconds > 0) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(a.hold_seconds * 1000));
    while (std::chrono::steady_clock::now() < until) {
      if (std::string why = (*bootstrap)->job_failure(); !why.empty()) {
        print_error("comm-check",
                    "rank " + std::to_string(env->rank) + ": the job failed while holding: " + why);
        return kExitFailure;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  if (ctx.printer()) std::printf("comm-check: all %d rank(s) ok\n", env->world_size);
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void add_comm_check_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<CommCheckArgs>();
  CLI::App* cmd =
      app.add_subcommand("comm-check",
                         "Check that the ranks of a job meet and talk (run under troupe "
                         "launch, srun, mpirun or torchrun)");
  cmd->add_option("--hold-seconds", args->hold_seconds, "Stay alive this long after the checks")
      ->capture_default_str();
  cmd->add_option("--fail-rank", args->fail_rank,
                  "Test hook: this rank exits with code 3 after --fail-after s");
  cmd->add_option("--fail-after", args->fail_after, "Seconds before --fail-rank exits")
      ->capture_default_str();
  cmd->add_flag("--ignore-stop-signals", args->ignore_stop_signals,
                "Test hook: ignore SIGINT and SIGTERM (the launcher must escalate to SIGKILL)");
  cmd->add_option("--connect-timeout", args->connect_timeout,
                  "Seconds ranks retry reaching rank 0's rendezvous")
      ->capture_default_str();
  cmd->add_option("--timeout", args->timeout, "Seconds a collective waits for missing ranks")
      ->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = run_comm_check(*args); });
}

}  // namespace troupe::apps
