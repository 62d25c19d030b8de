#include "comm/bootstrap/caf_bootstrap.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "comm/bootstrap/net_plan.hpp"
#include "comm/bootstrap/secure_transport.hpp"

namespace troupe::comm {

namespace {

// ---- Messages (registered on every rank: they cross processes) ----------------------------------

// No token: the connection that carries a join has already proven it (comm/bootstrap/secure_transport.hpp).
// A spare's join: any lost rank's place (CafBootstrapOptions::open_places).
constexpr int32_t kSpareRank = -2;

struct JoinRequest {
  int32_t rank = -1;  // kSpareRank for a spare
  int32_t world_size = 0;
  std::string host;  // as the joiner names itself (for logs)
  int32_t pid = 0;
  std::string rdzv_id;  // the launcher's --rdzv-id (TROUPE_RDZV_ID), "" when none was given
  int32_t attempt = 0;  // TROUPE_RESTART_COUNT, or the generation of in-job recovery (kAnyGeneration)
  // The numeric address the joiner reaches the rendezvous from ("" unknown, and for its own host's
  // join): where it would host the rendezvous as the standby.
  std::string addr;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JoinRequest& x) {
  return f(caf::meta::type_name("troupe.JoinRequest6"), x.rank, x.world_size, x.host, x.pid, x.rdzv_id, x.attempt,
           x.addr);
}

// A restarted rank that reaches the failed rank 0 of the attempt before its own (still ending on the
// same port) is told so with this text, and tries again until its own rank 0 listens.
constexpr const char* kEarlierAttempt = "rank 0 there is of an earlier attempt of the job";
// The rendezvous went away (before the join was answered: the failed attempt's rank 0 ending as a
// restarted rank reached it).
constexpr const char* kLostRendezvous = "lost the rendezvous on ";
constexpr const char* kClosedRendezvous = " has closed (rank 0 finished)";

// TROUPE_RESTART_COUNT (troupe launch) or TORCHELASTIC_RESTART_COUNT (torchrun): 0 when unset or not
// a count.
int32_t attempt_from_env() {
  for (const char* name : {"TROUPE_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n >= 0 && n < (1L << 30)) return static_cast<int32_t>(n);
  }
  return 0;
}

// Which start of the job this process joins as: the options' attempt, else the environment's.
int32_t attempt_of(const CafBootstrapOptions& options) {
  return options.attempt.value_or(attempt_from_env());
}

using join_atom = caf::atom_constant<caf::atom("bs_join")>;
using gather_atom = caf::atom_constant<caf::atom("bs_gather")>;
using leave_atom = caf::atom_constant<caf::atom("bs_leave")>;
using drain_atom = caf::atom_constant<caf::atom("bs_drain")>;
using timeout_atom = caf::atom_constant<caf::atom("bs_timeout")>;
using failed_atom = caf::atom_constant<caf::atom("bs_failed")>;
using report_atom = caf::atom_constant<caf::atom("bs_report")>;
using end_atom = caf::atom_constant<caf::atom("bs_end")>;
using offer_atom = caf::atom_constant<caf::atom("bs_offer")>;
using standby_atom = caf::atom_constant<caf::atom("bs_standby")>;
using lonely_atom = caf::atom_constant<caf::atom("bs_lonely")>;

// The rendezvous (rank 0, published). drain and timeout are accepted from this process only.
using rendezvous_actor = caf::typed_actor<
    caf::replies_to<join_atom, JoinRequest>::with<int32_t>,  // -> the joiner's rank (a spare's: its place)
    // (key, blob) -> every rank's blob in rank order
    caf::replies_to<gather_atom, std::string, std::string>::with<std::vector<std::string>>,
    caf::replies_to<leave_atom>::with<leave_atom>,
    caf::replies_to<drain_atom>::with<drain_atom>,  // answered once every joined rank disconnected
    caf::reacts_to<timeout_atom, std::string>,      // a gather's deadline passed
    caf::reacts_to<report_atom>,                    // time to say who has not joined yet
    caf::replies_to<end_atom, std::string>::with<end_atom>,  // the job ended (this process): tell the spares
    caf::reacts_to<offer_atom>,   // the spare grace passed: places nobody took are open to spares
    caf::reacts_to<lonely_atom>>;  // a standby's rendezvous: failover_after passed, has anyone joined?

// A rank's agent (one per rank, local): relays its calls and learns of the job's failure.
using agent_actor = caf::typed_actor<
    caf::replies_to<join_atom, JoinRequest>::with<int32_t>,
    caf::replies_to<gather_atom, std::string, std::string>::with<std::vector<std::string>>,
    caf::replies_to<leave_atom>::with<leave_atom>,
    caf::reacts_to<failed_atom, std::string>,  // from the rendezvous: the job failed, and why
    // from the rendezvous: where it is (addr, port, its host's rank) and its standby (the same)
    caf::reacts_to<standby_atom, std::string, int32_t, int32_t, std::string, int32_t, int32_t>>;

constexpr size_t kMaxBlobBytes = 1 << 20;

// Room in a message for CAF's own framing besides the blobs of a gather reply.
size_t gather_budget(size_t max_message_bytes, int world_size) {
  const size_t overhead = (size_t{64} << 10) + 16 * static_cast<size_t>(world_size);
  return max_message_bytes > overhead ? max_message_bytes - overhead : 0;
}

using Logger = std::function<void(const std::string&)>;

caf::error bootstrap_error(std::string message) {
  return caf::error(1, caf::atom("bootstrap"), caf::make_message(std::move(message)));
}

std::string render(const caf::error& err) {
  if (!err) return "no error";
  if (err.category() == caf::atom("bootstrap") && err.context().match_elements<std::string>())
    return err.context().get_as<std::string>(0);
  if (err.category() == caf::atom("exit"))
    return caf::to_string(static_cast<caf::exit_reason>(err.code()));
  if (err.category() == caf::atom("system")) {
    std::string s = caf::to_string(static_cast<caf::sec>(err.code()));
    if (!err.context().empty()) s += " " + caf::to_string(err.context());
    return s;
  }
  return caf::to_string(err);
}

bool is_orderly_exit(const caf::error& reason) {
  return !reason || reason == caf::exit_reason::normal || reason == caf::exit_reason::user_shutdown;
}

bool same_actor(const caf::strong_actor_ptr& a, const caf::actor_addr& b) {
  return a && caf::actor_cast<caf::actor_addr>(a) == b;
}

std::string seconds_text(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}
std::string limit_text(std::chrono::milliseconds d) { return seconds_text(d); }
std::string limit_text(caf::infinite_t) { return "ever"; }

// ---- Rendezvous ---------------------------------------------------------------------------------

struct Member {
  agent_actor agent;
  std::string host;
  int32_t pid = 0;
  std::string addr;   // JoinRequest::addr
  bool left = false;  // said goodbye: its disconnect is not a failure
  bool gone = false;  // disconnected
};

struct Gather {
  std::vector<std::optional<std::string>> blobs;  // by rank
  std::vector<caf::response_promise> promises;    // by rank
  int count = 0;
  size_t bytes = 0;  // of the blobs so far
};

// The states declare a constructor: as aggregates, C++20's parenthesised aggregate init would make
// CAF try to build them from the actor pointer.
// What rank 0's rendezvous is started with.
struct RendezvousSetup {
  int world_size = 0;
  size_t gather_budget = 0;  // the most blob bytes one gather's reply may carry
  std::chrono::milliseconds collective_timeout{0};
  std::chrono::milliseconds join_timeout{0};
  std::chrono::milliseconds report_interval{0};
  std::string rdzv_id;     // rank 0's; a joiner's must be the same
  std::vector<int> open_places;  // ranks a spare may take (CafBootstrapOptions::open_places)
  std::chrono::milliseconds spare_grace{0};  // then any place not taken is open to spares too
  // The ranks that disconnected without leaving, for CafBootstrap::lost_ranks (read from rank 0's thread).
  struct Lost {
    std::mutex mutex;
    std::vector<int> ranks;
  };
  std::shared_ptr<Lost> lost = std::make_shared<Lost>();
  int32_t attempt = 0;     // rank 0's JoinRequest::attempt; a joiner of a later one is told to retry
  bool in_job = false;     // in-job recovery: the generations' rules (CafBootstrapOptions::in_job_recovery)
  int ranks_per_node = 0;  // when every node runs as many ranks (troupe launch, torchrun); 0: unknown
  // The rendezvous moves (rendezvous_place.hpp): the rank of the process that hosts it, the job's
  // MASTER_PORT (the standby takes the other of it and the port after it), and whether this is a
  // standby's (it gives up when nobody else joins within failover_after).
  int owner_rank = 0;
  int base_port = 0;
  bool standby_hosted = false;
  std::chrono::milliseconds failover_after{0};
  // "addr:port" of the rendezvous, for the messages: set once published (the port may be the
  // kernel's pick), read by the rendezvous's reports.
  struct Where {
    std::mutex mutex;
    std::string text;
    RendezvousPlace place;  // as the joiners reach it
  };
  std::shared_ptr<Where> where = std::make_shared<Where>();
  std::string where_text() const {
    std::lock_guard<std::mutex> lock(where->mutex);
    return where->text;
  }
  RendezvousPlace where_place() const {
    std::lock_guard<std::mutex> lock(where->mutex);
    return where->place;
  }
  Logger log;
};

struct RendezvousState {
  RendezvousState() = default;
  int world_size = 0;
  size_t gather_budget = 0;  // the most blob bytes one gather's reply may carry
  std::chrono::milliseconds collective_timeout{0};
  RendezvousSetup setup;
  std::chrono::steady_clock::time_point started;
  Logger log;
  std::vector<std::optional<Member>> members;  // by rank, once joined
  std::map<std::string, Gather> gathers;       // in progress
  std::map<std::string, std::string> closed;   // finished keys -> "" (completed) or why they failed
  std::string failure;                         // set once the job failed
  std::vector<caf::response_promise> drains;
  // Spares waiting for a place (answered when the rendezvous fails or the job ends), the places
  // spares took, and the job's end once announced.
  struct Spare {
    caf::response_promise promise;
    agent_actor agent;
    std::string host;
    int32_t pid = 0;
    std::string addr;
  };
  std::vector<Spare> spares;
  std::set<int> open;  // places a spare may take: the lost ranks', and after the grace any free one
  std::set<int> taken_by_spare;
  std::string ended;
  std::optional<RendezvousPlace> standby;  // named once every rank joined (in-job recovery)
  static inline const char* name = "troupe.rendezvous";
};

using RendezvousPtr = rendezvous_actor::stateful_pointer<RendezvousState>;

std::string member_text(const RendezvousState& st, int rank) {
  std::string s = "rank " + std::to_string(rank);
  if (rank >= 0 && rank < static_cast<int>(st.members.size()) && st.members[rank])
    s +=
        " (host " + st.members[rank]->host + ", pid " + std::to_string(st.members[rank]->pid) + ")";
  return s;
}

int rank_of_sender(RendezvousPtr self) {
  const auto& sender = self->current_sender();
  auto& members = self->state.members;
  for (size_t r = 0; r < members.size(); ++r)
    if (members[r] && same_actor(sender, members[r]->agent.address())) return static_cast<int>(r);
  return -1;
}

bool from_this_process(RendezvousPtr self) {
  const auto& sender = self->current_sender();
  return sender && sender->node() == self->node();
}

// Refuses the current request with `reply` and logs `what` with the peer's network address. The
// reply waits for the middleman's answer, so the peer is still connected (and its address known)
// when asked.
caf::response_promise refuse(RendezvousPtr self, const std::string& what, caf::error reply) {
  const auto sender = self->current_sender();  // before make_response_promise, which takes it over
  auto promise = self->make_response_promise();
  const Logger log = self->state.log;
  if (!sender || sender->node() == self->node()) {
    log("refused " + what + (sender ? " from this process" : " from an anonymous sender"));
    promise.deliver(std::move(reply));
    return promise;
  }
  const caf::node_id node = sender->node();
  const std::string tail = " (CAF node " + caf::to_string(node) + ")";
  self->request(self->home_system().middleman().actor_handle(), std::chrono::seconds(5),
                caf::get_atom::value, node)
      .then(
          [=](const caf::node_id&, const std::string& host, uint16_t port) mutable {
            log("refused " + what + " from " +
                (host.empty() ? "an unknown address" : host + ":" + std::to_string(port)) + tail);
            promise.deliver(reply);
          },
          [=](caf::error&) mutable {
            log("refused " + what + " from an unknown address" + tail);
            promise.deliver(reply);
          });
  return promise;
}

void answer_drains(RendezvousPtr self) {
  auto& st = self->state;
  bool all_gone = true;
  for (const auto& m : st.members) all_gone = all_gone && (!m || m->gone);
  // Under in-job recovery a failed generation's rendezvous waits for every rank too (a bounded
  // wait: CafBootstrap::Impl::shutdown), so it learns every rank lost with the one that failed it
  // (a host's ranks die together, their disconnects a moment apart): their places open to spares.
  if (!all_gone && (st.failure.empty() || st.setup.in_job)) return;
  for (auto& p : st.drains) p.deliver(drain_atom::value);
  st.drains.clear();
}

void fail_gather(RendezvousPtr self, const std::string& key, const std::string& why) {
  auto it = self->state.gathers.find(key);
  if (it == self->state.gathers.end()) return;
  for (auto& p : it->second.promises)
    if (p.pending()) p.deliver(bootstrap_error(why));
  self->state.gathers.erase(it);
  self->state.closed[key] = why;
}

void fail_job(RendezvousPtr self, const std::string& why) {
  auto& st = self->state;
  if (!st.failure.empty()) return;
  st.failure = why;  // logged by each agent, rank 0's included
  // The broadcast goes first: an agent then knows the job failed before its pending call's error
  // reply arrives (messages from one sender arrive in order).
  for (auto& m : st.members)
    if (m && !m->left && !m->gone) self->send(m->agent, failed_atom::value, why);
  // Places a spare could have taken and no process holds stay open at the next generation.
  {
    std::lock_guard<std::mutex> lock(st.setup.lost->mutex);
    for (int place : st.open)
      if (!st.members[place]) st.setup.lost->ranks.push_back(place);
  }
  // Waiting spares try the next generation's rendezvous, where the lost places open.
  for (auto& sp : st.spares)
    sp.promise.deliver(bootstrap_error(std::string(kEarlierAttempt) + " (it failed: " + why + ")"));
  st.spares.clear();
  std::vector<std::string> keys;
  for (const auto& [key, g] : st.gathers) keys.push_back(key);
  for (const auto& key : keys) fail_gather(self, key, why);
  answer_drains(self);
}

// The first rank that left the job, or -1.
int first_departed(const RendezvousState& st) {
  for (size_t r = 0; r < st.members.size(); ++r)
    if (st.members[r] && (st.members[r]->left || st.members[r]->gone)) return static_cast<int>(r);
  return -1;
}

std::string id_text(const std::string& id) { return id.empty() ? "(none)" : "'" + id + "'"; }

// The ranks that have not joined, grouped by node when nodes are known: "ranks 2, 3 of node 1
// (no rank of it has joined: ...)". `why` ends each group's text.
std::string missing_text(const RendezvousState& st, std::vector<int>* missing_out) {
  std::vector<int> missing;
  for (int r = 0; r < st.world_size; ++r)
    if (!st.members[r]) missing.push_back(r);
  if (missing_out != nullptr) *missing_out = missing;
  auto list = [](const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s;
  };
  const int per_node = st.setup.ranks_per_node;
  if (per_node <= 0) return list(missing);
  std::map<int, std::vector<int>> by_node;
  for (int r : missing) by_node[r / per_node].push_back(r);
  std::string s;
  for (const auto& [node, ranks] : by_node) {
    std::string host;  // of a rank of this node that joined
    for (int r = node * per_node; r < std::min(st.world_size, (node + 1) * per_node) && host.empty(); ++r)
      if (st.members[r]) host = st.members[r]->host;
    s += (s.empty() ? "" : "; ") + list(ranks) + " of node " + std::to_string(node);
    if (node == 0)
      s += " (rank 0's own node: they have not started, or died before joining)";
    else if (!host.empty())
      s += " (on host " + host + ", where the node's other ranks joined: they have not started, or died)";
    else
      s += " (no rank of it has joined: start its launcher, troupe launch --node-rank " + std::to_string(node) +
           ", or check that it reaches " + st.setup.where_text() + ")";
  }
  return s;
}

// Every report_interval until all ranks joined: who is missing; at join_timeout the job fails.
void report_missing(RendezvousPtr self) {
  auto& st = self->state;
  if (!st.failure.empty()) return;
  std::vector<int> missing;
  const std::string text = missing_text(st, &missing);
  if (missing.empty()) return;
  const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - st.started);
  if (elapsed >= st.setup.join_timeout) {
    const std::string why = std::to_string(missing.size()) + " of " + std::to_string(st.world_size) +
                            " ranks never joined the rendezvous at " + st.setup.where_text() + " within " +
                            seconds_text(st.setup.join_timeout) + ": " + text +
                            " -- start every node's launcher with the same --nnodes, --nproc-per-node and master "
                            "address, or give them longer with --rdzv-conf join_timeout=SECONDS";
    st.log(why);
    fail_job(self, why);
    return;
  }
  if (elapsed >= st.setup.report_interval / 2)
    st.log("waiting for " + std::to_string(missing.size()) + " of " + std::to_string(st.world_size) +
           " ranks to join (" + seconds_text(std::chrono::duration_cast<std::chrono::seconds>(elapsed + std::chrono::milliseconds(500))) +
           " so far, giving up after " + seconds_text(st.setup.join_timeout) + "): " + text);
  const auto next = std::min(st.setup.report_interval, st.setup.join_timeout - elapsed);
  self->delayed_send(self, next, report_atom::value);
}

// Tells an agent where the rendezvous is and where it goes when lost.
void send_standby(RendezvousPtr self, const agent_actor& agent) {
  const auto& st = self->state;
  if (!st.standby) return;
  const RendezvousPlace at = st.setup.where_place();
  self->send(agent, standby_atom::value, at.addr, static_cast<int32_t>(at.port), static_cast<int32_t>(at.rank),
             st.standby->addr, static_cast<int32_t>(st.standby->port), static_cast<int32_t>(st.standby->rank));
}

// In-job recovery, once every rank has joined: names the standby (rendezvous_place.hpp) -- the
// lowest rank on another host than the rendezvous's, else the lowest other rank -- and tells every
// member and waiting spare.
void name_standby(RendezvousPtr self) {
  auto& st = self->state;
  if (!st.setup.in_job || st.standby || st.world_size < 2 || !st.failure.empty()) return;
  for (const auto& m : st.members)
    if (!m || m->gone || m->left) return;
  const int owner = st.setup.owner_rank;
  const std::string owner_host = owner >= 0 && owner < st.world_size ? st.members[owner]->host : "";
  int pick = -1;
  for (int pass = 0; pass < 2 && pick < 0; ++pass)
    for (int r = 0; r < st.world_size && pick < 0; ++r)
      if (r != owner && valid_place_addr(st.members[r]->addr) && (pass == 1 || st.members[r]->host != owner_host))
        pick = r;
  const RendezvousPlace at = st.setup.where_place();
  if (pick < 0 || at.port <= 0) return;
  const int base = st.setup.base_port > 0 ? st.setup.base_port : at.port;
  const int port = at.port != base ? base : base < 65535 ? base + 1 : base - 1;
  st.standby = RendezvousPlace{st.members[pick]->addr, port, pick};
  st.log("should this rendezvous be lost, " + member_text(st, pick) + " hosts the next at " +
         place_text(*st.standby));
  for (const auto& m : st.members) send_standby(self, m->agent);
  for (const auto& sp : st.spares) send_standby(self, sp.agent);
}

// Gives the open places no process holds to the waiting spares, first come first served.
void offer_places(RendezvousPtr self) {
  auto& st = self->state;
  for (int place : st.open) {
    if (st.spares.empty()) break;
    if (st.members[place]) continue;
    RendezvousState::Spare sp = std::move(st.spares.front());
    st.spares.erase(st.spares.begin());
    st.members[place] = Member{sp.agent, sp.host, sp.pid, sp.addr};
    st.taken_by_spare.insert(place);
    st.log("a spare (host " + sp.host + ", pid " + std::to_string(sp.pid) + ") takes the place of rank " +
           std::to_string(place));
    sp.promise.deliver(static_cast<int32_t>(place));
  }
  name_standby(self);
}

rendezvous_actor::behavior_type rendezvous(RendezvousPtr self, RendezvousSetup setup) {
  auto& st = self->state;
  st.world_size = setup.world_size;
  st.gather_budget = setup.gather_budget;
  st.collective_timeout = setup.collective_timeout;
  st.log = setup.log;
  st.setup = std::move(setup);
  st.started = std::chrono::steady_clock::now();
  st.members.resize(st.world_size);
  for (int place : st.setup.open_places)
    if (place >= 0 && place < st.world_size && place != st.setup.owner_rank) st.open.insert(place);
  // A standby's rendezvous that nobody else reaches: its own host was the one cut off.
  if (st.setup.standby_hosted && st.world_size > 1 && st.setup.failover_after.count() > 0)
    self->delayed_send(self, st.setup.failover_after, lonely_atom::value);
  // Not at the job's first generation: its ranks may start at any pace.
  if (st.setup.in_job && st.setup.attempt != 0 && st.world_size > 1 && st.setup.spare_grace.count() > 0)
    self->delayed_send(self, st.setup.spare_grace, offer_atom::value);
  if (st.world_size > 1 && st.setup.report_interval.count() > 0)
    self->delayed_send(self, std::min(st.setup.report_interval, st.setup.join_timeout), report_atom::value);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    st.spares.erase(std::remove_if(st.spares.begin(), st.spares.end(),
                                   [&](const RendezvousState::Spare& sp) { return sp.agent.address() == dm.source; }),
                    st.spares.end());
    for (size_t r = 0; r < st.members.size(); ++r) {
      auto& m = st.members[r];
      if (!m || m->gone || m->agent.address() != dm.source) continue;
      m->gone = true;
      // Lost: gone with its connection (died, cut off). A survivor that gives a failed generation up
      // ends its agent (user_shutdown) without leaving: it rejoins the next.
      if (!m->left && !is_orderly_exit(dm.reason)) {
        std::lock_guard<std::mutex> lock(st.setup.lost->mutex);
        st.setup.lost->ranks.push_back(static_cast<int>(r));
      }
      if (!m->left)
        fail_job(self, member_text(st, static_cast<int>(r)) +
                           " disconnected without leaving the job (" + render(dm.reason) +
                           "): it died, hung past the heartbeat timeout or lost the network");
    }
    answer_drains(self);
  });
  return {
      [self](join_atom, const JoinRequest& req) -> caf::result<int32_t> {
        auto& st = self->state;
        const std::string claim = "a peer claiming rank " + std::to_string(req.rank) + " of " +
                                  std::to_string(req.world_size) + " (host " + req.host + ", pid " +
                                  std::to_string(req.pid) + ")";
        // Before the failure check: a restarted rank may meet the failed attempt's rank 0, which
        // has not yet left the port to its own successor. (A healthy rank 0 of an earlier count
        // takes it: the nodes' launchers count their restarts each on its own.)
        const auto earlier = [&] {
          return bootstrap_error(std::string(kEarlierAttempt) + " (" + std::to_string(st.setup.attempt) +
                                 ", this rank's " + std::to_string(req.attempt) + ")");
        };
        if (req.rank == kSpareRank && !st.ended.empty()) return bootstrap_error(kJobEndedText + st.ended);
        if (req.attempt > st.setup.attempt && !st.failure.empty()) return earlier();
        // In-job recovery: a generation's rank 0 that has not yet noticed the failure its survivors
        // rejoin for is as earlier as a failed one, and a replacement process (any generation) waits
        // for a rendezvous that is healthy and whose place for it is free.
        if (st.setup.in_job && req.attempt == kAnyGeneration && !st.failure.empty()) return earlier();
        if (st.setup.in_job && st.setup.attempt != kAnyGeneration && req.attempt > st.setup.attempt) return earlier();
        // A rank's own process back (cut off, then reconnected) after a spare took its place, or
        // joining as a generation older than this one while its place is held: it is not the rank.
        if (st.setup.in_job && req.rank >= 0 && req.rank < st.world_size && st.members[req.rank] &&
            (st.taken_by_spare.count(req.rank) > 0 ||
             (req.attempt != kAnyGeneration && st.setup.attempt != kAnyGeneration && req.attempt < st.setup.attempt)))
          return bootstrap_error("rank " + std::to_string(req.rank) + kPlaceTakenText + " (now " +
                                 member_text(st, req.rank) + ")");
        if (st.setup.in_job && req.attempt == kAnyGeneration && req.rank >= 0 && req.rank < st.world_size &&
            st.members[req.rank])
          return earlier();
        if (!st.failure.empty())
          return bootstrap_error("the job has already failed: " + st.failure);
        if (req.world_size != st.world_size) {
          return refuse(
              self, claim + ": rank 0 runs a world of " + std::to_string(st.world_size),
              bootstrap_error("rank " + std::to_string(req.rank) + " was started for a world of " +
                              std::to_string(req.world_size) + " ranks but rank 0 for " +
                              std::to_string(st.world_size) +
                              " -- start every rank with the same world size"));
        }
        if (req.rdzv_id != st.setup.rdzv_id) {
          return refuse(
              self, claim + ": its --rdzv-id " + id_text(req.rdzv_id) + " is not rank 0's " + id_text(st.setup.rdzv_id),
              bootstrap_error("rank " + std::to_string(req.rank) + " was started with --rdzv-id " +
                              id_text(req.rdzv_id) + " but rank 0 with --rdzv-id " + id_text(st.setup.rdzv_id) +
                              " -- every launcher of a job must give the same --rdzv-id (is another job using "
                              "this master port?)"));
        }
        if (req.rank == kSpareRank && st.setup.in_job) {
          if (rank_of_sender(self) >= 0)
            return refuse(self, claim + ": a spare that already holds a rank", bootstrap_error("this process already holds a rank"));
          auto agent = caf::actor_cast<agent_actor>(self->current_sender());
          if (!agent) return bootstrap_error("a join request needs a sender to answer to");
          self->monitor(agent);
          // The lowest open place no process has taken back yet; else the spare waits here until a
          // place opens (the grace), this generation fails (it then asks the next one) or the job ends.
          auto promise = self->make_response_promise();
          st.spares.push_back({promise, agent, req.host, req.pid, req.addr});
          send_standby(self, agent);
          offer_places(self);
          return promise;
        }
        if (req.rank < 0 || req.rank >= st.world_size) {
          return refuse(
              self, claim + ": no such rank",
              bootstrap_error("rank " + std::to_string(req.rank) + " is outside the world of " +
                              std::to_string(st.world_size) + " -- ranks run from 0 to " +
                              std::to_string(st.world_size - 1)));
        }
        if (st.members[req.rank] || rank_of_sender(self) >= 0) {
          return refuse(self, claim + ": the rank has already joined",
                        bootstrap_error(member_text(st, req.rank) +
                                        " has already joined -- two processes were started "
                                        "with the same rank; check RANK / SLURM_PROCID / the "
                                        "launcher"));
        }
        auto agent = caf::actor_cast<agent_actor>(self->current_sender());
        if (!agent) return bootstrap_error("a join request needs a sender to answer to");
        self->monitor(agent);
        st.members[req.rank] = Member{agent, req.host, req.pid, req.addr};
        name_standby(self);
        return static_cast<int32_t>(req.rank);
      },
      [self](gather_atom, const std::string& key,
             std::string& blob) -> caf::result<std::vector<std::string>> {
        auto& st = self->state;
        const int rank = rank_of_sender(self);
        if (rank < 0) {
          return refuse(
              self, "a request for '" + key + "' by a peer that has not joined",
              bootstrap_error("this peer has not joined the job -- join with the job token first"));
        }
        if (!st.failure.empty()) return bootstrap_error(st.failure);
        if (auto it = st.closed.find(key); it != st.closed.end())
          return bootstrap_error(it->second.empty() ? "the key '" + key +
                                                          "' was already used -- use a new key for "
                                                          "every all_gather and barrier"
                                                    : it->second);
        auto& g = st.gathers[key];
        if (g.blobs.empty()) {
          g.blobs.resize(st.world_size);
          g.promises.resize(st.world_size);
          self->delayed_send(self, st.collective_timeout, timeout_atom::value, key);
        }
        if (g.blobs[rank])
          return bootstrap_error("rank " + std::to_string(rank) + " took part in '" + key +
                                 "' twice");
        auto promise = self->make_response_promise();
        g.bytes += blob.size();
        g.blobs[rank] = std::move(blob);
        g.promises[rank] = promise;
        ++g.count;
        if (g.bytes > st.gather_budget) {
          fail_gather(self, key,
                      "the blobs of '" + key + "' add up to more than " +
                          std::to_string(st.gather_budget) +
                          " bytes, too many for one bootstrap message (max_message_bytes) -- the "
                          "bootstrap carries control data only; move tensors with a Communicator");
          return promise;
        }
        if (const int gone = first_departed(st); gone >= 0 && !g.blobs[gone]) {
          fail_gather(
              self, key,
              member_text(st, gone) + " has left the job, so '" + key + "' cannot complete");
          return promise;
        }
        if (g.count == st.world_size) {
          std::vector<std::string> all;
          all.reserve(st.world_size);
          for (auto& b : g.blobs) all.push_back(std::move(*b));
          for (auto& p : g.promises) p.deliver(all);
          st.gathers.erase(key);
          st.closed[key] = "";
        }
        return promise;
      },
      [self](leave_atom) -> caf::result<leave_atom> {
        auto& st = self->state;
        const int rank = rank_of_sender(self);
        if (rank < 0) return leave_atom::value;
        st.members[rank]->left = true;
        std::vector<std::string> stuck;
        for (const auto& [key, g] : st.gathers)
          if (!g.blobs[rank]) stuck.push_back(key);
        for (const auto& key : stuck)
          fail_gather(self, key,
                      member_text(st, rank) + " left the job before taking part in '" + key + "'");
        return leave_atom::value;
      },
      [self](drain_atom) -> caf::result<drain_atom> {
        if (!from_this_process(self)) return bootstrap_error("drain is for rank 0's own process");
        auto promise = self->make_response_promise();
        self->state.drains.push_back(promise);
        answer_drains(self);
        return promise;
      },
      [self](timeout_atom, const std::string& key) {
        auto& st = self->state;
        if (!same_actor(self->current_sender(), self->address())) return;
        auto it = st.gathers.find(key);
        if (it == st.gathers.end()) return;
        std::string missing, never_joined;
        for (int r = 0; r < st.world_size; ++r) {
          if (!it->second.blobs[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          if (!st.members[r])
            never_joined += (never_joined.empty() ? "" : ", ") + std::to_string(r);
        }
        std::string why = "'" + key + "' timed out after " + seconds_text(st.collective_timeout) +
                          ": rank(s) " + missing + " did not take part";
        if (!never_joined.empty()) why += " (rank(s) " + never_joined + " never joined)";
        why += " -- a rank is stuck, crashed before joining or runs a different sequence of calls";
        st.log(why);
        fail_gather(self, key, why);
      },
      [self](report_atom) {
        if (!same_actor(self->current_sender(), self->address())) return;
        report_missing(self);
      },
      [self](offer_atom) {
        auto& st = self->state;
        if (!same_actor(self->current_sender(), self->address()) || !st.failure.empty()) return;
        for (int r = 0; r < st.world_size; ++r)
          if (!st.members[r]) st.open.insert(r);
        offer_places(self);
      },
      [self](lonely_atom) {
        auto& st = self->state;
        if (!same_actor(self->current_sender(), self->address()) || !st.failure.empty()) return;
        if (!st.spares.empty()) return;
        for (int r = 0; r < st.world_size; ++r)
          if (r != st.setup.owner_rank && st.members[r]) return;
        const std::string why = "no other process reached the standby's rendezvous at " + st.setup.where_text() +
                                " within " + seconds_text(st.setup.failover_after) +
                                ": this host is the one that was cut off from the job, which goes on where the "
                                "others are -- this process ends (its launcher starts it again as a spare)";
        st.log(why);
        fail_job(self, why);
      },
      [self](end_atom, const std::string& outcome) -> caf::result<end_atom> {
        if (!from_this_process(self)) return bootstrap_error("end is for rank 0's own process");
        auto& st = self->state;
        if (st.ended.empty()) st.ended = outcome.empty() ? "ended" : outcome;
        for (auto& sp : st.spares) sp.promise.deliver(bootstrap_error(kJobEndedText + st.ended));
        st.spares.clear();
        return end_atom::value;
      },
  };
}

// ---- Agent --------------------------------------------------------------------------------------

struct Health {
  mutable std::mutex mutex;
  std::string failure;
  bool rendezvous_lost = false;  // the failure was the rendezvous's loss
  void set(const std::string& why, bool lost = false) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure.empty()) return;
    failure = why;
    rendezvous_lost = lost;
  }
  std::string get() const {
    std::lock_guard<std::mutex> lock(mutex);
    return failure;
  }
  bool lost() const {
    std::lock_guard<std::mutex> lock(mutex);
    return rendezvous_lost;
  }
};

