// Rounds of nodes for `troupe launch --nnodes MIN:MAX` and `--spares K` (docs/RESILIENCE.md,
// "Elastic"): before
// each attempt ("round") the nodes' launchers meet at node 0's launcher (the host), which decides
// who is in the round and numbers them; the ranks of the round then meet as usual (their own rendezvous, at the
// master's port + 1). A node lost for good is left out of the next round once MIN nodes are there
// and the last call has passed; a node that comes back asks to join and node 0 takes it in at the
// job's next snapshot (the running round stops there, all rejoin). Spare nodes (node ranks MAX ..
// MAX+K-1) ask like any other and wait: a round takes at most MAX nodes (node 0, then the last
// round's members, then the lowest node ranks), so a lost node's place is filled at once.
//
// The host's standby. Once a round of several nodes has formed, the host names a standby: the
// round's lowest node on another host than its own (on one host, its lowest other node), at the
// address that node asks from and MASTER_PORT (on the host's own host, the other of MASTER_PORT and
// MASTER_PORT + 2). Every answer carries it. When the host stops answering for kFailoverAfter, the
// standby hosts the rounds at its place, taking over the round number and the run id, and the
// others ask there too (alternately with the old place). So that two sides of a partition never
// both go on, a host forms a round only with at least half of the last round's nodes present
// (itself counted), a standby that took over only with more than half.
//
// Protocol: one request line, one answer, over the job token's TLS channel (psk_channel.hpp: a
// launcher without the token is never answered). Request, every 0.2 s while a launcher waits:
//
//   troupe-rdzv 2 join NODE NPROC MIN MAX SPARES LAST ADDR
//        NODE: its --node-rank (0 .. MAX+SPARES-1, not the host's own); NPROC, MIN, MAX, SPARES: its
//        --nproc-per-node, --nnodes MIN:MAX and --spares (the host refuses others than its own);
//        LAST: the last round it ran, -1 before its first; ADDR: the address it asks from (the
//        kernel's source address toward the host), or '-' when unknown (it is then never standby)
//   troupe-rdzv 2 moved ROUND RUN_ID ADDR PORT
//        sent every second by a standby that took over to the old place (MASTER_ADDR:MASTER_PORT):
//        the job's rounds are hosted at ADDR:PORT, its last round ROUND, its run RUN_ID. A node 0
//        launcher started again there (host0 back) that has formed no round yet answers `follow`
//        and joins at ADDR:PORT as a node of the job instead of starting a job of its own; so does
//        the old host of the same run waiting for a round it cannot form (the minority side of a
//        split, once the split heals).
// Answers (STANDBY: `none`, or `NODE ADDR PORT` -- the standby's node rank and place):
//   wait ROUND PRESENT STANDBY                ROUND being formed (or running, the asker not in it);
//                                             PRESENT nodes asking now, the host counted
//   go ROUND GROUP_RANK NODES RUN_ID STANDBY  run round ROUND as node GROUP_RANK of NODES; RUN_ID:
//                                             the job's run id (node 0's launcher's)
//   done                                      the job finished: nothing to join
//   failed                                    the job failed (its restarts ran out): nothing to join
//   refused REASON                            the request cannot be served (REASON: printable ASCII)
//   follow                                    (to `moved`) this launcher joins the job at that place
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
// How long the standby waits without an answer from the host before it hosts the rounds itself.
inline constexpr std::chrono::seconds kFailoverAfter{5};

struct JoinRequest {
  int node = 0;         // the asker's --node-rank
  int nproc = 0;        // its --nproc-per-node
  int min_nodes = 0;    // its --nnodes MIN:MAX
  int max_nodes = 0;
  int spares = 0;       // its --spares
  int last_round = -1;  // the last round it ran (-1: none yet)
  std::string addr = "-";  // the address it asks from ('-': unknown)
};

// Where the rounds go when their host is lost.
struct ElasticStandby {
  int node = 0;      // its --node-rank
  std::string addr;  // numeric address (or host name) of its host
  int port = 0;      // where it would host the rounds (1..65535)
  bool operator==(const ElasticStandby&) const = default;
};

struct RoundAssignment {
  int round = 0;
  int group_rank = 0;  // this node's index in the round (GROUP_RANK)
  int nodes = 0;       // the round's node count (GROUP_WORLD_SIZE)
  std::string run_id;  // node 0's run id (32 lowercase hex digits)
  // Not on the wire: the host's place (the launcher fills it in: its ranks meet at its port + 1).
  std::string host_addr;
  int host_port = 0;
};

