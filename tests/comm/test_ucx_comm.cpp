// The ucx backend end to end: N worker processes ($TROUPE_UCX_WORKER_BIN, tests/comm/workers/
// ucx_worker.cpp) bootstrap through a FileBootstrap in a fresh directory and run every collective
// against a serial reference (bf16/f16 reductions against the rounding rule of the algorithm that
// runs: --half-large names it where the settings decide it), over shared memory, TCP loopback and
// UCX's default choice, with the shared-memory data path for same-host groups required, off, and
// falling back for lack of room; then the failure cases: one worker dies in the middle of an
// all_reduce and the others must report it (exit code 3) within 10 s; one is SIGKILLed at a random
// moment of mixed traffic, or at each step of world creation, and the others must fail cleanly
// naming it (no UCX fatal error, nothing left in /dev/shm); ranks that disagree on a count must all
// fail (exit code 4); all_to_all_v against its serial reference on 1..8 ranks and, with counts
// that disagree between pairs, failing on every receiver that sees it, naming both counts.
// FileBootstrap itself is tested in-process.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap/file_bootstrap.hpp"
#include "tests/test_util.hpp"

extern char** environ;

namespace {

using troupe::comm::FileBootstrap;
using troupe::comm::FileBootstrapOptions;
using troupe::test::TempDir;
using Clock = std::chrono::steady_clock;

struct Exit {
  int code = -1;       // exit status, or -1
  int signal = 0;      // terminating signal, or 0
  double seconds = 0;  // since the job started
};

struct JobResult {
  std::vector<Exit> exits;
  bool timed_out = false;
  std::string logs;                    // every worker's output, for failure messages
  std::vector<std::string> rank_logs;  // each worker's output
};

// The environment of the workers: ours without UCX_TLS / UCX_NET_DEVICES / TROUPE_UCX_*, plus
// `set`.
std::vector<std::string> worker_env(const std::map<std::string, std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    if (key == "UCX_TLS" || key == "UCX_NET_DEVICES" || key.rfind("TROUPE_UCX_", 0) == 0 ||
        set.count(key))
      continue;
    env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

// A SIGKILL the test sends to one worker `at` seconds after the job started (rank < 0: none).
struct Kill {
  int rank = -1;
  double at = 0;
};

// Starts `n` workers with `args` (plus --rank/--world/--store) and waits for all of them, killing
// every one that is still running after `timeout`.
JobResult run_job(const std::string& bin, int n, const std::vector<std::string>& args,
                  const std::map<std::string, std::string>& env_set, std::chrono::seconds timeout,
                  Kill kill_one = {}) {
  TempDir dir;
  const std::vector<std::string> env_strings = worker_env(env_set);
  std::vector<char*> envp;
  for (const std::string& s : env_strings) envp.push_back(const_cast<char*>(s.c_str()));
  envp.push_back(nullptr);

  const auto t0 = Clock::now();
  std::vector<pid_t> pids(static_cast<size_t>(n), -1);
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv_s = {
        bin,       "--rank",        std::to_string(r), "--world", std::to_string(n),
        "--store", dir.str("store")};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    const std::string log = dir.str("log" + std::to_string(r));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&pids[static_cast<size_t>(r)], bin.c_str(), &fa, nullptr,
                               argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE(rc == 0);
  }

  JobResult result;
  result.exits.resize(static_cast<size_t>(n));
  int running = n;
  bool killed = kill_one.rank < 0;
  while (running > 0) {
    if (!killed && std::chrono::duration<double>(Clock::now() - t0).count() >= kill_one.at) {
      killed = true;
      if (pids[static_cast<size_t>(kill_one.rank)] > 0)
        kill(pids[static_cast<size_t>(kill_one.rank)], SIGKILL);
    }
    for (int r = 0; r < n; ++r) {
      pid_t& pid = pids[static_cast<size_t>(r)];
      if (pid < 0) continue;
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) != pid) continue;
      Exit& e = result.exits[static_cast<size_t>(r)];
      e.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
      pid = -1;
      --running;
    }
    if (running == 0) break;
    if (Clock::now() - t0 > timeout) {
      result.timed_out = true;
      for (pid_t pid : pids) {
        if (pid > 0) kill(pid, SIGKILL);
      }
      for (pid_t pid : pids) {
        if (pid > 0) waitpid(pid, nullptr, 0);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(killed ? 5 : 1));
  }
  for (int r = 0; r < n; ++r) {
    std::ifstream in(dir.str("log" + std::to_string(r)));
    std::stringstream ss;
    ss << in.rdbuf();
    const Exit& e = result.exits[static_cast<size_t>(r)];
    result.rank_logs.push_back(ss.str());
    result.logs += "--- rank " + std::to_string(r) + " (exit " + std::to_string(e.code) +
                   ", signal " + std::to_string(e.signal) + ", " + std::to_string(e.seconds) +
                   " s):\n" + ss.str();
  }
  return result;
}