// What the rendezvous said about its standby (agents write, the process's threads read).
struct StandbyNews {
  mutable std::mutex mutex;
  std::optional<RendezvousPlace> standby;
  void set(const RendezvousPlace& p) {
    std::lock_guard<std::mutex> lock(mutex);
    standby = p;
  }
  std::optional<RendezvousPlace> get() const {
    std::lock_guard<std::mutex> lock(mutex);
    return standby;
  }
};
using OnStandby = std::function<void(const RendezvousPlace&, const RendezvousPlace&)>;

struct AgentState {
  AgentState() = default;
  rendezvous_actor rendezvous;
  std::string where;  // "rank 0 at host:port"
  std::shared_ptr<Health> health;
  std::shared_ptr<StandbyNews> news;
  int world = 0;
  std::function<void(const std::string&)> on_job_failed;
  OnStandby on_standby;
  Logger log;
  std::map<uint64_t, caf::response_promise> pending;
  uint64_t next_id = 0;
  std::string closed;  // why requests fail from now on; empty while usable
  bool joined = false;  // the join was answered: from now on a lost rendezvous is the job's failure
  static inline const char* name = "troupe.bootstrap_agent";
};

using AgentPtr = agent_actor::stateful_pointer<AgentState>;

// Fails every pending and later request with `why`; a failure (not an orderly close) of a joined
// agent is also recorded as the job's (before the join it is only the join's: join() may try again).
void close_agent(AgentPtr self, const std::string& why, bool job_failed, bool rendezvous_lost = false) {
  auto& st = self->state;
  if (!st.closed.empty()) return;
  st.closed = why;
  if (job_failed && st.joined) {
    st.health->set(why, rendezvous_lost);
    st.log("the job failed: " + why);
    if (st.on_job_failed) st.on_job_failed(why);
  }
  auto pending = std::move(st.pending);
  st.pending.clear();
  for (auto& [id, p] : pending) p.deliver(bootstrap_error(why));
}

