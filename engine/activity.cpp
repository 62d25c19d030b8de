#include "engine/activity.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <stdexcept>
#include <set>

#include <nlohmann/json.hpp>

namespace troupe {

const char* doing_name(Doing d) {
  switch (d) {
    case Doing::idle: return "idle";
    case Doing::forward: return "forward";
    case Doing::backward: return "backward";
    case Doing::weight: return "weight-gradient";
    case Doing::waiting: return "waiting";
    case Doing::reducing: return "reducing gradients";
    case Doing::optimizer: return "optimizer step";
    case Doing::gathering: return "gathering parameters";
    case Doing::evaluating: return "evaluating";
  }
  return "?";
}

std::string Activity::describe() const {
  std::string s = "rank " + std::to_string(rank) + " (pp " + std::to_string(stage) + ", tp " + std::to_string(tp) +
                  ", dp " + std::to_string(dp) + (cp >= 0 ? ", cp " + std::to_string(cp) : std::string()) + ") step " +
                  std::to_string(step) + ": ";
  if (doing == Doing::waiting) {
    s += "waiting for " + waiting.what;
  } else {
    s += doing_name(doing);
    if (micro >= 0) s += " of micro-batch " + std::to_string(micro) + " (chunk " + std::to_string(chunk) + ")";
  }
  if (action >= 0) s += ", action " + std::to_string(action + 1) + " of " + std::to_string(actions);
  char t[80];
  if (mailbox >= 0)
    std::snprintf(t, sizeof t, " (%.2f s; %lld in mailbox)", seconds_in_state, static_cast<long long>(mailbox));
  else
    std::snprintf(t, sizeof t, " (%.2f s)", seconds_in_state);
  return s + t;
}

ActivityBoard::ActivityBoard(int rank, int stage, int tp, int dp, int cp) {
  now_.cp = cp;
  now_.rank = rank;
  now_.stage = stage;
  now_.tp = tp;
  now_.dp = dp;
  state_since_ = progress_ = Clock::now();
}

void ActivityBoard::set_mailbox_probe(std::function<size_t()> probe) {
  std::lock_guard<std::mutex> lock(mu_);
  probe_ = std::move(probe);
  probe_thread_ = std::this_thread::get_id();
}

void ActivityBoard::sample_mailbox() {  // mu_ held
  if (probe_ && std::this_thread::get_id() == probe_thread_) now_.mailbox = static_cast<int64_t>(probe_());
}

void ActivityBoard::begin_step(int actions) {
  std::lock_guard<std::mutex> lock(mu_);
  sample_mailbox();
  const auto t = Clock::now();
  if (now_.step > 0) now_.last_step_seconds = std::chrono::duration<double>(t - step_began_).count();
  step_began_ = t;
  now_.step += 1;
  now_.actions = actions;
}

void ActivityBoard::set(Doing doing, int micro, int chunk, int action) {
  std::lock_guard<std::mutex> lock(mu_);
  sample_mailbox();
  now_.doing = doing;
  now_.micro = micro;
  now_.chunk = chunk;
  now_.action = action;
  now_.waiting = {};
  state_since_ = progress_ = Clock::now();
}

void ActivityBoard::wait(WaitTarget target) {
  std::lock_guard<std::mutex> lock(mu_);
  sample_mailbox();
  before_wait_ = now_.doing;
  now_.doing = Doing::waiting;
  now_.waiting = std::move(target);
  state_since_ = progress_ = Clock::now();
}

void ActivityBoard::done_waiting() {
  std::lock_guard<std::mutex> lock(mu_);
  sample_mailbox();
  now_.doing = before_wait_;
  now_.waiting = {};
  state_since_ = progress_ = Clock::now();
}

Activity ActivityBoard::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  Activity a = now_;
  const auto t = Clock::now();
  a.seconds_in_state = std::chrono::duration<double>(t - state_since_).count();
  a.seconds_since_progress = std::chrono::duration<double>(t - progress_).count();
  return a;
}

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::set<int> members(const Activity& a) {
  std::set<int> m(a.waiting.ranks.begin(), a.waiting.ranks.end());
  m.insert(a.rank);
  return m;
}

}  // namespace

double stall_threshold(const std::vector<Activity>& ranks) {
  double slowest = 0;
  for (const Activity& a : ranks) slowest = std::max(slowest, a.last_step_seconds);
  return std::max(1.0, 3 * slowest);
}