const char* worker_bin() {
  return std::getenv("TROUPE_UCX_WORKER_BIN");
}

// Runs the full check suite for each (ranks, count scale) under one transport setting; `extra`
// goes to every worker's command line.
void run_suite(const std::map<std::string, std::string>& env,
               const std::vector<std::pair<int, double>>& jobs,
               const std::vector<std::string>& extra = {}) {
  for (const auto& [n, scale] : jobs) {
    DYNAMIC_SECTION("ranks " << n << ", count scale " << scale) {
      std::vector<std::string> args = {"--count-scale", std::to_string(scale)};
      args.insert(args.end(), extra.begin(), extra.end());
      // A hang guard, not a speed bound: 8 busy-polling ranks share 2 cores with other tests in CI.
      JobResult r = run_job(worker_bin(), n, args, env, std::chrono::seconds(180));
      INFO(r.logs);
      REQUIRE_FALSE(r.timed_out);
      for (const Exit& e : r.exits) {
        CHECK(e.signal == 0);
        CHECK(e.code == 0);
      }
    }
  }
}

// One worker (the last, or `victim`) dies in the middle of an all_reduce (or `op`): it must die by
// SIGKILL, and every other one must exit with code 3 ("peer failed, and the error named it") within
// 10 s of it.
void run_peer_death(const std::map<std::string, std::string>& env, int n, const std::string& mode,
                    const std::string& op = "all_reduce") {
  JobResult r =
      run_job(worker_bin(), n, {"--check", mode, "--op", op}, env, std::chrono::seconds(30));
  INFO(r.logs);
  REQUIRE_FALSE(r.timed_out);
  const Exit& victim = r.exits.back();
  CHECK(victim.signal == SIGKILL);
  for (int i = 0; i + 1 < n; ++i) {
    const Exit& e = r.exits[static_cast<size_t>(i)];
    CHECK(e.signal == 0);
    CHECK(e.code == 3);
    CHECK(e.seconds - victim.seconds < 10.0);
  }
}

}  // namespace

TEST_CASE("ucx collectives over shared memory (UCX_TLS=sm,self)", "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  run_suite({{"UCX_TLS", "sm,self"}}, {{1, 0.0}, {2, 0.0}, {3, 1.0}, {4, 0.0}, {5, 0.0}, {8, 1.0}});
}

TEST_CASE("ucx collectives over TCP loopback (UCX_TLS=tcp,self, UCX_NET_DEVICES=lo)",
          "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  run_suite({{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}},
            {{1, 0.0}, {2, 1.0}, {3, 0.0}, {4, 0.0}, {5, 0.3}, {8, 0.0}}, {"--half-large", "ring"});
}

TEST_CASE("ucx collectives with background waits (a wait sleeps at once, no polling first)", "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  // The main thread's waits as the offload writer's snapshot copies wait; the suite's second thread
  // polls as usual, so both kinds of waiter drive one engine.
  run_suite({{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}}, {{3, 0.3}},
            {"--half-large", "ring", "--background-waits", "1"});
}

