// Where a job's rendezvous is, and where it goes when the process that hosts it is lost (in-job
// recovery with warm spares; docs/RESILIENCE.md, "The rendezvous moves").
//
// The first generation's rendezvous is rank 0's, at MASTER_ADDR:MASTER_PORT. Once every rank has
// joined a generation, the rendezvous names a standby: the lowest rank on another host than its own
// (on one host, the lowest other rank), at the address that rank reaches the rendezvous from and
// the other of MASTER_PORT and MASTER_PORT + 1. Every process learns it (members and waiting
// spares). When the rendezvous is lost (its process died, hung or was cut off), the standby hosts
// the next generation's at that place and the others look for it there first.
//
// A process started later (a replacement, a spare) knows only MASTER_ADDR; this node's processes
// therefore keep what they last learned in a hint file (TROUPE_RDZV_HINT, a path the launcher
// gives; written whole by rename), which a fresh process reads:
//
//   troupe-rdzv-hint 1
//   at ADDR PORT RANK          the rendezvous: ADDR numeric (or a host name), PORT 1..65535, RANK its host's
//   standby ADDR PORT RANK     optional: where it goes when lost
//
// Numbers are decimal without sign or leading zeros; fields one space apart; lines end with '\n';
// nothing else. The reader is strict and bounded (kMaxHintBytes; fuzz target rendezvous_hint).
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "troupe/status.hpp"

namespace troupe::comm {

inline constexpr size_t kMaxHintBytes = 1024;

struct RendezvousPlace {
  std::string addr;  // numeric IPv4 / IPv6 address or a host name (1..253 of [A-Za-z0-9.:_%-])
  int port = 0;      // 1..65535
  int rank = -1;     // the rank of the process that hosts it there (0 .. 2^30)
  bool operator==(const RendezvousPlace&) const = default;
};

// "10.0.0.2:29501 (rank 2)"; an IPv6 address in brackets.
std::string place_text(const RendezvousPlace& p);
// An address a place may carry (the hint's and the standby message's check).
bool valid_place_addr(std::string_view addr);

struct RendezvousHint {
  RendezvousPlace at;
  std::optional<RendezvousPlace> standby;
  bool operator==(const RendezvousHint&) const = default;
};

std::string encode_hint(const RendezvousHint& h);
// Bad input naming what is wrong (and the file's role), never a crash.
Result<RendezvousHint> parse_hint(std::string_view text);

// Writes `h` to `path` whole (a temporary beside it, then rename): a reader sees the old or the new
// hint, never a part.
Status write_hint(const std::string& path, const RendezvousHint& h);
// The hint at `path`: nullopt when there is none (no file); an unreadable or malformed one is an
// error (a fresh process then looks at MASTER_ADDR only). Reads at most kMaxHintBytes + 1 bytes.
Result<std::optional<RendezvousHint>> read_hint(const std::string& path);

}  // namespace troupe::comm
