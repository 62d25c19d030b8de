// The CAF bootstrap over real loopback sockets: ranks are bootstraps with their own actor systems
// in threads of this process, or bootstrap_peer processes (tests/comm/workers) where a rank must
// crash, hang or take rank 0 down with it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap/caf_bootstrap.hpp"
#include "tests/comm/bootstrap_test_util.hpp"
#include "tests/test_util.hpp"

extern char** environ;

namespace troupe::comm {
namespace {

using Catch::Contains;
using test::create_ok;
using test::LogSink;
using test::options_with;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kToken = "9f2c4e1a7b3d5f6e8a0c2e4f6a8b0d1c";

LaunchEnv make_env(int rank, int world, int port, const std::string& token = kToken) {
  return test::make_env(rank, world, port, token);
}



double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The worker: TROUPE_BOOTSTRAP_PEER_BIN, else beside this test executable (where CMake builds the
// workers), else "".
std::string peer_bin() {
  if (const char* bin = std::getenv("TROUPE_BOOTSTRAP_PEER_BIN")) return bin;
  std::error_code ec;
  const auto here = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const auto beside = here.parent_path() / "bootstrap_peer";
  return std::filesystem::exists(beside, ec) ? beside.string() : "";
}

// A bootstrap_peer process with its own environment; reads its stdout line by line.
class Peer {
 public:
  Peer(const std::vector<std::string>& args, const std::map<std::string, std::string>& vars) {
    const std::string bin = peer_bin();
    REQUIRE(bin != "");
    std::vector<std::string> argv = {bin};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      if (name.rfind("TROUPE_", 0) != 0 || name.find("_BIN") != std::string::npos)
        env.push_back(entry);
    }
    for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
    std::vector<char*> c_argv, c_env;
    for (auto& s : argv) c_argv.push_back(s.data());
    for (auto& s : env) c_env.push_back(s.data());
    c_argv.push_back(nullptr);
    c_env.push_back(nullptr);
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      execve(c_argv[0], c_argv.data(), c_env.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }
  ~Peer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }
  // The next line of output, or "" after `timeout` or at the end.
  std::string read_line(std::chrono::milliseconds timeout = 15s) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return "";
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[512];
      const ssize_t n = read(out_, buf, sizeof buf);
      if (n <= 0) return "";
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
};

std::map<std::string, std::string> peer_env(int rank, int world, int port,
                                            const std::string& token = kToken) {
  return {{"TROUPE_RANK", std::to_string(rank)},
          {"TROUPE_WORLD_SIZE", std::to_string(world)},
          {"TROUPE_MASTER_ADDR", "127.0.0.1"},
          {"TROUPE_MASTER_PORT", std::to_string(port)},
          {"TROUPE_JOB_TOKEN", token}};
}

#define REQUIRE_PEER_BIN()                                                                    \
  do {                                                                                        \
    if (peer_bin().empty())                                                                   \
      TROUPE_SKIP("no bootstrap_peer worker: set TROUPE_BOOTSTRAP_PEER_BIN (ctest sets it)"); \
  } while (0)

TEST_CASE("three ranks gather blobs in rank order and meet at barriers", "[bootstrap]") {
  LogSink sink;
  const auto o = options_with(sink);
  auto r0 = create_ok(make_env(0, 3, 0), o);
  const int port = r0->port();
  REQUIRE(port > 0);
  CHECK(r0->rank() == 0);
  CHECK(r0->world_size() == 3);

  std::string binary;  // UCX worker addresses are binary: every byte value must survive
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));

  std::vector<std::string> errors(3);
  std::vector<std::vector<std::string>> first(3), second(3);
  auto run_rank = [&](int rank, CafBootstrap& b) {
    auto a = b.all_gather("addresses", "blob-" + std::to_string(rank));
    if (!a) {
      errors[rank] = a.status().message();
      return;
    }
    first[rank] = *a;
    if (Status st = b.barrier("after-addresses"); !st) {
      errors[rank] = st.message();
      return;
    }
    auto c = b.all_gather("binary", rank == 1 ? binary : std::string());
    if (!c) {
      errors[rank] = c.status().message();
      return;
    }
    second[rank] = *c;
  };
  std::vector<std::thread> threads;
  for (int rank = 1; rank < 3; ++rank)
    threads.emplace_back([&, rank] {
      auto b = create_caf_bootstrap(make_env(rank, 3, port), o);
      if (!b) {
        errors[rank] = b.status().message();
        return;
      }
      run_rank(rank, **b);
    });
  run_rank(0, *r0);
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    CHECK(errors[rank] == "");
    CHECK(first[rank] == std::vector<std::string>{"blob-0", "blob-1", "blob-2"});
    CHECK(second[rank] == std::vector<std::string>{"", binary, ""});
  }
  // A key is used once.
  auto again = r0->all_gather("addresses", "x");
  REQUIRE_FALSE(again);
  CHECK_THAT(again.status().message(), Contains("already used"));
  CHECK(r0->job_failure() == "");
}

TEST_CASE("a single rank needs no network", "[bootstrap]") {
  LogSink sink;
  auto r0 =
      create_ok(make_env(0, 1, 1), options_with(sink));  // port 1 would need root: never bound
  auto all = r0->all_gather("k", "only");
  REQUIRE(all);
  CHECK(*all == std::vector<std::string>{"only"});
  CHECK(r0->barrier("b"));
}

