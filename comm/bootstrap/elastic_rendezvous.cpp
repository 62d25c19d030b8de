// comm/bootstrap/elastic_rendezvous.hpp: the launchers' round protocol and node 0's side of it.
#include "comm/bootstrap/elastic_rendezvous.hpp"

#include <algorithm>

#include "base/strict_text.hpp"
#include "comm/bootstrap/rendezvous_place.hpp"

namespace troupe::comm {

namespace {

std::vector<std::string_view> fields(std::string_view s) { return split_fields(s, ' '); }

// A decimal count in [0, max], one spelling (no sign, no leading zero).
std::optional<int> count(std::string_view s, int max) {
  int64_t v = 0;
  if (!parse_strict_count(s, max, &v)) return std::nullopt;
  return static_cast<int>(v);
}

bool is_run_id(std::string_view s) { return is_lower_hex(s, 32, 32); }

Status bad(std::string_view what, std::string_view line) {
  const std::string shown(line.substr(0, 80));
  return Status::bad_input("elastic rendezvous: " + std::string(what) + " in '" +
                           (is_printable_ascii(shown) ? shown : "(binary)") +
                           "' -- every node's launcher must be this troupe's (troupe launch --nnodes MIN:MAX)");
}

}  // namespace

std::string encode_join(const JoinRequest& r) {
  return "troupe-rdzv 2 join " + std::to_string(r.node) + " " + std::to_string(r.nproc) + " " +
         std::to_string(r.min_nodes) + " " + std::to_string(r.max_nodes) + " " + std::to_string(r.spares) + " " +
         std::to_string(r.last_round) + " " + r.addr;
}

Result<JoinRequest> parse_join(std::string_view line) {
  if (line.size() > kMaxRendezvousLine) return bad("a request longer than 1024 bytes", line);
  const auto f = fields(line);
  if (f.size() < 3 || f[0] != "troupe-rdzv" || f[2] != "join") return bad("not a join request", line);
  if (f[1] != "2") return bad("protocol version " + std::string(f[1].substr(0, 8)) + ", not 2", line);
  if (f.size() != 10) return bad("not a join request of 10 fields", line);
  if (f[9] != "-" && !valid_place_addr(f[9])) return bad("an address that is not 1 to 253 of [A-Za-z0-9.:_%-]", line);
  JoinRequest r;
  const auto node = count(f[3], 2 * kMaxElasticNodes), nproc = count(f[4], 4096),
             lo = count(f[5], kMaxElasticNodes), hi = count(f[6], kMaxElasticNodes), spares = count(f[7], 1024);
  std::optional<int> last;
  if (f[8] == "-1") last = -1;
  else last = count(f[8], 1'000'000'000);
  if (!node || !nproc || !lo || !hi || !spares || !last) return bad("a field that is not a count", line);
  r.node = *node;
  r.nproc = *nproc;
  r.min_nodes = *lo;
  r.max_nodes = *hi;
  r.spares = *spares;
  r.last_round = *last;
  r.addr = std::string(f[9]);
  if (r.nproc < 1 || r.min_nodes < 1 || r.min_nodes > r.max_nodes || r.node >= r.max_nodes + r.spares)
    return bad("sizes out of range", line);
  return r;
}

std::string encode_moved(const MovedNotice& m) {
  return "troupe-rdzv 2 moved " + std::to_string(m.round) + " " + m.run_id + " " + m.addr + " " +
         std::to_string(m.port);
}

Result<MovedNotice> parse_moved(std::string_view line) {
  if (line.size() > kMaxRendezvousLine) return bad("a notice longer than 1024 bytes", line);
  const auto f = fields(line);
  if (f.size() != 7 || f[0] != "troupe-rdzv" || f[1] != "2" || f[2] != "moved") return bad("not a moved notice", line);
  const auto round = count(f[3], 1'000'000'000), port = count(f[6], 65535);
  if (!round || !is_run_id(f[4]) || !valid_place_addr(f[5]) || !port || *port < 1)
    return bad("a moved notice with bad fields", line);
  return MovedNotice{*round, std::string(f[4]), std::string(f[5]), *port};
}

std::string standby_fields(const std::optional<ElasticStandby>& s) {
  return s ? std::to_string(s->node) + " " + s->addr + " " + std::to_string(s->port) : "none";
}

std::string encode_answer(const JoinAnswer& a) {
  switch (a.kind) {
    case JoinAnswer::Kind::wait:
      return "wait " + std::to_string(a.round) + " " + std::to_string(a.present) + " " + standby_fields(a.standby);
    case JoinAnswer::Kind::go:
      return "go " + std::to_string(a.go.round) + " " + std::to_string(a.go.group_rank) + " " +
             std::to_string(a.go.nodes) + " " + a.go.run_id + " " + standby_fields(a.standby);
    case JoinAnswer::Kind::done:
      return "done";
    case JoinAnswer::Kind::failed:
      return "failed";
    case JoinAnswer::Kind::refused:
      return "refused " + a.reason;
    case JoinAnswer::Kind::follow:
      return "follow";
  }
  return "refused unknown answer";
}

Result<JoinAnswer> parse_answer(std::string_view line) {
  if (line.size() > kMaxRendezvousLine) return bad("an answer longer than 1024 bytes", line);
  JoinAnswer a;
  if (line == "done" || line == "failed" || line == "follow") {
    a.kind = line == "done"     ? JoinAnswer::Kind::done
             : line == "failed" ? JoinAnswer::Kind::failed
                                : JoinAnswer::Kind::follow;
    return a;
  }
  if (line.rfind("refused ", 0) == 0) {
    a.kind = JoinAnswer::Kind::refused;
    a.reason = std::string(line.substr(8));
    if (a.reason.empty() || !is_printable_ascii(a.reason)) return bad("a refusal without a printable reason", line);
    return a;
  }
  auto f = fields(line);
  // The standby: the last field `none`, or the last three NODE ADDR PORT.
  std::optional<ElasticStandby> standby;
  if (f.size() >= 2 && f.back() == "none") {
    f.pop_back();
  } else if (f.size() >= 4) {
    const auto node = count(f[f.size() - 3], 2 * kMaxElasticNodes), port = count(f[f.size() - 1], 65535);
    if (!node || !port || *port < 1 || !valid_place_addr(f[f.size() - 2])) return bad("a bad standby", line);
    standby = ElasticStandby{*node, std::string(f[f.size() - 2]), *port};
    f.resize(f.size() - 3);
  } else {
    return bad("not an answer", line);
  }
  a.standby = standby;
  if (f[0] == "wait" && f.size() == 3) {
    const auto round = count(f[1], 1'000'000'000), present = count(f[2], kMaxElasticNodes);
    if (!round || !present || *present < 1) return bad("a wait answer with bad counts", line);
    a.round = *round;
    a.present = *present;
    return a;
  }
  if (f[0] == "go" && f.size() == 5) {
    const auto round = count(f[1], 1'000'000'000), rank = count(f[2], kMaxElasticNodes - 1),
               nodes = count(f[3], kMaxElasticNodes);
    if (!round || !rank || !nodes || *rank >= *nodes || !is_run_id(f[4]))
      return bad("a go answer with bad fields", line);
    a.kind = JoinAnswer::Kind::go;
    a.go.round = *round;
    a.go.group_rank = *rank;
    a.go.nodes = *nodes;
    a.go.run_id = std::string(f[4]);
    return a;
  }
  return bad("not an answer", line);
}

RendezvousHost::RendezvousHost(Settings s) : s_(std::move(s)) {
  if (s_.taken_over_round >= 0) {
    round_ = s_.taken_over_round;
    last_nodes_ = s_.taken_over_nodes;
    strict_ = true;
  }
}

std::vector<int> RendezvousHost::present_locked(Clock::time_point now) const {
  std::vector<int> out = {s_.host_node};
  for (const auto& [node, at] : seen_)
    if (now - at <= s_.stale && (!open_ || at >= opened_)) out.push_back(node);
  return out;  // the host, then ascending: seen_ is ordered and holds no host
}

bool RendezvousHost::was_member_locked(int node) const {
  if (node == s_.host_node) return true;
  if (!members_.empty()) return std::find(members_.begin(), members_.end(), node) != members_.end();
  // A standby that took over knows the lost host's round by its number only: its nodes say they ran it.
  const auto last = last_of_.find(node);
  return round_ >= 0 && last != last_of_.end() && last->second == round_;
}

int RendezvousHost::quorum_missing_locked(const std::vector<int>& here) const {
  if (round_ < 0 || last_nodes_ <= 1) return 0;
  const int need = strict_ ? last_nodes_ / 2 + 1 : (last_nodes_ + 1) / 2;
  const int have =
      static_cast<int>(std::count_if(here.begin(), here.end(), [&](int n) { return was_member_locked(n); }));
  return std::max(0, need - have);
}

std::optional<ElasticStandby> RendezvousHost::name_standby_locked() const {
  // The lowest member on another host than the host's; else the lowest other member.
  std::optional<ElasticStandby> pick;
  for (int pass = 0; pass < 2 && !pick; ++pass)
    for (size_t g = 1; g < members_.size() && !pick; ++g) {
      const auto addr = addr_of_.find(members_[g]);
      if (addr == addr_of_.end() || addr->second == "-") continue;
      const bool away = addr->second != s_.host_addr;
      if (pass == 0 && !away) continue;
      const int port = away ? s_.master_port : (s_.host_port == s_.master_port ? s_.master_port + 2 : s_.master_port);
      if (port < 1 || port > 65535) continue;
      pick = ElasticStandby{members_[g], addr->second, port};
    }
  return pick;
}

std::string RendezvousHost::answer(std::string_view request, Clock::time_point now) {
  JoinAnswer a;
  if (request.rfind("troupe-rdzv 2 moved ", 0) == 0) {
    auto m = parse_moved(request);
    std::lock_guard<std::mutex> lock(mu_);
    // Followed by a host that has formed no round (node 0 started again), or by the host of this
    // job whose next round has not formed (it lost its quorum to a network split: the other side
    // took the job over with a majority).
    const bool ours = m && m->run_id == s_.run_id && open_ && m->round >= round_;
    if (m && !done_ && (round_ < 0 || ours)) {
      moved_to_ = m.value();
      a.kind = JoinAnswer::Kind::follow;
    } else {
      a.kind = JoinAnswer::Kind::refused;
      a.reason = !m ? "a bad moved notice" : "this launcher hosts the rounds of a job that runs";
    }
    return encode_answer(a);
  }
  auto r = parse_join(request);
  if (!r) {
    a.kind = JoinAnswer::Kind::refused;
    a.reason = r.status().message();
    for (char& c : a.reason)
      if (c < 0x20 || c >= 0x7f) c = '?';
    return encode_answer(a);
  }
  const JoinRequest& j = r.value();
  std::lock_guard<std::mutex> lock(mu_);
  if (j.nproc != s_.nproc || j.min_nodes != s_.min_nodes || j.max_nodes != s_.max_nodes || j.spares != s_.spares ||
      j.node == s_.host_node) {
    a.kind = JoinAnswer::Kind::refused;
    a.reason = j.node == s_.host_node
                   ? "node rank " + std::to_string(j.node) + " is this launcher's own (it hosts the rendezvous) -- "
                     "give each node its own --node-rank 0 .. " + std::to_string(s_.max_nodes + s_.spares - 1)
                           : "node " + std::to_string(j.node) + " runs --nproc-per-node " + std::to_string(j.nproc) +
                                 " --nnodes " + std::to_string(j.min_nodes) + ":" + std::to_string(j.max_nodes) +
                                 " --spares " + std::to_string(j.spares) + ", node 0 " + std::to_string(s_.nproc) +
                                 ", " + std::to_string(s_.min_nodes) + ":" + std::to_string(s_.max_nodes) + " and " +
                                 std::to_string(s_.spares) + " -- give every node the same flags";
    return encode_answer(a);
  }
  if (done_) {
    a.kind = failed_ ? JoinAnswer::Kind::failed : JoinAnswer::Kind::done;
    return encode_answer(a);
  }
  seen_[j.node] = now;
  last_of_[j.node] = j.last_round;
  addr_of_[j.node] = j.addr;
  a.standby = standby_;
  const bool member = std::find(members_.begin(), members_.end(), j.node) != members_.end();
  if (!open_ && round_ > j.last_round && member) {
    a.kind = JoinAnswer::Kind::go;
    a.go.round = round_;
    a.go.group_rank = static_cast<int>(std::find(members_.begin(), members_.end(), j.node) - members_.begin());
    a.go.nodes = static_cast<int>(members_.size());
    a.go.run_id = s_.run_id;
    return encode_answer(a);
  }
  a.round = open_ ? round_ + 1 : std::max(round_, 0);
  a.present = static_cast<int>(present_locked(now).size());
  return encode_answer(a);
}

void RendezvousHost::open_round(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = true;
  opened_ = now;
  min_since_.reset();
}

std::optional<RendezvousHost::Round> RendezvousHost::try_form(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_ || moved_to_) return std::nullopt;
  const std::vector<int> here = present_locked(now);
  const int n = static_cast<int>(here.size());
  if (n < s_.min_nodes) {
    min_since_.reset();
    return std::nullopt;
  }
  if (!min_since_) min_since_ = now;
  if (n < s_.max_nodes && now - *min_since_ < s_.last_call) return std::nullopt;
  if (quorum_missing_locked(here) > 0) return std::nullopt;
  // At most MAX: the host, the last round's members still here, then the lowest node ranks.
  std::vector<int> chosen;
  for (int pass = 0; pass < 2; ++pass)
    for (int node : here)
      if (node != s_.host_node && was_member_locked(node) == (pass == 0) &&
          static_cast<int>(chosen.size()) + 1 < s_.max_nodes)
        chosen.push_back(node);
  std::sort(chosen.begin(), chosen.end());
  chosen.insert(chosen.begin(), s_.host_node);
  ++round_;
  open_ = false;
  members_ = std::move(chosen);
  last_nodes_ = static_cast<int>(members_.size());
  strict_ = false;
  standby_ = name_standby_locked();
  formed_ = now;
  min_since_.reset();
  return Round{round_, members_, standby_};
}

std::vector<int> RendezvousHost::present(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  return present_locked(now);
}

int RendezvousHost::round() const {
  std::lock_guard<std::mutex> lock(mu_);
  return round_;
}

int RendezvousHost::quorum_missing(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  return quorum_missing_locked(present_locked(now));
}

double RendezvousHost::last_call_left(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_ || !min_since_) return -1;
  return std::max(0.0, std::chrono::duration<double>(s_.last_call - (now - *min_since_)).count());
}

bool RendezvousHost::newcomer_waiting(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_ || round_ < 0 || static_cast<int>(members_.size()) >= s_.max_nodes) return false;
  // Only a node that asked since the round formed: one that asked before (a node of the last round
  // whose launcher was lost just after, a standby watching the host) is no proof of a newcomer.
  for (const auto& [node, at] : seen_)
    if (now - at <= s_.stale && at >= formed_ && std::find(members_.begin(), members_.end(), node) == members_.end())
      return true;
  return false;
}

std::optional<MovedNotice> RendezvousHost::moved_to() const {
  std::lock_guard<std::mutex> lock(mu_);
  return moved_to_;
}

void RendezvousHost::finish(bool failed) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  failed_ = failed;
}

}  // namespace troupe::comm
