// The rounds of an elastic job (comm/bootstrap/elastic_rendezvous.hpp): node 0's decisions stepped
// in time without a network, the strict readers of both lines, and one round over the real TLS
// channel with the job token.
#include <catch2/catch.hpp>
#include <algorithm>
#include <bit>
#include <random>
#include <set>
#include <string>

#include "comm/bootstrap/elastic_rendezvous.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "comm/bootstrap/psk_channel.hpp"

using namespace troupe;
using namespace troupe::comm;
using Catch::Matchers::Contains;
using Clock = RendezvousHost::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

const std::string kRun = "0123456789abcdef0123456789abcdef";

RendezvousHost::Settings settings(int min_nodes, int max_nodes) {
  RendezvousHost::Settings s;
  s.min_nodes = min_nodes;
  s.max_nodes = max_nodes;
  s.nproc = 2;
  s.run_id = kRun;
  s.last_call = seconds(5);
  return s;
}

RendezvousHost::Settings with_spares(int min_nodes, int max_nodes, int spares) {
  RendezvousHost::Settings s = settings(min_nodes, max_nodes);
  s.spares = spares;
  return s;
}

JoinAnswer ask(RendezvousHost& host, int node, int last, Clock::time_point now, int min_nodes, int max_nodes,
               int spares = 0) {
  auto a = parse_answer(host.answer(encode_join({node, 2, min_nodes, max_nodes, spares, last}), now));
  REQUIRE(a);
  return a.value();
}

}  // namespace

TEST_CASE("elastic rendezvous: all nodes form a round at once; a lost node is left out after the last call",
          "[elastic]") {
  RendezvousHost host(settings(1, 3));
  const auto t0 = Clock::now();
  host.open_round(t0);
  CHECK(ask(host, 2, -1, t0, 1, 3).kind == JoinAnswer::Kind::wait);
  CHECK_FALSE(host.try_form(t0 + milliseconds(100)));  // 2 of 3: the last call runs
  CHECK(host.last_call_left(t0 + milliseconds(100)) == Approx(5.0));
  CHECK(ask(host, 1, -1, t0 + milliseconds(200), 1, 3).kind == JoinAnswer::Kind::wait);
  auto r0 = host.try_form(t0 + milliseconds(300));  // all 3: at once
  REQUIRE(r0);
  CHECK(r0->round == 0);
  CHECK(r0->members == std::vector<int>{0, 1, 2});
  for (int node : {1, 2}) {
    const JoinAnswer a = ask(host, node, -1, t0 + milliseconds(400), 1, 3);
    REQUIRE(a.kind == JoinAnswer::Kind::go);
    CHECK(a.go.round == 0);
    CHECK(a.go.group_rank == node);
    CHECK(a.go.nodes == 3);
    CHECK(a.go.run_id == kRun);
  }
  // Having run round 0, a node asking again waits for the next round (never round 0 twice).
  CHECK(ask(host, 1, 0, t0 + seconds(1), 1, 3).kind == JoinAnswer::Kind::wait);
  CHECK_FALSE(host.newcomer_waiting(t0 + seconds(1)));  // node 1 is in the running round
  // Round 0 failed soon after it began, node 2 with it; its last question (1 s before the next
  // round opened, well within the stale time) is no proof it is there: only asking after counts.
  {
    RendezvousHost quick(settings(1, 2));
    quick.open_round(t0);
    ask(quick, 1, -1, t0, 1, 2);
    REQUIRE(quick.try_form(t0));
    CHECK(ask(quick, 1, -1, t0 + milliseconds(100), 1, 2).kind == JoinAnswer::Kind::go);
    quick.open_round(t0 + seconds(1));
    CHECK(quick.present(t0 + seconds(1)) == std::vector<int>{0});
    CHECK_FALSE(quick.try_form(t0 + seconds(1)));  // 1 of 2: the last call runs, without node 1
    auto lone = quick.try_form(t0 + seconds(7));
    REQUIRE(lone);
    CHECK(lone->members == std::vector<int>{0});
  }
  // A node's question just before the round that left it out formed (a standby watching the host,
  // its launcher lost right after) is no newcomer; a question after the round formed is.
  {
    RendezvousHost::Settings s = settings(1, 2);
    s.last_call = seconds(1);
    RendezvousHost quick(s);
    quick.open_round(t0);
    ask(quick, 1, -1, t0, 1, 2);
    REQUIRE(quick.try_form(t0));
    ask(quick, 1, 0, t0 + seconds(5), 1, 2);  // while round 0 runs
    quick.open_round(t0 + milliseconds(5500));
    auto lone = quick.try_form(t0 + milliseconds(5600));
    CHECK_FALSE(lone);
    lone = quick.try_form(t0 + milliseconds(6600));
    REQUIRE(lone);
    CHECK(lone->members == std::vector<int>{0});
    CHECK_FALSE(quick.newcomer_waiting(t0 + milliseconds(6700)));  // node 1's question of 5 s: before
    ask(quick, 1, 0, t0 + seconds(7), 1, 2);
    CHECK(quick.newcomer_waiting(t0 + seconds(7)));
  }
  // Round 0 failed; node 2 is gone. Node 1 asks; the round forms after the last call without node 2.
  const auto t1 = t0 + seconds(10);
  host.open_round(t1);
  CHECK(ask(host, 1, 0, t1, 1, 3).round == 1);
  auto t = t1;
  for (; t < t1 + seconds(4); t += milliseconds(200)) {
    ask(host, 1, 0, t, 1, 3);
    REQUIRE_FALSE(host.try_form(t));
  }
  std::optional<RendezvousHost::Round> r1;
  for (; !r1 && t < t1 + seconds(7); t += milliseconds(200)) {
    ask(host, 1, 0, t, 1, 3);
    r1 = host.try_form(t);
  }
  REQUIRE(r1);
  CHECK(r1->round == 1);
  CHECK(r1->members == std::vector<int>{0, 1});
  CHECK(t - t1 >= seconds(5));
  const JoinAnswer go = ask(host, 1, 0, t, 1, 3);
  REQUIRE(go.kind == JoinAnswer::Kind::go);
  CHECK(go.go.round == 1);
  CHECK(go.go.nodes == 2);
  // Node 2 comes back while round 1 runs: it waits, and node 0 hears of a newcomer.
  CHECK(ask(host, 2, -1, t + seconds(1), 1, 3).kind == JoinAnswer::Kind::wait);
  CHECK(host.newcomer_waiting(t + seconds(1)));
  CHECK_FALSE(host.newcomer_waiting(t + seconds(5)));  // it stopped asking: gone again
  host.finish(false);
  CHECK(ask(host, 2, -1, t + seconds(6), 1, 3).kind == JoinAnswer::Kind::done);
}

