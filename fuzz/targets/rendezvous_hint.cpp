// The rendezvous hint a fresh process reads (comm/bootstrap/rendezvous_place.hpp: this node's
// processes write it, TROUPE_RDZV_HINT). Properties: an accepted hint has one spelling (it writes
// back to its very bytes) and its places are within their bounds.
#include <string>

#include "comm/bootstrap/rendezvous_place.hpp"
#include "fuzz/fuzz_targets.hpp"

namespace troupe::fuzz {

Status rendezvous_hint(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto hint = comm::parse_hint(text);
  if (!hint) return hint.status();
  for (const comm::RendezvousPlace* p : {&hint->at, hint->standby ? &*hint->standby : nullptr}) {
    if (p == nullptr) continue;
    TROUPE_CHECK(comm::valid_place_addr(p->addr) && p->port >= 1 && p->port <= 65535 && p->rank >= 0,
                 "a place out of bounds accepted");
  }
  TROUPE_CHECK(comm::encode_hint(hint.value()) == text, "a hint has one spelling");
  return Status::ok();
}

}  // namespace troupe::fuzz