TEST_CASE("ucx collectives with UCX's default transports", "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  // Same-host peers over shared memory (the default), then with UCX error handling (TCP loopback).
  run_suite({}, {{4, 1.0}});
  run_suite({{"TROUPE_UCX_SAME_HOST", "ucx"}}, {{3, 0.3}}, {"--half-large", "ring"});
}

TEST_CASE("ucx algorithm variants: small chunks, ring everywhere, ring all_gather", "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  // UCX's own transports only (no shared-memory path), as on a group that spans hosts. Many
  // chunks and an odd number of lanes (ring and direct all_gather).
  run_suite({{"UCX_TLS", "sm,self"},
             {"TROUPE_UCX_SHM", "off"},
             {"TROUPE_UCX_CHUNK_BYTES", "16K"},
             {"TROUPE_UCX_CHUNKS_IN_FLIGHT", "3"}},
            {{2, 1.0}, {5, 0.3}}, {"--half-large", "ring"});
  // The large-message algorithms for every size (blocks smaller than one element, empty blocks),
  // and the ring all_gather that one-host groups otherwise skip.
  run_suite({{"UCX_TLS", "sm,self"},
             {"TROUPE_UCX_SHM", "off"},
             {"TROUPE_UCX_RING_THRESHOLD", "0"},
             {"TROUPE_UCX_DIRECT_MAX_RANKS", "0"}},
            {{4, 0.2}, {7, 0.0}}, {"--half-large", "ring"});
}

TEST_CASE("ucx shared-memory path: required, every size, small slots, default transports",
          "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  // require: world creation fails unless every same-host pair mapped its segments, so the large
  // collectives below really take the shared-memory path.
  run_suite({{"UCX_TLS", "sm,self"}, {"TROUPE_UCX_SHM", "require"}}, {{2, 1.0}, {3, 0.3}, {8, 0.3}},
            {"--half-large", "shm"});
  // Every size through it (blocks of 0 and 1 elements), one-page pieces: many chunks per call, and
  // lanes reused across calls and by concurrent calls of one group.
  run_suite({{"UCX_TLS", "sm,self"},
             {"TROUPE_UCX_SHM", "require"},
             {"TROUPE_UCX_RING_THRESHOLD", "0"},
             {"TROUPE_UCX_SHM_SLOT_BYTES", "4096"}},
            {{4, 0.2}, {5, 0.0}}, {"--half-large", "shm"});
  run_suite({{"TROUPE_UCX_SHM", "require"}}, {{4, 1.0}}, {"--half-large", "shm"});
}

TEST_CASE("ucx shared-memory path: a member without room makes every member fall back to UCX",
          "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  // 512 KiB pieces need areas of at least 4 MiB, which a 2 MiB segment cannot hold: rank 0 alone
  // publishes "no area", so the others must fall back too; then every rank lacks room.
  run_suite({{"UCX_TLS", "sm,self"}, {"TROUPE_UCX_SHM_SLOT_BYTES", "512K"}}, {{3, 0.3}},
            {"--rank-env", "0", "TROUPE_UCX_SHM_BYTES=2M"});
  run_suite({{"UCX_TLS", "sm,self"},
             {"TROUPE_UCX_SHM_SLOT_BYTES", "512K"},
             {"TROUPE_UCX_SHM_BYTES", "2M"}},
            {{4, 0.2}});
}

TEST_CASE("ucx: ranks that disagree on a large collective's count all fail instead of hanging",
          "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  JobResult r =
      run_job(worker_bin(), 3, {"--check", "mismatch"},
              {{"UCX_TLS", "sm,self"}, {"TROUPE_UCX_SHM", "require"}}, std::chrono::seconds(30));
  INFO(r.logs);
  REQUIRE_FALSE(r.timed_out);
  for (const Exit& e : r.exits) {
    CHECK(e.signal == 0);
    CHECK(e.code == 4);
  }
}