TEST_CASE("elastic rendezvous: a spare fills a lost node's place at once; a full round keeps it waiting",
          "[elastic]") {
  RendezvousHost host(with_spares(2, 2, 1));  // --nnodes 2 --spares 1: node ranks 0, 1 and the spare 2
  auto t = Clock::now();
  host.open_round(t);
  ask(host, 2, -1, t, 2, 2, 1);  // the spare asks first
  ask(host, 1, -1, t, 2, 2, 1);
  auto r0 = host.try_form(t);
  REQUIRE(r0);  // 3 asking, 2 wanted: at once
  CHECK(r0->members == std::vector<int>{0, 1});  // the lowest node ranks
  CHECK(ask(host, 2, -1, t, 2, 2, 1).kind == JoinAnswer::Kind::wait);
  CHECK_FALSE(host.newcomer_waiting(t));  // a full round: the spare waits, the job is not stopped for it
  // Node 1 is lost; the spare keeps asking: the next round forms at once, the spare in node 1's place.
  t += seconds(10);
  host.open_round(t);
  ask(host, 2, -1, t, 2, 2, 1);
  auto r1 = host.try_form(t);
  REQUIRE(r1);
  CHECK(r1->members == std::vector<int>{0, 2});
  const JoinAnswer go = ask(host, 2, -1, t, 2, 2, 1);
  REQUIRE(go.kind == JoinAnswer::Kind::go);
  CHECK(go.go.group_rank == 1);
  // Node 1 comes back and asks: now the spare, it waits (the last round's members come first).
  t += seconds(10);
  ask(host, 1, 0, t, 2, 2, 1);
  CHECK_FALSE(host.newcomer_waiting(t));
  host.open_round(t);
  ask(host, 2, 1, t, 2, 2, 1);
  auto r2 = host.try_form(t);
  REQUIRE(r2);
  CHECK(r2->members == std::vector<int>{0, 2});
}

