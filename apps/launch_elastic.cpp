// apps/launch_elastic.hpp: node 0 forms the rounds; the other nodes ask for theirs.
#include "apps/launch_elastic.hpp"

#include <cstdio>
#include <thread>

#include "comm/bootstrap/psk_channel.hpp"

namespace troupe::apps {

namespace {

using Clock = comm::RendezvousHost::Clock;
constexpr auto kPoll = std::chrono::milliseconds(200);
constexpr auto kProgressEvery = std::chrono::seconds(10);

std::string node_list(const std::vector<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : ", ") + std::to_string(n);
  return s;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

struct ElasticMembership::Impl {
  LaunchOptions o;
  std::string token;
  std::unique_ptr<comm::RendezvousHost> host;  // node 0 only
  std::unique_ptr<comm::PskServer> server;
};

ElasticMembership::~ElasticMembership() = default;

Result<std::unique_ptr<ElasticMembership>> ElasticMembership::start(const LaunchOptions& o, const std::string& token,
                                                                    const std::string& run_id) {
  std::unique_ptr<ElasticMembership> m(new ElasticMembership());
  m->impl_ = std::make_unique<Impl>();
  Impl& s = *m->impl_;
  s.o = o;
  s.token = token;
  if (o.node_rank != 0) return m;
  comm::RendezvousHost::Settings settings;
  settings.min_nodes = o.min_nnodes;
  settings.max_nodes = o.nnodes;
  settings.spares = o.spares;
  settings.nproc = o.nproc_per_node;
  settings.run_id = run_id;
  settings.last_call = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.last_call_s));
  s.host = std::make_unique<comm::RendezvousHost>(settings);
  comm::RendezvousHost* host = s.host.get();
  auto server = comm::PskServer::start(
      "0.0.0.0", o.master_port, token, [host](const std::string& request) { return host->answer(request, Clock::now()); },
      "the elastic rendezvous (--master-port)");
  if (!server) return server.status();
  s.server = std::move(server).value();
  std::fprintf(stderr,
               "troupe launch: hosting the rounds of a job of %d to %d node(s)%s on port %d; each round's ranks meet on "
               "port %d\n",
               o.min_nnodes, o.nnodes, o.spares > 0 ? (" and " + std::to_string(o.spares) + " spare(s)").c_str() : "",
               o.master_port, o.master_port + 1);
  return m;
}

Result<std::optional<comm::RoundAssignment>> ElasticMembership::next_round(int last_round) {
  return impl_->host ? host_round() : join_round(last_round);
}

Result<std::optional<comm::RoundAssignment>> ElasticMembership::host_round() {
  Impl& s = *impl_;
  const auto began = Clock::now();
  auto report_at = began + kProgressEvery;
  s.host->open_round(began);
  for (;;) {
    const auto now = Clock::now();
    if (auto round = s.host->try_form(now)) {
      std::fprintf(stderr, "troupe launch: round %d: %zu of %d..%d node(s), node ranks %s; this node is node 0\n",
                   round->round, round->members.size(), s.o.min_nnodes, s.o.nnodes, node_list(round->members).c_str());
      return std::optional<comm::RoundAssignment>(
          comm::RoundAssignment{round->round, 0, static_cast<int>(round->members.size()), std::string()});
    }
    const std::vector<int> here = s.host->present(now);
    if (seconds(now - began) > s.o.join_timeout_s)
      return Status::error("only " + std::to_string(here.size()) + " of at least " + std::to_string(s.o.min_nnodes) +
                           " node(s) asked to join within " + std::to_string(static_cast<int>(s.o.join_timeout_s)) +
                           " s (node ranks " + node_list(here) + ") -- start the others' launchers (troupe launch "
                           "--node-rank K) and check that they reach this host's port " + std::to_string(s.o.master_port));
    if (now >= report_at) {
      report_at += kProgressEvery;
      const double left = s.host->last_call_left(now);
      std::fprintf(stderr, "troupe launch: forming a round: %zu of %d..%d node(s) here (node ranks %s)%s\n", here.size(),
                   s.o.min_nnodes, s.o.nnodes, node_list(here).c_str(),
                   left >= 0 ? (", starting without the rest in " + std::to_string(static_cast<int>(left + 0.5)) + " s")
                                   .c_str()
                             : "");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<std::optional<comm::RoundAssignment>> ElasticMembership::join_round(int last_round) {
  Impl& s = *impl_;
  const comm::JoinRequest request{s.o.node_rank, s.o.nproc_per_node, s.o.min_nnodes, s.o.nnodes, s.o.spares, last_round};
  const std::string line = comm::encode_join(request);
  // join_timeout bounds the time without an answer from node 0; told to wait (a round forming, or
  // running without this node: a spare, a node back too late for it) it waits as long as the job runs.
  auto answered = Clock::now();
  auto report_at = answered + kProgressEvery;
  std::string last_problem = "no answer yet", reported;
  for (;;) {
    auto answer = comm::psk_request(s.o.master_addr, s.o.master_port, s.token, line, std::chrono::seconds(5));
    const auto now = Clock::now();
    if (answer) {
      auto parsed = comm::parse_answer(answer.value());
      if (!parsed) return parsed.status();
      const comm::JoinAnswer& a = parsed.value();
      answered = now;
      switch (a.kind) {
        case comm::JoinAnswer::Kind::go:
          std::fprintf(stderr, "troupe launch: round %d: node %d of %d (this launcher's --node-rank %d)\n", a.go.round,
                       a.go.group_rank, a.go.nodes, s.o.node_rank);
          return std::optional<comm::RoundAssignment>(a.go);
        case comm::JoinAnswer::Kind::done:
          std::fprintf(stderr, "troupe launch: the job finished without this node (node 0 says so)\n");
          return std::optional<comm::RoundAssignment>();
        case comm::JoinAnswer::Kind::failed:
          return Status::error("the job failed on the other nodes (node 0 says so; see its output)");
        case comm::JoinAnswer::Kind::refused:
          return Status::bad_input("node 0 refused this node: " + a.reason);
        case comm::JoinAnswer::Kind::wait:
          last_problem = "waiting for a place: round " + std::to_string(a.round) + ", " + std::to_string(a.present) +
                         " node(s) asking";
          break;
      }
    } else {
      last_problem = answer.status().message();
    }
    if (seconds(now - answered) > s.o.join_timeout_s)
      return Status::error("no answer from node 0 at " + s.o.master_addr + ":" + std::to_string(s.o.master_port) +
                           " for " + std::to_string(static_cast<int>(s.o.join_timeout_s)) + " s (" + last_problem +
                           ") -- check that node 0's launcher runs and this host reaches it");
    // Progress every 10 s while node 0 does not answer; while it says wait, when that changes.
    if (now >= report_at && (last_problem != reported || seconds(now - answered) >= 1)) {
      report_at = now + kProgressEvery;
      reported = last_problem;
      std::fprintf(stderr, "troupe launch: joining the job at %s:%d (%s)\n", s.o.master_addr.c_str(), s.o.master_port,
                   last_problem.c_str());
    }
    std::this_thread::sleep_for(kPoll);
  }
}

bool ElasticMembership::newcomer_waiting() const {
  return impl_->host != nullptr && impl_->host->newcomer_waiting(Clock::now());
}

void ElasticMembership::finish(bool failed) {
  Impl& s = *impl_;
  if (!s.host) return;
  s.host->finish(failed);
  // Nodes waiting to join ask every 0.2 s: long enough for each to hear `done`.
  if (s.host->present(Clock::now()).size() > 1) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace troupe::apps
