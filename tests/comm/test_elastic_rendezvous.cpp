// The rounds of an elastic job (comm/bootstrap/elastic_rendezvous.hpp): node 0's decisions stepped
// in time without a network, the strict readers of both lines, and one round over the real TLS
// channel with the job token.
#include <catch2/catch.hpp>
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
  std::mt19937 rng(4242);
  for (int trial = 0; trial < 40; ++trial) {
    const int max_nodes = 2 + static_cast<int>(rng() % 6), min_nodes = 1 + static_cast<int>(rng() % max_nodes);
    RendezvousHost host(settings(min_nodes, max_nodes));
    auto t = Clock::now();
    int last = -1;
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
      if (here < min_nodes) {
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
      t += seconds(10);  // the round runs; the nodes stop asking
    }
  }
}

TEST_CASE("elastic rendezvous: each line has one spelling; strict readers", "[elastic]") {
  const JoinRequest r{7, 8, 2, 16, 3, 41};
  auto back = parse_join(encode_join(r));
  REQUIRE(back);
  CHECK(encode_join(back.value()) == encode_join(r));
  CHECK(parse_join("troupe-rdzv 1 join 1 2 1 2 0 -1"));
  CHECK(parse_join("troupe-rdzv 1 join 2 2 1 2 1 -1"));  // a spare
  for (const char* bad : {"troupe-rdzv 1 join 1 2 1 2 0", "troupe-rdzv 2 join 1 2 1 2 0 -1", "troupe-rdzv 1 join 01 2 1 2 0 -1",
                          "troupe-rdzv 1 join 1 2 1 2 0 -2", "troupe-rdzv 1 join 2 2 1 2 0 -1", "troupe-rdzv 1 join 1 0 1 2 0 -1",
                          "troupe-rdzv 1 join 1 2 3 2 0 -1", "troupe-rdzv 1 join 1 2 1 2 0 -1 ", "troupe-rdzv  1 join 1 2 1 2 0 -1",
                          "troupe-rdzv 1 join +1 2 1 2 0 -1", "troupe-rdzv 1 join 1 2 1 2 -1 -1", "troupe-rdzv 1 join 3 2 1 2 1 -1", ""})
    CHECK_FALSE(parse_join(bad));
  for (const char* good : {"wait 3 2", "go 4 1 3 0123456789abcdef0123456789abcdef", "done", "failed", "refused no"}) {
    auto a = parse_answer(good);
    REQUIRE(a);
    CHECK(encode_answer(a.value()) == good);
  }
  for (const char* bad : {"wait 3 0", "go 4 3 3 0123456789abcdef0123456789abcdef", "go 4 1 3 0123456789ABCDEF0123456789abcdef",
                          "go 4 1 3 00", "refused ", "refused \x01", "waiting", "wait 1", "done "})
    CHECK_FALSE(parse_answer(bad));
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