TEST_CASE("a bootstrap on the caller's actor system", "[bootstrap]") {
  LogSink sink;
  const auto o = options_with(sink);
  caf::actor_system_config cfg;
  configure_for_bootstrap(cfg, o);
  caf::actor_system sys{cfg};
  auto r0 = create_caf_bootstrap(make_env(0, 2, 0), sys, o);
  REQUIRE(r0);
  const int port = (*r0)->port();
  std::vector<std::string> got1;
  std::thread t([&] {
    auto r1 = create_caf_bootstrap(make_env(1, 2, port), sys, o);  // the same system
    if (!r1) return;
    auto a = (*r1)->all_gather("k", "b");
    if (a) got1 = *a;
  });
  auto a0 = (*r0)->all_gather("k", "a");
  t.join();
  REQUIRE(a0);
  CHECK(*a0 == std::vector<std::string>{"a", "b"});
  CHECK(got1 == std::vector<std::string>{"a", "b"});
  r0->reset();  // before the system goes
}

TEST_CASE("a peer with a wrong token is refused and logged, and cannot join or send requests",
          "[bootstrap]") {
  LogSink sink;
  const auto o = options_with(sink);
  auto r0 = create_ok(make_env(0, 2, 0), o);
  const int port = r0->port();

  auto bad = create_caf_bootstrap(make_env(1, 2, port, "0000000000000000wrongwrongwrong00"), o);
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.status().message(), Contains("wrong job token"));
  CHECK_THAT(bad.status().message(), Contains("TROUPE_JOB_TOKEN"));
  const std::string logged = sink.wait_for({"refused", "wrong job token"});
  CHECK_THAT(logged, Contains("claiming rank 1 of 2"));
  CHECK_THAT(logged, Contains("127.0.0.1"));  // the peer's address, from the transport
  CHECK_THAT(logged, !Contains(kToken));

  SECTION("a peer that skips the join cannot send requests") {
    caf::actor_system_config cfg;
    configure_for_bootstrap(cfg);
    caf::actor_system sys{cfg};
    // A peer holding the token, straight through a middleman actor of the secure transport, as a
    // peer that knows the protocol would: no interface check, no join.
    SecureTransportOptions t;
    t.token = kToken;
    t.identity = tls::make_identity(1, 2, "test", 1);
    auto transport = SecureTransport::create(t);
    REQUIRE(transport);
    auto middleman = (*transport)->spawn_middleman(sys);
    {
      caf::scoped_actor self{sys};
      caf::strong_actor_ptr rv;
      self->request(middleman, 5s, caf::connect_atom::value, std::string("127.0.0.1"),
                    static_cast<uint16_t>(port))
          .receive([&](const caf::node_id&, caf::strong_actor_ptr& p,
                       const std::set<std::string>&) { rv = p; },
                   [&](caf::error& e) { FAIL("connect: " << sys.render(e)); });
      REQUIRE(rv);
      std::string error;
      self->request(caf::actor_cast<caf::actor>(rv), 5s,
                    caf::atom_constant<caf::atom("bs_gather")>::value, std::string("gather/k"),
                    std::string("x"))
          .receive([&](std::vector<std::string>&) { error = "answered"; },
                   [&](caf::error& e) { error = caf::to_string(e.context()); });
      CHECK_THAT(error, Contains("has not joined"));
      CHECK(sink.wait_for({"refused a request for 'gather/k'"}) != "");
    }
    caf::scoped_actor self{sys, true};
    self->send_exit(middleman, caf::exit_reason::kill);
    self->wait_for(middleman);
  }
  SECTION("a wrong world size and a duplicate rank are refused too") {
    auto wrong_world = create_caf_bootstrap(make_env(1, 3, port), o);
    REQUIRE_FALSE(wrong_world);
    CHECK_THAT(wrong_world.status().message(), Contains("world of 3 ranks but rank 0 for 2"));
    auto dup = create_caf_bootstrap(make_env(0, 2, port), [&] {
      auto o2 = o;
      o2.bind_addr = "127.0.0.1";
      return o2;
    }());
    REQUIRE_FALSE(dup);  // a second rank 0 cannot even listen on the port
    CHECK_THAT(dup.status().message(), Contains(std::to_string(port)));
    CHECK_THAT(dup.status().message(), Contains("--master-port"));
  }
  // The job itself is unharmed: the right rank 1 joins and the gather completes.
  std::vector<std::string> got1;
  std::thread t([&] {
    auto r1 = create_caf_bootstrap(make_env(1, 2, port), o);
    if (!r1) return;
    auto a = (*r1)->all_gather("k2", "one");
    if (a) got1 = *a;
    // A second join of rank 1 while it is a member: refused as a duplicate.
    auto dup = create_caf_bootstrap(make_env(1, 2, port), o);
    if (!dup && dup.status().message().find("already joined") != std::string::npos)
      got1.push_back("dup refused");
  });
  auto a0 = r0->all_gather("k2", "zero");
  t.join();
  REQUIRE(a0);
  CHECK(*a0 == std::vector<std::string>{"zero", "one"});
  CHECK(got1 == std::vector<std::string>{"zero", "one", "dup refused"});
}

TEST_CASE("a rank that crashes fails the others' pending all_gather, naming it", "[bootstrap]") {
  REQUIRE_PEER_BIN();
  LogSink sink;
  auto o = options_with(sink);
  std::atomic<int> failure_callbacks{0};
  o.on_job_failed = [&](const std::string&) { ++failure_callbacks; };
  auto r0 = create_ok(make_env(0, 3, 0), o);
  const int port = r0->port();
  auto r1 = create_ok(make_env(1, 3, port), o);  // joined before rank 2 crashes
  std::string error1;
  std::string failure1;
  std::thread t([&] {
    auto a = r1->all_gather("x", "1");
    error1 = a ? "completed" : a.status().message();
    failure1 = r1->job_failure();
  });
  Peer crash({"join-exit"}, peer_env(2, 3, port));
  const auto start = Clock::now();
  CHECK(crash.read_line() == "joined");
  auto a0 = r0->all_gather("x", "0");
  t.join();
  REQUIRE_FALSE(a0);
  CHECK_THAT(a0.status().message(), Contains("rank 2"));
  CHECK_THAT(a0.status().message(), Contains("disconnected"));
  CHECK_THAT(error1, Contains("rank 2"));
  CHECK_THAT(r0->job_failure(), Contains("rank 2"));
  CHECK_THAT(failure1, Contains("rank 2"));
  CHECK(failure_callbacks >= 2);
  CHECK(seconds_since(start) < 5);
  // Later requests fail at once.
  auto later = r0->barrier("later");
  REQUIRE_FALSE(later);
  CHECK_THAT(later.message(), Contains("rank 2"));
}

