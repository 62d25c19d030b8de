// The inspector's `flight` and `stacks` answers and what the stall file adds of them
// (docs/INSPECT.md has the JSON): a process's part from its ranks' flight recorders
// (comm/flight_recorder.hpp) and its threads' stacks (base/stacks.hpp), and, in rank 0's process,
// the whole job's from the other processes' parts.
//
// An answer is a JSON document (text); a refused request is {"error": "..."}. `ask_peers` gets
// every other process's answer to the same request line (and lists those that did not answer in
// `unreachable`); it is called only for a job-wide answer (local false).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/flight_recorder.hpp"

namespace troupe {

using Flights = std::vector<std::shared_ptr<const comm::FlightRecorder>>;
using AskPeers = std::function<std::vector<std::string>(std::vector<std::string>& unreachable)>;

inline constexpr const char* kFlightUsage = "flight [RANK] [--last N]";
inline constexpr const char* kFlightHelp =
    "the last communication operations of every rank (or RANK): group, sequence number, kind, "
    "bytes, state, times";
inline constexpr const char* kStacksUsage = "stacks";
inline constexpr const char* kStacksHelp =
    "every thread's native stack in every process of the job";

// args: the words after "flight". {"ranks": [record...]} by rank, "unreachable" when a process
// did not answer.
std::string flight_answer(const Flights& flights, const std::vector<std::string>& args, bool local,
                          const AskPeers& ask_peers);
// {"processes": [process...]} by pid. Each process waits at most `timeout_ms` for its threads.
std::string stacks_answer(const Flights& flights, const std::vector<std::string>& args, bool local,
                          const AskPeers& ask_peers, int timeout_ms = 500);

// The stall file's document (stall_report_json, engine/activity.hpp) with "flight" (this
// process's ranks, as flight's answer) and "stacks" (this process, as one entry of stacks').
std::string with_flight_and_stacks(const std::string& stall_json, const Flights& flights);

}  // namespace troupe
