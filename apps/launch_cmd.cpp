// troupe launch: starts the ranks of a job on this node, torchrun's way.
//
//   troupe launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]
//                 [--prefix-output] [--stop-grace S] -- <subcommand and its flags>
//   troupe launch --new-token    prints a fresh job token (for srun, mpirun, several nodes)
//
// Each of the N children runs this same binary (/proc/self/exe) with the subcommand, in its own
// process group, with TROUPE_{RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, JOB_TOKEN} and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR, MASTER_PORT. Global rank = node_rank * N + local rank. The token is
// made here for one node; with several nodes it is taken from TROUPE_JOB_TOKEN, which must hold
// the same value on every node (the rendezvous refuses ranks whose token differs).
//
// Supervision: when a rank dies (non-zero exit or a signal) the others get SIGTERM, then SIGKILL
// after --stop-grace seconds (3), and the launcher exits 1 naming the rank, its pid and how it
// died. SIGINT, SIGTERM and SIGHUP to the launcher are passed on to every rank (a second one sends
// SIGKILL at once); ranks then have --stop-grace seconds to finish (default 60 here: troupe train
// finishes its iteration and saves), and the launcher exits 128 + the signal. The children get
// SIGTERM if the launcher itself dies (PR_SET_PDEATHSIG). Nothing waits without a bound: ranks
// that survive SIGKILL for 10 s (stuck in the kernel) are reported and left behind.
//
// Restarts (--max-restarts N): after a failure every rank of this node is stopped and started
// again with TROUPE_RESTART_COUNT raised; troupe train then resumes this run's latest checkpoint
// in its --save. With several nodes each node's launcher does this on its own: a failure on one
// node ends the job on every node (the bootstrap notices the lost rank or rendezvous), every
// launcher restarts its ranks, and they meet again at the same MASTER_ADDR:MASTER_PORT with the
// same token (--save must be a folder every node sees). TROUPE_RUN_ID (32 hex digits, one per
// launch, the same for every restart) names the run; with several nodes node 0's is the run's.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apps/commands.hpp"
#include "apps/report.hpp"
#include "comm/bootstrap/launch_env.hpp"

extern char** environ;