// Sends the request to the rendezvous and answers the caller when it replies or the agent closes.
// Joins: the request is the join, whose answer makes the agent a member.
template <class Reply, bool Joins = false, class... Ts>
caf::result<Reply> relay(AgentPtr self, Ts... xs) {
  auto& st = self->state;
  if (!st.closed.empty()) return bootstrap_error(st.closed);
  auto promise = self->make_response_promise();
  const uint64_t id = st.next_id++;
  st.pending.emplace(id, promise);
  auto finish = [self, id](auto&& answer) {
    auto it = self->state.pending.find(id);
    if (it == self->state.pending.end()) return;  // already failed by close_agent
    auto p = it->second;
    self->state.pending.erase(it);
    p.deliver(std::forward<decltype(answer)>(answer));
  };
  self->request(st.rendezvous, caf::infinite, xs...)
      .then([self, finish](Reply& r) mutable {
              if constexpr (Joins) self->state.joined = true;
              finish(std::move(r));
            },
            [self, finish](caf::error& e) mutable {
              // The rendezvous went away with the request under way: its error can come before the
              // down message, so it says what the down message will (join() tries a lost
              // rendezvous again for a later attempt: the old rank 0 closing as this rank rejoins).
              if (e == caf::sec::request_receiver_down)
                e = bootstrap_error(std::string(kLostRendezvous) + self->state.where + " (request_receiver_down)");
              finish(e);
            });
  return promise;
}

