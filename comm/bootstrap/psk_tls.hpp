// TLS 1.3 with an external pre-shared key derived from the job token: the transport of the
// bootstrap's control connections (comm/bootstrap/secure_transport.hpp puts it under CAF's middleman).
//
// Key: psk = HKDF-SHA256(ikm = the token's bytes, salt = "troupe job token v1",
// info = "troupe bootstrap tls13 external psk"), 32 bytes, cipher suite TLS_AES_128_GCM_SHA256.
// The token never leaves the process: the handshake proves knowledge of the key with the PSK
// binder (RFC 8446 4.2.11), and psk_dhe_ke (ephemeral X25519 on top of the key) gives forward
// secrecy. No certificates and nothing on disk. A peer without the token cannot complete the
// handshake, so nothing it sends reaches the layer above; its bytes go to OpenSSL only, which
// reads one TLS record at a time (at most ~16.7 KiB).
//
// PSK identity: what the client claims, in plain text ("troupe1 rank=R world=W host=H pid=P",
// see make_identity): the server uses it for its logs only, so that a refusal can say who tried.
// It is not secret and proves nothing.
//
// PskSession drives one non-blocking socket: read() and write() first advance the handshake,
// then move application bytes. Socket I/O uses send(MSG_NOSIGNAL)/recv, so a closed peer never
// raises SIGPIPE. Not thread-safe: one session is used by one thread at a time (CAF's multiplexer).
// A PskContext may be shared by any number of sessions and threads.
#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "troupe/status.hpp"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace troupe::comm::tls {

using Psk = std::array<unsigned char, 32>;

Psk derive_psk(std::string_view token);
// RFC 5869 HKDF with SHA-256 (what derive_psk uses; exposed for its test vectors). `length` <=
// 255*32.
std::string hkdf_sha256(std::string_view ikm, std::string_view salt, std::string_view info,
                        size_t length);

// "troupe1 rank=R world=W host=H pid=P" (host reduced to printable characters, at most 64).
std::string make_identity(int rank, int world_size, std::string_view host, int pid);

// What a client's identity claims, for logs: "a peer claiming rank R of W (host H, pid P)", or ""
// when the identity is not troupe's. Untrusted input: the result is printable ASCII, bounded.
std::string describe_identity(std::string_view identity);

class PskContext {
 public:
  // Fails only when OpenSSL cannot set up TLS 1.3 (a broken installation).
  static Result<std::shared_ptr<PskContext>> create(std::string_view token);
  ~PskContext();
  PskContext(const PskContext&) = delete;
  PskContext& operator=(const PskContext&) = delete;

  SSL_CTX* client() const { return client_; }
  SSL_CTX* server() const { return server_; }
  const Psk& key() const { return key_; }

 private:
  PskContext() = default;
  SSL_CTX* client_ = nullptr;
  SSL_CTX* server_ = nullptr;
  Psk key_{};
};

// Why a session failed.
enum class Failure {
  none,
  closed,      // the peer closed the connection or the socket failed
  wrong_key,   // server: the client's binder did not verify; client: the server refused our key
  not_troupe,  // server: no troupe PSK identity offered (not TLS, or another client)
  protocol,    // any other TLS error
};

class PskSession {
 public:
  enum class Role { client, server };
  // `identity`: sent by a client (make_identity); ignored for a server. The session does not own
  // `fd`. A client sends its ClientHello at once.
  PskSession(std::shared_ptr<const PskContext> context, Role role, int fd, std::string identity);
  ~PskSession();
  PskSession(const PskSession&) = delete;
  PskSession& operator=(const PskSession&) = delete;

  // Advances the handshake; false once the session failed (see failure()).
  bool step();
  bool established() const { return established_; }
  // The handshake is blocked until the socket can take more bytes (poll for writing).
  bool wants_write() const { return wants_write_; }

  // Non-blocking; `got` / `put` = bytes moved, 0 when the socket has nothing / no room (or the
  // handshake is not done). false once the session failed or the peer closed it.
  bool read(void* buf, size_t len, size_t& got);
  bool write(const void* buf, size_t len, size_t& put);
  // Decrypted bytes waiting in the session (readable without touching the socket).
  size_t pending() const;

  Failure failure() const { return failure_; }
  // One line on why it failed, e.g. "the peer's key binder did not verify (wrong job token)".
  const std::string& failure_text() const { return failure_text_; }
  // Server: the identity the client offered (raw, untrusted), "" if none.
  const std::string& peer_identity() const { return peer_identity_; }

  // For OpenSSL's callbacks.
  const std::string& own_identity() const { return identity_; }
  void set_peer_identity(std::string id) { peer_identity_ = std::move(id); }
  const PskContext& context() const { return *context_; }

 private:
  bool fail_from(int ret);

  std::shared_ptr<const PskContext> context_;
  Role role_;
  SSL* ssl_ = nullptr;
  std::string identity_;
  std::string peer_identity_;
  bool established_ = false;
  bool wants_write_ = false;
  Failure failure_ = Failure::none;
  std::string failure_text_;
};

const char* failure_name(Failure f);

}  // namespace troupe::comm::tls