WaitGraph wait_graph(const std::vector<Activity>& ranks, double stall_seconds) {
  WaitGraph g;
  std::map<int, const Activity*> by_rank;
  for (const Activity& a : ranks) by_rank[a.rank] = &a;
  std::map<int, std::vector<int>> out;  // rank -> ranks it waits on
  double longest_momentary = 0;
  std::set<int> momentary_ranks;
  for (const Activity& a : ranks) {
    if (a.doing != Doing::waiting) continue;
    for (int peer : a.waiting.ranks) {
      if (peer == a.rank) continue;
      auto it = by_rank.find(peer);
      if (a.waiting.collective && it != by_rank.end()) {
        const Activity& p = *it->second;
        if (p.doing == Doing::waiting && p.waiting.collective && members(p) == members(a)) continue;  // arrived
      }
      if (a.seconds_in_state < stall_seconds) {
        g.momentary.push_back({a.rank, peer, a.waiting.what});
        momentary_ranks.insert(a.rank);
        longest_momentary = std::max(longest_momentary, a.seconds_in_state);
        continue;
      }
      g.edges.push_back({a.rank, peer, a.waiting.what});
      out[a.rank].push_back(peer);
    }
  }
  if (g.edges.empty()) {
    if (momentary_ranks.empty()) {
      g.summary = "nothing is stuck: no rank is waiting on another";
    } else {
      char t[120];
      std::snprintf(t, sizeof t, " (at most %.2f s; a stall is a wait over %.1f s)", longest_momentary, stall_seconds);
      const std::vector<int> list(momentary_ranks.begin(), momentary_ranks.end());
      g.summary = "nothing is stuck: " + std::string(list.size() == 1 ? "rank " : "ranks ") + rank_list(list) +
                  (list.size() == 1 ? " waits" : " wait") + " momentarily on neighbours, as a healthy job does" + t;
    }
    return g;
  }
  g.stuck = true;
  // Everything reachable from a waiting rank; the culprits are the reachable ranks without
  // outgoing edges. Without any, the waits go round in cycles: a deadlock of the reachable ranks
  // that are on a cycle.
  std::set<int> reached;
  std::vector<int> todo;
  for (const auto& [r, peers] : out) todo.push_back(r);
  while (!todo.empty()) {
    const int r = todo.back();
    todo.pop_back();
    if (!reached.insert(r).second) continue;
    for (int p : out[r]) todo.push_back(p);
  }
  for (int r : reached)
    if (out[r].empty()) g.culprits.push_back(r);
  if (g.culprits.empty()) {
    g.deadlock = true;
    g.culprits.assign(reached.begin(), reached.end());
    g.summary = "deadlock: ranks " + rank_list(g.culprits) + " wait on each other";
    return g;
  }
  std::string s;
  for (int c : g.culprits) {
    std::vector<int> waiting_on_it;
    for (const WaitEdge& e : g.edges)
      if (e.to == c && std::find(waiting_on_it.begin(), waiting_on_it.end(), e.from) == waiting_on_it.end())
        waiting_on_it.push_back(e.from);
    std::sort(waiting_on_it.begin(), waiting_on_it.end());
    if (!s.empty()) s += "; ";
    auto it = by_rank.find(c);
    s += it != by_rank.end() ? it->second->describe() : "rank " + std::to_string(c) + " (no report)";
    // Everyone whose waits lead here.
    std::set<int> behind;
    for (bool grew = true; grew;) {
      grew = false;
      for (const WaitEdge& e : g.edges)
        if ((e.to == c || behind.count(e.to)) && e.from != c && behind.insert(e.from).second) grew = true;
    }
    s += (waiting_on_it.size() == 1 ? " -- rank " : " -- ranks ") + rank_list(waiting_on_it) +
         (waiting_on_it.size() == 1 ? " waits on it" : " wait on it");
    if (behind.size() > waiting_on_it.size())
      s += ", " + std::to_string(behind.size()) + " ranks in all through them";
  }
  g.summary = s;
  return g;
}