agent_actor::behavior_type bootstrap_agent(AgentPtr self, rendezvous_actor rv, std::string where,
                                           std::shared_ptr<Health> health, std::shared_ptr<StandbyNews> news,
                                           int world, std::function<void(const std::string&)> on_job_failed,
                                           OnStandby on_standby, Logger log) {
  auto& st = self->state;
  st.rendezvous = rv;
  st.where = std::move(where);
  st.health = std::move(health);
  st.news = std::move(news);
  st.world = world;
  st.on_job_failed = std::move(on_job_failed);
  st.on_standby = std::move(on_standby);
  st.log = std::move(log);
  self->monitor(rv);
  self->set_down_handler([self](const caf::down_msg& dm) {
    if (dm.source != self->state.rendezvous.address()) return;
    if (is_orderly_exit(dm.reason))
      close_agent(self, "the rendezvous on " + self->state.where + kClosedRendezvous, false);
    else
      close_agent(self,
                  std::string(kLostRendezvous) + self->state.where + " (" + render(dm.reason) +
                      "): its process died, hung past the heartbeat timeout or the network failed",
                  true, true);
  });
  return {
      [self](join_atom, const JoinRequest& req) -> caf::result<int32_t> {
        return relay<int32_t, true>(self, join_atom::value, req);
      },
      [self](gather_atom, const std::string& key,
             const std::string& blob) -> caf::result<std::vector<std::string>> {
        return relay<std::vector<std::string>>(self, gather_atom::value, key, blob);
      },
      [self](leave_atom) -> caf::result<leave_atom> {
        return relay<leave_atom>(self, leave_atom::value);
      },
      [self](failed_atom, const std::string& why) {
        if (!same_actor(self->current_sender(), self->state.rendezvous.address())) return;
        close_agent(self, why, true);
      },
      [self](standby_atom, const std::string& at_addr, int32_t at_port, int32_t at_rank, const std::string& addr,
             int32_t port, int32_t rank) {
        auto& st = self->state;
        if (!same_actor(self->current_sender(), st.rendezvous.address())) return;
        // From the rendezvous the token admitted, yet checked before anything uses it.
        const RendezvousPlace at{at_addr, at_port, at_rank}, standby{addr, port, rank};
        for (const auto* p : {&at, &standby})
          if (!valid_place_addr(p->addr) || p->port < 1 || p->port > 65535 || p->rank < 0 || p->rank >= st.world)
            return;
        // The caller's record first (the node's hint file): standby() answers once it is written.
        if (st.on_standby) st.on_standby(at, standby);
        st.news->set(standby);
      },
  };
}