TEST_CASE("elastic rendezvous: below MIN nothing forms; mismatched flags and node 0 are refused", "[elastic]") {
  RendezvousHost host(settings(3, 4));
  const auto t0 = Clock::now();
  host.open_round(t0);
  ask(host, 1, -1, t0, 3, 4);
  for (int k = 0; k < 100; ++k) CHECK_FALSE(host.try_form(t0 + seconds(k)));  // node 1 went quiet: 1 of 3
  auto refused = [&](JoinRequest r, const std::string& why) {
    auto a = parse_answer(host.answer(encode_join(r), t0));
    REQUIRE(a);
    CHECK(a->kind == JoinAnswer::Kind::refused);
    CHECK_THAT(a->reason, Contains(why));
  };
  refused({2, 3, 3, 4, 0, -1}, "node 2 runs --nproc-per-node 3 --nnodes 3:4 --spares 0, node 0 2, 3:4 and 0");
  refused({2, 2, 2, 4, 0, -1}, "give every node the same flags");
  refused({2, 2, 3, 4, 1, -1}, "give every node the same flags");
  refused({0, 2, 3, 4, 0, -1}, "node rank 0 is this launcher's own");
  auto junk = parse_answer(host.answer("GET / HTTP/1.1", t0));
  REQUIRE(junk);
  CHECK(junk->kind == JoinAnswer::Kind::refused);
  CHECK_THAT(junk->reason, Contains("not a join request"));
  host.finish(true);
  CHECK(ask(host, 1, -1, t0, 3, 4).kind == JoinAnswer::Kind::failed);
}

TEST_CASE("elastic rendezvous: random arrivals and losses; every round is what the rule says", "[elastic]") {
  // The rule: MIN nodes and at least half of the last round's, at once with MAX, else after the last call.
  std::mt19937 rng(4242);
  for (int trial = 0; trial < 40; ++trial) {
    const int max_nodes = 2 + static_cast<int>(rng() % 6), min_nodes = 1 + static_cast<int>(rng() % max_nodes);
    RendezvousHost host(settings(min_nodes, max_nodes));
    auto t = Clock::now();
    int last = -1;
    std::vector<int> members;  // of the last round
    for (int round = 0; round < 4; ++round) {
      host.open_round(t);
      std::set<int> alive;
      for (int n = 1; n < max_nodes; ++n)
        if (rng() % 3 != 0) alive.insert(n);
      std::optional<RendezvousHost::Round> formed;
      const auto began = t;
      while (!formed && t < began + seconds(20)) {
        for (int n : alive) ask(host, n, last, t, min_nodes, max_nodes);
        formed = host.try_form(t);
        t += milliseconds(200);
      }
      const int here = 1 + static_cast<int>(alive.size());
      // The last round's nodes still here (node 0 counted): at least half of them, or no round.
      const int stayed = 1 + static_cast<int>(std::count_if(alive.begin(), alive.end(), [&](int n) {
                           return std::find(members.begin(), members.end(), n) != members.end();
                         }));
      if (here < min_nodes || 2 * stayed < static_cast<int>(members.size())) {
        CHECK_FALSE(formed);
        break;
      }
      REQUIRE(formed);
      CHECK(formed->round == last + 1);
      std::vector<int> want = {0};
      want.insert(want.end(), alive.begin(), alive.end());
      CHECK(formed->members == want);
      // At once with MAX, else after the last call.
      CHECK((t - began <= milliseconds(200)) == (here == max_nodes));
      for (size_t g = 1; g < want.size(); ++g) {
        const JoinAnswer a = ask(host, want[g], last, t, min_nodes, max_nodes);
        REQUIRE(a.kind == JoinAnswer::Kind::go);
        CHECK(a.go.group_rank == static_cast<int>(g));
        CHECK(a.go.nodes == here);
      }
      last = formed->round;
      members = formed->members;
      t += seconds(10);  // the round runs; the nodes stop asking
    }
  }
}

