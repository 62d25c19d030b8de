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

#include <algorithm>
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
#include "comm/bootstrap/caf_bootstrap.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "comm/local/local_world.hpp"
#include "comm/ucx/ucx_world.hpp"

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

// Collectives on `c` checked exactly against the serial result: inputs are integer-valued floats
// computed from (rank, index), so every rank knows every other rank's input and the expected output.
Status check_collectives(comm::Communicator& c) {
  const int n = c.size(), me = c.rank();
  auto input = [](int rank, size_t i) { return static_cast<float>((rank * 31 + static_cast<int>(i % 1009)) % 97 - 40); };
  auto fail = [&](const std::string& what, size_t i) {
    return Status::error(what + ": wrong value at element " + std::to_string(i) + " on rank " + std::to_string(me));
  };
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000003}}) {
    std::vector<float> buf(count), expect(count, 0.0f), mx(count);
    for (size_t i = 0; i < count; ++i) buf[i] = input(me, i);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) expect[i] += input(r, i);
    TROUPE_RETURN_IF_ERROR(c.all_reduce(buf.data(), count, DType::f32, comm::ReduceOp::sum)->wait());
    for (size_t i = 0; i < count; ++i)
      if (buf[i] != expect[i]) return fail("all_reduce sum of " + std::to_string(count), i);
    for (size_t i = 0; i < count; ++i) mx[i] = input(me, i);
    TROUPE_RETURN_IF_ERROR(c.all_reduce(mx.data(), count, DType::f32, comm::ReduceOp::max)->wait());
    for (size_t i = 0; i < count; ++i) {
      float m = input(0, i);
      for (int r = 1; r < n; ++r) m = std::max(m, input(r, i));
      if (mx[i] != m) return fail("all_reduce max of " + std::to_string(count), i);
    }
    // Uneven blocks: rank r owns count * (r + 1) / sum parts (the last takes the rest).
    std::vector<size_t> counts(n);
    size_t used = 0;
    for (int r = 0; r < n; ++r) {
      counts[r] = r + 1 == n ? count - used : count * (r + 1) / (n * (n + 1) / 2);
      used += counts[r];
    }
    size_t offset = 0;
    for (int r = 0; r < me; ++r) offset += counts[r];
    std::vector<float> send(count), block(counts[me]);
    for (size_t i = 0; i < count; ++i) send[i] = input(me, i);
    TROUPE_RETURN_IF_ERROR(c.reduce_scatter_v(send.data(), block.data(), counts, DType::f32, comm::ReduceOp::sum)->wait());
    for (size_t i = 0; i < counts[me]; ++i)
      if (block[i] != expect[offset + i]) return fail("reduce_scatter_v of " + std::to_string(count), i);
    std::vector<float> gathered(count);
    TROUPE_RETURN_IF_ERROR(c.all_gather_v(block.data(), gathered.data(), counts, DType::f32)->wait());
    for (size_t i = 0; i < count; ++i)
      if (gathered[i] != expect[i]) return fail("all_gather_v of " + std::to_string(count), i);
    for (int root = 0; root < n; ++root) {
      for (size_t i = 0; i < count; ++i) buf[i] = input(me, i);
      TROUPE_RETURN_IF_ERROR(c.broadcast(buf.data(), count, DType::f32, root)->wait());
      for (size_t i = 0; i < count; ++i)
        if (buf[i] != input(root, i)) return fail("broadcast from rank " + std::to_string(root), i);
    }
    // A ring of tagged messages: every rank sends to the next and receives from the previous.
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    std::vector<float> out(count), in(count);
    for (size_t i = 0; i < count; ++i) out[i] = input(me, i);
    comm::WorkPtr r = c.recv(in.data(), count, DType::f32, prev, 17);
    comm::WorkPtr s = c.send(out.data(), count, DType::f32, next, 17);
    TROUPE_RETURN_IF_ERROR(comm::wait_all({s, r}));
    for (size_t i = 0; i < count; ++i)
      if (in[i] != input(prev, i)) return fail("send/recv from rank " + std::to_string(prev), i);
  }
  return c.barrier()->wait();
}

// The UCX backend across the job's processes.
Status check_ucx(CheckContext& ctx) {
  auto world = comm::create_ucx_world(ctx.bootstrap);
  if (!world) return world.status();
  auto everyone = world.value()->everyone();
  if (!everyone) return everyone.status();
  TROUPE_RETURN_IF_ERROR(check_collectives(*everyone.value()));
  // Two halves (even and odd ranks) as concurrent subgroups.
  std::vector<int> half;
  for (int r = ctx.env.rank % 2; r < ctx.env.world_size; r += 2) half.push_back(r);
  auto group = world.value()->group(half);
  if (!group) return group.status();
  return check_collectives(*group.value());
}

// The local backend inside this process: three threads as ranks.
Status check_local(CheckContext&) {
  constexpr int kRanks = 3;
  auto fabric = comm::LocalFabric::create(kRanks);
  if (!fabric) return fabric.status();
  std::vector<Status> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      auto everyone = fabric.value().world(r)->everyone();
      results[r] = everyone ? check_collectives(*everyone.value()) : everyone.status();
      if (!results[r]) fabric.value().abort(r, results[r].message());
    });
  for (auto& t : threads) t.join();
  for (const Status& st : results) TROUPE_RETURN_IF_ERROR(st);
  return Status::ok();
}

std::vector<CommCheck> comm_checks() {
  return {
      {"bootstrap", check_bootstrap},
      {"ucx collectives", check_ucx},
      {"local collectives", check_local},
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