TEST_CASE(
    "ucx all_to_all_v equals the serial exchange: 1, 2, 3, 4 and 8 ranks, shared memory, "
    "TCP, default transports, shared-memory path required",
    "[comm][ucx][all_to_all]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  // Same-host groups run all_to_all through shared memory (ucx_shm_ops.cpp: chunks of every pair
  // behind a length header, a 128 KiB slot, so the 40000-element blocks take several chunks), the
  // others by pairwise UCX messages (TCP; TROUPE_UCX_SAME_HOST=ucx in the mismatch test).
  const std::vector<std::string> check = {"--check", "all_to_all"};
  run_suite({{"UCX_TLS", "sm,self"}}, {{1, 1.0}, {2, 1.0}, {3, 1.0}, {4, 1.0}, {8, 0.5}}, check);
  run_suite({{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}}, {{3, 1.0}}, check);
  run_suite({}, {{4, 1.0}}, check);
  run_suite({{"UCX_TLS", "sm,self"}, {"TROUPE_UCX_SHM", "require"}}, {{5, 1.0}}, check);
  // One step in flight at a time (the strict pairwise order) and many.
  run_suite({{"UCX_TLS", "sm,self"}, {"TROUPE_UCX_CHUNKS_IN_FLIGHT", "1"}}, {{4, 0.3}}, check);
  run_suite({{"UCX_TLS", "sm,self"}, {"TROUPE_UCX_CHUNKS_IN_FLIGHT", "16"}}, {{7, 0.3}}, check);
}

TEST_CASE(
    "ucx all_to_all_v: counts that disagree fail every receiver that sees it, naming both "
    "counts, without a hang or a write past recv",
    "[comm][ucx][all_to_all]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  // Eager truncated (0 -> 1), short (1 -> 2), rendezvous truncated (2 -> 0); see ucx_worker.cpp.
  const std::vector<std::string> want = {
      "rank 2 (group rank 2) sends 300000 elements to this rank (group rank 0), whose "
      "recv_counts[2] is 299999",
      "rank 0 (group rank 0) sends 7 elements to this rank (group rank 1), whose recv_counts[0] "
      "is 5",
      "rank 1 (group rank 1) sends 3 elements to this rank (group rank 2), whose recv_counts[1] "
      "is 6"};
  for (const std::map<std::string, std::string>& env :
       std::vector<std::map<std::string, std::string>>{
           {{"UCX_TLS", "sm,self"}},
           {{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}},
           {{"TROUPE_UCX_SAME_HOST", "ucx"}}}) {
    JobResult r =
        run_job(worker_bin(), 3, {"--check", "a2a-mismatch"}, env, std::chrono::seconds(30));
    INFO(r.logs);
    REQUIRE_FALSE(r.timed_out);
    for (size_t q = 0; q < 3; ++q) {
      CHECK(r.exits[q].signal == 0);
      CHECK(r.exits[q].code == 4);
      CHECK(r.rank_logs[q].find(want[q]) != std::string::npos);
    }
  }
}

TEST_CASE("ucx: a rank that dies mid-collective fails the others' operations, naming it",
          "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  SECTION("UCX error handling (TROUPE_UCX_SAME_HOST=ucx), dies while sending") {
    run_peer_death({{"TROUPE_UCX_SAME_HOST", "ucx"}}, 4, "kill-target");
  }
  SECTION("TCP loopback, dies while sending") {
    run_peer_death({{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}}, 3, "kill-target");
  }
  SECTION("shared memory (process watch), dies while the others wait for it") {
    run_peer_death({{"UCX_TLS", "sm,self"}}, 4, "kill-target-idle");
  }
  SECTION("shared-memory path (required), dies in the middle of its copies") {
    run_peer_death({{"UCX_TLS", "sm,self"}, {"TROUPE_UCX_SHM", "require"}}, 4, "kill-target");
  }
  SECTION("UCX's shared memory without the shared-memory path, dies while the others wait") {
    run_peer_death({{"UCX_TLS", "sm,self"}, {"TROUPE_UCX_SHM", "off"}}, 3, "kill-target-idle");
  }
  SECTION("UCX's shared memory without the shared-memory path, dies during cma reads from it") {
    run_peer_death({{"UCX_TLS", "sm,self"}, {"TROUPE_UCX_SHM", "off"}}, 3, "kill-target");
  }
  SECTION("default transports (shared memory, process watch), dies while the others wait for it") {
    run_peer_death({}, 3, "kill-target-idle");
  }
  SECTION("all_to_all, UCX's shared memory and cma, dies in the middle of it") {
    run_peer_death({{"UCX_TLS", "sm,self"}}, 4, "kill-target", "all_to_all");
  }
  SECTION("all_to_all, TCP loopback, dies while the others wait for it") {
    run_peer_death({{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}}, 3, "kill-target-idle",
                   "all_to_all");
  }
}