TEST_CASE("elastic rendezvous: each line has one spelling; strict readers", "[elastic]") {
  JoinRequest r{7, 8, 2, 16, 3, 41};
  for (const char* addr : {"-", "10.0.0.7", "fe80::1%eth0", "node7.cluster"}) {
    r.addr = addr;
    auto back = parse_join(encode_join(r));
    REQUIRE(back);
    CHECK(back->addr == addr);
    CHECK(encode_join(back.value()) == encode_join(r));
  }
  CHECK(parse_join("troupe-rdzv 2 join 1 2 1 2 0 -1 -"));
  CHECK(parse_join("troupe-rdzv 2 join 2 2 1 2 1 -1 10.0.0.2"));  // a spare
  CHECK(parse_join("troupe-rdzv 2 join 0 2 1 2 0 3 10.0.0.1"));   // node 0 asks a standby that took over
  for (const char* bad :
       {"troupe-rdzv 2 join 1 2 1 2 0 -1", "troupe-rdzv 1 join 1 2 1 2 0 -1", "troupe-rdzv 1 join 1 2 1 2 0 -1 -",
        "troupe-rdzv 2 join 01 2 1 2 0 -1 -", "troupe-rdzv 2 join 1 2 1 2 0 -2 -", "troupe-rdzv 2 join 2 2 1 2 0 -1 -",
        "troupe-rdzv 2 join 1 0 1 2 0 -1 -", "troupe-rdzv 2 join 1 2 3 2 0 -1 -", "troupe-rdzv 2 join 1 2 1 2 0 -1 - ",
        "troupe-rdzv  2 join 1 2 1 2 0 -1 -", "troupe-rdzv 2 join +1 2 1 2 0 -1 -", "troupe-rdzv 2 join 1 2 1 2 -1 -1 -",
        "troupe-rdzv 2 join 3 2 1 2 1 -1 -", "troupe-rdzv 2 join 1 2 1 2 0 -1 10.0.0.1/8", "troupe-rdzv 2 join 1 2 1 2 0 -1 ",
        ""})
    CHECK_FALSE(parse_join(bad));
  for (const char* good : {"wait 3 2 none", "wait 3 2 4 10.0.0.2 29500", "go 4 1 3 0123456789abcdef0123456789abcdef none",
                           "go 4 1 3 0123456789abcdef0123456789abcdef 1 host1 29502", "done", "failed", "refused no"}) {
    auto a = parse_answer(good);
    REQUIRE(a);
    CHECK(encode_answer(a.value()) == good);
  }
  CHECK(parse_answer("wait 3 2 4 10.0.0.2 29500")->standby == ElasticStandby{4, "10.0.0.2", 29500});
  for (const char* bad : {"wait 3 2", "wait 3 0 none", "go 4 3 3 0123456789abcdef0123456789abcdef none",
                          "go 4 1 3 0123456789ABCDEF0123456789abcdef none", "go 4 1 3 00 none", "refused ", "refused \x01",
                          "waiting", "wait 1 none", "done ", "wait 3 2 4 10.0.0.2 0", "wait 3 2 4 10.0.0.2 65536",
                          "wait 3 2 04 10.0.0.2 29500", "wait 3 2 4 10.0.0.2/8 29500", "wait 3 2 10.0.0.2 29500",
                          "go 4 1 3 0123456789abcdef0123456789abcdef", "none"})
    CHECK_FALSE(parse_answer(bad));
}

namespace {

JoinAnswer ask_from(RendezvousHost& host, int node, int last, const std::string& addr, Clock::time_point now,
                    int min_nodes, int max_nodes) {
  JoinRequest r{node, 2, min_nodes, max_nodes, 0, last};
  r.addr = addr;
  auto a = parse_answer(host.answer(encode_join(r), now));
  REQUIRE(a);
  return a.value();
}

RendezvousHost::Settings hosted_at(int min_nodes, int max_nodes, int host_node, const std::string& addr, int port) {
  RendezvousHost::Settings s = settings(min_nodes, max_nodes);
  s.host_node = host_node;
  s.host_addr = addr;
  s.host_port = port;
  s.master_port = 29500;
  return s;
}

}  // namespace

