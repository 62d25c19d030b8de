// Rounds of nodes for `troupe launch --nnodes MIN:MAX` and `--spares K` (docs/RESILIENCE.md,
// "Elastic"): before
// each attempt ("round") the nodes' launchers meet at node 0's launcher, which decides who is in the
// round and numbers them; the ranks of the round then meet as usual (their own rendezvous, at the
// master's port + 1). A node lost for good is left out of the next round once MIN nodes are there
// and the last call has passed; a node that comes back asks to join and node 0 takes it in at the
// job's next snapshot (the running round stops there, all rejoin). Spare nodes (node ranks MAX ..
// MAX+K-1) ask like any other and wait: a round takes at most MAX nodes (node 0, then the last
// round's members, then the lowest node ranks), so a lost node's place is filled at once.
//
// Protocol: one request line, one answer, over the job token's TLS channel (psk_channel.hpp: a
// launcher without the token is never answered). Request, every 0.2 s while a launcher waits:
//
//   troupe-rdzv 1 join NODE NPROC MIN MAX SPARES LAST
//        NODE: its --node-rank (1 .. MAX+SPARES-1; node 0 hosts); NPROC, MIN, MAX, SPARES: its
//        --nproc-per-node, --nnodes MIN:MAX and --spares (node 0 refuses others than its own);
//        LAST: the last round it ran, -1 before its first
// Answers:
//   wait ROUND PRESENT                 ROUND being formed (or running, the asker not in it); PRESENT
//                                      nodes asking now, node 0 counted
//   go ROUND GROUP_RANK NODES RUN_ID   run round ROUND as node GROUP_RANK of NODES; RUN_ID: node 0's
//   done                               the job finished: nothing to join
//   failed                             the job failed (node 0's restarts ran out): nothing to join
//   refused REASON                     the request cannot be served (REASON: printable ASCII)
//
// Numbers are decimal without sign or leading zeros; fields one space apart; nothing else on the
// line. The readers are strict (fuzz target elastic_rendezvous) and bounded: a line is at most
// kMaxRendezvousLine bytes.
#pragma once
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::comm {

inline constexpr size_t kMaxRendezvousLine = 1024;
inline constexpr int kMaxElasticNodes = 100000;  // --nnodes' own bound

struct JoinRequest {
  int node = 0;         // the asker's --node-rank
  int nproc = 0;        // its --nproc-per-node
  int min_nodes = 0;    // its --nnodes MIN:MAX
  int max_nodes = 0;
  int spares = 0;       // its --spares
  int last_round = -1;  // the last round it ran (-1: none yet)
};

struct RoundAssignment {
  int round = 0;
  int group_rank = 0;  // this node's index in the round (GROUP_RANK)
  int nodes = 0;       // the round's node count (GROUP_WORLD_SIZE)
  std::string run_id;  // node 0's run id (32 lowercase hex digits)
};

struct JoinAnswer {
  enum class Kind { wait, go, done, failed, refused };
  Kind kind = Kind::wait;
  int round = 0;    // wait: the round being formed or running
  int present = 0;  // wait: nodes asking now, node 0 counted
  RoundAssignment go;
  std::string reason;  // refused
};

std::string encode_join(const JoinRequest& r);
Result<JoinRequest> parse_join(std::string_view line);
std::string encode_answer(const JoinAnswer& a);
Result<JoinAnswer> parse_answer(std::string_view line);

// Node 0's side: who is in each round. Thread-safe: answer() runs on the TLS server's thread,
// the rest on the launcher's. Time is given by the caller (tests step it).
class RendezvousHost {
 public:
  using Clock = std::chrono::steady_clock;
  struct Settings {
    int min_nodes = 1;
    int max_nodes = 1;
    int spares = 0;
    int nproc = 1;
    std::string run_id;
    Clock::duration last_call = std::chrono::seconds(30);  // torchrun's last_call_timeout
    // A node that has not asked for this long is taken to be gone (waiters ask every 0.2 s).
    Clock::duration stale = std::chrono::seconds(3);
  };
  struct Round {
    int round = 0;
    std::vector<int> members;  // node ranks, ascending; members[group rank]
  };
  explicit RendezvousHost(Settings s);

  // One request line in, one answer line out (never throws; a bad line is refused, naming why).
  std::string answer(std::string_view request, Clock::time_point now);
  // Node 0 enters the rendezvous of the next round (after the first start or a failed round).
  void open_round(Clock::time_point now);
  // The open round, formed once MAX nodes ask, or MIN and the last call has passed since MIN were
  // there; nullopt while it waits. Node 0 is always members[0]; of more than MAX asking (spares),
  // the last round's members come first, then the lowest node ranks.
  std::optional<Round> try_form(Clock::time_point now);
  // The nodes asking now (node 0 first): while a round is being formed, those that asked since it
  // was opened (a member of the last round asked before its end is no proof it outlived it), and
  // within the stale time; and the seconds left of the last call (-1: not running).
  std::vector<int> present(Clock::time_point now) const;
  double last_call_left(Clock::time_point now) const;
  // A node asks to join while a round of fewer than MAX runs without it: the running round should
  // end at its next snapshot so that the next round takes the node in. (A spare of a full round
  // waits.)
  bool newcomer_waiting(Clock::time_point now) const;
  // The job ended: every further request is answered `done`, or `failed`.
  void finish(bool failed);

 private:
  std::vector<int> present_locked(Clock::time_point now) const;
  Settings s_;
  mutable std::mutex mu_;
  int round_ = -1;           // the last round formed
  bool open_ = false;        // a round is being formed
  bool done_ = false;
  bool failed_ = false;
  std::vector<int> members_;  // of round_
  std::map<int, Clock::time_point> seen_;  // node -> when it last asked (node 0 excluded)
  std::optional<Clock::time_point> min_since_;
  Clock::time_point opened_{};  // when the round being formed was opened
};

}  // namespace troupe::comm
