// troupe launch: starts the ranks of a job on this node, with torchrun's flags
// (apps/cli/launch_options.hpp reads them; docs/COMM.md "Starting a job", docs/COMPAT.md
// "troupe launch vs torchrun").
//
//   troupe launch --nproc-per-node N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT]
//                 [--log-dir D --tee 3] [--prefix-output] [--stop-grace S] -- COMMAND ...
//   troupe launch --new-token    prints a fresh job token (for srun, mpirun, several nodes)
//
// COMMAND is a troupe subcommand (train, comm-check, ...: this binary, /proc/self/exe, runs it) or
// any other program, exec'd as given (PATH lookup when the word has no '/'): torchrun's
// --no-python semantics, with or without the flag; torchrun without it would run `python
// COMMAND`, troupe needs the interpreter written (-- python3 train.py). --run-path runs
// `$PYTHON_EXEC|python3 SCRIPT ARGS`. Each rank runs in its own process group with
// TROUPE_{RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, JOB_TOKEN,
// RUN_ID, RESTART_COUNT} and torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_{RUN_ID, RESTART_COUNT, MAX_RESTARTS, USE_AGENT_STORE=False, ERROR_FILE with a log
// folder}, TORCH_NCCL_ASYNC_ERROR_HANDLING (1 unless set) and OMP_NUM_THREADS=1 when there are
// several ranks and it is unset. USE_AGENT_STORE is False because no launcher-side store exists:
// a torch.distributed program's rank 0 hosts its own TCPStore at MASTER_ADDR:MASTER_PORT.
// Global rank = node_rank * N + local rank. The token is made here for one node; with several
// nodes it is taken from TROUPE_JOB_TOKEN, which must hold the same value on every node.
// --rdzv-id reaches the ranks as TROUPE_RDZV_ID (the rendezvous refuses a rank whose id differs
// from rank 0's) and TORCHELASTIC_RUN_ID; --rdzv-conf join_timeout as TROUPE_RDZV_TIMEOUT.
//
// Supervision: when a rank dies (non-zero exit or a signal) the others get SIGTERM, then SIGKILL
// after --stop-grace seconds (3), and the launcher exits 1 (2 when that rank refused its input with
// exit code 2: bad flags, config or data) naming the rank, its pid and how it
// died. The signals of --signals-to-handle (SIGINT, SIGTERM, SIGHUP) to the launcher are passed on
// to every rank (a second one sends SIGKILL at once); ranks then have --stop-grace seconds to
// finish (default 60 here: troupe train finishes its iteration and saves), and the launcher exits
// 128 + the signal. The children get SIGTERM if the launcher itself dies (PR_SET_PDEATHSIG).
// Nothing waits without a bound: ranks that survive SIGKILL for 10 s are reported and left behind.
//
// Restarts (--max-restarts N): after a failure every rank of this node is stopped and started
// again with TROUPE_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT raised; troupe train then resumes
// this run's latest checkpoint in its --save. With several nodes each node's launcher does this on
// its own: a failure on one node ends the job on every node, every launcher restarts its ranks, and
// they meet again at the same MASTER_ADDR:MASTER_PORT with the same token. With --nnodes MIN:MAX
// (elastic, apps/launch_elastic.hpp) every attempt is a round of the nodes there, formed by node 0's
// launcher on MASTER_PORT (or by its standby, at its own place, once node 0 is lost); the round's
// ranks meet at the host's port + 1 with TROUPE_ELASTIC and TROUPE_JOB_RUN_ID (the job's run) set and
// SIGUSR2 blocked (node 0 sends it when a node asks to join; troupe train then stops at its next
// snapshot and exits 75, which starts the next round without counting a restart). TROUPE_RUN_ID (32 hex
// digits, one per launch, the same for every restart) names the run; with several nodes node 0's
// is the run's.
#include <algorithm>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "apps/cli/launch_options.hpp"
#include "apps/commands.hpp"
#include "apps/plan_flags.hpp"
#include "apps/launch_elastic.hpp"
#include "apps/launch_output.hpp"
#include "apps/report.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "kernels/device_info.hpp"
#include "storage/sharded_checkpoint.hpp"

extern char** environ;