TEST_CASE("elastic rendezvous: the standby is the lowest node on another host, told in every answer", "[elastic]") {
  {
    RendezvousHost host(hosted_at(1, 4, 0, "10.0.0.1", 29500));
    auto t = Clock::now();
    host.open_round(t);
    CHECK_FALSE(ask_from(host, 3, -1, "10.0.0.2", t, 1, 4).standby);  // before round 0: none
    ask_from(host, 1, -1, "10.0.0.1", t, 1, 4);                        // node 0's host
    ask_from(host, 2, -1, "10.0.0.2", t, 1, 4);
    auto r0 = host.try_form(t);
    REQUIRE(r0);
    CHECK(r0->members == std::vector<int>{0, 1, 2, 3});
    const ElasticStandby want{2, "10.0.0.2", 29500};  // not node 1: it shares node 0's host
    CHECK(r0->standby == want);
    for (int node : {1, 2, 3}) CHECK(ask_from(host, node, -1, "10.0.0.9", t, 1, 4).standby == want);
    // The standby stays that of the round that ran: a later address does not move it.
    host.open_round(t + seconds(10));
    CHECK(ask_from(host, 1, 0, "10.0.0.1", t + seconds(10), 1, 4).standby == want);
  }
  // A round formed at once by a host of these settings with these nodes (node rank, address) asking.
  auto formed = [](const RendezvousHost::Settings& s, const std::vector<std::pair<int, std::string>>& asking) {
    RendezvousHost host(s);
    const auto t = Clock::now();
    host.open_round(t);
    for (const auto& [node, addr] : asking) ask_from(host, node, -1, addr, t, s.min_nodes, s.max_nodes);
    auto r = host.try_form(t);
    REQUIRE(r);
    return r.value();
  };
  // Every node on one host: the lowest other node, two ports after the host's (its ranks meet at +1).
  CHECK(formed(hosted_at(1, 3, 0, "127.0.0.1", 29500), {{2, "127.0.0.1"}, {1, "127.0.0.1"}}).standby ==
        ElasticStandby{1, "127.0.0.1", 29502});
  // A host at the standby's port on the master's host names the next standby there at the master's port.
  const auto moved = formed(hosted_at(1, 2, 1, "127.0.0.1", 29502), {{0, "127.0.0.1"}});
  CHECK(moved.members == std::vector<int>{1, 0});  // the host first
  CHECK(moved.standby == ElasticStandby{0, "127.0.0.1", 29500});
  // A node that does not know its address is never named.
  CHECK_FALSE(formed(hosted_at(1, 2, 0, "10.0.0.1", 29500), {{1, "-"}}).standby);
}

TEST_CASE("elastic rendezvous: a standby takes over the round number and needs more than half of the last round",
          "[elastic]") {
  // Round 4 was nodes 0, 1, 2 (node 0 hosted); node 0 is lost; node 1, the standby, hosts at its place.
  RendezvousHost::Settings s = hosted_at(1, 3, 1, "10.0.0.2", 29500);
  s.taken_over_round = 4;
  s.taken_over_nodes = 3;
  RendezvousHost host(s);
  auto t = Clock::now();
  host.open_round(t);
  CHECK(host.round() == 4);
  CHECK(host.quorum_missing(t) == 1);  // itself: 1 of 3
  // The old node 0 (back, or on the other side of a split) asking afresh is no member of round 4.
  ask_from(host, 0, -1, "10.0.0.1", t, 1, 3);
  for (auto k = seconds(0); k < seconds(20); k += seconds(1)) {
    ask_from(host, 0, -1, "10.0.0.1", t + k, 1, 3);
    REQUIRE_FALSE(host.try_form(t + k));
  }
  CHECK(host.quorum_missing(t + seconds(20)) == 1);
  auto refused = parse_answer(host.answer(encode_join({1, 2, 1, 3, 0, 4}), t));
  REQUIRE(refused);
  CHECK(refused->kind == JoinAnswer::Kind::refused);
  CHECK_THAT(refused->reason, Contains("node rank 1 is this launcher's own"));
  // Node 2 of round 4 asks: 2 of 3; the round forms after the last call (3 nodes asking: node 0 too).
  const auto t1 = t + seconds(30);
  std::optional<RendezvousHost::Round> r;
  for (auto k = milliseconds(0); !r && k < seconds(2); k += milliseconds(200)) {
    ask_from(host, 2, 4, "10.0.0.3", t1 + k, 1, 3);
    ask_from(host, 0, -1, "10.0.0.1", t1 + k, 1, 3);
    r = host.try_form(t1 + k);
  }
  REQUIRE(r);
  CHECK(r->round == 5);
  CHECK(r->members == std::vector<int>{1, 0, 2});
  CHECK(r->standby == ElasticStandby{0, "10.0.0.1", 29500});  // the lowest on another host
  const JoinAnswer go = ask_from(host, 2, 4, "10.0.0.3", t1 + seconds(2), 1, 3);
  REQUIRE(go.kind == JoinAnswer::Kind::go);
  CHECK(go.go.round == 5);
  CHECK(go.go.group_rank == 2);
  CHECK(go.go.run_id == kRun);
}