namespace troupe::apps {

namespace {

using Clock = std::chrono::steady_clock;

struct LaunchArgs {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = comm::kDefaultMasterPort;
  bool port_given = false;  // --master-port on the command line
  bool new_token = false;
  bool prefix_output = false;
  double stop_grace = 3.0;
  bool stop_grace_given = false;  // --stop-grace on the command line
  // After a forwarded SIGINT/SIGTERM, unless --stop-grace is given: time for ranks to save.
  double signal_grace = 60.0;
  int max_restarts = 0;  // torchrun's: restart every rank after a failure, this many times
  std::vector<std::string> command;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  int out_fd = -1, err_fd = -1;  // read ends when --prefix-output
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

bool succeeded(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The child's environment: ours, minus the variables the launcher sets, plus them.
std::vector<std::string> child_environment(const LaunchArgs& a, int rank, int local_rank,
                                           const std::string& token, const std::string& run_id,
                                           int restart) {
  const int world = a.nnodes * a.nproc_per_node;
  const std::vector<std::pair<std::string, std::string>> set = {
      {"TROUPE_RUN_ID", run_id},
      {"TROUPE_RESTART_COUNT", std::to_string(restart)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
      {"TROUPE_RANK", std::to_string(rank)},
      {"TROUPE_WORLD_SIZE", std::to_string(world)},
      {"TROUPE_LOCAL_RANK", std::to_string(local_rank)},
      {"TROUPE_LOCAL_WORLD_SIZE", std::to_string(a.nproc_per_node)},
      {"TROUPE_MASTER_ADDR", a.master_addr},
      {"TROUPE_MASTER_PORT", std::to_string(a.master_port)},
      {"TROUPE_JOB_TOKEN", token},
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(a.nproc_per_node)},
      {"GROUP_RANK", std::to_string(a.node_rank)},
      {"MASTER_ADDR", a.master_addr},
      {"MASTER_PORT", std::to_string(a.master_port)},
  };
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
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

// Starts one rank. The exec error, if any, comes back through a close-on-exec pipe.
Status spawn_child(const std::string& exe, std::vector<std::string> argv,
                   std::vector<std::string> env, const sigset_t& parent_mask, bool capture,
                   Child& c) {
  int err_pipe[2], out_pipe[2] = {-1, -1}, errout_pipe[2] = {-1, -1};
  if (pipe2(err_pipe, O_CLOEXEC) != 0)
    return Status::error(std::string("pipe: ") + std::strerror(errno));
  if (capture && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(errout_pipe, O_CLOEXEC) != 0))
    return Status::error(std::string("pipe: ") + std::strerror(errno));
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
    if (capture) {
      dup2(out_pipe[1], STDOUT_FILENO);
      dup2(errout_pipe[1], STDERR_FILENO);
    }
    // The launcher decides when ranks stop: they must act on the SIGINT / SIGTERM it passes on even
    // where the launcher was started with them ignored (a background job of a script).
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
  if (capture) {
    close(out_pipe[1]);
    close(errout_pipe[1]);
    c.out_fd = out_pipe[0];
    c.err_fd = errout_pipe[0];
  }
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
    return Status::error("cannot start rank " + std::to_string(c.rank) + ": exec " + exe + ": " +
                         std::strerror(e));
  }
  return Status::ok();
}

// Copies the children's output line by line with a "[rank N] " prefix, until every pipe is closed
// or `stop` is set.
class OutputPrefixer {
 public:
  void add(int fd, int rank, FILE* to) { streams_.push_back({fd, rank, to, {}}); }
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  // Waits up to `grace` for the pipes to drain (a grandchild may keep one open), then stops.
  void finish(std::chrono::milliseconds grace) {
    if (!thread_.joinable()) return;
    const auto deadline = Clock::now() + grace;
    while (!done_ && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stop_ = true;
    thread_.join();
  }

 private:
  struct Stream {
    int fd, rank;
    FILE* to;
    std::string partial;
  };
  void emit(Stream& s, const std::string& text) {
    std::fprintf(s.to, "[rank %d] %s", s.rank, text.c_str());
    std::fflush(s.to);
  }
  void run() {
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<Stream*> which;
      for (auto& s : streams_)
        if (s.fd >= 0) {
          fds.push_back({s.fd, POLLIN, 0});
          which.push_back(&s);
        }
      if (fds.empty() || stop_) break;
      if (poll(fds.data(), fds.size(), 100) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Stream& s = *which[i];
        char buf[4096];
        const ssize_t n = read(s.fd, buf, sizeof buf);
        if (n <= 0) {
          if (n < 0 && errno == EINTR) continue;
          if (!s.partial.empty()) emit(s, s.partial + "\n");
          close(s.fd);
          s.fd = -1;
          continue;
        }
        s.partial.append(buf, static_cast<size_t>(n));
        size_t nl;
        while ((nl = s.partial.find('\n')) != std::string::npos) {
          emit(s, s.partial.substr(0, nl + 1));
          s.partial.erase(0, nl + 1);
        }
      }
    }
    done_ = true;
  }
  std::vector<Stream> streams_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, done_{false};
};

void signal_all(std::vector<Child>& children, int sig) {
  for (auto& c : children)
    if (c.running && kill(-c.pid, sig) != 0)
      kill(c.pid, sig);  // its process group: it and what it started
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

Status validate(const LaunchArgs& a) {
  if (a.nproc_per_node < 1) return Status::error("--nproc-per-node must be at least 1");
  if (a.nnodes < 1) return Status::error("--nnodes must be at least 1");
  if (a.node_rank < 0 || a.node_rank >= a.nnodes)
    return Status::error("--node-rank " + std::to_string(a.node_rank) + " is outside [0, " +
                         std::to_string(a.nnodes) + ") for --nnodes " + std::to_string(a.nnodes));
  if (a.master_port < 1 || a.master_port > 65535)
    return Status::error("--master-port " + std::to_string(a.master_port) +
                         " is not a TCP port -- use 1..65535");
  if (a.nnodes > 1 && (a.master_addr == "localhost" || a.master_addr.rfind("127.", 0) == 0))
    return Status::error("--nnodes " + std::to_string(a.nnodes) +
                         " needs --master-addr set to the host of node 0 "
                         "(reachable from every node), not " +
                         a.master_addr);
  if (!(a.stop_grace >= 0 && a.stop_grace <= 3600))
    return Status::error("--stop-grace must be in [0, 3600] seconds");
  if (a.max_restarts < 0)
    return Status::error("--max-restarts must be >= 0 (0: stop at the first failure)");
  if (a.command.empty())
    return Status::error(
        "no subcommand to run -- e.g. troupe launch --nproc-per-node 4 -- comm-check");
  return Status::ok();
}

// A TCP port nobody listens on now (the kernel's pick for port 0 on loopback), or -1. One node, no
// --master-port: like torchrun --standalone, two jobs on one machine then do not collide.
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

// Starts every rank of this node (attempt `restart`, 0 first) and waits for them: the exit code of
// the launch; *restartable when ranks failed by themselves (not stopped by a signal to the launcher).
int run_ranks(const LaunchArgs& a, const std::string& exe, const std::string& token,
              const std::string& run_id, int restart, bool* restartable) {
  // Signals are taken synchronously with sigtimedwait; children get the original mask back.
  sigset_t wait_set, old_mask;
  sigemptyset(&wait_set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&wait_set, s);
  sigprocmask(SIG_BLOCK, &wait_set, &old_mask);
  auto restore = [&] { sigprocmask(SIG_SETMASK, &old_mask, nullptr); };

  std::vector<Child> children(a.nproc_per_node);
  OutputPrefixer prefixer;
  for (int local = 0; local < a.nproc_per_node; ++local) {
    Child& c = children[local];
    c.rank = a.node_rank * a.nproc_per_node + local;
    std::vector<std::string> argv = {exe};  // a user's program: argv[0] is its path
    argv.insert(argv.end(), a.command.begin(), a.command.end());
    Status st = spawn_child(exe, argv, child_environment(a, c.rank, local, token, run_id, restart),
                            old_mask, a.prefix_output, c);
    if (!st) {
      print_error("launch", st);
      signal_all(children, SIGKILL);
      for (auto& other : children)
        if (other.running) waitpid(other.pid, nullptr, 0);
      restore();
      return kExitFailure;
    }
    if (a.prefix_output) {
      prefixer.add(c.out_fd, c.rank, stdout);
      prefixer.add(c.err_fd, c.rank, stderr);
    }
  }
  if (a.prefix_output) prefixer.start();

  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(a.stop_grace * 1000));
  const double signal_grace_s = a.stop_grace_given ? a.stop_grace : a.signal_grace;
  const auto signal_grace = std::chrono::milliseconds(static_cast<int64_t>(signal_grace_s * 1000));
  int running = a.nproc_per_node;
  const Child* first_failure = nullptr;
  int forwarded_signal = 0;
  bool stopping = false, killed = false;
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
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (forwarded_signal == 0) {
        forwarded_signal = sig;
        std::fprintf(stderr,
                     "troupe launch: received SIG%s, passing it on to the %d running rank(s)\n",
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
        if (!succeeded(status) &&
            (failed_now == nullptr || (WIFSIGNALED(status) && !WIFSIGNALED(failed_now->status))))
          failed_now = &c;
      }
    }
    if (failed_now != nullptr && first_failure == nullptr && !stopping) {
      first_failure = failed_now;
      std::fprintf(stderr, "troupe launch: rank %d (pid %d) %s; stopping the other ranks\n", failed_now->rank,
                   failed_now->pid, describe_status(failed_now->status).c_str());
      begin_stop();
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
      std::fprintf(
          stderr,
          "troupe launch: rank(s) %s did not end 10 s after SIGKILL (stuck in the kernel?); "
          "leaving them\n",
          rank_list(stuck).c_str());
      break;
    }
  }
  prefixer.finish(std::chrono::milliseconds(1000));
  restore();