TEST_CASE("a rank that leaves early fails gathers it never joined, naming it", "[bootstrap]") {
  LogSink sink;
  const auto o = options_with(sink);
  auto r0 = create_ok(make_env(0, 3, 0), o);
  const int port = r0->port();
  std::string error1;
  std::thread t([&] {
    auto r1 = create_caf_bootstrap(make_env(1, 3, port), o);
    if (!r1) return;
    auto a = (*r1)->all_gather("x", "1");
    error1 = a ? "completed" : a.status().message();
  });
  {
    auto r2 = create_ok(make_env(2, 3, port), o);
    std::this_thread::sleep_for(200ms);
  }  // leaves the job
  auto a0 = r0->all_gather("x", "0");
  t.join();
  REQUIRE_FALSE(a0);
  CHECK_THAT(a0.status().message(), Contains("rank 2"));
  CHECK_THAT(a0.status().message(), Contains("left the job"));
  CHECK_THAT(error1, Contains("rank 2"));
  CHECK(r0->job_failure() == "");  // leaving is not a failure
}

TEST_CASE("losing rank 0 fails the other ranks' calls", "[bootstrap]") {
  REQUIRE_PEER_BIN();
  Peer rank0({"rank0-exit", "1.5"}, [] {
    auto vars = peer_env(0, 2, 1);
    vars["BOOTSTRAP_PEER_EPHEMERAL_PORT"] = "1";
    return vars;
  }());
  const std::string line = rank0.read_line();
  REQUIRE(line.rfind("port ", 0) == 0);
  const int port = std::stoi(line.substr(5));
  LogSink sink;
  auto r1 = create_ok(make_env(1, 2, port), options_with(sink));
  const auto start = Clock::now();
  auto a = r1->all_gather("x", "1");
  REQUIRE_FALSE(a);
  CHECK_THAT(a.status().message(), Contains("lost the rendezvous"));
  CHECK_THAT(r1->job_failure(), Contains("lost the rendezvous"));
  CHECK(seconds_since(start) < 5);
}

TEST_CASE("a hung rank is found by the heartbeat", "[bootstrap]") {
  REQUIRE_PEER_BIN();
  LogSink sink;
  auto o = options_with(sink);
  o.heartbeat_interval = 100ms;
  o.connection_timeout = 500ms;
  auto r0 = create_ok(make_env(0, 2, 0), o);
  Peer hung({"join-stop"}, [&] {
    auto vars = peer_env(1, 2, r0->port());
    vars["BOOTSTRAP_PEER_HEARTBEAT_MS"] = "100";
    return vars;
  }());
  REQUIRE(hung.read_line() == "joined");
  const auto start = Clock::now();
  auto a = r0->all_gather("x", "0");
  REQUIRE_FALSE(a);
  CHECK_THAT(a.status().message(), Contains("rank 1"));
  CHECK(seconds_since(start) < 10);
}

TEST_CASE("a gather with a missing rank times out, naming it", "[bootstrap]") {
  LogSink sink;
  auto o = options_with(sink);
  o.collective_timeout = 500ms;
  auto r0 = create_ok(make_env(0, 2, 0), o);
  auto a = r0->all_gather("lonely", "0");
  REQUIRE_FALSE(a);
  CHECK_THAT(a.status().message(), Contains("timed out"));
  CHECK_THAT(a.status().message(), Contains("rank(s) 1 did not take part"));
  CHECK_THAT(a.status().message(), Contains("never joined"));
}

TEST_CASE("rank 0 reports the ranks that have not joined, then fails the job at the join timeout", "[bootstrap]") {
  LogSink sink;
  auto o = options_with(sink);
  o.wait_report_interval = 200ms;
  o.join_timeout = 1500ms;
  // One node of five ranks under troupe launch; ranks 0 and 3 join, 1, 2 and 4 never. (Several
  // nodes need a master address other than loopback: tests/cli/launch_rendezvous.sh.)
  auto env_of = [](int rank, int port) {
    auto e = make_env(rank, 5, port);
    e.source = "troupe launch";
    return e;
  };
  auto r0 = create_ok(env_of(0, 0), o);
  auto r3 = create_ok(env_of(3, r0->port()), o);
  const std::string report = sink.wait_for({"waiting for 3 of 5 ranks to join"});
  CHECK_THAT(report, Contains("giving up after 1.5 s): ranks 1, 2, 4 of node 0 (rank 0's own node: they have not "
                              "started, or died before joining)"));
  auto a = r0->all_gather("hosts", "0");
  REQUIRE_FALSE(a);
  CHECK_THAT(a.status().message(), Contains("3 of 5 ranks never joined the rendezvous at 127.0.0.1:" +
                                            std::to_string(r0->port()) + " within 1.5 s: ranks 1, 2, 4 of node 0"));
  CHECK_THAT(a.status().message(), Contains("--rdzv-conf join_timeout"));
  for (int i = 0; i < 250 && r3->job_failure().empty(); ++i) std::this_thread::sleep_for(20ms);  // the notice travels
  CHECK_THAT(r3->job_failure(), Contains("ranks 1, 2, 4 of node 0"));
}

