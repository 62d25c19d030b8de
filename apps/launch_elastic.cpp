// apps/launch_elastic.hpp: the host (node 0, or the standby that took over) forms the rounds; the
// other nodes ask for theirs.
#include "apps/launch_elastic.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <stop_token>
#include <thread>

#include "comm/bootstrap/net_plan.hpp"
#include "comm/bootstrap/psk_channel.hpp"
#include "comm/bootstrap/rendezvous_place.hpp"

namespace troupe::apps {

namespace {

using Clock = comm::RendezvousHost::Clock;
constexpr auto kPoll = std::chrono::milliseconds(200);
constexpr auto kProgressEvery = std::chrono::seconds(10);
// How often a standby that took over asks the old host whether it is there after all.
constexpr auto kRecheckOldHost = std::chrono::seconds(1);

std::string node_list(const std::vector<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : ", ") + std::to_string(n);
  return s;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Place {
  std::string addr;
  int port = 0;
  bool operator==(const Place&) const = default;
};

std::string text(const Place& p) {
  return (p.addr.find(':') != std::string::npos ? "[" + p.addr + "]" : p.addr) + ":" + std::to_string(p.port);
}

// The address this host asks `host` from (the kernel's route toward it); "-" when unknown.
std::string source_toward(const std::string& host) {
  const comm::NetQueries q = comm::system_net_queries();
  auto resolved = q.resolve(host);
  if (!resolved || resolved->empty()) return "-";
  auto src = q.source_addr(resolved->front());
  return src && comm::valid_place_addr(*src) ? *src : "-";
}

// A thread that runs `ask` about every second until it is stopped (each ask bounded by its own
// 1 s request timeout): the standby's watch of the host, and the notices of a standby that took over.
std::jthread every_second(std::function<void()> ask) {
  return std::jthread([ask = std::move(ask)](std::stop_token stop) {
    while (!stop.stop_requested()) {
      ask();
      for (int k = 0; k < 10 && !stop.stop_requested(); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

std::string standby_text(const std::optional<comm::ElasticStandby>& s) {
  return s ? "node " + std::to_string(s->node) + " hosts the rounds at " + text({s->addr, s->port})
           : "no other node can host the rounds (the job ends with this launcher)";
}

}  // namespace

struct ElasticMembership::Impl {
  LaunchOptions o;
  std::string token;
  std::string run_id;                          // the job's: this launcher's until a host names another
  Place place;                                 // where the rounds are hosted
  std::optional<comm::ElasticStandby> standby;  // who hosts them should that host be lost
  int last_nodes = 0;                          // the node count of the last round this node ran
  std::optional<Place> old_host;               // a standby that took over: the host it replaced
  std::unique_ptr<comm::RendezvousHost> host;  // while this launcher hosts
  std::unique_ptr<comm::PskServer> server;
  std::map<std::string, std::string> source;  // a place's address -> the address this host asks it from
  // A standby that took over: tells the old place every second where the rounds are (a node 0
  // launcher started again there follows). Stopped first, before what it reads.
  std::jthread notifier;
  // The standby, while its round runs: asks the host every second, so that when the round fails
  // the host's silence is already measured (the failover does not wait kFailoverAfter more).
  std::shared_ptr<std::atomic<Clock::rep>> host_heard;  // when the host last answered
  std::jthread watcher;
  void watch_host(int round) {
    watcher = std::jthread();
    host_heard = std::make_shared<std::atomic<Clock::rep>>(Clock::now().time_since_epoch().count());
    comm::JoinRequest asking{o.node_rank, o.nproc_per_node, o.min_nnodes, o.nnodes, o.spares, round};
    asking.addr = source_for(place.addr);
    watcher = every_second([at = place, line = comm::encode_join(asking), token = token, heard = host_heard] {
      if (auto answer = comm::psk_request(at.addr, at.port, token, line, std::chrono::seconds(1));
          answer && comm::parse_answer(answer.value()))
        heard->store(Clock::now().time_since_epoch().count());
    });
  }
  const std::string& source_for(const std::string& addr) {
    auto it = source.find(addr);
    if (it == source.end()) it = source.emplace(addr, source_toward(addr)).first;
    return it->second;
  }
};

ElasticMembership::~ElasticMembership() = default;

Result<std::unique_ptr<ElasticMembership>> ElasticMembership::start(const LaunchOptions& o, const std::string& token,
                                                                    const std::string& run_id) {
  std::unique_ptr<ElasticMembership> m(new ElasticMembership());
  m->impl_ = std::make_unique<Impl>();
  Impl& s = *m->impl_;
  s.o = o;
  s.token = token;
  s.run_id = run_id;
  s.place = {o.master_addr, o.master_port};
  if (o.node_rank != 0) return m;
  if (Status st = m->start_hosting(-1); !st) return st;
  return m;
}

Status ElasticMembership::start_hosting(int taken_over_round) {
  Impl& s = *impl_;
  const bool taken_over = taken_over_round >= 0;
  const Place at = taken_over ? Place{s.standby->addr, s.standby->port} : s.place;
  comm::RendezvousHost::Settings settings;
  settings.min_nodes = s.o.min_nnodes;
  settings.max_nodes = s.o.nnodes;
  settings.spares = s.o.spares;
  settings.nproc = s.o.nproc_per_node;
  settings.run_id = s.run_id;
  settings.last_call = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.o.last_call_s));
  settings.host_node = s.o.node_rank;
  settings.host_addr = taken_over ? at.addr : s.source_for(s.o.master_addr);
  settings.host_port = at.port;
  settings.master_port = s.o.master_port;
  settings.taken_over_round = taken_over_round;
  settings.taken_over_nodes = s.last_nodes;
  auto host = std::make_unique<comm::RendezvousHost>(settings);
  comm::RendezvousHost* answering = host.get();
  auto server = comm::PskServer::start(
      "0.0.0.0", at.port, s.token,
      [answering](const std::string& request) { return answering->answer(request, Clock::now()); },
      taken_over ? "the elastic rendezvous (the standby's place)" : "the elastic rendezvous (--master-port)");
  if (!server) return server.status();
  s.host = std::move(host);
  s.server = std::move(server).value();
  if (taken_over) {
    s.old_host = s.place;
    s.place = at;
    const Place master{s.o.master_addr, s.o.master_port};
    comm::RendezvousHost* hosting = s.host.get();
    s.notifier = every_second([master, at, hosting, run_id = s.run_id, token = s.token] {
      const std::string notice = comm::encode_moved({hosting->round(), run_id, at.addr, at.port});
      (void)comm::psk_request(master.addr, master.port, token, notice, std::chrono::seconds(1));
    });
    std::fprintf(stderr,
                 "troupe launch: hosting the rounds of the job from now on at %s (this launcher, --node-rank %d, is "
                 "the standby of round %d); the next round needs more than half of its %d node(s)\n",
                 text(at).c_str(), s.o.node_rank, taken_over_round, s.last_nodes);
  } else {
    std::fprintf(stderr,
                 "troupe launch: hosting the rounds of a job of %d to %d node(s)%s on port %d; each round's ranks meet "
                 "on port %d\n",
                 s.o.min_nnodes, s.o.nnodes,
                 s.o.spares > 0 ? (" and " + std::to_string(s.o.spares) + " spare(s)").c_str() : "", at.port,
                 at.port + 1);
  }
  return Status::ok();
}

bool ElasticMembership::hosting() const { return impl_->host != nullptr; }

Result<std::optional<comm::RoundAssignment>> ElasticMembership::next_round(int last_round) {
  return impl_->host ? host_round() : join_round(last_round);
}

Result<std::optional<comm::RoundAssignment>> ElasticMembership::host_round() {
  Impl& s = *impl_;
  const auto began = Clock::now();
  auto report_at = began + kProgressEvery;
  auto recheck_at = began + kRecheckOldHost;
  s.host->open_round(began);
  for (;;) {
    const auto now = Clock::now();
    // Node 0 started again after its standby took the rounds over: it joins them there.
    if (auto moved = s.host->moved_to()) {
      std::fprintf(stderr, "troupe launch: the job's rounds are hosted at %s (node 0's standby took them over when "
                           "node 0 was lost; its last round %d): this launcher joins there as --node-rank %d\n",
                   text({moved->addr, moved->port}).c_str(), moved->round, s.o.node_rank);
      const int last = s.host->round();
      s.server.reset();
      s.host.reset();
      s.place = {moved->addr, moved->port};
      s.run_id = moved->run_id;
      return join_round(last);
    }
    if (auto round = s.host->try_form(now)) {
      s.old_host.reset();
      s.standby = round->standby;
      s.last_nodes = static_cast<int>(round->members.size());
      std::fprintf(stderr, "troupe launch: round %d: %zu of %d..%d node(s), node ranks %s; %s\n", round->round,
                   round->members.size(), s.o.min_nnodes, s.o.nnodes, node_list(round->members).c_str(),
                   s.o.node_rank == 0 ? "this node is node 0"
                                      : ("this launcher (--node-rank " + std::to_string(s.o.node_rank) +
                                         ") hosts the rounds and is node 0")
                                            .c_str());
      if (round->members.size() > 1)
        std::fprintf(stderr, "troupe launch: round %d: should this launcher be lost, %s\n", round->round,
                     standby_text(round->standby).c_str());
      comm::RoundAssignment r;
      r.round = round->round;
      r.nodes = static_cast<int>(round->members.size());
      r.run_id = s.run_id;
      r.host_addr = s.place.addr;
      r.host_port = s.place.port;
      return std::optional<comm::RoundAssignment>(r);
    }
    // A standby that took over, before its first round: should the old host answer after all (it
    // was slow, not lost), this launcher stops hosting and joins there.
    if (s.old_host && now >= recheck_at) {
      recheck_at = now + kRecheckOldHost;
      const comm::JoinRequest probe{s.o.node_rank,
                                    s.o.nproc_per_node,
                                    s.o.min_nnodes,
                                    s.o.nnodes,
                                    s.o.spares,
                                    s.host->round(),
                                    s.source_for(s.old_host->addr)};
      auto answer = comm::psk_request(s.old_host->addr, s.old_host->port, s.token, comm::encode_join(probe),
                                      std::chrono::seconds(1));
      if (answer && comm::parse_answer(answer.value())) {
        std::fprintf(stderr, "troupe launch: the rounds' host at %s answers again: this launcher stops hosting and "
                             "joins there\n",
                     text(*s.old_host).c_str());
        const int last = s.host->round();
        s.notifier = std::jthread();
        s.server.reset();
        s.host.reset();
        s.place = *s.old_host;
        s.old_host.reset();
        return join_round(last);
      }
    }
    const std::vector<int> here = s.host->present(now);
    const int missing = s.host->quorum_missing(now);
    const std::string quorum =
        missing > 0 ? " and " + std::to_string(missing) + " more of the last round's node(s) (at least half of them " +
                          "must be here, more than half after its host was lost: the other side of a network split " +
                          "may hold the rest)"
                    : "";
    if (seconds(now - began) > s.o.join_timeout_s)
      return Status::error("only " + std::to_string(here.size()) + " of at least " + std::to_string(s.o.min_nnodes) +
                           " node(s)" + quorum + " asked to join within " +
                           std::to_string(static_cast<int>(s.o.join_timeout_s)) + " s (node ranks " + node_list(here) +
                           ") -- start the others' launchers (troupe launch --node-rank K) and check that they reach "
                           "this host's port " + std::to_string(s.place.port));
    if (now >= report_at) {
      report_at += kProgressEvery;
      const double left = s.host->last_call_left(now);
      std::fprintf(stderr, "troupe launch: forming a round: %zu of %d..%d node(s) here (node ranks %s)%s%s\n",
                   here.size(), s.o.min_nnodes, s.o.nnodes, node_list(here).c_str(),
                   left >= 0 && missing == 0
                       ? (", starting without the rest in " + std::to_string(static_cast<int>(left + 0.5)) + " s").c_str()
                       : "",
                   missing > 0 ? ("; waiting for " + std::to_string(missing) + " more of the last round's").c_str() : "");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<std::optional<comm::RoundAssignment>> ElasticMembership::join_round(int last_round) {
  Impl& s = *impl_;
  comm::JoinRequest request{s.o.node_rank, s.o.nproc_per_node, s.o.min_nnodes, s.o.nnodes, s.o.spares, last_round};
  // join_timeout bounds the time without an answer from the host; told to wait (a round forming, or
  // running without this node: a spare, a node back too late for it) it waits as long as the job runs.
  auto answered = Clock::now();
  auto report_at = answered + kProgressEvery;
  // The standby watched the host while its round ran: the host's silence counts from its last answer.
  if (s.watcher.joinable()) {
    s.watcher = std::jthread();
    answered = std::min(answered, Clock::time_point(Clock::duration(s.host_heard->load())));
  }
  std::string last_problem = "no answer yet", reported;
  Place asking = s.place;
  bool cannot_host = false;
  for (;;) {
    const bool standby_here = s.standby && s.standby->node == s.o.node_rank;
    request.addr = s.source_for(asking.addr);
    // With a standby named, a place that does not answer is left for the other within 2 s.
    auto answer = comm::psk_request(asking.addr, asking.port, s.token, comm::encode_join(request),
                                    s.standby ? std::chrono::seconds(2) : std::chrono::seconds(5));
    const auto now = Clock::now();
    if (answer) {
      auto parsed = comm::parse_answer(answer.value());
      if (!parsed) return parsed.status();
      const comm::JoinAnswer& a = parsed.value();
      answered = now;
      if (!(asking == s.place))
        std::fprintf(stderr, "troupe launch: the rounds are hosted at %s now (the standby's place)\n",
                     text(asking).c_str());
      s.place = asking;
      if (a.kind == comm::JoinAnswer::Kind::go || a.kind == comm::JoinAnswer::Kind::wait) s.standby = a.standby;
      switch (a.kind) {
        case comm::JoinAnswer::Kind::go: {
          std::fprintf(stderr, "troupe launch: round %d: node %d of %d (this launcher's --node-rank %d)\n", a.go.round,
                       a.go.group_rank, a.go.nodes, s.o.node_rank);
          if (a.standby && a.standby->node == s.o.node_rank)
            std::fprintf(stderr, "troupe launch: round %d: this launcher is the standby: should the rounds' host be "
                                 "lost, it hosts them at %s\n",
                         a.go.round, text({a.standby->addr, a.standby->port}).c_str());
          s.run_id = a.go.run_id;
          s.last_nodes = a.go.nodes;
          comm::RoundAssignment r = a.go;
          r.host_addr = asking.addr;
          r.host_port = asking.port;
          if (a.standby && a.standby->node == s.o.node_rank) s.watch_host(a.go.round);
          return std::optional<comm::RoundAssignment>(r);
        }
        case comm::JoinAnswer::Kind::done:
          std::fprintf(stderr, "troupe launch: the job finished without this node (the rounds' host says so)\n");
          return std::optional<comm::RoundAssignment>();
        case comm::JoinAnswer::Kind::failed:
          return Status::error("the job failed on the other nodes (the rounds' host at " + text(asking) +
                               " says so; see its output)");
        case comm::JoinAnswer::Kind::refused:
          return Status::bad_input("the rounds' host at " + text(asking) + " refused this node: " + a.reason);
        case comm::JoinAnswer::Kind::follow:
          return Status::bad_input("the rounds' host at " + text(asking) + " answered a join request with 'follow'");
        case comm::JoinAnswer::Kind::wait:
          last_problem = "waiting for a place: round " + std::to_string(a.round) + ", " + std::to_string(a.present) +
                         " node(s) asking";
          break;
      }
    } else {
      last_problem = text(asking) + ": " + answer.status().message();
      // The host is silent: its standby hosts the rounds once kFailoverAfter has passed; the others
      // ask at the standby's place in turn with the host's.
      if (standby_here && !cannot_host && now - answered >= comm::kFailoverAfter) {
        std::fprintf(stderr, "troupe launch: the rounds' host at %s has not answered for %d s (%s)\n",
                     text(s.place).c_str(), static_cast<int>(seconds(now - answered)), last_problem.c_str());
        if (Status st = start_hosting(last_round); st) return host_round();
        else {
          cannot_host = true;
          std::fprintf(stderr, "troupe launch: this launcher, the standby, cannot host the rounds (%s); asking on\n",
                       st.message().c_str());
        }
      }
      if (s.standby && !standby_here) {
        const Place other{s.standby->addr, s.standby->port};
        asking = asking == s.place ? other : s.place;
      }
    }
    if (seconds(now - answered) > s.o.join_timeout_s)
      return Status::error("no answer from the rounds' host at " + text(s.place) +
                           (s.standby && !standby_here ? " nor its standby at " + text({s.standby->addr, s.standby->port})
                                                       : std::string()) +
                           " for " + std::to_string(static_cast<int>(s.o.join_timeout_s)) + " s (" + last_problem +
                           ") -- check that node 0's launcher runs and this host reaches it");
    // Progress every 10 s while the host does not answer; while it says wait, when that changes.
    if (now >= report_at && (last_problem != reported || seconds(now - answered) >= 1)) {
      report_at = now + kProgressEvery;
      reported = last_problem;
      std::fprintf(stderr, "troupe launch: joining the job at %s (%s)\n", text(asking).c_str(), last_problem.c_str());
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