namespace {

std::set<std::string> shm_names() {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm"))
    names.insert(entry.path().filename().string());
  return names;
}

// Names in /dev/shm that were not there `before` and are still there a moment later (another
// test's UCX may hold one for a millisecond).
std::string new_shm_names(const std::set<std::string>& before) {
  std::set<std::string> fresh;
  for (const std::string& n : shm_names()) {
    if (before.count(n) == 0) fresh.insert(n);
  }
  if (fresh.empty()) return "";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::set<std::string> now = shm_names();
  std::string left;
  for (const std::string& n : fresh) {
    if (now.count(n) != 0) left += " " + n;
  }
  return left;
}

// Whether `log` holds a list "rank(s) 0, 2, 5" (FileBootstrap's timeout) that includes `rank`.
bool listed(const std::string& log, int rank) {
  for (size_t at = log.find("rank(s) "); at != std::string::npos;
       at = log.find("rank(s) ", at + 1)) {
    std::istringstream list(
        log.substr(at + 8, log.find_first_not_of("0123456789, ", at + 8) - at - 8));
    std::string item;
    while (std::getline(list, item, ',')) {
      if (std::atoi(item.c_str()) == rank && item.find_first_of("0123456789") != std::string::npos)
        return true;
    }
  }
  return false;
}

// Whether a worker's output names world rank `r` as failed: "rank R (host ...", or in a list
// "rank(s) 0, 2" (FileBootstrap's timeout).
bool names(const std::string& log, int r) {
  return log.find("rank " + std::to_string(r) + " (host ") != std::string::npos || listed(log, r);
}

// The survivors of a job whose worker `victim` was SIGKILLed: none died of a signal or an abort;
// each ended with 0 (it had finished), 2 (world creation failed) or 3 (a peer failed); a failure
// names the victim or another rank that failed (during world creation one failure can cascade: a
// rank whose creation failed destroys its world, and a slower peer then cannot connect to it),
// and some survivor names the victim (the first failure can only be its death). No survivor's
// output has a UCX fatal error or backtrace, or troupe's report of one; /dev/shm holds nothing new.
// (UCX's non-fatal error lines may appear: UCX logs one when it attaches a dead peer's segment, or
// reconnects over TCP to a dead peer, before it fails the endpoint.)
void check_survivors(const JobResult& r, int victim, const std::set<std::string>& shm_before) {
  INFO(r.logs);
  REQUIRE_FALSE(r.timed_out);
  CHECK(new_shm_names(shm_before) == "");
  const Exit& dead = r.exits[static_cast<size_t>(victim)];
  if (dead.signal == 0 && dead.code == 0) {
    // The kill came after the victim had finished: then everybody finished.
    for (const Exit& e : r.exits) CHECK(e.code == 0);
    return;
  }
  CHECK(dead.signal == SIGKILL);
  bool victim_named = false, any_failed = false;
  for (size_t q = 0; q < r.exits.size(); ++q) {
    if (static_cast<int>(q) == victim) continue;
    INFO("survivor rank " << q);
    const Exit& e = r.exits[q];
    const std::string& log = r.rank_logs[q];
    CHECK(e.signal == 0);
    CHECK((e.code == 0 || e.code == 2 || e.code == 3));
    if (e.code != 0) {
      any_failed = true;
      victim_named = victim_named || names(log, victim);
      bool named_failed = false;
      for (size_t f = 0; f < r.exits.size(); ++f) {
        if (f != q && r.exits[f].code != 0 && names(log, static_cast<int>(f))) named_failed = true;
      }
      CHECK(named_failed);
    }
    for (const char* noise : {"FATAL", "Caught signal", "backtrace", "UCX failed fatally"})
      CHECK(log.find(noise) == std::string::npos);
  }
  if (any_failed) CHECK(victim_named);
}

// `trials` jobs of `n` workers running every kind of traffic (--check chaos) under `env`, each
// with one worker SIGKILLed at a random moment: half of them within the first 0.15 s (process
// start and world creation), the others during the traffic (2.4 s) or the teardown, or after it.
void run_random_kills(const std::map<std::string, std::string>& env, int n, int trials) {
  std::random_device rd;
  const unsigned seed = rd();
  std::mt19937 rng(seed);
  for (int t = 0; t < trials; ++t) {
    const int victim = std::uniform_int_distribution<int>(0, n - 1)(rng);
    const double at = t % 2 == 0 ? std::uniform_real_distribution<double>(0.0, 0.15)(rng)
                                 : std::uniform_real_distribution<double>(0.15, 2.5)(rng);
    INFO("seed " << seed << ", trial " << t << ": rank " << victim << " killed at " << at << " s");
    const std::set<std::string> before = shm_names();
    JobResult r =
        run_job(worker_bin(), n, {"--check", "chaos", "--seconds", "2.4", "--boot-timeout", "3"},
                env, std::chrono::seconds(40), Kill{victim, at});
    check_survivors(r, victim, before);
  }
}

}  // namespace

