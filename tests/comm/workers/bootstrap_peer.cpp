// A rank in its own process for tests/comm/test_caf_bootstrap.cpp: joins the CAF bootstrap
// described by the TROUPE_* environment, then misbehaves as told. Prints one line per step on
// stdout.
//
//   bootstrap_peer join-exit        join, print "joined", then exit at once without leaving (as a
//                                   crash)
//   bootstrap_peer join-stop        join, print "joined", then stop itself (SIGSTOP: hung, socket
//                                   open)
//   bootstrap_peer rank0-exit SECS  as rank 0: print "port N", wait SECS, then exit without leaving
//   bootstrap_peer gather KEY BLOB  join, all_gather, print "gathered a,b,c" or "error: ..."
//   bootstrap_peer plain-connect HOST PORT
//                                   no TROUPE_* needed: connect with plain CAF (unencrypted BASP,
//                                   as a troupe without the secure transport would) and print
//                                   "connected" or "refused: ..."
//
// Heartbeats: BOOTSTRAP_PEER_HEARTBEAT_MS sets the interval (connection timeout: 5x).
// BOOTSTRAP_PEER_EPHEMERAL_PORT=1: rank 0 listens on a port the OS picks (printed by rank0-exit).
// BOOTSTRAP_PEER_IN_JOB=1: under in-job recovery (generation 0).
#include <signal.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/bootstrap/caf_bootstrap.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bootstrap_peer join-exit|join-stop|rank0-exit SECS|gather KEY BLOB|"
                 "plain-connect HOST PORT\n");
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "plain-connect" && argc == 4) {
    caf::actor_system_config cfg;
    comm::configure_for_bootstrap(cfg);
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    std::string result = "refused: no answer";
    self->request(sys.middleman().actor_handle(), std::chrono::seconds(10),
                  caf::connect_atom::value, std::string(argv[2]),
                  static_cast<uint16_t>(std::atoi(argv[3])))
        .receive(
            [&](const caf::node_id&, caf::strong_actor_ptr& p, const std::set<std::string>&) {
              result = p ? "connected" : "refused: no actor";
            },
            [&](caf::error& e) { result = "refused: " + sys.render(e); });
    std::printf("%s\n", result.c_str());
    return result == "connected" ? 0 : 1;
  }
  auto env = comm::detect_launch_env();
  if (!env) {
    std::printf("error: %s\n", env.status().message().c_str());
    return 1;
  }
  comm::CafBootstrapOptions options;
  options.connect_timeout = std::chrono::seconds(20);
  if (const char* hb = std::getenv("BOOTSTRAP_PEER_HEARTBEAT_MS")) {
    options.heartbeat_interval = std::chrono::milliseconds(std::atoi(hb));
    options.connection_timeout = 5 * options.heartbeat_interval;
  }
  if (std::getenv("BOOTSTRAP_PEER_EPHEMERAL_PORT")) env->master_port = 0;  // rank 0: the OS picks
  if (std::getenv("BOOTSTRAP_PEER_IN_JOB")) {  // in-job recovery, generation 0: the rendezvous names a standby
    options.in_job_recovery = true;
    options.attempt = 0;
  }
  auto b = comm::create_caf_bootstrap(*env, options);
  if (!b) {
    std::printf("error: %s\n", b.status().message().c_str());
    std::fflush(stdout);
    return 1;
  }
  if (mode == "rank0-exit" && argc == 3) {
    std::printf("port %d\n", (*b)->port());
    std::fflush(stdout);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int>(std::atof(argv[2]) * 1000)));
    std::_Exit(1);
  }
  std::printf("joined\n");
  std::fflush(stdout);
  if (mode == "join-exit") std::_Exit(1);
  if (mode == "join-stop") {
    raise(SIGSTOP);
    std::_Exit(1);
  }
  if (mode == "gather" && argc == 4) {
    auto all = (*b)->all_gather(argv[2], argv[3]);
    if (!all) {
      std::printf("error: %s\n", all.status().message().c_str());
      return 1;
    }
    std::string joined;
    for (const auto& s : *all) joined += (joined.empty() ? "" : ",") + s;
    std::printf("gathered %s\n", joined.c_str());
    return 0;
  }
  std::fprintf(stderr, "bootstrap_peer: unknown mode %s\n", mode.c_str());
  return 2;
}