TEST_CASE("elastic rendezvous: node 0 started again follows the standby that took its rounds over", "[elastic]") {
  const MovedNotice notice{3, "fedcba9876543210fedcba9876543210", "10.0.0.2", 29500};
  CHECK(encode_moved(notice) == "troupe-rdzv 2 moved 3 fedcba9876543210fedcba9876543210 10.0.0.2 29500");
  auto back = parse_moved(encode_moved(notice));
  REQUIRE(back);
  CHECK(back.value() == notice);
  for (const char* bad : {"troupe-rdzv 2 moved 3 fedcba9876543210fedcba9876543210 10.0.0.2 0",
                          "troupe-rdzv 2 moved 3 fedcba9876543210 10.0.0.2 29500",
                          "troupe-rdzv 2 moved -1 fedcba9876543210fedcba9876543210 10.0.0.2 29500",
                          "troupe-rdzv 1 moved 3 fedcba9876543210fedcba9876543210 10.0.0.2 29500",
                          "troupe-rdzv 2 moved 3 fedcba9876543210fedcba9876543210 10.0.0.2/1 29500"})
    CHECK_FALSE(parse_moved(bad));
  CHECK(parse_answer("follow")->kind == JoinAnswer::Kind::follow);
  auto t = Clock::now();
  {  // A fresh node 0 (no round formed): it follows, and forms none of its own afterwards.
    RendezvousHost fresh(hosted_at(1, 3, 0, "10.0.0.1", 29500));
    fresh.open_round(t);
    CHECK_FALSE(fresh.moved_to());
    CHECK(parse_answer(fresh.answer(encode_moved(notice), t))->kind == JoinAnswer::Kind::follow);
    CHECK(fresh.moved_to() == notice);
    CHECK_FALSE(fresh.try_form(t + seconds(60)));  // MIN 1: it would have formed a round alone
  }
  {  // A node 0 whose job runs (a round formed) refuses: it is the job, not a stray start.
    RendezvousHost running(hosted_at(1, 2, 0, "10.0.0.1", 29500));
    running.open_round(t);
    ask_from(running, 1, -1, "10.0.0.2", t, 1, 2);
    REQUIRE(running.try_form(t));
    const JoinAnswer a = parse_answer(running.answer(encode_moved(notice), t)).value();
    CHECK(a.kind == JoinAnswer::Kind::refused);
    CHECK_THAT(a.reason, Contains("hosts the rounds of a job that runs"));
    CHECK_FALSE(running.moved_to());
    // Its round fails and it is left with too few of its nodes to form the next (the minority side
    // of a split): its own run's notice, of a round at least its own, is followed; another run's not.
    running.open_round(t + seconds(10));
    CHECK(running.quorum_missing(t + seconds(10)) == 0);  // 1 of 2 is half: the host's side may go on
  }
  {
    RendezvousHost minority(hosted_at(1, 3, 0, "10.0.0.1", 29500));
    minority.open_round(t);
    ask_from(minority, 1, -1, "10.0.0.2", t, 1, 3);
    ask_from(minority, 2, -1, "10.0.0.2", t, 1, 3);
    REQUIRE(minority.try_form(t));
    minority.open_round(t + seconds(10));
    CHECK(minority.quorum_missing(t + seconds(10)) == 1);
    MovedNotice other = notice;
    other.round = 0;
    CHECK(parse_answer(minority.answer(encode_moved(other), t + seconds(11)))->kind == JoinAnswer::Kind::refused);
    MovedNotice own{0, kRun, "10.0.0.2", 29500};
    CHECK(parse_answer(minority.answer(encode_moved(own), t + seconds(11)))->kind == JoinAnswer::Kind::follow);
    CHECK(minority.moved_to() == own);
    CHECK_FALSE(minority.try_form(t + seconds(60)));
  }
}

