#include "engine/flight_report.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/stacks.hpp"
#include "engine/inspect_merge.hpp"

namespace troupe {

namespace {

using nlohmann::json;

// Names from outside (thread names, symbols, a peer's strings) may not be UTF-8: replaced, not
// thrown.
std::string text(const json& j, int indent = -1) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string error_json(const std::string& message) {
  return text(json{{"error", message}}) + "\n";
}

std::optional<long long> whole_number(const std::string& word) {
  long long v = 0;
  const char* end = word.data() + word.size();
  const auto [at, ec] = std::from_chars(word.data(), end, v);
  if (ec != std::errc() || at != end || v < 0) return std::nullopt;
  return v;
}

struct FlightArgs {
  int rank = -1;    // -1: every rank
  size_t last = 0;  // 0: all the ring holds
};

// "flight [RANK] [--last N]"; an error names the word and the usage.
std::optional<FlightArgs> parse_flight_args(const std::vector<std::string>& args,
                                            std::string& error) {
  FlightArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--last") {
      const auto n = i + 1 < args.size() ? whole_number(args[i + 1]) : std::nullopt;
      if (!n || *n < 1 || *n > 1'000'000) {
        error = "flight: --last takes a number of operations from 1 to 1000000 -- usage: " +
                std::string(kFlightUsage);
        return std::nullopt;
      }
      out.last = static_cast<size_t>(*n);
      ++i;
    } else if (const auto r = whole_number(args[i]); r && out.rank < 0 && *r < (1 << 30)) {
      out.rank = static_cast<int>(*r);
    } else {
      error = "flight: unexpected \"" + args[i] + "\" -- usage: " + std::string(kFlightUsage);
      return std::nullopt;
    }
  }
  return out;
}

json local_flight(const Flights& flights, const FlightArgs& args) {
  json ranks = json::array();
  for (const auto& f : flights)
    if (f && (args.rank < 0 || f->rank() == args.rank))
      ranks.push_back(json::parse(comm::flight_record_json(f->snapshot(args.last))));
  return json{{"ranks", ranks}};
}

// The job's size as this process's recorders know it (the world group's members), or 0.
size_t job_size(const Flights& flights) {
  for (const auto& f : flights) {
    if (!f) continue;
    for (const comm::FlightGroup& g : f->snapshot(1).groups)
      if (g.name == "world") return g.members.size();
  }
  return 0;
}

std::string hex(uintptr_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%zx", static_cast<size_t>(v));
  return text;
}

json process_stacks(const Flights& flights, int timeout_ms) {
  const ProcessStacks stacks = capture_stacks(std::chrono::milliseconds(timeout_ms));
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  std::vector<int> ranks;
  for (const auto& f : flights)
    if (f) ranks.push_back(f->rank());
  json threads = json::array();
  for (const ThreadStack& t : stacks.threads) {
    json frames = json::array();
    for (const StackFrame& f : t.frames)
      frames.push_back({{"address", hex(f.address)},
                        {"function", f.function.empty() ? json(nullptr) : json(f.function)},
                        {"function_offset", hex(f.function_offset)},
                        {"module", f.module},
                        {"module_offset", hex(f.offset)}});
    threads.push_back({{"tid", t.tid},
                       {"name", t.name},
                       {"answered", t.answered},
                       {"caller", t.caller},
                       {"frames", frames}});
  }
  json p{{"pid", stacks.pid},
         {"host", host},
         {"ranks", ranks},
         {"signal", stacks.signal},
         {"threads", threads}};
  if (!stacks.error.empty()) p["error"] = stacks.error;
  return p;
}

}  // namespace

std::string flight_answer(const Flights& flights, const std::vector<std::string>& args, bool local,
                          const AskPeers& ask_peers) {
  std::string error;
  const auto parsed = parse_flight_args(args, error);
  if (!parsed) return error_json(error);
  const json mine = local_flight(flights, *parsed);
  if (local) return text(mine) + "\n";
  // One rank of this process: nobody else has it.
  if (parsed->rank >= 0 && !mine["ranks"].empty()) return text(mine, 1) + "\n";
  std::vector<std::string> unreachable;
  const std::vector<std::string> answers = ask_peers(unreachable);
  const std::string merged = merge_answers(text(mine), answers, "ranks", "rank", unreachable);
  if (parsed->rank >= 0 && unreachable.empty() && json::parse(merged)["ranks"].empty()) {
    const size_t size = job_size(flights);
    return error_json(
        "flight: no rank " + std::to_string(parsed->rank) + " in this job" +
        (size > 0 ? " (its ranks are 0 to " + std::to_string(size - 1) + ")" : std::string()));
  }
  return merged;
}

std::string stacks_answer(const Flights& flights, const std::vector<std::string>& args, bool local,
                          const AskPeers& ask_peers, int timeout_ms) {
  if (!args.empty())
    return error_json("stacks: unexpected \"" + args.front() + "\" -- usage: " + kStacksUsage);
  const json mine{{"processes", json::array({process_stacks(flights, timeout_ms)})}};
  if (local) return text(mine) + "\n";
  std::vector<std::string> unreachable;
  const std::vector<std::string> answers = ask_peers(unreachable);
  return merge_answers(text(mine), answers, "processes", "pid", unreachable);
}

std::string with_flight_and_stacks(const std::string& stall_json, const Flights& flights) {
  json j = json::parse(stall_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return stall_json;
  j["flight"] = local_flight(flights, FlightArgs{});
  j["stacks"] = process_stacks(flights, 500);
  return text(j, 1) + "\n";
}

}  // namespace troupe