// A standby that took over tells the old place where the rounds are now.
struct MovedNotice {
  int round = 0;       // the last round formed (or taken over)
  std::string run_id;  // the job's run id
  std::string addr;    // where the rounds are hosted
  int port = 0;
  bool operator==(const MovedNotice&) const = default;
};

struct JoinAnswer {
  enum class Kind { wait, go, done, failed, refused, follow };
  Kind kind = Kind::wait;
  int round = 0;    // wait: the round being formed or running
  int present = 0;  // wait: nodes asking now, node 0 counted
  RoundAssignment go;
  std::optional<ElasticStandby> standby;  // wait and go
  std::string reason;  // refused
};

std::string encode_join(const JoinRequest& r);
Result<JoinRequest> parse_join(std::string_view line);
std::string encode_moved(const MovedNotice& m);
Result<MovedNotice> parse_moved(std::string_view line);
std::string encode_answer(const JoinAnswer& a);
Result<JoinAnswer> parse_answer(std::string_view line);

// The host's side (node 0's launcher, or a standby that took over): who is in each round. Thread-safe: answer() runs on the TLS server's thread,
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
    int host_node = 0;       // the hosting launcher's --node-rank
    std::string host_addr;   // its address as the others reach it (the standby's other-host test)
    int host_port = 0;       // the port it hosts on
    int master_port = 0;     // --master-port (where a standby on another host would host)
    // A standby that took over: the round that failed with the host and its node count (the
    // first round it forms needs more than half of them).
    int taken_over_round = -1;
    int taken_over_nodes = 0;
  };
  struct Round {
    int round = 0;
    std::vector<int> members;  // node ranks, the host first, then ascending; members[group rank]
    std::optional<ElasticStandby> standby;
  };
  explicit RendezvousHost(Settings s);

  // One request line in, one answer line out (never throws; a bad line is refused, naming why).
  std::string answer(std::string_view request, Clock::time_point now);
  // Node 0 enters the rendezvous of the next round (after the first start or a failed round).
  void open_round(Clock::time_point now);
  // The open round, formed once MAX nodes ask, or MIN and the last call has passed since MIN were
  // there, and at least half of the last round's nodes ask (more than half for a standby's first
  // round); nullopt while it waits. The host is always members[0]; of more than MAX asking
  // (spares), the last round's members come first, then the lowest node ranks.
  std::optional<Round> try_form(Clock::time_point now);
  // The last round formed (or taken over), -1 before the first.
  int round() const;
  // The last round's nodes this host still needs before a round can form (0: none).
  int quorum_missing(Clock::time_point now) const;
  // The nodes asking now (the host first): while a round is being formed, those that asked since it
  // was opened (a member of the last round asked before its end is no proof it outlived it), and
  // within the stale time; and the seconds left of the last call (-1: not running).
  std::vector<int> present(Clock::time_point now) const;
  double last_call_left(Clock::time_point now) const;
  // A node asks to join while a round of fewer than MAX runs without it (it asked since the round
  // formed, within the stale time): the running round should end at its next snapshot so that the
  // next round takes the node in. (A spare of a full round waits.)
  bool newcomer_waiting(Clock::time_point now) const;
  // The job ended: every further request is answered `done`, or `failed`.
  void finish(bool failed);
  // A `moved` notice this host followed (it had formed no round): where the job's rounds are.
  std::optional<MovedNotice> moved_to() const;

 private:
  std::vector<int> present_locked(Clock::time_point now) const;
  int quorum_missing_locked(const std::vector<int>& here) const;
  bool was_member_locked(int node) const;
  std::optional<ElasticStandby> name_standby_locked() const;
  Settings s_;
  mutable std::mutex mu_;
  int round_ = -1;           // the last round formed
  bool open_ = false;        // a round is being formed
  bool done_ = false;
  bool failed_ = false;
  std::vector<int> members_;  // of round_
  int last_nodes_ = 0;        // members_.size(), or Settings::taken_over_nodes before this host's first round
  bool strict_ = false;       // a standby's first round: more than half of the last round's nodes
  std::optional<ElasticStandby> standby_;  // of round_
  std::optional<MovedNotice> moved_to_;
  std::map<int, Clock::time_point> seen_;  // node -> when it last asked (the host excluded)
  std::map<int, int> last_of_;             // node -> the LAST of its latest request
  std::map<int, std::string> addr_of_;     // node -> the ADDR of its latest request
  std::optional<Clock::time_point> min_since_;
  Clock::time_point opened_{};  // when the round being formed was opened
  Clock::time_point formed_{};  // when round_ formed
};

}  // namespace troupe::comm