void default_log(int rank, const std::string& line) {
  if (rank < 0)
    std::fprintf(stderr, "troupe bootstrap (spare): %s\n", line.c_str());
  else
    std::fprintf(stderr, "troupe bootstrap (rank %d): %s\n", rank, line.c_str());
  std::fflush(stderr);
}

std::string local_hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

// ---- CafBootstrap -------------------------------------------------------------------------------

struct CafBootstrap::Impl {
  std::unique_ptr<caf::actor_system_config> own_config;  // when the bootstrap runs its own system
  std::unique_ptr<caf::actor_system> own_system;
  caf::actor_system* sys = nullptr;
  int rank = 0;
  int world_size = 1;
  int port = 0;
  CafBootstrapOptions options;
  NetworkPlan plan;
  std::shared_ptr<SecureTransport> transport;
  caf::io::middleman_actor middleman;  // the transport's: every publish and connect goes through it
  std::shared_ptr<Health> health = std::make_shared<Health>();
  std::shared_ptr<StandbyNews> news = std::make_shared<StandbyNews>();
  RendezvousPlace place;        // where the rendezvous was met (its own, when hosted here)
  rendezvous_actor rendezvous;  // its host: the local actor; others: a proxy
  agent_actor agent;
  bool owns_rendezvous = false;
  bool hosts_at_master = false;  // the network plan is rank 0's (this process hosts at MASTER_ADDR)
  bool published = false;
  std::shared_ptr<RendezvousSetup::Lost> lost;  // rank 0: its rendezvous's lost ranks

