// Private to the ucx backend: constants and small helpers shared by the engine's files
// (comm/ucx/ucx_engine.cpp: connection, groups, messages, progress; comm/ucx/ucx_peers.cpp: peer failure
// detection and the control messages about it).
#pragma once
#include <ucp/api/ucp.h>

#include <cstdint>
#include <string>

namespace troupe::comm::ucx::detail {

inline constexpr unsigned kAmP2P = 1;
inline constexpr unsigned kAmControl = 2;
inline constexpr uint32_t kControlBye = 1;   // the sender destroys its world (it is not failing)
inline constexpr uint32_t kControlDown = 2;  // `rank` failed, as seen by the sender
// Shared memory: the sender published what we may wait for.
inline constexpr uint32_t kControlWake = 3;
// Empty iterations of the progress loop before it sleeps on the event fd: a short spin catches the
// next event of a busy exchange without a system call, and costs little when nothing comes.
inline constexpr int kIdleSpins = 16;
inline constexpr int kPollTimeoutMs = 100;  // a safety net; wake-ups come from the event fd

struct ControlHeader {
  uint32_t type;
  int32_t rank;
  int32_t from;
};

inline std::string ucs_message(ucs_status_t status) {
  return ucs_status_string(status);
}

inline uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64 finaliser over a running hash.
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

// True when process `pid` (of this pid namespace) is gone or a zombie.
bool process_gone(long pid);

// Fault injection for the tests (comm/ucx/ucx_peers.cpp): with TROUPE_FAULT_UCX_KILL=rank<R>@<STEP>,
// rank R SIGKILLs itself when its world creation reaches STEP (worker, segment, exchange,
// endpoints, attach, ready; see Engine::create), unless troupe launch restarted the process
// (TROUPE_RESTART_COUNT > 0).
void fault_point(int rank, const char* step);

// Makes a fatal error inside UCX (a log message at level FATAL, after which UCX aborts) end the
// process as troupe's run-time failure instead: one line naming this rank and UCX's message on
// stderr, exit code 1. Not installed when UCX_HANDLE_ERRORS is set (UCX's own handling is wanted
// then: a backtrace, a debugger). Idempotent; `rank` is named in the message.
void install_fatal_handler(int rank);

inline std::string identity_field(const std::string& identity, const std::string& key) {
  const std::string k = key + "=";
  size_t pos = identity.find(k);
  if (pos == std::string::npos) return "";
  pos += k.size();
  return identity.substr(pos, identity.find(' ', pos) - pos);
}

}  // namespace troupe::comm::ucx::detail