  if (first_failure != nullptr) {
    std::vector<int> stopped, needed_kill;
    for (const auto& c : children) {
      if (&c == first_failure || succeeded(c.status)) continue;
      stopped.push_back(c.rank);
      if (WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL) needed_kill.push_back(c.rank);
    }
    std::string others;
    if (!stopped.empty()) others = "; stopped rank(s) " + rank_list(stopped);
    if (!needed_kill.empty())
      others += " (rank(s) " + rank_list(needed_kill) + " only by SIGKILL after the " +
                seconds_text(a.stop_grace) + " grace)";
    // A rank refused its input (exit code 2: bad flags, config, data): starting again cannot help.
    const bool bad_input = WIFEXITED(first_failure->status) && WEXITSTATUS(first_failure->status) == kExitUsage;
    *restartable = forwarded_signal == 0 && !bad_input;
    print_error("launch", "rank " + std::to_string(first_failure->rank) + " (pid " +
                              std::to_string(first_failure->pid) + ") " +
                              describe_status(first_failure->status) + others +
                              " -- see the rank's output above for the cause");
    return kExitFailure;
  }
  if (forwarded_signal != 0) {
    std::vector<int> needed_kill;
    for (const auto& c : children)
      if (WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL) needed_kill.push_back(c.rank);
    print_error("launch", std::string("stopped by SIG") + sigabbrev_np(forwarded_signal) +
                              (needed_kill.empty() ? std::string()
                                                   : " (rank(s) " + rank_list(needed_kill) +
                                                         " only by SIGKILL after the " +
                                                         seconds_text(signal_grace_s) + " grace)"));
    return 128 + forwarded_signal;
  }
  std::vector<int> failed;
  for (const auto& c : children)
    if (!succeeded(c.status)) failed.push_back(c.rank);
  if (!failed.empty()) {
    *restartable = true;
    print_error("launch", "rank(s) " + rank_list(failed) + " failed");
    return kExitFailure;
  }
  return kExitOk;
}

int run_launch(LaunchArgs a) {
  if (a.new_token) {
    auto token = comm::generate_job_token();
    if (!token) {
      print_error("launch", token.status());
      return kExitFailure;
    }
    std::printf("%s\n", token->c_str());
    return kExitOk;
  }
  // "troupe launch -- troupe train ..." reads like torchrun's script argument: drop the program
  // name.
  if (!a.command.empty()) {
    const std::string& first = a.command.front();
    if (first == "troupe" ||
        (first.size() > 7 && first.compare(first.size() - 7, 7, "/troupe") == 0))
      a.command.erase(a.command.begin());
  }
  if (Status st = validate(a); !st) {
    print_error("launch", st);
    return kExitUsage;
  }
  if (a.nnodes == 1 && !a.port_given) {
    if (const int port = free_local_port(); port > 0) a.master_port = port;
  }
  std::string token;
  if (a.nnodes == 1) {
    auto fresh = comm::generate_job_token();
    if (!fresh) {
      print_error("launch", fresh.status());
      return kExitFailure;
    }
    token = *fresh;
  } else {
    const char* env_token = std::getenv("TROUPE_JOB_TOKEN");
    if (env_token == nullptr || *env_token == '\0') {
      print_error(
          "launch",
          "--nnodes " + std::to_string(a.nnodes) +
              " needs the job token in TROUPE_JOB_TOKEN, the same value on every node -- run "
              "`export TROUPE_JOB_TOKEN=$(troupe launch --new-token)` once and set that value "
              "in the environment of troupe launch on each node");
      return kExitUsage;
    }
    if (Status st = comm::validate_job_token(env_token, "TROUPE_JOB_TOKEN"); !st) {
      print_error("launch", st);
      return kExitUsage;
    }
    token = env_token;
  }

  char exe_buf[4096];
  const ssize_t len = readlink("/proc/self/exe", exe_buf, sizeof exe_buf - 1);
  if (len <= 0) {
    print_error("launch", std::string("cannot find this program through /proc/self/exe: ") +
                              std::strerror(errno));
    return kExitFailure;
  }
  std::string exe(exe_buf, static_cast<size_t>(len));
  // A path (it has a '/') is a program of its own, e.g. one embedding troupe (troupe::train finds
  // the launch environment): it runs instead of a troupe subcommand, with the rest as its arguments.
  if (a.command.front().find('/') != std::string::npos) {
    exe = a.command.front();
    a.command.erase(a.command.begin());
    if (access(exe.c_str(), X_OK) != 0) {
      print_error("launch", exe + " is not an executable program (" + std::strerror(errno) +
                                ") -- give a troupe subcommand (train, comm-check, ...) or the path of a program to run");
      return kExitUsage;
    }
  }
  // The run's name for every restart of this launch (troupe train resumes only its own run's
  // checkpoints): 128 random bits.
  auto random = comm::generate_job_token();
  if (!random) {
    print_error("launch", random.status());
    return kExitFailure;
  }
  const std::string run_id = random->substr(0, 32);

  for (int restart = 0;; ++restart) {
    bool restartable = false;
    const int code = run_ranks(a, exe, token, run_id, restart, &restartable);
    if (code == kExitOk || restart >= a.max_restarts) return code;
    if (!restartable) {
      std::fprintf(stderr, "troupe launch: not restarting: the ranks were stopped by a signal or refused their "
                           "input (exit code 2)\n");
      return code;
    }
    if (a.nnodes == 1 && !a.port_given) {
      if (const int port = free_local_port(); port > 0) a.master_port = port;
    }
    std::fprintf(stderr,
                 "troupe launch: restart %d of %d: starting all %d rank(s)%s again "
                 "(TROUPE_RESTART_COUNT=%d)\n",
                 restart + 1, a.max_restarts, a.nproc_per_node, a.nnodes > 1 ? " of this node" : "",
                 restart + 1);
  }
}

}  // namespace

// comm-check (apps/comm_check_cmd.cpp) is launch's companion and is registered with it.
void add_comm_check_command(CLI::App& app, int* exit_code);

void add_launch_command(CLI::App& app, int* exit_code) {
  add_comm_check_command(app, exit_code);
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand("launch",
                                     "Start the ranks of a job on this node (torchrun's flags): "
                                     "troupe launch --nproc-per-node N -- train ...");
  cmd->add_option("--nproc-per-node,--nproc_per_node", args->nproc_per_node,
                  "Ranks to start on this node")
      ->capture_default_str();
  cmd->add_option("--nnodes", args->nnodes, "Nodes in the job (one troupe launch per node)")
      ->capture_default_str();
  cmd->add_option("--node-rank,--node_rank", args->node_rank, "This node's index, 0 .. nnodes-1")
      ->capture_default_str();
  cmd->add_option("--master-addr,--master_addr", args->master_addr,
                  "Host of rank 0 (node 0), reachable from all nodes")
      ->capture_default_str();
  cmd->add_option("--master-port,--master_port", args->master_port,
                  "TCP port of rank 0's rendezvous (default: a free port on one node, else 29500)");
  cmd->add_flag("--new-token", args->new_token,
                "Print a fresh job token and exit (export it as TROUPE_JOB_TOKEN for srun, mpirun, "
                "several nodes)");
  cmd->add_flag("--prefix-output", args->prefix_output,
                "Prefix every output line with \"[rank N] \"");
  cmd->add_option(
         "--stop-grace", args->stop_grace,
         "Seconds between SIGTERM and SIGKILL when stopping the ranks after a failure (3), "
         "and after passing on a SIGINT/SIGTERM (default there: 60, time to save)")
      ->capture_default_str();
  cmd->add_option(
         "--max-restarts,--max_restarts", args->max_restarts,
         "After a rank fails, stop the others and start every rank of this node again, up to N "
         "times (with several nodes every node's launcher does so and the ranks meet again); "
         "each restart sets TROUPE_RESTART_COUNT, and troupe train then resumes this run's "
         "latest checkpoint in its --save (with several nodes: a folder every node sees)")
      ->capture_default_str();
  cmd->add_option("command", args->command,
                  "The subcommand each rank runs, after --, e.g. -- comm-check; or the path of a program to run (one that embeds troupe: troupe::train finds the launch environment)")
      ->expected(-1);
  cmd->callback([cmd, args, exit_code] {
    args->port_given = cmd->count("--master-port") > 0;
    args->stop_grace_given = cmd->count("--stop-grace") > 0;
    *exit_code = run_launch(*args);
  });
}

}  // namespace troupe::apps