TEST_CASE("a rank whose rendezvous id is not rank 0's is refused, naming both", "[bootstrap]") {
  LogSink sink;
  auto o = options_with(sink);
  auto e0 = make_env(0, 2, 0);
  e0.rdzv_id = "jobA";
  auto r0 = create_ok(e0, o);
  auto e1 = make_env(1, 2, r0->port());
  for (const std::string& other : {std::string("jobB"), std::string()}) {
    e1.rdzv_id = other;
    auto b = create_caf_bootstrap(e1, o);
    REQUIRE_FALSE(b);
    const std::string shown = other.empty() ? "(none)" : "'" + other + "'";
    CHECK_THAT(b.status().message(),
               Contains("rank 1 was started with --rdzv-id " + shown + " but rank 0 with --rdzv-id 'jobA'"));
    CHECK(sink.wait_for({"refused a peer claiming rank 1 of 2", "its --rdzv-id " + shown + " is not rank 0's 'jobA'"}) !=
          "");
  }
  e1.rdzv_id = "jobA";  // the right id joins, and the job works
  std::thread t([&] {
    auto r1 = create_caf_bootstrap(e1, o);
    if (r1) (void)(*r1)->all_gather("k", "1");
  });
  auto a = r0->all_gather("k", "0");
  t.join();
  REQUIRE(a);
  CHECK(*a == std::vector<std::string>{"0", "1"});
}

TEST_CASE("no rendezvous: the connect gives up after its timeout, naming the address",
          "[bootstrap]") {
  LogSink sink;
  auto o = options_with(sink);
  o.connect_timeout = 700ms;
  int port = 0;
  {  // a port nobody listens on: one rank 0 had and closed
    auto r0 = create_ok(make_env(0, 2, 0), o);
    port = r0->port();
  }
  const auto start = Clock::now();
  auto b = create_caf_bootstrap(make_env(1, 2, port), o);
  REQUIRE_FALSE(b);
  CHECK_THAT(b.status().message(), Contains("cannot reach the rendezvous"));
  CHECK_THAT(b.status().message(), Contains("127.0.0.1:" + std::to_string(port)));
  CHECK(seconds_since(start) >= 0.6);  // it retried for the whole connect timeout
  CHECK(seconds_since(start) < 5);
}