TEST_CASE("ucx: SIGKILL at a random moment (default transports): survivors fail cleanly, naming it",
          "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  run_random_kills({}, 3, 6);
}

TEST_CASE(
    "ucx: SIGKILL at a random moment (UCX's shared memory and cma, or TCP with UCX error "
    "handling): survivors fail cleanly",
    "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  // Without troupe's shared-memory path every large message is a UCX rendezvous (a cma read from
  // the peer): a peer that dies during one used to make UCX abort the reader.
  SECTION("UCX shared memory and cma") {
    run_random_kills({{"TROUPE_UCX_SHM", "off"}}, 3, 4);
  }
  SECTION("TCP loopback, UCX error handling") {
    run_random_kills({{"TROUPE_UCX_SAME_HOST", "ucx"}}, 3, 2);
  }
}

TEST_CASE(
    "ucx: a rank killed at each step of world creation: survivors fail naming it, nothing "
    "left in /dev/shm",
    "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  // TROUPE_FAULT_UCX_KILL: the rank SIGKILLs itself at that step (comm/ucx/ucx_detail.hpp).
  int victim = 0;
  for (const char* step : {"worker", "segment", "exchange", "endpoints", "attach", "ready"}) {
    INFO("rank " << victim << " dies at step " << step);
    const std::set<std::string> before = shm_names();
    JobResult r = run_job(worker_bin(), 3,
                          {"--check", "chaos", "--seconds", "1", "--boot-timeout", "2",
                           "--rank-env", std::to_string(victim),
                           "TROUPE_FAULT_UCX_KILL=rank" + std::to_string(victim) + "@" + step},
                          {}, std::chrono::seconds(30));
    check_survivors(r, victim, before);
    CHECK(r.rank_logs[static_cast<size_t>(victim)].find("TROUPE_FAULT_UCX_KILL") !=
          std::string::npos);
    victim = (victim + 1) % 3;
  }
}