  ~Impl() { shutdown(); }

  // Leaves, lets rank 0 wait for the others, stops the actors; then the own system (if any) goes.
  void shutdown() {
    if (sys == nullptr) return;
    {
      caf::scoped_actor self{*sys};
      if (agent) {
        if (health->get().empty())
          self->request(agent, std::chrono::seconds(5), leave_atom::value)
              .receive([](leave_atom) {}, [](caf::error&) {});
        self->send_exit(agent, caf::exit_reason::user_shutdown);
      }
      if (owns_rendezvous && rendezvous) {
        // A failed generation's rank 0 under in-job recovery waits a moment for every rank to go (so
        // it knows all the lost ones), not the whole grace a finished job gives them.
        const auto grace = options.in_job_recovery && !health->get().empty()
                               ? std::min(options.shutdown_grace, std::chrono::milliseconds(2000))
                               : options.shutdown_grace;
        self->request(rendezvous, grace, drain_atom::value)
            .receive([](drain_atom) {}, [](caf::error&) {});
        self->send_exit(rendezvous, caf::exit_reason::user_shutdown);
        if (middleman && published)
          self->request(middleman, std::chrono::seconds(5), caf::close_atom::value,
                        static_cast<uint16_t>(port))
              .receive([] {}, [](caf::error&) {});
      }
    }
    if (middleman) {
      caf::scoped_actor self{*sys, true};
      self->send_exit(middleman, caf::exit_reason::kill);
      self->wait_for(middleman);
    }
    agent = nullptr;
    rendezvous = nullptr;
    middleman = nullptr;
    own_system.reset();  // closes the connections
    own_config.reset();
    transport.reset();
    sys = nullptr;
  }

  Logger logger() const {
    if (options.log) return options.log;
    const int r = rank;
    return [r](const std::string& line) { default_log(r, line); };
  }

  // Calls the agent and waits, at most the collective timeout plus a margin (the rendezvous times a
  // gather out first; this bounds a lost reply).
  template <class Reply, class... Ts>
  Result<Reply> ask(const std::string& what, Ts... xs) {
    return ask_within<Reply>(options.collective_timeout + std::chrono::seconds(30), what, xs...);
  }
  template <class Reply, class Limit, class... Ts>
  Result<Reply> ask_within(Limit limit, const std::string& what, Ts... xs) {
    const std::string where = what + " on rank " + std::to_string(rank) + ": ";
    Result<Reply> out{Status::error("no reply")};
    caf::scoped_actor self{*sys};
    self->request(agent, limit, xs...)
        .receive([&](Reply& r) { out = std::move(r); },
                 [&](caf::error& e) {
                   if (e == caf::sec::request_timeout)
                     out = Status::error(where + "no answer from the rendezvous within " +
                                         limit_text(limit) +
                                         " -- a rank is stuck or the network is partitioned");
                   else
                     out = Status::error(where + render(e));
                 });
    return out;
  }
};

namespace {

// One connection attempt through the middleman actor (what remote_actor does, but bounded: a
// listener that accepts and never answers, e.g. another program on the port, cannot stall us).
caf::expected<rendezvous_actor> connect_once(caf::actor_system& sys,
                                             const caf::io::middleman_actor& middleman,
                                             const std::string& host, uint16_t port,
                                             std::chrono::milliseconds timeout) {
  caf::expected<rendezvous_actor> out{caf::sec::cannot_connect_to_node};
  caf::scoped_actor self{sys};
  self->request(middleman, timeout, caf::connect_atom::value, host, port)
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>& ifs) {
            if (!ptr)
              out = caf::make_error(caf::sec::no_actor_published_at_port, port);
            else if (!sys.assignable<rendezvous_actor>(ifs))
              out = caf::make_error(caf::sec::unexpected_actor_messaging_interface);
            else
              out = caf::actor_cast<rendezvous_actor>(std::move(ptr));
          },
          [&](caf::error& e) { out = std::move(e); });
  return out;
}

// The places to look for the rendezvous at, in turn: options.rendezvous_at, options.places, what the
// last rendezvous said of its standby (first, when it was lost), MASTER_ADDR:MASTER_PORT; no place
// twice. Without rendezvous_at and a standby: MASTER_ADDR:MASTER_PORT alone.
std::vector<RendezvousPlace> places_to_look(const CafBootstrap::Impl& b, const LaunchEnv& env, bool lost,
                                            const std::optional<RendezvousPlace>& learned) {
  std::vector<RendezvousPlace> out;
  auto add = [&](const RendezvousPlace& p) {
    for (const auto& q : out)
      if (q.addr == p.addr && q.port == p.port) return;
    out.push_back(p);
  };
  if (learned && lost) add(*learned);
  if (b.options.rendezvous_at) add(*b.options.rendezvous_at);
  for (const auto& p : b.options.places) add(p);
  if (learned) add(*learned);
  add(RendezvousPlace{b.plan.connect_addr, env.master_port, 0});
  return out;
}

std::string places_text(const std::vector<RendezvousPlace>& places) {
  std::string s;
  for (const auto& p : places) {
    const bool v6 = p.addr.find(':') != std::string::npos;
    s += (s.empty() ? "" : ", ") + (v6 ? "[" + p.addr + "]" : p.addr) + ":" + std::to_string(p.port);
  }
  return s;
}

// Reaches the rendezvous at one of `places` (one place: until the deadline; several: a short try at
// each in turn), setting b.rendezvous and b.place. *timed_out: nothing answered before the deadline.
Status connect(CafBootstrap::Impl& b, const LaunchEnv& env, const std::vector<RendezvousPlace>& places,
               std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds limit, bool* timed_out) {
  *timed_out = false;
  const std::string where = places_text(places);
  const std::string who = env.rank >= 0 ? "rank " + std::to_string(env.rank) : std::string("a spare");
  auto pause = std::chrono::milliseconds(100);
  for (size_t turn = 0;; ++turn) {
    const RendezvousPlace& at = places[turn % places.size()];
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto try_for = std::max(left, std::chrono::milliseconds(100));
    if (places.size() > 1) try_for = std::min(try_for, std::chrono::milliseconds(2000));
    auto rv = connect_once(*b.sys, b.middleman, at.addr, static_cast<uint16_t>(at.port), try_for);
    if (rv) {
      b.rendezvous = std::move(*rv);
      b.place = at;
      b.port = at.port;
      return Status::ok();
    }
    // The TLS handshake says why a connection that reached a listener failed.
    const auto [kind, why] = b.transport->take_client_failure();
    if (kind == tls::Failure::wrong_key)
      return Status::error("the rendezvous at " + place_text(at) + " refused " + who + ": " + why +
                           " -- every rank of a job must carry the same TROUPE_JOB_TOKEN (is "
                           "another job using this master port?)");
    const bool foreign = kind == tls::Failure::protocol || kind == tls::Failure::not_troupe ||
                         rv.error() == caf::sec::unexpected_actor_messaging_interface ||
                         rv.error() == caf::sec::no_actor_published_at_port;
    // Another program at a standby's place (the port after MASTER_PORT) is no reason to stop looking.
    if (foreign && places.size() == 1)
      return Status::error(who + ": what listens at " + where + " is not a troupe rendezvous of this version (" +
                           (why.empty() ? render(rv.error()) : why) +
                           ") -- another program or troupe version uses this port; pick another with "
                           "--master-port / MASTER_PORT");
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      *timed_out = true;
      return Status::error(
          who + " cannot reach the rendezvous at " + where + " after " + seconds_text(limit) + " (" +
          render(rv.error()) +
          ") -- check that rank 0 started, that --master-addr / MASTER_ADDR names its host and that TCP port " +
          std::to_string(env.master_port) + (places.size() > 1 ? " and the one after it are" : " is") +
          " open between the nodes");
    }
    if (places.size() > 1 && (turn + 1) % places.size() != 0) continue;  // the next place at once
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    // A spare polls at the first pace: the next generation's rendezvous is about to listen, and the
    // spare that reaches it first takes the lost place.
    pause = std::min(pause * 2, std::chrono::milliseconds(env.spare ? 100 : 1000));
  }
}