TEST_CASE("elastic rendezvous: the two sides of any split never both form a round", "[elastic]") {
  // Round 0 of N nodes hosted by node 0 with standby S fails; the nodes split in two sides. The host's
  // side forms with at least half of them, the standby's (taken over) with more than half: never both,
  // and a side of more than half always goes on.
  for (int n = 2; n <= 6; ++n)
    for (int standby = 1; standby < n; ++standby)
      for (unsigned side = 0; side < (1u << n); ++side) {  // bit k: node k on the host's side
        if ((side & 1u) == 0) continue;                    // the host is on its own side
        RendezvousHost host(hosted_at(1, n, 0, "10.0.0.1", 29500));
        RendezvousHost::Settings s = hosted_at(1, n, standby, "10.0.0.2", 29500);
        s.taken_over_round = 0;
        s.taken_over_nodes = n;
        RendezvousHost took(s);
        auto t = Clock::now();
        host.open_round(t);
        for (int k = 1; k < n; ++k) ask_from(host, k, -1, "10.0.0.2", t, 1, n);
        REQUIRE(host.try_form(t));
        t += seconds(10);
        host.open_round(t);
        took.open_round(t);
        bool host_formed = false, took_formed = false;
        const bool standby_on_host_side = ((side >> standby) & 1u) != 0;
        for (auto k = milliseconds(0); k < seconds(8); k += milliseconds(500)) {
          for (int node = 1; node < n; ++node) {
            if ((side >> node) & 1u) ask_from(host, node, 0, "10.0.0.2", t + k, 1, n);
            else if (!standby_on_host_side && node != standby) ask_from(took, node, 0, "10.0.0.2", t + k, 1, n);
          }
          host_formed = host_formed || host.try_form(t + k).has_value();
          if (!standby_on_host_side) took_formed = took_formed || took.try_form(t + k).has_value();
        }
        const int host_side = std::popcount(side);
        INFO("n " << n << " standby " << standby << " side " << side);
        CHECK_FALSE((host_formed && took_formed));
        CHECK(host_formed == (2 * host_side >= n));
        if (!standby_on_host_side) CHECK(took_formed == (2 * (n - host_side) > n));
      }
}

TEST_CASE("elastic rendezvous: a round over the job token's TLS channel; a wrong token is not served",
          "[elastic][network]") {
  auto token = generate_job_token();
  REQUIRE(token);
  RendezvousHost host(settings(1, 2));
  auto server = PskServer::start(
      "127.0.0.1", 0, token.value(), [&](const std::string& line) { return host.answer(line, Clock::now()); },
      "the elastic rendezvous");
  REQUIRE(server);
  host.open_round(Clock::now());
  auto asked = psk_request("127.0.0.1", server.value()->port(), token.value(), encode_join({1, 2, 1, 2, 0, -1}));
  REQUIRE(asked);
  CHECK(parse_answer(asked.value())->kind == JoinAnswer::Kind::wait);
  REQUIRE(host.try_form(Clock::now()));  // both of 2
  asked = psk_request("127.0.0.1", server.value()->port(), token.value(), encode_join({1, 2, 1, 2, 0, -1}));
  REQUIRE(asked);
  auto go = parse_answer(asked.value());
  REQUIRE(go);
  CHECK(go->kind == JoinAnswer::Kind::go);
  CHECK(go->go.nodes == 2);
  auto other = generate_job_token();
  REQUIRE(other);
  CHECK_FALSE(psk_request("127.0.0.1", server.value()->port(), other.value(), encode_join({1, 2, 1, 2, 0, -1})));
}