namespace troupe::apps {

namespace {

using Clock = std::chrono::steady_clock;

// One launch, resolved: the options and what the launcher decided from them.
struct Launch {
  LaunchOptions o;
  std::string exe;                     // what each rank execs
  std::vector<std::string> argv;       // its argv, argv[0] included
  bool troupe_command = false;         // a troupe subcommand (not a program of its own)
  std::string token;                   // TROUPE_JOB_TOKEN
  std::string run_id;                  // TROUPE_RUN_ID
  std::string elastic_run_id;          // TORCHELASTIC_RUN_ID: --rdzv-id, a fresh one, or "none"
  std::string job_run_id;              // TROUPE_JOB_RUN_ID: an elastic round's (its host's run id)
  std::string rdzv_id;                 // TROUPE_RDZV_ID, "" when no id was given
  std::string run_log_dir;             // "" without log files
  std::vector<int> signals;            // passed on to the ranks
  bool elastic = false;                // --nnodes MIN:MAX (the ranks get TROUPE_ELASTIC)
  int max_nnodes = 1;                  // its MAX (the options' nnodes is the round's)
  std::string rdzv_hint;               // --in-job-recovery --spares: TROUPE_RDZV_HINT, this node's hint file
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  int restarts = 0;  // --in-job-recovery: how often this place's process was started again
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + " (SIG" + (abbrev ? abbrev : "?") + ")";
  }
  return "ended with status " + std::to_string(status);
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
// troupe train stopped for a node that asks to join (elastic): the next round, not a failure.
bool regrouped(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == kExitRegroup; }
// troupe train under in-job recovery: the job spent its recoveries and every rank ends so
// (kExitGivenUp): a failure, but nothing to start again.
bool given_up(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == kExitGivenUp; }

// The child's environment: ours, minus the variables the launcher sets or clears, plus those set.
// A warm spare (--in-job-recovery --spares) has no rank: TROUPE_RANK=-1 until the job gives it one.
std::vector<std::string> child_environment(const Launch& l, int rank, int local_rank, int restart,
                                           const std::string& error_file, bool replacement = false,
                                           bool spare = false) {
  const LaunchOptions& a = l.o;
  const int world = a.nnodes * a.nproc_per_node;
  if (spare) rank = -1;
  std::vector<std::pair<std::string, std::string>> set = {
      {"TROUPE_RUN_ID", l.run_id},
      {"TROUPE_RESTART_COUNT", std::to_string(restart)},
      {"TROUPE_RANK", std::to_string(rank)},
      {"TROUPE_WORLD_SIZE", std::to_string(world)},
      {"TROUPE_LOCAL_RANK", std::to_string(local_rank)},
      {"TROUPE_LOCAL_WORLD_SIZE", std::to_string(a.nproc_per_node)},
      {"TROUPE_MASTER_ADDR", a.master_addr},
      {"TROUPE_MASTER_PORT", std::to_string(a.master_port)},
      {"TROUPE_JOB_TOKEN", l.token},
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(a.nproc_per_node)},
      {"GROUP_RANK", std::to_string(a.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(a.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},  // one role: its ranks are the job's
      {"ROLE_NAME", a.role},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", a.master_addr},
      {"MASTER_PORT", std::to_string(a.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(a.max_restarts)},
      {"TORCHELASTIC_RUN_ID", l.elastic_run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
  };
  const char* nccl = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  set.push_back({"TORCH_NCCL_ASYNC_ERROR_HANDLING", nccl != nullptr ? nccl : "1"});
  if (a.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) set.push_back({"OMP_NUM_THREADS", "1"});
  if (!l.rdzv_id.empty()) set.push_back({"TROUPE_RDZV_ID", l.rdzv_id});
  if (!l.job_run_id.empty()) set.push_back({"TROUPE_JOB_RUN_ID", l.job_run_id});
  if (l.elastic) set.push_back({"TROUPE_ELASTIC", std::to_string(a.min_nnodes) + ":" + std::to_string(l.max_nnodes)});
  if (a.join_timeout_given) set.push_back({"TROUPE_RDZV_TIMEOUT", std::to_string(a.join_timeout_s)});
  if (a.in_job_recovery) set.push_back({"TROUPE_IN_JOB_RECOVERY", "1"});
  if (replacement) set.push_back({"TROUPE_REPLACEMENT", "1"});
  if (a.warm_spares()) set.push_back({"TROUPE_IN_JOB_SPARES", "1"});
  if (spare) set.push_back({"TROUPE_SPARE", "1"});
  if (!l.rdzv_hint.empty()) set.push_back({"TROUPE_RDZV_HINT", l.rdzv_hint});
  if (!error_file.empty()) set.push_back({"TORCHELASTIC_ERROR_FILE", error_file});
  // --local-addr on node 0: where rank 0's rendezvous listens (a TROUPE_BIND_ADDR of the user's wins).
  if (!a.local_addr.empty() && a.node_rank == 0 && std::getenv("TROUPE_BIND_ADDR") == nullptr)
    set.push_back({"TROUPE_BIND_ADDR", a.local_addr});
  // Inherited values of these would mislead a rank (another launch's id, timeout or error file).
  const std::set<std::string> cleared = {"TROUPE_RDZV_ID",     "TROUPE_RDZV_TIMEOUT",    "TORCHELASTIC_ERROR_FILE",
                                         "TROUPE_ELASTIC",     "TROUPE_IN_JOB_RECOVERY", "TROUPE_REPLACEMENT",
                                         "TROUPE_IN_JOB_SPARES", "TROUPE_SPARE", "TROUPE_RDZV_HINT", "TROUPE_JOB_RUN_ID"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = cleared.count(name) > 0;
    for (const auto& [k, v] : set) replaced = replaced || k == name;
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Starts one rank with `out_fd` / `err_fd` as its stdout / stderr (-1: the launcher's). The exec
// error, if any, comes back through a close-on-exec pipe.
Status spawn_child(const std::string& exe, std::vector<std::string> argv, std::vector<std::string> env,
                   const sigset_t& parent_mask, int out_fd, int err_fd, Child& c) {
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return Status::error(std::string("pipe: ") + std::strerror(errno));
  auto c_argv = c_strings(argv);
  auto c_env = c_strings(env);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Status::error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(126);  // the launcher died before prctl took effect
    if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);
    if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
    // The launcher decides when ranks stop: they must act on the signals it passes on even where
    // the launcher was started with them ignored (a background job of a script).
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigprocmask(SIG_SETMASK, &parent_mask, nullptr);
    execve(exe.c_str(), c_argv.data(), c_env.data());
    const int e = errno;
    [[maybe_unused]] ssize_t n = write(err_pipe[1], &e, sizeof e);
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so a signal sent right away already reaches the group
  close(err_pipe[1]);
  c.pid = pid;
  c.running = true;
  int e = 0;
  ssize_t n;
  do n = read(err_pipe[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  close(err_pipe[0]);
  if (n == sizeof e) {
    waitpid(pid, &c.status, 0);
    c.running = false;
    return Status::error("cannot start rank " + std::to_string(c.rank) + ": exec " + exe + ": " + std::strerror(e));
  }
  return Status::ok();
}

void signal_all(std::vector<Child>& children, int sig) {
  for (auto& c : children)
    if (c.running && kill(-c.pid, sig) != 0) kill(c.pid, sig);  // its process group: it and what it started
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// A TCP port nobody listens on now (the kernel's pick for port 0 on loopback), or -1. One node, no
// port given: like torchrun --standalone, two jobs on one machine then do not collide.
int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// The console prefix and the log file of one stream of a local rank.
StreamPlan stream_plan(const Launch& l, int rank, int local, int which, const std::string& attempt_dir) {
  const LaunchOptions& o = l.o;
  const bool tee = (o.tee.of(local) & which) != 0;
  const bool redirect = (o.redirects.of(local) & which) != 0;
  StreamPlan p;
  if ((tee || redirect) && !attempt_dir.empty())
    p.file = attempt_dir + "/" + std::to_string(local) + (which == kStdOut ? "/stdout.log" : "/stderr.log");
  p.console = !(redirect && !tee);
  if (!o.local_ranks_filter.empty() && o.local_ranks_filter.count(local) == 0) p.console = false;
  if (o.prefix_output) p.prefix = rank < 0 ? "[spare " + std::to_string(local) + "] " : "[rank " + std::to_string(rank) + "] ";
  if (tee) p.prefix += "[" + o.role + std::to_string(local) + "]:";
  return p;
}

// Starts every rank of this node (attempt `restart`, 0 first) and waits for them: the exit code of
// the launch (kExitRegroup: they stopped for a node that asks to join); *restartable when ranks
// failed by themselves (not stopped by a signal to the launcher). elastic (node 0 of an elastic
// job, else null): a node asking to join gets the ranks SIGUSR2, once. replaced (--in-job-recovery,
// else null): the ranks that fail are started again alone (TROUPE_REPLACEMENT=1) and the others
// stay, each process's place at most --max-restarts times (the job itself gives up after as many
// recoveries, exit code 76: the places' counts only bound a process that fails before it rejoins);
// replaced->sweeps counts the restarts, replaced->spent says a place had none left.
struct InJobRestarts {
  int sweeps = 0;
  bool spent = false;
};
int run_ranks(const Launch& l, int restart, bool* restartable, const ElasticMembership* elastic,
              InJobRestarts* replaced) {
  const LaunchOptions& a = l.o;
  // Signals are taken synchronously with sigtimedwait; children get the original mask back.
  sigset_t wait_set, old_mask;
  sigemptyset(&wait_set);
  sigaddset(&wait_set, SIGCHLD);
  for (int s : l.signals) sigaddset(&wait_set, s);
  sigprocmask(SIG_BLOCK, &wait_set, &old_mask);
  auto restore = [&] { sigprocmask(SIG_SETMASK, &old_mask, nullptr); };

  std::string attempt_dir;
  if (!l.run_log_dir.empty()) {
    auto dir = make_attempt_dir(l.run_log_dir, restart, a.nproc_per_node);
    if (!dir) {
      print_error("launch", dir.status());
      restore();
      return kExitFailure;
    }
    attempt_dir = *dir;
  }
  std::vector<Child> children(a.nproc_per_node);
  // One router for the first start, one for each replacement (a router takes no streams once started).
  std::vector<std::unique_ptr<OutputRouter>> routers;
  routers.push_back(std::make_unique<OutputRouter>());
  // Elastic: SIGUSR2 (a node asks to join) stays pending in a rank until troupe train takes it.
  sigset_t child_mask = old_mask;
  if (l.elastic) sigaddset(&child_mask, SIGUSR2);
  // --in-job-recovery --spares: a spare node's processes start as warm spares, and a failed process
  // other than rank 0 comes back as one (rank 0's replacement decides: it hosts the job's first
  // rendezvous if that never completed, else it is a spare, the standby hosting) -- a waiting spare took
  // its place already, or this one takes it.
  auto start_child = [&](int local, int count, bool replacement, const std::string& dir, OutputRouter& router) {
    Child& c = children[local];
    const int rank = a.node_rank * a.nproc_per_node + local;
    const bool spare = a.spare_node() || (a.warm_spares() && replacement && rank != 0);
    c.rank = spare ? -1 : rank;
    const StreamPlan out_plan = stream_plan(l, c.rank, local, kStdOut, dir);
    const StreamPlan err_plan = stream_plan(l, c.rank, local, kStdErr, dir);
    auto out = open_stream(out_plan);
    auto err = out ? open_stream(err_plan) : out;
    Status st = !out ? out.status() : !err ? err.status() : Status::ok();
    if (st) {
      const std::string error_file = dir.empty() ? "" : dir + "/" + std::to_string(local) + "/error.json";
      st = spawn_child(l.exe, l.argv, child_environment(l, c.rank, local, count, error_file, replacement, spare),
                       child_mask,
                       out->child_fd, err->child_fd, c);
      // The rank holds its ends now; the router copies the rest.
      for (const auto* e : {&*out, &*err})
        if (e->child_fd >= 0) close(e->child_fd);
      router.add(*out, stdout, out_plan.prefix);
      router.add(*err, stderr, err_plan.prefix);
    }
    return st;
  };
  auto finish_routers = [&](std::chrono::milliseconds grace) {
    for (auto& r : routers) r->finish(grace);
  };
  for (int local = 0; local < a.nproc_per_node; ++local) {
    Status st = start_child(local, restart, false, attempt_dir, *routers.front());
    if (!st) {
      print_error("launch", st);
      signal_all(children, SIGKILL);
      for (auto& other : children)
        if (other.running) waitpid(other.pid, nullptr, 0);
      finish_routers(std::chrono::milliseconds(0));
      restore();
      return kExitFailure;
    }
  }
  routers.front()->start();

  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(a.stop_grace * 1000));
  const double signal_grace_s = a.stop_grace_given ? a.stop_grace : 60.0;
  const auto signal_grace = std::chrono::milliseconds(static_cast<int64_t>(signal_grace_s * 1000));
  int running = a.nproc_per_node;
  const Child* first_failure = nullptr;
  int forwarded_signal = 0;
  bool stopping = false, killed = false, regroup_asked = false;
  Clock::time_point kill_at{}, give_up_at{};
  auto begin_stop = [&] {
    stopping = true;
    signal_all(children, SIGTERM);
    kill_at = Clock::now() + grace;
  };

  while (running > 0) {
    timespec tick{0, 100'000'000};
    siginfo_t info;
    const int sig = sigtimedwait(&wait_set, &info, &tick);
    if (sig > 0 && sig != SIGCHLD) {
      if (forwarded_signal == 0) {
        forwarded_signal = sig;
        std::fprintf(stderr, "troupe launch: received SIG%s, passing it on to the %d running rank(s)\n",
                     sigabbrev_np(sig), running);
        signal_all(children, sig);
        stopping = true;
        kill_at = Clock::now() + signal_grace;
      } else if (!killed) {
        signal_all(children, SIGKILL);
        killed = true;
        give_up_at = Clock::now() + std::chrono::seconds(10);
      }
    }
    int status;
    pid_t pid;
    // Of the ranks found dead in one sweep, the cause is the one a signal killed (the launcher sent
    // none yet), not a survivor that exited 1 reporting that death.
    const Child* failed_now = nullptr;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& c : children) {
        if (c.pid != pid || !c.running) continue;
        c.running = false;
        c.status = status;
        --running;
        if (!succeeded(status) && !regrouped(status) &&
            (failed_now == nullptr || (WIFSIGNALED(status) && !WIFSIGNALED(failed_now->status))))
          failed_now = &c;
      }
    }
    // In-job recovery: the ranks that failed start again alone; the others rejoin the job. Not once
    // a rank has finished (the job is ending: nobody would rejoin) nor while stopping.
    const bool any_finished = std::any_of(children.begin(), children.end(),
                                          [](const Child& c) { return !c.running && succeeded(c.status); });
    const bool places_left =
        replaced != nullptr && std::all_of(children.begin(), children.end(), [&](const Child& c) {
          return c.running || succeeded(c.status) || regrouped(c.status) || c.restarts < a.max_restarts;
        });
    if (failed_now != nullptr && replaced != nullptr && !places_left) replaced->spent = true;
    if (failed_now != nullptr && places_left && !stopping && !any_finished &&
        forwarded_signal == 0 && !given_up(failed_now->status) &&
        !(WIFEXITED(failed_now->status) && WEXITSTATUS(failed_now->status) == kExitUsage)) {
      const int sweep = ++replaced->sweeps;
      std::string dir;
      if (!l.run_log_dir.empty()) {
        dir = l.run_log_dir + "/attempt_" + std::to_string(sweep);
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
      }
      routers.push_back(std::make_unique<OutputRouter>());
      Status st = Status::ok();
      for (int local = 0; local < a.nproc_per_node && st; ++local) {
        Child& c = children[local];
        if (c.running || succeeded(c.status) || regrouped(c.status)) continue;
        const int restarts = ++c.restarts;
        if (a.warm_spares() && !(a.node_rank == 0 && local == 0))
          std::fprintf(stderr, "troupe launch: the process of local rank %d (pid %d) %s; in-job recovery %d of %d: "
                               "starting a spare in its place (a waiting spare takes its rank), the other ranks "
                               "rejoin the job\n", local, c.pid, describe_status(c.status).c_str(), restarts,
                       a.max_restarts);
        else
          std::fprintf(stderr, "troupe launch: rank %d (pid %d) %s; in-job recovery %d of %d: starting it again, the "
                               "other ranks rejoin the job\n", c.rank, c.pid, describe_status(c.status).c_str(),
                       restarts, a.max_restarts);
        if (!dir.empty()) {
          std::error_code ec;
          std::filesystem::create_directories(dir + "/" + std::to_string(local), ec);
        }
        st = start_child(local, sweep, true, dir, *routers.back());
        if (st) ++running;
      }
      routers.back()->start();
      if (st) continue;
      print_error("launch", st);
    }
    if (failed_now != nullptr && first_failure == nullptr && !stopping) {
      first_failure = failed_now;
      std::fprintf(stderr, "troupe launch: rank %d (pid %d) %s; stopping the other ranks\n", failed_now->rank,
                   failed_now->pid, describe_status(failed_now->status).c_str());
      begin_stop();
    }
    if (elastic != nullptr && !regroup_asked && !stopping && elastic->newcomer_waiting()) {
      regroup_asked = true;
      std::fprintf(stderr, "troupe launch: a node asks to join: the ranks stop at the job's next snapshot and the next "
                           "round takes it in\n");
      for (auto& c : children)
        if (c.running) kill(c.pid, SIGUSR2);
    }
    if (stopping && !killed && running > 0 && Clock::now() >= kill_at) {
      signal_all(children, SIGKILL);
      killed = true;
      give_up_at = Clock::now() + std::chrono::seconds(10);
    }
    if (killed && running > 0 && Clock::now() >= give_up_at) {
      std::vector<int> stuck;
      for (const auto& c : children)
        if (c.running) stuck.push_back(c.rank);
      std::fprintf(stderr,
                   "troupe launch: rank(s) %s did not end 10 s after SIGKILL (stuck in the kernel?); leaving them\n",
                   rank_list(stuck).c_str());
      break;
    }
  }
  finish_routers(std::chrono::milliseconds(1000));
  restore();

  if (first_failure != nullptr) {
    std::vector<int> stopped, needed_kill;
    for (const auto& c : children) {
      if (&c == first_failure || succeeded(c.status)) continue;
      stopped.push_back(c.rank);
      // Only a SIGKILL the launcher sent (one from elsewhere killed a rank that was already gone).
      if (killed && WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL) needed_kill.push_back(c.rank);
    }
    std::string others;
    if (!stopped.empty()) others = "; stopped rank(s) " + rank_list(stopped);
    if (!needed_kill.empty())
      others += " (rank(s) " + rank_list(needed_kill) + " only by SIGKILL after the " + seconds_text(a.stop_grace) +
                " grace)";
    // A rank refused its input (exit code 2: bad flags, config, data): starting again cannot help.
    const bool bad_input = WIFEXITED(first_failure->status) && WEXITSTATUS(first_failure->status) == kExitUsage;
    *restartable = forwarded_signal == 0 && !bad_input && !given_up(first_failure->status);
    const std::string where = attempt_dir.empty() ? "the rank's output above" : "the rank's output (logs in " + attempt_dir + ")";
    print_error("launch", "rank " + std::to_string(first_failure->rank) + " (pid " + std::to_string(first_failure->pid) +
                              ") " + describe_status(first_failure->status) + others + " -- see " + where +
                              " for the cause");
    // A refusal of the input is the launch's refusal too: exit 2, as `troupe train` alone would.
    return bad_input ? kExitUsage : kExitFailure;
  }
  if (forwarded_signal != 0) {
    std::vector<int> needed_kill;
    for (const auto& c : children)
      // Only a SIGKILL the launcher sent (one from elsewhere killed a rank that was already gone).
      if (killed && WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL) needed_kill.push_back(c.rank);
    print_error("launch", std::string("stopped by SIG") + sigabbrev_np(forwarded_signal) +
                              (needed_kill.empty() ? std::string()
                                                   : " (rank(s) " + rank_list(needed_kill) + " only by SIGKILL after the " +
                                                         seconds_text(signal_grace_s) + " grace)"));
    return 128 + forwarded_signal;
  }
  std::vector<int> failed;
  bool regroup = false;
  for (const auto& c : children) {
    if (regrouped(c.status)) regroup = true;
    else if (!succeeded(c.status)) failed.push_back(c.rank);
  }
  if (!failed.empty()) {
    *restartable = true;
    print_error("launch", "rank(s) " + rank_list(failed) + " failed");
    return kExitFailure;
  }
  return regroup ? kExitRegroup : kExitOk;
}

// An executable regular file named `name` on PATH, or "".
std::string which(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  for (;;) {
    const size_t colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string::npos) return "";
    start = colon + 1;
  }
}

// CUDA devices the ranks' programs will see: this build's CUDA runtime when it has one; otherwise
// the NVIDIA driver's list (/proc/driver/nvidia/gpus) cut by CUDA_VISIBLE_DEVICES as CUDA reads it
// (indices or GPU-/MIG- UUIDs, up to the first entry that names no device).
int visible_gpus(std::string* detail) {
  const DeviceInfo d = query_devices();
  if (d.cuda_built) {
    if (d.cuda_devices == 0) *detail = d.cuda_detail;
    return d.cuda_devices;
  }
  int physical = 0;
  if (DIR* dir = opendir("/proc/driver/nvidia/gpus")) {
    while (const dirent* e = readdir(dir))
      if (e->d_name[0] != '.') ++physical;
    closedir(dir);
  }
  if (physical == 0) {
    *detail = "no NVIDIA driver lists a GPU in /proc/driver/nvidia/gpus";
    return 0;
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return physical;
  int count = 0;
  std::set<long> seen;
  std::string list = visible;
  for (size_t start = 0; start <= list.size();) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, comma - start);
    start = comma + 1;
    char* end = nullptr;
    const long idx = std::strtol(item.c_str(), &end, 10);
    const bool index_ok = !item.empty() && *end == '\0' && idx >= 0 && idx < physical && seen.insert(idx).second;
    if (!index_ok && item.rfind("GPU-", 0) != 0 && item.rfind("MIG-", 0) != 0) break;
    ++count;
  }
  if (count == 0) *detail = "CUDA_VISIBLE_DEVICES='" + list + "' hides the " + std::to_string(physical) + " GPU(s)";
  return count;
}

// 122 random bits as a UUID (version 4), torchrun --standalone's run id.
std::string fresh_uuid(const std::string& hex64) {
  std::string h = hex64.substr(0, 32);
  h[12] = '4';
  h[16] = "89ab"[std::stoi(h.substr(16, 1), nullptr, 16) & 3];
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" + h.substr(20);
}

}  // namespace

int run_launch_command(const std::vector<std::string>& args, const std::set<std::string>& subcommands) {
  HostFacts host;
  host.cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  host.gpus = visible_gpus(&host.gpu_detail);
  host.which = which;
  auto parsed = parse_launch_args(args, host, comm::process_env(), subcommands);
  if (!parsed) {
    print_error("launch", parsed.status());
    return kExitUsage;
  }
  Launch l;
  l.o = std::move(parsed).value();
  LaunchOptions& o = l.o;
  if (o.help) {
    std::printf("%s", launch_usage().c_str());
    return kExitOk;
  }
  if (o.new_token) {
    auto token = comm::generate_job_token();
    if (!token) {
      print_error("launch", token.status());
      return kExitFailure;
    }
    std::printf("%s\n", token->c_str());
    return kExitOk;
  }
  // What each rank execs.
  l.troupe_command = command_kind(o, subcommands) == CommandKind::troupe;
  // train --auto-layout on one host: the launcher plans once for the job's processes and passes
  // every process the same sizes (each process measuring the machine on its own could choose
  // differently). Over several hosts the ranks' rank 0 plans once they have met and sends its choice
  // to the others (RunOptions::choose_layout).
  if (l.troupe_command && !o.command.empty() && o.command[0] == "train" && o.nnodes == 1 &&
      std::find(o.command.begin(), o.command.end(), "--auto-layout") != o.command.end()) {
    std::vector<std::string> lines;
    auto resolved = resolve_auto_layout({o.command.begin() + 1, o.command.end()}, o.nproc_per_node, o.nproc_per_node,
                                        &lines);
    if (!resolved) {
      print_error("launch", resolved.status());
      return exit_code_for(resolved.status());
    }
    for (const std::string& line : lines) std::printf("troupe launch: %s\n", line.c_str());
    std::fflush(stdout);
    o.command.resize(1);
    o.command.insert(o.command.end(), resolved.value().begin(), resolved.value().end());
  }
  if (l.troupe_command) {
    char exe_buf[4096];
    const ssize_t len = readlink("/proc/self/exe", exe_buf, sizeof exe_buf - 1);
    if (len <= 0) {
      print_error("launch", std::string("cannot find this program through /proc/self/exe: ") + std::strerror(errno));
      return kExitFailure;
    }
    l.exe.assign(exe_buf, static_cast<size_t>(len));
    l.argv = {l.exe};  // a user's program sees its own path as argv[0]; troupe's is troupe
    l.argv.insert(l.argv.end(), o.command.begin(), o.command.end());
  } else {
    l.argv = o.command;
    if (o.run_path) {
      const char* py = std::getenv("PYTHON_EXEC");
      l.argv.insert(l.argv.begin(), py != nullptr && *py != '\0' ? py : "python3");
    }
    l.exe = which(l.argv.front());
    if (l.exe.empty() || access(l.exe.c_str(), X_OK) != 0) {
      print_error("launch", "'" + l.argv.front() + "' is not an executable program" +
                                (l.exe.empty() ? std::string(" on PATH") : " (" + std::string(std::strerror(errno)) + ")") +
                                " -- give a troupe subcommand (train, comm-check, ...), a program's path, or a "
                                "program on PATH");
      return kExitUsage;
    }
  }
  if (o.nnodes == 1 && !o.master_port_given) {
    if (const int port = free_local_port(); port > 0) o.master_port = port;
  }
  if (o.nnodes == 1) {
    auto fresh = comm::generate_job_token();
    if (!fresh) {
      print_error("launch", fresh.status());
      return kExitFailure;
    }
    l.token = *fresh;
  } else {
    const char* env_token = std::getenv("TROUPE_JOB_TOKEN");
    if (env_token == nullptr || *env_token == '\0') {
      print_error("launch", "--nnodes " + std::to_string(o.nnodes) +
                                " needs the job token in TROUPE_JOB_TOKEN, the same value on every node -- run "
                                "`export TROUPE_JOB_TOKEN=$(troupe launch --new-token)` once and set that value "
                                "in the environment of troupe launch on each node");
      return kExitUsage;
    }
    if (Status st = comm::validate_job_token(env_token, "TROUPE_JOB_TOKEN"); !st) {
      print_error("launch", st);
      return kExitUsage;
    }
    l.token = env_token;
  }
  // The run's name for every restart of this launch (troupe train resumes only its own run's
  // checkpoints): 128 random bits.
  auto random = comm::generate_job_token();
  if (!random) {
    print_error("launch", random.status());
    return kExitFailure;
  }
  l.run_id = random->substr(0, 32);
  l.rdzv_id = o.standalone ? fresh_uuid(random->substr(32)) : o.rdzv_id;
  l.elastic_run_id = l.rdzv_id.empty() ? "none" : l.rdzv_id;
  l.signals = o.signals.empty() ? std::vector<int>{SIGINT, SIGTERM, SIGHUP} : o.signals;
  if (!o.log_dir.empty() || o.redirects.any() || o.tee.any()) {
    auto dir = make_run_log_dir(o.log_dir, l.elastic_run_id);
    if (!dir) {
      print_error("launch", dir.status());
      return exit_code_for(dir.status());
    }
    l.run_log_dir = *dir;
    std::fprintf(stderr, "troupe launch: the ranks' logs go to %s/attempt_<restart>/<local rank>/\n",
                 l.run_log_dir.c_str());
  }
  for (const std::string& note : o.notes) std::fprintf(stderr, "troupe launch: note: %s\n", note.c_str());
  if (!o.local_addr.empty() && o.node_rank != 0)
    std::fprintf(stderr, "troupe launch: note: --local-addr %s: no effect on node %d -- its ranks connect to the "
                         "master from the address the kernel picks toward it\n",
                 o.local_addr.c_str(), o.node_rank);
  if (!l.troupe_command && o.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr)
    std::fprintf(stderr, "troupe launch: note: OMP_NUM_THREADS=1 for every rank (torchrun's default when it is "
                         "unset, so %d ranks do not overload the host; set it to tune)\n",
                 o.nproc_per_node);

  // troupe train --save-memory-interval keeps the run's in-memory snapshots in a tmpfs folder named
  // by the run id, which every restart of the ranks resumes from and the launcher removes at its end.
  struct MemorySnapshots {
    std::string dir;
    ~MemorySnapshots() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } memory;
  if (l.troupe_command && std::find(l.argv.begin(), l.argv.end(), "train") != l.argv.end()) {
    std::string base;
    bool snapshots = false;
    for (size_t i = 0; i < l.argv.size(); ++i) {
      const std::string& a = l.argv[i];
      if (a == "--save-memory-interval" || a.rfind("--save-memory-interval=", 0) == 0) snapshots = true;
      if (a == "--save-memory-dir" && i + 1 < l.argv.size()) base = l.argv[i + 1];
      else if (a.rfind("--save-memory-dir=", 0) == 0) base = a.substr(18);
    }
    if (snapshots) {
      memory.dir = memory_snapshot_dir(base, l.run_id);
      // The launcher owns the folder (its ranks come and go with restarts); folders of launchers or
      // processes killed before they could remove theirs go now.
      std::error_code ec;
      std::filesystem::create_directories(memory.dir, ec);
      if (!ec) (void)write_snapshot_owner(memory.dir, ::getpid());
      for (const std::string& gone : sweep_abandoned_snapshot_folders(memory.dir))
        std::fprintf(stderr, "troupe launch: removed %s: the in-memory snapshots of a process that is gone\n", gone.c_str());
    }
  }
  // --in-job-recovery --spares: the rendezvous moves when its host is lost; this node's processes keep
  // where it is in a file of the launcher's (comm/bootstrap/rendezvous_place.hpp), which a process
  // started later reads. The launcher removes it at its end.
  struct HintFile {
    std::string path;
    ~HintFile() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } hint;
  if (o.warm_spares()) {
    const char* tmp = std::getenv("TMPDIR");
    hint.path = std::string(tmp != nullptr && *tmp == '/' ? tmp : "/tmp") + "/troupe-rdzv-" + l.run_id;
    l.rdzv_hint = hint.path;
  }
  // --nnodes MIN:MAX or --spares K: each attempt is a round of the nodes there (apps/launch_elastic.hpp).
  std::unique_ptr<ElasticMembership> elastic;
  l.elastic = o.rounds();
  l.max_nnodes = o.nnodes;
  if (o.rounds()) {
    auto started = ElasticMembership::start(o, l.token, l.run_id);
    if (!started) {
      print_error("launch", started.status());
      return exit_code_for(started.status());
    }
    elastic = std::move(started).value();
  }
  int last_round = -1;
  for (int restart = 0;; ++restart) {
    Launch attempt = l;
    int count = restart;  // TROUPE_RESTART_COUNT: the round's number when elastic
    if (elastic) {
      auto round = elastic->next_round(last_round);
      if (!round) {
        print_error("launch", round.status());
        return exit_code_for(round.status());
      }
      if (!round->has_value()) return kExitOk;
      const comm::RoundAssignment& r = **round;
      last_round = count = r.round;
      attempt.o.nnodes = r.nodes;
      attempt.o.node_rank = r.group_rank;
      attempt.o.master_addr = r.host_addr;
      attempt.o.master_port = r.host_port + 1;
      attempt.job_run_id = r.run_id;
    }
    bool restartable = false;
    InJobRestarts replaced;  // --in-job-recovery: the restarts of single processes
    const int code = run_ranks(attempt, count, &restartable, elastic && elastic->hosting() ? elastic.get() : nullptr,
                               o.in_job_recovery ? &replaced : nullptr);
    if (o.in_job_recovery) {
      if (code != kExitOk && restartable && replaced.spent)
        std::fprintf(stderr, "troupe launch: not restarting: in-job recovery spent its %d restart(s)\n", o.max_restarts);
      return code;
    }
    if (code == kExitRegroup && elastic) {
      std::fprintf(stderr, "troupe launch: round %d ended for a node that asks to join; forming the next\n", last_round);
      --restart;  // a new member is not a failure: no restart counted
      continue;
    }
    if (code == kExitOk || restart >= o.max_restarts) {
      if (elastic) elastic->finish(code != kExitOk);
      return code;
    }
    if (!restartable) {
      std::fprintf(stderr, "troupe launch: not restarting: the ranks were stopped by a signal or refused their "
                           "input (exit code 2)\n");
      if (elastic) elastic->finish(true);
      return code;
    }
    if (o.nnodes == 1 && !o.master_port_given) {
      if (const int port = free_local_port(); port > 0) o.master_port = port;
    }
    std::fprintf(stderr, "troupe launch: restart %d of %d: starting all %d rank(s)%s again (TROUPE_RESTART_COUNT=%d)\n",
                 restart + 1, o.max_restarts, o.nproc_per_node, o.nnodes > 1 ? " of this node" : "",
                 elastic ? last_round + 1 : restart + 1);
  }
}

// comm-check (apps/comm_check_cmd.cpp) is launch's companion and is registered with it.
void add_comm_check_command(CLI::App& app, int* exit_code);

void add_launch_command(CLI::App& app, int* exit_code) {
  add_comm_check_command(app, exit_code);
  // Listed for `troupe --help`; main() hands `troupe launch ...` to run_launch_command before CLI11
  // parses (torchrun's grammar is not CLI11's: the command's first word ends the flags).
  CLI::App* cmd = app.add_subcommand("launch",
                                     "Start the ranks of a job on this node (torchrun's flags): "
                                     "troupe launch --nproc-per-node N -- train ... (troupe launch --help)");
  cmd->allow_extras();
  cmd->callback([exit_code, cmd, &app] {
    std::set<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.insert(sub->get_name());
    *exit_code = run_launch_command(cmd->remaining(), names);
  });
}

}  // namespace troupe::apps