// Publishes through the transport's middleman actor (what middleman::publish does through the
// default one).
caf::expected<uint16_t> publish(CafBootstrap::Impl& b, uint16_t port, const std::string& bind) {
  caf::expected<uint16_t> out{caf::sec::cannot_open_port};
  caf::scoped_actor self{*b.sys};
  self->request(b.middleman, caf::infinite, caf::publish_atom::value, port,
                caf::actor_cast<caf::strong_actor_ptr>(b.rendezvous),
                b.sys->message_types(b.rendezvous), bind, true)
      .receive([&](uint16_t actual) { out = actual; }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

// Hosts the rendezvous: rank 0 at MASTER_ADDR:MASTER_PORT (`at` unset), or at `at` (the rendezvous
// moved: `standby` says it is a standby's).
Status start_rendezvous(CafBootstrap::Impl& b, const LaunchEnv& env, const std::optional<RendezvousPlace>& at,
                        bool standby) {
  const size_t budget = gather_budget(b.options.max_message_bytes, env.world_size);
  RendezvousSetup setup;
  setup.world_size = env.world_size;
  setup.gather_budget = budget;
  setup.collective_timeout = b.options.collective_timeout;
  setup.join_timeout = b.options.join_timeout;
  setup.report_interval = b.options.wait_report_interval;
  setup.rdzv_id = env.rdzv_id;
  setup.attempt = attempt_of(b.options);
  setup.in_job = b.options.in_job_recovery;
  setup.open_places = b.options.open_places;
  setup.spare_grace = b.options.spare_grace;
  setup.owner_rank = env.rank;
  setup.base_port = env.master_port;
  setup.standby_hosted = standby;
  if (standby) setup.spare_grace = std::min(setup.spare_grace, b.options.moved_spare_grace);
  setup.failover_after = b.options.failover_after;
  b.lost = setup.lost;
  // troupe launch and torchrun start as many ranks on every node, numbered node by node.
  if (env.source == "troupe launch" || env.source == "torchrun env") setup.ranks_per_node = env.local_world_size;
  const auto where = setup.where;
  const std::string host = at ? at->addr : b.plan.connect_addr.empty() ? env.master_addr : b.plan.connect_addr;
  setup.log = b.logger();
  b.rendezvous = b.sys->spawn(rendezvous, std::move(setup));
  b.owns_rendezvous = true;
  const int want = at ? at->port : env.master_port;
  b.port = want;
  b.place = RendezvousPlace{host, want, env.rank};
  if (env.world_size == 1) return Status::ok();  // nobody to meet: nothing is published
  const std::string bind = at ? at->addr : b.options.bind_addr.empty() ? b.plan.bind_addr : b.options.bind_addr;
  auto port = publish(b, static_cast<uint16_t>(want), bind);
  if (!port)
    return Status::error(
        "rank " + std::to_string(env.rank) + " cannot listen on " + bind + ":" + std::to_string(want) +
        " for the rendezvous (" + render(port.error()) +
        (at ? "): the port is in use or not allowed -- the rendezvous moves to the standby's host at MASTER_PORT or "
              "the port after it: keep both free there (troupe launch --master-port)"
            : "): the port is in use (another job?) or not allowed -- pass another --master-port to "
              "troupe launch (or set MASTER_PORT / TROUPE_MASTER_PORT on every rank); the address "
              "comes from MASTER_ADDR (TROUPE_BIND_ADDR overrides it)"));
  b.port = *port;
  b.place.port = *port;
  b.published = true;
  std::lock_guard<std::mutex> lock(where->mutex);
  where->text = place_text(RendezvousPlace{host, b.port, env.rank});
  where->text = where->text.substr(0, where->text.find(" (rank"));
  where->place = b.place;
  return Status::ok();
}

// Room for the job's connections besides the bounded pending handshakes: raise the soft limit on
// open files up to the hard one when the world needs it (rank 0 holds one socket per rank).
void ensure_descriptors(int world_size, int pending) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = static_cast<rlim_t>(world_size) + static_cast<rlim_t>(pending) + 256;
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= want) return;
  lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
  setrlimit(RLIMIT_NOFILE, &lim);
}

}  // namespace

void configure_for_bootstrap(caf::actor_system_config& cfg, const CafBootstrapOptions& options) {
  cfg.add_message_type<JoinRequest>("troupe.JoinRequest6");
  cfg.set("middleman.heartbeat-interval", caf::timespan{options.heartbeat_interval});
  cfg.set("middleman.connection-timeout", caf::timespan{options.connection_timeout});
  cfg.load<caf::io::middleman>();
}