TEST_CASE(
    "ucx: a fatal error inside UCX ends the process as troupe's failure (exit 1, no "
    "backtrace)",
    "[comm][ucx]") {
  if (worker_bin() == nullptr)
    TROUPE_SKIP("TROUPE_UCX_WORKER_BIN is not set (the ucx_worker program)");
  JobResult r = run_job(worker_bin(), 2, {"--check", "ucx-fatal"}, {}, std::chrono::seconds(30));
  INFO(r.logs);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exits[0].signal == 0);
  CHECK(r.exits[0].code == 1);
  CHECK(r.rank_logs[0].find("troupe: error: rank 0 (pid ") != std::string::npos);
  CHECK(r.rank_logs[0].find("UCX failed fatally: injected by ucx_worker") != std::string::npos);
  CHECK(r.rank_logs[0].find("==== backtrace") == std::string::npos);
  CHECK(r.exits[1].code == 3);
  CHECK(r.rank_logs[1].find("rank 0 (host ") != std::string::npos);
  // With UCX_HANDLE_ERRORS set, UCX's own handling stays (here: an abort without a backtrace).
  JobResult own = run_job(worker_bin(), 2, {"--check", "ucx-fatal"},
                          {{"UCX_HANDLE_ERRORS", "none"}}, std::chrono::seconds(30));
  INFO(own.logs);
  CHECK(own.exits[0].signal == SIGABRT);
}

TEST_CASE("FileBootstrap gathers every rank's blob in rank order", "[comm][bootstrap]") {
  TempDir dir;
  const int n = 4;
  std::vector<std::vector<std::string>> got(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto boot = FileBootstrap::create(dir.str("store"), r, n);
      if (!boot.is_ok()) {
        errors[static_cast<size_t>(r)] = boot.status().message();
        return;
      }
      // Binary blobs, and keys that are not file names.
      const std::string blob = std::string("rank\0", 5) + std::to_string(r) + std::string(1, '\n');
      auto a = (*boot)->all_gather("ucx/world0/address", blob);
      if (!a.is_ok()) {
        errors[static_cast<size_t>(r)] = a.status().message();
        return;
      }
      got[static_cast<size_t>(r)] = a.value();
      if (troupe::Status s = (*boot)->barrier("end"); !s.is_ok())
        errors[static_cast<size_t>(r)] = s.message();
      auto b = (*boot)->all_gather("../second key", std::to_string(r * r));
      if (!b.is_ok() || b.value()[3] != "9") errors[static_cast<size_t>(r)] = "second key";
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << errors[static_cast<size_t>(r)]);
    CHECK(errors[static_cast<size_t>(r)].empty());
    REQUIRE(got[static_cast<size_t>(r)].size() == static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) {
      CHECK(got[static_cast<size_t>(r)][static_cast<size_t>(q)] ==
            std::string("rank\0", 5) + std::to_string(q) + std::string(1, '\n'));
    }
  }
  // Nothing escaped the directory.
  CHECK_FALSE(std::filesystem::exists(dir.path() / "second key.0"));
}

TEST_CASE("FileBootstrap fails with the missing ranks after its timeout", "[comm][bootstrap]") {
  TempDir dir;
  auto boot = FileBootstrap::create(dir.str("store"), 1, 3,
                                    FileBootstrapOptions{std::chrono::milliseconds(200)});
  REQUIRE(boot.is_ok());
  auto r = (*boot)->all_gather("k", "x");
  REQUIRE_FALSE(r.is_ok());
  INFO(r.status().message());
  CHECK(r.status().message().find("rank(s) 0, 2") != std::string::npos);
  CHECK(r.status().message().find("timed out") != std::string::npos);

  CHECK_FALSE(FileBootstrap::create(dir.str("store"), 3, 3).is_ok());
  CHECK_FALSE(FileBootstrap::create(dir.str("store"), 0, 0).is_ok());
}

TEST_CASE("FileBootstrap refuses ranks started with another world size", "[comm][bootstrap]") {
  TempDir dir;
  auto a =
      FileBootstrap::create(dir.str("store"), 0, 2, FileBootstrapOptions{std::chrono::seconds(5)});
  auto b = FileBootstrap::create(dir.str("store"), 1, 3,
                                 FileBootstrapOptions{std::chrono::milliseconds(300)});
  REQUIRE(a.is_ok());
  REQUIRE(b.is_ok());
  std::thread t([&] { (void)(*b)->all_gather("k", "b"); });
  auto r = (*a)->all_gather("k", "a");
  t.join();
  REQUIRE_FALSE(r.is_ok());
  INFO(r.status().message());
  CHECK(r.status().message().find("world size") != std::string::npos);
}