namespace {

nlohmann::json rank_json(const Activity& a) {
  nlohmann::json j = {{"rank", a.rank},
          {"pp", a.stage},
          {"tp", a.tp},
          {"dp", a.dp},
          {"step", a.step},
          {"doing", doing_name(a.doing)},
          {"micro_batch", a.micro},
          {"chunk", a.chunk},
          {"action", a.action},
          {"actions", a.actions},
          {"waiting_for", a.waiting.what},
          {"waiting_on", a.waiting.ranks},
          {"collective", a.waiting.collective},
          {"seconds_in_state", a.seconds_in_state},
          {"seconds_since_progress", a.seconds_since_progress},
          {"mailbox", a.mailbox},
          {"last_step_seconds", a.last_step_seconds},
          {"describe", a.describe()}};
  if (a.cp >= 0) j["cp"] = a.cp;
  return j;
}

nlohmann::json where_object(const std::vector<Activity>& ranks, const WaitGraph& graph) {
  nlohmann::json j;
  j["summary"] = graph.summary;
  j["stuck"] = graph.stuck;
  j["deadlock"] = graph.deadlock;
  j["culprits"] = graph.culprits;
  j["edges"] = nlohmann::json::array();
  for (const WaitEdge& e : graph.edges) j["edges"].push_back({{"from", e.from}, {"to", e.to}, {"what", e.what}});
  j["momentary"] = nlohmann::json::array();
  for (const WaitEdge& e : graph.momentary) j["momentary"].push_back({{"from", e.from}, {"to", e.to}, {"what", e.what}});
  j["ranks"] = nlohmann::json::array();
  for (const Activity& a : ranks) j["ranks"].push_back(rank_json(a));
  return j;
}

}  // namespace

std::string status_json(const std::vector<Activity>& ranks, int64_t iteration) {
  nlohmann::json j;
  j["iteration"] = iteration;
  j["ranks"] = nlohmann::json::array();
  for (const Activity& a : ranks) j["ranks"].push_back(rank_json(a));
  return j.dump(1) + "\n";
}

namespace {

// An integer field of another process's document: a JSON integer within T's range. A float or a
// larger number is a malformed document (nlohmann's get<int> would convert it with undefined
// behaviour).
template <class T>
T integer_field(const nlohmann::json& v) {
  if (!v.is_number_integer()) throw std::domain_error("not an integer");
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw std::domain_error("out of range");
    return static_cast<T>(u);
  }
  const int64_t x = v.get<int64_t>();
  if (x < static_cast<int64_t>(std::numeric_limits<T>::min()) || x > static_cast<int64_t>(std::numeric_limits<T>::max()))
    throw std::domain_error("out of range");
  return static_cast<T>(x);
}

}  // namespace

Result<std::vector<Activity>> activities_from_status_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ranks") || !j["ranks"].is_array())
    return Status::error("not a status document");
  std::vector<Activity> out;
  try {
    for (const auto& r : j["ranks"]) {
      Activity a;
      a.rank = integer_field<int>(r.at("rank"));
      a.stage = integer_field<int>(r.at("pp"));
      a.tp = integer_field<int>(r.at("tp"));
      a.dp = integer_field<int>(r.at("dp"));
      if (r.contains("cp")) a.cp = integer_field<int>(r.at("cp"));
      a.step = integer_field<int64_t>(r.at("step"));
      const std::string doing = r.at("doing").get<std::string>();
      a.doing = Doing::idle;
      for (int d = 0; d <= static_cast<int>(Doing::evaluating); ++d)
        if (doing == doing_name(static_cast<Doing>(d))) a.doing = static_cast<Doing>(d);
      a.micro = integer_field<int>(r.at("micro_batch"));
      a.chunk = integer_field<int>(r.at("chunk"));
      a.action = integer_field<int>(r.at("action"));
      a.actions = integer_field<int>(r.at("actions"));
      a.waiting.what = r.at("waiting_for").get<std::string>();
      if (!r.at("waiting_on").is_array()) throw std::domain_error("waiting_on is not an array");
      for (const auto& peer : r.at("waiting_on")) a.waiting.ranks.push_back(integer_field<int>(peer));
      a.waiting.collective = r.at("collective").get<bool>();
      a.seconds_in_state = r.at("seconds_in_state").get<double>();
      a.seconds_since_progress = r.at("seconds_since_progress").get<double>();
      a.mailbox = r.contains("mailbox") ? integer_field<int64_t>(r["mailbox"]) : -1;
      a.last_step_seconds = r.contains("last_step_seconds") ? r["last_step_seconds"].get<double>() : 0;
      out.push_back(std::move(a));
    }
  } catch (const std::exception&) {  // nlohmann's, or integer_field's
    return Status::error("a malformed status document: a rank lacks a field, or has one of the wrong type");
  }
  return out;
}

std::string where_json(const std::vector<Activity>& ranks, const WaitGraph& graph) {
  return where_object(ranks, graph).dump(1) + "\n";
}

std::string stall_report_json(const std::vector<Activity>& ranks, const WaitGraph& graph, double stalled_seconds,
                              int64_t after_iteration) {
  nlohmann::json j = where_object(ranks, graph);
  j["stalled_seconds"] = stalled_seconds;
  j["after_iteration"] = after_iteration;
  return j.dump(1) + "\n";
}

}  // namespace troupe
