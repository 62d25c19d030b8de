// What node 0's launcher reads from the other launchers of an elastic job (a join request) and
// what they read back (an answer), comm/bootstrap/elastic_rendezvous.hpp; and node 0's answering of
// any line, as node 0 and as a standby that took over. Properties: an accepted line has one spelling (it writes back to its very bytes), its
// fields are within their bounds, and node 0 answers any line with an answer its peers accept.
#include <string>

#include "comm/bootstrap/elastic_rendezvous.hpp"
#include "comm/bootstrap/rendezvous_place.hpp"
#include "fuzz/fuzz_targets.hpp"

namespace troupe::fuzz {

Status elastic_rendezvous(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  comm::RendezvousHost::Settings s;
  s.min_nodes = 1;
  s.max_nodes = 4;
  s.nproc = 2;
  s.spares = 1;
  s.run_id = "0123456789abcdef0123456789abcdef";
  comm::RendezvousHost host(s);
  const auto now = comm::RendezvousHost::Clock::now();
  host.open_round(now);
  TROUPE_CHECK(comm::parse_answer(host.answer(text, now)).is_ok(), "node 0 answered a line its peers refuse");
  (void)host.try_form(now);
  TROUPE_CHECK(comm::parse_answer(host.answer(text, now)).is_ok(), "node 0 answered a line its peers refuse");
  // A standby that took over round 0 (of 2 nodes) at node 1's place.
  s.host_node = 1;
  s.host_addr = "10.0.0.2";
  s.host_port = s.master_port = 29500;
  s.taken_over_round = 0;
  s.taken_over_nodes = 2;
  s.last_call = std::chrono::seconds(0);
  comm::RendezvousHost took(s);
  took.open_round(now);
  TROUPE_CHECK(comm::parse_answer(took.answer(text, now)).is_ok(), "a standby answered a line its peers refuse");
  if (auto formed = took.try_form(now))
    TROUPE_CHECK(formed->members.front() == 1 && formed->round == 1, "a standby's round without it, or misnumbered");
  TROUPE_CHECK(comm::parse_answer(took.answer(text, now)).is_ok(), "a standby answered a line its peers refuse");
  auto join = comm::parse_join(text);
  auto answer = comm::parse_answer(text);
  if (join) {
    const comm::JoinRequest& r = join.value();
    TROUPE_CHECK(r.node >= 0 && r.min_nodes >= 1 && r.min_nodes <= r.max_nodes &&
                     r.nproc >= 1 && r.spares >= 0 && r.node < r.max_nodes + r.spares && r.last_round >= -1,
                 "a join request out of bounds accepted");
    TROUPE_CHECK(r.addr == "-" || comm::valid_place_addr(r.addr), "a join request with a bad address accepted");
    TROUPE_CHECK(comm::encode_join(r) == text, "a join request has one spelling");
  }
  if (answer) {
    if (answer->kind == comm::JoinAnswer::Kind::go)
      TROUPE_CHECK(answer->go.group_rank < answer->go.nodes && answer->go.run_id.size() == 32, "a go out of bounds");
    if (answer->standby)
      TROUPE_CHECK(answer->standby->port >= 1 && answer->standby->port <= 65535 &&
                       comm::valid_place_addr(answer->standby->addr),
                   "a standby out of bounds");
    TROUPE_CHECK(comm::encode_answer(answer.value()) == text, "an answer has one spelling");
  }
  auto moved = comm::parse_moved(text);
  if (moved) {
    TROUPE_CHECK(moved->port >= 1 && moved->port <= 65535 && moved->run_id.size() == 32 &&
                     comm::valid_place_addr(moved->addr),
                 "a moved notice out of bounds");
    TROUPE_CHECK(comm::encode_moved(moved.value()) == text, "a moved notice has one spelling");
  }
  if (!join && !answer && !moved) return join.status();
  return Status::ok();
}

}  // namespace troupe::fuzz