// A restart races the failed attempt's end: the restarted rank 1 (attempt 1) reaches the port while
// the failed attempt's rank 0 (attempt 0) still holds it. It must not join that one (a job that has
// failed, or is about to), but reach the port again until its own rank 0 answers.
TEST_CASE("a restarted rank that meets the failed attempt's rank 0 waits for its successor", "[bootstrap]") {
  REQUIRE_PEER_BIN();
  // Attempt 0: rank 0, and a rank 2 that dies at once: its job has failed.
  Peer old_rank0({"rank0-exit", "2.5"}, [] {
    auto vars = peer_env(0, 3, 1);
    vars["BOOTSTRAP_PEER_EPHEMERAL_PORT"] = "1";
    vars["TROUPE_RESTART_COUNT"] = "0";
    return vars;
  }());
  const std::string line = old_rank0.read_line();
  REQUIRE(line.rfind("port ", 0) == 0);
  const int port = std::stoi(line.substr(5));
  Peer old_rank2({"join-exit"}, [&] {
    auto vars = peer_env(2, 3, port);
    vars["TROUPE_RESTART_COUNT"] = "0";
    return vars;
  }());
  REQUIRE(old_rank2.read_line() == "joined");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its end reaches rank 0
  ::setenv("TROUPE_RESTART_COUNT", "1", 1);
  LogSink sink;
  const auto start = Clock::now();
  Result<std::unique_ptr<CafBootstrap>> r1 = Status::error("not run");
  std::thread joiner([&] { r1 = create_caf_bootstrap(make_env(1, 2, port), options_with(sink)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // the old rank 0 is gone at 2.5 s
  auto r0 = create_caf_bootstrap(make_env(0, 2, port), options_with(sink));
  joiner.join();
  ::unsetenv("TROUPE_RESTART_COUNT");
  REQUIRE(r0);
  INFO((r1 ? std::string("joined") : r1.status().message()));
  REQUIRE(r1);
  CHECK(seconds_since(start) > 2);
  std::vector<std::string> got0, got1;
  std::thread g([&] {
    auto a = r1.value()->all_gather("after", "one");
    if (a) got1 = *a;
  });
  auto b = r0.value()->all_gather("after", "zero");
  g.join();
  REQUIRE(b);
  CHECK(*b == std::vector<std::string>{"zero", "one"});
  CHECK(got1 == *b);
}

// Every rank's all_gather of `key` at once (rank r contributes blobs[r]), each from its own thread:
// what each got, empty where its gather failed.
std::vector<std::vector<std::string>> gather_all(const std::vector<CafBootstrap*>& ranks, const std::string& key,
                                                 const std::vector<std::string>& blobs) {
  std::vector<std::vector<std::string>> got(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r)
    threads.emplace_back([&, r] {
      auto a = ranks[r]->all_gather(key, blobs[r]);
      if (a) got[r] = *a;
    });
  for (auto& t : threads) t.join();
  return got;
}

// The options of a process under in-job recovery joining as `attempt` (its generation, or
// kAnyGeneration for a replacement).
CafBootstrapOptions in_job_options(LogSink& sink, int32_t attempt) {
  CafBootstrapOptions o = options_with(sink);
  o.in_job_recovery = true;
  o.attempt = attempt;
  return o;
}

// In-job recovery (troupe launch --in-job-recovery): rank 2 dies; the survivors (ranks 0 and 1)
// stay and rejoin as generation 1, and a replacement rank 2 joins whichever generation forms. The
// survivor rank 1 and the replacement both reach the port while the failed generation's rank 0
// still holds it; neither may join that one (nor fail), and all three meet in generation 1 once
// rank 0 has rejoined.
TEST_CASE("in-job recovery: the survivors and a replacement form the next generation", "[bootstrap]") {
  REQUIRE_PEER_BIN();
  LogSink sink;
  auto in_job = [&](int32_t attempt) { return in_job_options(sink, attempt); };
  auto r0 = create_caf_bootstrap(make_env(0, 3, 0), in_job(0));
  REQUIRE(r0);
  const int port = r0.value()->port();
  Result<std::unique_ptr<CafBootstrap>> r1 = Status::error("not run");
  std::thread first([&] { r1 = create_caf_bootstrap(make_env(1, 3, port), in_job(0)); });
  Peer dying({"join-exit"}, peer_env(2, 3, port));
  REQUIRE(dying.read_line() == "joined");
  first.join();
  REQUIRE(r1);
  const auto failed_by = Clock::now() + 10s;
  while ((r0.value()->job_failure().empty() || r1.value()->job_failure().empty()) && Clock::now() < failed_by)
    std::this_thread::sleep_for(20ms);
  REQUIRE_FALSE(r0.value()->job_failure().empty());
  REQUIRE_FALSE(r1.value()->job_failure().empty());

  // Generation 1: the survivor rank 1 lets go of its old rendezvous and rejoins; the replacement of
  // rank 2 starts; both meet the failed generation's rank 0 first.
  const auto start = Clock::now();
  r1 = Status::error("not run");
  Result<std::unique_ptr<CafBootstrap>> again1 = Status::error("not run"), replacement = Status::error("not run");
  std::thread survivor([&] { again1 = create_caf_bootstrap(make_env(1, 3, port), in_job(1)); });
  std::thread fresh([&] { replacement = create_caf_bootstrap(make_env(2, 3, port), in_job(kAnyGeneration)); });
  std::this_thread::sleep_for(1500ms);
  r0 = Status::error("rejoining");  // the failed generation's rendezvous closes
  auto again0 = create_caf_bootstrap(make_env(0, 3, port), in_job(1));
  survivor.join();
  fresh.join();
  REQUIRE(again0);
  INFO((again1 ? std::string("joined") : again1.status().message()));
  REQUIRE(again1);
  INFO((replacement ? std::string("joined") : replacement.status().message()));
  REQUIRE(replacement);
  CHECK(seconds_since(start) > 1.4);
  const auto got = gather_all({again0.value().get(), again1.value().get(), replacement.value().get()}, "generation 1",
                              {"zero", "one", "two"});
  CHECK(got[0] == std::vector<std::string>{"zero", "one", "two"});
  CHECK(got[1] == got[0]);
  CHECK(got[2] == got[0]);
}

// A generation's rank 0 that has not noticed the failure yet (healthy) tells a survivor of the next
// generation to try again rather than letting it join, and takes it once it rejoins itself.
TEST_CASE("in-job recovery: a rank 0 of an older generation sends a later one's joiner back", "[bootstrap]") {
  LogSink sink;
  auto in_job = [&](int32_t attempt) { return in_job_options(sink, attempt); };
  auto old0 = create_caf_bootstrap(make_env(0, 2, 0), in_job(3));
  REQUIRE(old0);
  const int port = old0.value()->port();
  Result<std::unique_ptr<CafBootstrap>> r1 = Status::error("not run");
  std::thread joiner([&] { r1 = create_caf_bootstrap(make_env(1, 2, port), in_job(4)); });
  std::this_thread::sleep_for(1000ms);
  CHECK(old0.value()->job_failure().empty());  // healthy, and the joiner was not taken
  old0 = Status::error("rejoining");
  auto new0 = create_caf_bootstrap(make_env(0, 2, port), in_job(4));
  joiner.join();
  REQUIRE(new0);
  INFO((r1 ? std::string("joined") : r1.status().message()));
  REQUIRE(r1);
  std::thread g([&] { (void)r1.value()->barrier("met"); });
  CHECK(new0.value()->barrier("met"));
  g.join();
}


// Warm spares (troupe launch --in-job-recovery --spares): a spare process waits at the rendezvous
// while the job runs; rank 2 dies, rank 0 finds it lost (not the survivor rank 1, which gives the
// failed generation up in order), and at the next generation the spare takes rank 2's place at once
// and gathers as rank 2. Rank 2's own process coming back (cut off, then reconnected) is told its
// place was taken; a second spare, for which there is no place, waits until rank 0 says the job
// finished.
TEST_CASE("warm spares: a waiting spare takes a lost rank's place at the next generation", "[bootstrap]") {
  REQUIRE_PEER_BIN();
  LogSink sink;
  auto in_job = [&](int32_t attempt) { return in_job_options(sink, attempt); };
  auto spare_env = [](int port) {
    LaunchEnv e = make_env(0, 3, port);
    e.rank = -1;
    e.spare = true;
    return e;
  };
  auto r0 = create_caf_bootstrap(make_env(0, 3, 0), in_job(0));
  REQUIRE(r0);
  const int port = r0.value()->port();
  Result<std::unique_ptr<CafBootstrap>> spare = Status::error("not run");
  std::thread waiting([&] { spare = create_caf_bootstrap(spare_env(port), in_job(kAnyGeneration)); });
  std::this_thread::sleep_for(500ms);  // the spare waits in generation 0, which has no place for it
  Result<std::unique_ptr<CafBootstrap>> r1 = Status::error("not run");
  std::thread first([&] { r1 = create_caf_bootstrap(make_env(1, 3, port), in_job(0)); });
  Peer dying({"join-exit"}, peer_env(2, 3, port));
  REQUIRE(dying.read_line() == "joined");
  first.join();
  REQUIRE(r1);
  const auto failed_by = Clock::now() + 10s;
  while ((r0.value()->job_failure().empty() || r1.value()->job_failure().empty()) && Clock::now() < failed_by)
    std::this_thread::sleep_for(20ms);
  REQUIRE_FALSE(r1.value()->job_failure().empty());
  r1 = Status::error("rejoining");  // the survivor gives the failed generation up first
  std::this_thread::sleep_for(300ms);
  CHECK(r0.value()->lost_ranks() == std::vector<int>{2});

  // Generation 1: rank 0 opens rank 2's place; the spare, sent on by the failed rendezvous, takes it.
  CafBootstrapOptions next0 = in_job(1);
  next0.open_places = r0.value()->lost_ranks();
  r0 = Status::error("rejoining");
  auto again0 = create_caf_bootstrap(make_env(0, 3, port), next0);
  REQUIRE(again0);
  auto again1 = create_caf_bootstrap(make_env(1, 3, port), in_job(1));
  REQUIRE(again1);
  waiting.join();
  INFO((spare ? std::string("joined") : spare.status().message()));
  REQUIRE(spare);
  CHECK(spare.value()->rank() == 2);
  CHECK_FALSE(sink.wait_for({"a spare (host", "takes the place of rank 2"}).empty());
  const auto got = gather_all({again0.value().get(), again1.value().get(), spare.value().get()}, "generation 1",
                              {"zero", "one", "two"});
  CHECK(got[0] == std::vector<std::string>{"zero", "one", "two"});
  CHECK(got[2] == got[0]);

  // Rank 2's own process comes back: its place is taken.
  auto back = create_caf_bootstrap(make_env(2, 3, port), in_job(1));
  REQUIRE_FALSE(back);
  CHECK(place_taken_by_spare(back.status()));
  CHECK_THAT(back.status().message(), Contains("rank 2's place was taken by a spare"));

  // A second spare waits (no place is open) until the job ends.
  Result<std::unique_ptr<CafBootstrap>> unneeded = Status::error("not run");
  const auto asked = Clock::now();
  std::thread second([&] { unneeded = create_caf_bootstrap(spare_env(port), in_job(kAnyGeneration)); });
  std::this_thread::sleep_for(700ms);
  again0.value()->end_job("finished");
  second.join();
  CHECK(seconds_since(asked) > 0.6);
  REQUIRE_FALSE(unneeded);
  CHECK(job_ended_for_spare(unneeded.status()));
  CHECK_THAT(unneeded.status().message(), Contains("the job has ended without needing this spare: finished"));
  CHECK(again0.value()->lost_ranks().empty());  // nobody was lost in generation 1
}

// The spare grace: at the job's first generation a spare never takes a place (ranks start at any
// pace); at a later one, a place no process took within the grace opens to a waiting spare even
// when rank 0 knows of no loss (a replacement rank 0, say, whose node lost another rank with it).
TEST_CASE("warm spares: after the grace a later generation's free place goes to a spare", "[bootstrap]") {
  LogSink sink;
  auto in_job = [&](int32_t attempt) {
    CafBootstrapOptions o = in_job_options(sink, attempt);
    o.spare_grace = 300ms;
    return o;
  };
  auto r0 = create_caf_bootstrap(make_env(0, 3, 0), in_job(0));
  REQUIRE(r0);
  const int port = r0.value()->port();
  auto r1 = create_caf_bootstrap(make_env(1, 3, port), in_job(0));
  REQUIRE(r1);
  std::atomic<bool> done{false};
  Result<std::unique_ptr<CafBootstrap>> spare = Status::error("not run");
  std::thread waiting([&] {
    LaunchEnv e = make_env(0, 3, port);
    e.rank = -1;
    e.spare = true;
    spare = create_caf_bootstrap(e, in_job(kAnyGeneration));
    done = true;
  });
  std::this_thread::sleep_for(1000ms);
  CHECK_FALSE(done.load());  // generation 0: rank 2's place stays its own
  // Generation 1 under a fresh rank 0 (no open places); rank 2 never comes.
  r1 = Status::error("rejoining");
  r0 = Status::error("rejoining");
  const auto start = Clock::now();
  auto again0 = create_caf_bootstrap(make_env(0, 3, port), in_job(kAnyGeneration));
  REQUIRE(again0);
  auto again1 = create_caf_bootstrap(make_env(1, 3, port), in_job(1));
  REQUIRE(again1);
  waiting.join();
  INFO((spare ? std::string("joined") : spare.status().message()));
  REQUIRE(spare);
  CHECK(spare.value()->rank() == 2);
  CHECK(seconds_since(start) >= 0.25);
  const auto met = gather_all({again0.value().get(), again1.value().get(), spare.value().get()}, "met", {"0", "1", "2"});
  CHECK(met[0] == std::vector<std::string>{"0", "1", "2"});
  CHECK(met[2] == met[0]);
}

// A spare outside in-job recovery is refused before it reaches anything.
TEST_CASE("warm spares: a spare needs in-job recovery", "[bootstrap]") {
  LogSink sink;
  LaunchEnv e = make_env(0, 2, 1);
  e.rank = -1;
  e.spare = true;
  auto b = create_caf_bootstrap(e, options_with(sink));
  REQUIRE_FALSE(b);
  CHECK_THAT(b.status().message(), Contains("--in-job-recovery --spares K"));
}


// The rendezvous moves (comm/bootstrap/rendezvous_place.hpp) -------------------------------------

// Two consecutive TCP ports free on loopback now: the rendezvous's and its standby's.
int free_port_pair() {
  for (int tries = 0; tries < 100; ++tries) {
    const int a = ::socket(AF_INET, SOCK_STREAM, 0), b = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    int port = -1;
    if (::bind(a, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        ::getsockname(a, reinterpret_cast<sockaddr*>(&addr), &len) == 0 && ntohs(addr.sin_port) < 65000) {
      port = ntohs(addr.sin_port);
      addr.sin_port = htons(static_cast<uint16_t>(port + 1));
      if (::bind(b, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) port = -1;
    }
    ::close(a);
    ::close(b);
    if (port > 0) return port;
  }
  FAIL("no two consecutive free ports on loopback");
  return -1;
}

LaunchEnv spare_env(int port) {
  LaunchEnv e = make_env(0, 3, port);
  e.rank = -1;
  e.spare = true;
  return e;
}

template <class F>
bool eventually(F ready, std::chrono::milliseconds within = 10s) {
  const auto until = Clock::now() + within;
  while (!ready()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// Rank 0's process (its rendezvous with it) is lost: once every rank had joined, the rendezvous had
// named its standby -- rank 1, the lowest other rank (one host here), at the port after rank 0's --
// and told every member and the waiting spare; rank 1 hosts the next generation there, rank 2 looks
// there first, and the spare, sent on by the loss, finds it by what it learned and takes rank 0's
// place at once (the lost host's rank opens without the spare grace). The new rendezvous names the
// next standby: rank 0, now the spare, at the first port. The node's hint file holds what it said.
TEST_CASE("the rendezvous moves: rank 0 lost, its standby hosts the next generation", "[bootstrap]") {
  REQUIRE_PEER_BIN();
  LogSink sink;
  auto in_job = [&](int32_t attempt) { return in_job_options(sink, attempt); };
  const int port = free_port_pair();
  troupe::test::TempDir tmp;
  const std::string hint_path = tmp.str("hint");
  Peer rank0({"rank0-exit", "3"}, [&] {
    auto vars = peer_env(0, 3, port);
    vars["BOOTSTRAP_PEER_IN_JOB"] = "1";
    return vars;
  }());
  REQUIRE(rank0.read_line() == "port " + std::to_string(port));
  Result<std::unique_ptr<CafBootstrap>> spare = Status::error("not run");
  std::thread waiting([&] { spare = create_caf_bootstrap(spare_env(port), in_job(kAnyGeneration)); });
  CafBootstrapOptions o1 = in_job(0);
  o1.on_standby = [&](const RendezvousPlace& at, const RendezvousPlace& standby) {
    (void)write_hint(hint_path, RendezvousHint{at, standby});
  };
  auto r1 = create_ok(make_env(1, 3, port), o1);
  auto r2 = create_ok(make_env(2, 3, port), in_job(0));
  REQUIRE(eventually([&] { return r1->standby() && r2->standby(); }));
  const RendezvousPlace first{"127.0.0.1", port, 0}, standby{"127.0.0.1", port + 1, 1};
  CHECK(*r1->standby() == standby);
  CHECK(*r2->standby() == standby);
  CHECK(r1->place() == first);
  CHECK_FALSE(r1->hosts_rendezvous());
  auto hint = read_hint(hint_path);  // written before standby() answers
  REQUIRE(hint);
  REQUIRE(hint.value());
  CHECK(hint.value()->at == first);
  CHECK(hint.value()->standby == standby);

  REQUIRE(eventually([&] { return !r1->job_failure().empty() && !r2->job_failure().empty(); }));
  CHECK(r1->rendezvous_lost());
  CHECK(r2->rendezvous_lost());
  r1.reset();
  r2.reset();
  // Generation 1, as JobLink (api/train.cpp) places it.
  CafBootstrapOptions n1 = in_job(1), n2 = in_job(1);
  for (auto* o : {&n1, &n2}) {
    o->rendezvous_at = standby;
    o->rendezvous_moved = true;
    o->places = {first};
  }
  n1.open_places = {0};
  const auto start = Clock::now();
  auto again1 = create_ok(make_env(1, 3, port), n1);
  CHECK(again1->hosts_rendezvous());
  CHECK(again1->port() == port + 1);
  auto again2 = create_ok(make_env(2, 3, port), n2);
  CHECK(again2->place() == standby);
  waiting.join();
  INFO((spare ? std::string("joined") : spare.status().message()));
  REQUIRE(spare);
  CHECK(spare.value()->rank() == 0);
  CHECK(seconds_since(start) < 4);  // not after the spare grace (5 s)
  const auto got = gather_all({spare.value().get(), again1.get(), again2.get()}, "generation 1", {"zero", "one", "two"});
  CHECK(got[0] == std::vector<std::string>{"zero", "one", "two"});
  CHECK(got[1] == got[0]);
  CHECK(got[2] == got[0]);
  REQUIRE(eventually([&] { return again2->standby().has_value(); }));
  CHECK(*again2->standby() == RendezvousPlace{"127.0.0.1", port, 0});
  CHECK_FALSE(
      sink.wait_for({"should this rendezvous be lost, rank 0", "hosts the next at 127.0.0.1:" + std::to_string(port)})
          .empty());
}

// A generation failed with the rendezvous announcing it (rank 2 died), then the rendezvous's own
// process went too before hosting the next: its standby, rank 1, looks for it for failover_after,
// then hosts it at its place; a replacement of rank 2 and a spare started later, knowing the places
// from the node's hint, find it there (rank 0's place opening to the spare after the grace).
TEST_CASE("the rendezvous moves: a standby hosts when the rendezvous's host goes silent", "[bootstrap]") {
  REQUIRE_PEER_BIN();
  LogSink sink;
  auto in_job = [&](int32_t attempt) {
    CafBootstrapOptions o = in_job_options(sink, attempt);
    o.failover_after = 1000ms;
    o.spare_grace = 300ms;
    return o;
  };
  const int port = free_port_pair();
  auto r0 = create_ok(make_env(0, 3, port), in_job(0));
  auto r1 = create_ok(make_env(1, 3, port), in_job(0));
  Peer dying({"join-exit"}, peer_env(2, 3, port));
  REQUIRE(dying.read_line() == "joined");
  REQUIRE(eventually([&] { return !r1->job_failure().empty(); }));
  const RendezvousPlace first{"127.0.0.1", port, 0}, standby{"127.0.0.1", port + 1, 1};
  REQUIRE(r1->standby());
  CHECK(*r1->standby() == standby);
  CHECK_FALSE(r1->rendezvous_lost());  // announced: rank 2 was lost, not the rendezvous
  r1.reset();
  r0.reset();  // and rank 0 never comes back
  CafBootstrapOptions n1 = in_job(1);
  n1.rendezvous_at = first;
  n1.places = {standby};
  n1.standby_here = standby;
  Result<std::unique_ptr<CafBootstrap>> replacement = Status::error("not run"), spare = Status::error("not run");
  auto from_hint = [&](int32_t attempt) {
    CafBootstrapOptions o = in_job(attempt);
    o.rendezvous_at = first;
    o.places = {standby};
    return o;
  };
  std::thread fresh([&] { replacement = create_caf_bootstrap(make_env(2, 3, port), from_hint(kAnyGeneration)); });
  std::thread waiting([&] { spare = create_caf_bootstrap(spare_env(port), from_hint(kAnyGeneration)); });
  const auto start = Clock::now();
  auto again1 = create_ok(make_env(1, 3, port), n1);
  CHECK(seconds_since(start) >= 0.9);
  CHECK(again1->hosts_rendezvous());
  CHECK(again1->place() == standby);
  fresh.join();
  waiting.join();
  INFO((replacement ? std::string("joined") : replacement.status().message()));
  REQUIRE(replacement);
  INFO((spare ? std::string("joined") : spare.status().message()));
  REQUIRE(spare);
  CHECK(replacement.value()->rank() == 2);
  CHECK(spare.value()->rank() == 0);
  const auto got = gather_all({spare.value().get(), again1.get(), replacement.value().get()}, "met", {"0", "1", "2"});
  CHECK(got[0] == std::vector<std::string>{"0", "1", "2"});
  CHECK_FALSE(sink.wait_for({"this process, its standby, hosts it at", std::to_string(port + 1)}).empty());
}

// A standby whose own host was the one cut off hosts a rendezvous nobody reaches: after
// failover_after it gives it up, failing the generation with a message that says so.
TEST_CASE("the rendezvous moves: a standby's rendezvous that nobody reaches gives up", "[bootstrap]") {
  LogSink sink;
  CafBootstrapOptions o = in_job_options(sink, 1);
  o.failover_after = 500ms;
  const int port = free_port_pair();
  o.rendezvous_at = RendezvousPlace{"127.0.0.1", port + 1, 1};
  o.rendezvous_moved = true;
  o.places = {RendezvousPlace{"127.0.0.1", port, 0}};
  const auto start = Clock::now();
  auto lonely = create_ok(make_env(1, 2, port), o);
  CHECK(lonely->hosts_rendezvous());
  auto g = lonely->all_gather("generation", "1");
  REQUIRE_FALSE(g);
  CHECK_THAT(g.status().message(), Contains("no other process reached the standby's rendezvous") &&
                                       Contains("this host is the one that was cut off"));
  CHECK(seconds_since(start) < 5);
  CHECK_FALSE(lonely->rendezvous_lost());
}

// A rendezvous hosted away from MASTER_ADDR:MASTER_PORT (by rank 1, at the port after the master's,
// as after a move) whose generation fails by an announced loss (rank 2's process dies): rank 1 hosts
// the next there again, binding its own place, and rank 0 and a replacement of rank 2 meet it.
TEST_CASE("the rendezvous moves: a moved rendezvous's host hosts the next generation in its place", "[bootstrap]") {
  REQUIRE_PEER_BIN();
  LogSink sink;
  auto in_job = [&](int32_t attempt) {
    CafBootstrapOptions o = in_job_options(sink, attempt);
    o.rendezvous_at = RendezvousPlace{"127.0.0.1", 0, 1};
    return o;
  };
  const int port = free_port_pair();
  auto at = [&](int32_t attempt) {
    CafBootstrapOptions o = in_job(attempt);
    o.rendezvous_at->port = port + 1;
    return o;
  };
  auto r1 = create_ok(make_env(1, 3, port), at(1));
  CHECK(r1->hosts_rendezvous());
  CHECK(r1->port() == port + 1);
  auto r0 = create_ok(make_env(0, 3, port), at(1));
  CHECK_FALSE(r0->hosts_rendezvous());
  CHECK(r0->place() == RendezvousPlace{"127.0.0.1", port + 1, 1});
  Peer dying({"join-exit"}, peer_env(2, 3, port + 1));
  REQUIRE(dying.read_line() == "joined");
  REQUIRE(eventually([&] { return !r0->job_failure().empty(); }));
  CHECK_FALSE(r0->rendezvous_lost());  // announced: rank 2 was lost
  REQUIRE(r0->standby());
  CHECK(*r0->standby() == RendezvousPlace{"127.0.0.1", port, 0});  // the lowest other rank, the first port
  r0.reset();
  r1.reset();
  auto again1 = create_ok(make_env(1, 3, port), at(2));
  CHECK(again1->hosts_rendezvous());
  CHECK(again1->port() == port + 1);
  Result<std::unique_ptr<CafBootstrap>> replacement = Status::error("not run");
  std::thread fresh([&] { replacement = create_caf_bootstrap(make_env(2, 3, port), at(kAnyGeneration)); });
  auto again0 = create_ok(make_env(0, 3, port), at(2));
  fresh.join();
  INFO((replacement ? std::string("joined") : replacement.status().message()));
  REQUIRE(replacement);
  const auto got = gather_all({again0.get(), again1.get(), replacement.value().get()}, "generation 2", {"0", "1", "2"});
  CHECK(got[0] == std::vector<std::string>{"0", "1", "2"});
  CHECK(got[2] == got[0]);
}

}  // namespace
}  // namespace troupe::comm