CafBootstrap::CafBootstrap(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CafBootstrap::~CafBootstrap() = default;
int CafBootstrap::rank() const {
  return impl_->rank;
}
int CafBootstrap::world_size() const {
  return impl_->world_size;
}
int CafBootstrap::port() const {
  return impl_->port;
}
std::string CafBootstrap::job_failure() const {
  return impl_->health->get();
}
std::string CafBootstrap::ucx_net_devices() const {
  return impl_->plan.ucx_net_devices;
}
const NetworkPlan& CafBootstrap::network_plan() const {
  return impl_->plan;
}
SecureTransportStats CafBootstrap::transport_stats() const {
  return impl_->transport ? impl_->transport->stats() : SecureTransportStats{};
}
std::vector<int> CafBootstrap::lost_ranks() const {
  if (!impl_->lost) return {};
  std::lock_guard<std::mutex> lock(impl_->lost->mutex);
  std::vector<int> ranks = impl_->lost->ranks;
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}
void CafBootstrap::close() { impl_->shutdown(); }
bool CafBootstrap::hosts_rendezvous() const { return impl_->owns_rendezvous; }
RendezvousPlace CafBootstrap::place() const { return impl_->place; }
std::optional<RendezvousPlace> CafBootstrap::standby() const { return impl_->news->get(); }
bool CafBootstrap::rendezvous_lost() const { return impl_->health->lost(); }
void CafBootstrap::end_job(const std::string& outcome) {
  if (!impl_->owns_rendezvous || !impl_->rendezvous || impl_->sys == nullptr) return;
  caf::scoped_actor self{*impl_->sys};
  self->request(impl_->rendezvous, std::chrono::seconds(5), end_atom::value, outcome)
      .receive([](end_atom) {}, [](caf::error&) {});
}
bool job_ended_for_spare(const Status& st) {
  return !st.is_ok() && st.message().find(kJobEndedText) != std::string::npos;
}
bool place_taken_by_spare(const Status& st) {
  return !st.is_ok() && st.message().find(kPlaceTakenText) != std::string::npos;
}

Result<std::vector<std::string>> CafBootstrap::all_gather(const std::string& key,
                                                          const std::string& mine) {
  const size_t budget = gather_budget(impl_->options.max_message_bytes, impl_->world_size);
  if (mine.size() > kMaxBlobBytes || mine.size() * static_cast<size_t>(impl_->world_size) > budget)
    return Status::error(
        "all_gather '" + key + "': a blob of " + std::to_string(mine.size()) +
        " bytes is too large for the bootstrap (at most 1 MiB, and " +
        std::to_string(impl_->world_size) + " ranks' blobs must fit one message of " +
        std::to_string(budget) +
        " bytes) -- it carries control data only; move tensors with a Communicator");
  return impl_->ask<std::vector<std::string>>("all_gather '" + key + "'", gather_atom::value,
                                              "gather/" + key, mine);
}

Status CafBootstrap::barrier(const std::string& key) {
  auto r = impl_->ask<std::vector<std::string>>("barrier '" + key + "'", gather_atom::value,
                                                "barrier/" + key, std::string());
  return r ? Status::ok() : r.status();
}

namespace {

Result<std::unique_ptr<CafBootstrap>> join(std::unique_ptr<CafBootstrap::Impl> b,
                                           const LaunchEnv& env) {
  if (env.world_size < 1 || (!env.spare && (env.rank < 0 || env.rank >= env.world_size)))
    return Status::error("rank " + std::to_string(env.rank) + " does not fit a world of " +
                         std::to_string(env.world_size) + " -- check the launch environment");
  if (env.token.empty())
    return Status::error(
        "the job token is empty -- set TROUPE_JOB_TOKEN (export TROUPE_JOB_TOKEN=$(troupe launch "
        "--new-token))");
  if (env.spare && !b->options.in_job_recovery)
    return Status::error("a spare process (TROUPE_SPARE=1) joins a job under in-job recovery only -- troupe launch "
                         "--in-job-recovery --spares K starts them");
  b->rank = env.spare ? -1 : env.rank;
  b->world_size = env.world_size;
  if (const char* v = std::getenv("TROUPE_HANDSHAKE_TIMEOUT")) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(s > 0 && s <= 3600))
      return Status::error(std::string("TROUPE_HANDSHAKE_TIMEOUT='") + v +
                           "' is not a number of seconds in (0, 3600] -- fix or unset it");
    b->options.handshake_timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }
  // troupe launch --rdzv-conf join_timeout: how long rank 0 waits for the others to join, and the
  // others retry reaching it.
  if (const char* v = std::getenv("TROUPE_RDZV_TIMEOUT")) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(s > 0 && s <= 86400))
      return Status::bad_input(std::string("TROUPE_RDZV_TIMEOUT='") + v +
                               "' is not a number of seconds in (0, 86400] -- fix or unset it (troupe launch "
                               "--rdzv-conf join_timeout=S sets it)");
    b->options.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
    b->options.connect_timeout = b->options.join_timeout;
  }
  if (env.world_size > 1) {
    // The network plan of a process that connects; of rank 0's at MASTER_ADDR for the process that
    // hosts there (after the rendezvous moved, rank 0 may be a process on any host).
    LaunchEnv connecting = env;
    connecting.rank = -1;
    auto plan = plan_network(connecting);
    if (!plan) return plan.status();
    const auto& at = b->options.rendezvous_at;
    const bool master = !env.spare && (at ? at->rank == env.rank && at->port == env.master_port &&
                                                (at->addr == plan->connect_addr || at->addr == env.master_addr)
                                          : env.rank == 0);
    if (master) plan = plan_network(env);
    if (!plan) return plan.status();
    b->plan = std::move(plan).value();
    b->hosts_at_master = master;
    SecureTransportOptions t;
    t.token = env.token;
    t.identity =
        tls::make_identity(env.rank, env.world_size, local_hostname(), static_cast<int>(getpid()));
    t.max_message_bytes = b->options.max_message_bytes;
    t.handshake_timeout = b->options.handshake_timeout;
    t.max_pending_handshakes = b->options.max_pending_handshakes;
    t.log = b->logger();
    auto transport = SecureTransport::create(std::move(t));
    if (!transport) return transport.status();
    b->transport = std::move(transport).value();
    b->middleman = b->transport->spawn_middleman(*b->sys);
    ensure_descriptors(env.world_size, b->options.max_pending_handshakes);
  }
  JoinRequest req;
  req.rank = env.spare ? kSpareRank : env.rank;
  req.world_size = env.world_size;
  req.host = local_hostname();
  req.pid = static_cast<int32_t>(getpid());
  req.rdzv_id = env.rdzv_id;
  req.attempt = attempt_of(b->options);
  // Who hosts: rank 0 at MASTER_ADDR, or the process the rendezvous moved to (rendezvous_place.hpp);
  // a spare never. A standby whose generation failed otherwise hosts once nothing answers.
  const auto& at = b->options.rendezvous_at;
  bool host = !env.spare && (at ? at->rank == env.rank : env.rank == 0);
  // Hosting at MASTER_ADDR:MASTER_PORT binds where the network plan says (TROUPE_BIND_ADDR, ...).
  std::optional<RendezvousPlace> host_at = b->hosts_at_master ? std::nullopt : at;
  bool as_standby = host && b->options.rendezvous_moved;
  auto give_up = std::chrono::steady_clock::now() + b->options.connect_timeout;
  const auto standby_by = std::chrono::steady_clock::now() + b->options.failover_after;
  bool lost = false;  // the last try lost the rendezvous: its standby first
  for (;;) {
    if (host) {
      req.addr.clear();
      TROUPE_RETURN_IF_ERROR(start_rendezvous(*b, env, host_at, as_standby));
    } else {
      const auto places = places_to_look(*b, env, lost, b->news->get());
      const bool standby = b->options.standby_here.has_value();
      bool timed_out = false;
      Status st = connect(*b, env, places, standby ? std::min(give_up, standby_by) : give_up,
                          standby ? b->options.failover_after : b->options.connect_timeout, &timed_out);
      if (!st && standby && timed_out && std::chrono::steady_clock::now() < give_up) {
        b->logger()("the rendezvous is not at " + places_text(places) + " after " +
                    seconds_text(b->options.failover_after) + ": this process, its standby, hosts it at " +
                    place_text(*b->options.standby_here));
        host = as_standby = true;
        host_at = b->options.standby_here;
        continue;
      }
      TROUPE_RETURN_IF_ERROR(st);
      // The address this process reaches the rendezvous from: where it would host as the standby.
      req.addr.clear();
      const NetQueries q = system_net_queries();
      if (auto resolved = q.resolve(b->place.addr); resolved && !resolved->empty())
        if (auto src = q.source_addr(resolved->front()); src && valid_place_addr(*src)) req.addr = *src;
    }
    const std::string where = "rank " + std::to_string(b->place.rank) + " at " +
                              places_text(std::vector<RendezvousPlace>{b->place});
    b->agent = b->sys->spawn(bootstrap_agent, b->rendezvous, where, b->health, b->news, env.world_size,
                             b->options.on_job_failed,
                             b->options.on_standby, b->logger());
    // A spare waits in its join for as long as the job runs without a place for it (the rendezvous
    // answers when its generation fails or the job ends; a lost rendezvous fails it at once).
    auto joined = env.spare ? b->ask_within<int32_t>(caf::infinite, "joining the job as a spare", join_atom::value, req)
                            : b->ask<int32_t>("joining the job", join_atom::value, req);
    if (joined) {
      b->rank = joined.value();
      return std::make_unique<CafBootstrap>(std::move(b));
    }
    // A later attempt (a restarted process, or one that rejoins in the job) meets the failed one's
    // rendezvous: told so, or losing it (or seeing it close) while the join is under way as it ends.
    const std::string& why = joined.status().message();
    const bool later = req.attempt != 0 || b->options.in_job_recovery;
    lost = why.find(kLostRendezvous) != std::string::npos;
    const bool retry = why.find(kEarlierAttempt) != std::string::npos ||
                       (later && (lost || why.find(kClosedRendezvous) != std::string::npos));
    if (host || !retry || std::chrono::steady_clock::now() >= give_up) return joined.status();
    // A spare was answered by a rendezvous that ran: the next generation's comes soon.
    if (env.spare) give_up = std::chrono::steady_clock::now() + b->options.connect_timeout;
    // The failed attempt's rendezvous still holds the port: let go of it (before it ends, so its end
    // is not this rank's failure) and look again until its successor answers.
    caf::anon_send_exit(b->agent, caf::exit_reason::user_shutdown);
    b->rendezvous = nullptr;
    std::this_thread::sleep_for(std::chrono::milliseconds(env.spare ? 50 : 200));
  }
}

}  // namespace

Result<std::unique_ptr<CafBootstrap>> create_caf_bootstrap(const LaunchEnv& env,
                                                           const CafBootstrapOptions& options) {
  auto b = std::make_unique<CafBootstrap::Impl>();
  b->options = options;
  b->own_config = std::make_unique<caf::actor_system_config>();
  configure_for_bootstrap(*b->own_config, options);
  // Control traffic only: two scheduler threads that sleep when idle.
  b->own_config->set("scheduler.max-threads", 2);
  b->own_config->set("scheduler.policy", caf::atom("sharing"));
  b->own_config->set("middleman.workers", 1);
  b->own_system = std::make_unique<caf::actor_system>(*b->own_config);
  b->sys = b->own_system.get();
  return join(std::move(b), env);
}

Result<std::unique_ptr<CafBootstrap>> create_caf_bootstrap(const LaunchEnv& env,
                                                           caf::actor_system& sys,
                                                           const CafBootstrapOptions& options) {
  auto b = std::make_unique<CafBootstrap::Impl>();
  b->options = options;
  b->sys = &sys;
  return join(std::move(b), env);
}

}  // namespace troupe::comm
