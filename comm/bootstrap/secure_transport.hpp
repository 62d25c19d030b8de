// SecureTransport: CAF's io middleman with troupe's own connections for the bootstrap. A
// middleman actor (spawned in the bootstrap's actor system, used for publish and connect instead
// of sys.middleman().actor_handle()) gives every connection CAF's BASP broker makes a TLS 1.3
// session keyed by the job token (comm/bootstrap/psk_tls.hpp) and these bounds:
//
//   - Nothing of a peer reaches BASP before it has proven the job token: its bytes go to OpenSSL
//     until the handshake completes, and BASP's own first message to it (the server handshake,
//     which names the published actor) waits until then too.
//   - Handshakes are bounded: at most max_pending_handshakes accepted connections may be in their
//     handshake at once (more are closed at once), and one that has not finished after
//     handshake_timeout is shut down. Outgoing connects give up after tcp_connect_timeout.
//   - Message sizes are capped before allocation: when BASP asks a connection for a payload
//     larger than max_message_bytes (it would allocate a buffer of that size), the connection is
//     closed instead, so even a peer holding the token cannot make this process allocate more.
//
// Refusals (wrong token, not TLS, too many pending handshakes, timeouts, oversized messages) are
// logged with the peer's address through options.log, at most 5 lines per kind per 10 s (a flood
// is summarised). The token itself is never logged or sent.
//
// Threads: create() starts one thread that enforces the handshake deadlines. Connections run in
// CAF's multiplexer thread; stats() and take_client_failure() may be called from any thread.
#pragma once
#include <caf/fwd.hpp>
#include <caf/io/middleman_actor.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/bootstrap/psk_tls.hpp"
#include "troupe/status.hpp"

namespace troupe::comm {

struct SecureTransportOptions {
  std::string token;     // the job token (the key is derived from it; it is never sent)
  std::string identity;  // what this process claims when it connects: tls::make_identity(...)
  size_t max_message_bytes = size_t{16} << 20;
  std::chrono::milliseconds handshake_timeout{10'000};
  int max_pending_handshakes = 64;
  std::chrono::milliseconds tcp_connect_timeout{5'000};
  // Thread-safe; called from CAF's multiplexer thread and the deadline thread. Default: stderr.
  std::function<void(const std::string&)> log;
};

struct SecureTransportStats {
  uint64_t accepted = 0;       // incoming TCP connections taken into a handshake
  uint64_t refused_busy = 0;   // closed at once: too many handshakes pending
  uint64_t established = 0;    // handshakes completed (both directions)
  uint64_t refused_key = 0;    // the peer did not prove the job token
  uint64_t refused_other = 0;  // not TLS, other TLS errors, closed during the handshake
  uint64_t timed_out = 0;      // no handshake within handshake_timeout
  uint64_t oversized = 0;      // closed: a message above max_message_bytes was announced
  int pending = 0;             // incoming handshakes in progress now
};

class SecureTransport {
 public:
  struct Shared;
  static Result<std::shared_ptr<SecureTransport>> create(SecureTransportOptions options);
  // Stops the deadline thread. Connections still open stay usable until CAF closes them.
  ~SecureTransport();
  SecureTransport(const SecureTransport&) = delete;
  SecureTransport& operator=(const SecureTransport&) = delete;

  // A middleman actor for `sys` (io middleman loaded) whose publish and connect go through this
  // transport; it shares CAF's BASP broker. Detached and hidden: stop it (send_exit + wait_for)
  // before `sys` goes.
  caf::io::middleman_actor spawn_middleman(caf::actor_system& sys);

  SecureTransportStats stats() const;
  // Why the latest outgoing connection's handshake failed ({none, ""} if none did); clears it.
  std::pair<tls::Failure, std::string> take_client_failure();
  const SecureTransportOptions& options() const;

 private:
  explicit SecureTransport(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
};

}  // namespace troupe::comm
