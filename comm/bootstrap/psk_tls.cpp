#include "comm/bootstrap/psk_tls.hpp"

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

namespace troupe::comm::tls {

namespace {

constexpr std::string_view kSalt = "troupe job token v1";
constexpr std::string_view kInfo = "troupe bootstrap tls13 external psk";
constexpr std::string_view kIdentityPrefix = "troupe1 ";
// TLS_AES_128_GCM_SHA256 (RFC 8446 B.4): the suite the key is bound to.
constexpr unsigned char kSuite[2] = {0x13, 0x01};
constexpr size_t kMaxIdentity = 200;

// ---- Socket BIO: send(MSG_NOSIGNAL) / recv on a non-blocking socket ---------------------------
// OpenSSL's own socket BIO writes with write(2), which raises SIGPIPE on a closed peer.

struct SocketBio {
  int fd = -1;
  bool eof = false;
};

int bio_write(BIO* b, const char* data, size_t len, size_t* written) {
  BIO_clear_retry_flags(b);
  auto* s = static_cast<SocketBio*>(BIO_get_data(b));
  for (;;) {
    const ssize_t n = ::send(s->fd, data, len, MSG_NOSIGNAL);
    if (n >= 0) {
      *written = static_cast<size_t>(n);
      return 1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
    return 0;
  }
}

int bio_read(BIO* b, char* data, size_t len, size_t* got) {
  BIO_clear_retry_flags(b);
  auto* s = static_cast<SocketBio*>(BIO_get_data(b));
  for (;;) {
    const ssize_t n = ::recv(s->fd, data, len, 0);
    if (n > 0) {
      *got = static_cast<size_t>(n);
      return 1;
    }
    if (n == 0) {
      s->eof = true;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(b);
    return 0;
  }
}

long bio_ctrl(BIO* b, int cmd, long, void*) {
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      return 1;
    case BIO_CTRL_EOF:
      return static_cast<SocketBio*>(BIO_get_data(b))->eof ? 1 : 0;
    default:
      return 0;
  }
}

int bio_create(BIO* b) {
  BIO_set_data(b, new SocketBio);
  BIO_set_init(b, 1);
  return 1;
}

int bio_destroy(BIO* b) {
  delete static_cast<SocketBio*>(BIO_get_data(b));
  BIO_set_data(b, nullptr);
  return 1;
}

const BIO_METHOD* socket_bio_method() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "troupe socket");
    TROUPE_CHECK(m != nullptr, "OpenSSL cannot create a BIO method");
    BIO_meth_set_write_ex(m, bio_write);
    BIO_meth_set_read_ex(m, bio_read);
    BIO_meth_set_ctrl(m, bio_ctrl);
    BIO_meth_set_create(m, bio_create);
    BIO_meth_set_destroy(m, bio_destroy);
    return m;
  }();
  return method;
}

// ---- PSK callbacks ------------------------------------------------------------------------------

int session_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

PskSession* session_of(SSL* ssl) {
  return static_cast<PskSession*>(SSL_get_ex_data(ssl, session_index()));
}

SSL_SESSION* make_psk_session(const Psk& key, const SSL_CIPHER* cipher) {
  SSL_SESSION* s = SSL_SESSION_new();
  if (s == nullptr) return nullptr;
  if (SSL_SESSION_set1_master_key(s, key.data(), key.size()) != 1 ||
      SSL_SESSION_set_cipher(s, cipher) != 1 ||
      SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

// Client: offer the job key under our identity (OpenSSL takes the returned session's reference).
int use_session_cb(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen,
                   SSL_SESSION** sess) {
  PskSession* s = session_of(ssl);
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kSuite);
  if (s == nullptr || cipher == nullptr) return 0;
  *sess = nullptr;
  *id = nullptr;
  *idlen = 0;
  if (md != nullptr && md != SSL_CIPHER_get_handshake_digest(cipher)) return 1;  // no PSK fits
  *sess = make_psk_session(s->context().key(), cipher);
  if (*sess == nullptr) return 0;
  *id = reinterpret_cast<const unsigned char*>(s->own_identity().data());
  *idlen = s->own_identity().size();
  return 1;
}

// Server: every troupe identity maps to the job key; OpenSSL then checks the binder.
int find_session_cb(SSL* ssl, const unsigned char* identity, size_t len, SSL_SESSION** sess) {
  PskSession* s = session_of(ssl);
  *sess = nullptr;
  if (s == nullptr) return 0;
  const std::string id(reinterpret_cast<const char*>(identity), std::min(len, kMaxIdentity));
  s->set_peer_identity(id);
  if (id.rfind(kIdentityPrefix, 0) != 0) return 1;  // not ours: no PSK, the handshake fails
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kSuite);
  if (cipher == nullptr) return 0;
  *sess = make_psk_session(s->context().key(), cipher);
  return *sess != nullptr ? 1 : 0;
}

// Certificates play no part: a server that sends one (it did not take our key) is refused.
int refuse_certificates(int, X509_STORE_CTX*) {
  return 0;
}

SSL_CTX* make_context(bool server) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return nullptr;
  bool ok = SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) == 1 &&
            SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) == 1 &&
            SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256") == 1;
  // No tickets, no cache: every connection proves the key afresh. No SSL_OP_ALLOW_NO_DHE_KEX:
  // psk_dhe_ke only (forward secrecy).
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_COMPRESSION);
  ok = ok && SSL_CTX_set_num_tickets(ctx, 0) == 1;
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
  if (server) {
    SSL_CTX_set_psk_find_session_callback(ctx, find_session_cb);
  } else {
    SSL_CTX_set_psk_use_session_callback(ctx, use_session_cb);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, refuse_certificates);
  }
  if (!ok) {
    SSL_CTX_free(ctx);
    return nullptr;
  }
  return ctx;
}

std::string printable(std::string_view s, size_t max) {
  std::string out;
  for (char c : s.substr(0, max)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

// The value of "key=" in a space-separated identity, or "".
std::string field(std::string_view id, std::string_view key) {
  std::string k(1, ' ');
  k.append(key);
  k.push_back('=');
  const size_t at = id.find(k);
  if (at == std::string_view::npos) return "";
  const size_t begin = at + k.size();
  const size_t end = std::min(id.find(' ', begin), id.size());
  return std::string(id.substr(begin, end - begin));
}

std::string openssl_reasons() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    const char* r = ERR_reason_error_string(e);
    if (!out.empty()) out += "; ";
    out += r != nullptr ? r : "error " + std::to_string(ERR_GET_REASON(e));
  }
  return out;
}

}  // namespace

std::string hkdf_sha256(std::string_view ikm, std::string_view salt, std::string_view info,
                        size_t length) {
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  TROUPE_CHECK(kdf != nullptr, "OpenSSL has no HKDF (a broken libssl installation?)");
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  TROUPE_CHECK(ctx != nullptr, "OpenSSL cannot create an HKDF context");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<char*>(ikm.data()),
                                        ikm.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(salt.data()),
                                        salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(info.data()),
                                        info.size()),
      OSSL_PARAM_construct_end()};
  std::string out(length, '\0');
  const int ok = EVP_KDF_derive(ctx, reinterpret_cast<unsigned char*>(out.data()), length, params);
  EVP_KDF_CTX_free(ctx);
  TROUPE_CHECK(ok == 1, "HKDF-SHA256 failed for a " + std::to_string(length) + "-byte output");
  return out;
}

Psk derive_psk(std::string_view token) {
  const std::string k = hkdf_sha256(token, kSalt, kInfo, 32);
  Psk key;
  std::copy(k.begin(), k.end(), key.begin());
  return key;
}

std::string make_identity(int rank, int world_size, std::string_view host, int pid) {
  std::string h;
  for (char c : host.substr(0, 64))
    h += (c > 0x20 && c < 0x7f) ? c : '_';  // no spaces: fields are space-separated
  return std::string(kIdentityPrefix) + "rank=" + std::to_string(rank) +
         " world=" + std::to_string(world_size) + " host=" + (h.empty() ? "?" : h) +
         " pid=" + std::to_string(pid);
}

std::string describe_identity(std::string_view identity) {
  if (identity.rfind(kIdentityPrefix, 0) != 0) return "";
  const std::string id = printable(identity, kMaxIdentity);
  auto f = [&](std::string_view key) {
    const std::string v = field(id, key);
    return v.empty() ? std::string("?") : printable(v, 64);
  };
  return "a peer claiming rank " + f("rank") + " of " + f("world") + " (host " + f("host") +
         ", pid " + f("pid") + ")";
}

const char* failure_name(Failure f) {
  switch (f) {
    case Failure::none:
      return "none";
    case Failure::closed:
      return "closed";
    case Failure::wrong_key:
      return "wrong key";
    case Failure::not_troupe:
      return "not troupe";
    case Failure::protocol:
      return "protocol";
  }
  return "?";
}

Result<std::shared_ptr<PskContext>> PskContext::create(std::string_view token) {
  std::shared_ptr<PskContext> c(new PskContext);
  c->client_ = make_context(false);
  c->server_ = make_context(true);
  if (c->client_ == nullptr || c->server_ == nullptr)
    return Status::error("OpenSSL cannot set up TLS 1.3 with a pre-shared key (" +
                         openssl_reasons() + ") -- check the libssl3 installation");
  c->key_ = derive_psk(token);
  return c;
}

PskContext::~PskContext() {
  SSL_CTX_free(client_);
  SSL_CTX_free(server_);
  OPENSSL_cleanse(key_.data(), key_.size());
}

PskSession::PskSession(std::shared_ptr<const PskContext> context, Role role, int fd,
                       std::string identity)
    : context_(std::move(context)), role_(role), identity_(std::move(identity)) {
  ssl_ = SSL_new(role_ == Role::client ? context_->client() : context_->server());
  BIO* bio = ssl_ != nullptr ? BIO_new(socket_bio_method()) : nullptr;
  if (ssl_ == nullptr || bio == nullptr) {
    failure_ = Failure::protocol;
    failure_text_ = "OpenSSL cannot create a session (" + openssl_reasons() + ")";
    return;
  }
  static_cast<SocketBio*>(BIO_get_data(bio))->fd = fd;
  SSL_set_bio(ssl_, bio, bio);  // one BIO for both directions: one reference, owned by ssl_
  SSL_set_ex_data(ssl_, session_index(), this);
  if (role_ == Role::client) {
    SSL_set_connect_state(ssl_);
    step();  // the ClientHello goes out now
  } else {
    SSL_set_accept_state(ssl_);
  }
}

PskSession::~PskSession() {
  SSL_free(ssl_);
}

bool PskSession::fail_from(int ret) {
  const int err = SSL_get_error(ssl_, ret);
  if (err == SSL_ERROR_WANT_READ) {
    wants_write_ = false;
    return true;
  }
  if (err == SSL_ERROR_WANT_WRITE) {
    wants_write_ = true;
    return true;
  }
  bool binder = false, decrypt_alert = false, eof = err == SSL_ERROR_ZERO_RETURN;
  std::string reasons;
  while (const unsigned long e = ERR_get_error()) {
    const int reason = ERR_GET_REASON(e);
    binder = binder || reason == SSL_R_BINDER_DOES_NOT_VERIFY;
    // OpenSSL 3.0 answers a binder that does not verify with illegal_parameter, others with
    // decrypt_error; from a troupe server during the PSK handshake both mean the key differs.
    decrypt_alert = decrypt_alert || reason == SSL_R_TLSV1_ALERT_DECRYPT_ERROR ||
                    reason == SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER;
    eof = eof || reason == SSL_R_UNEXPECTED_EOF_WHILE_READING;
    const char* text = ERR_reason_error_string(e);
    if (!reasons.empty()) reasons += "; ";
    reasons += text != nullptr ? text : "error " + std::to_string(reason);
  }
  if (err == SSL_ERROR_SYSCALL && reasons.empty()) eof = true;
  if (reasons.empty()) reasons = eof ? "connection closed" : "error " + std::to_string(err);
  if (role_ == Role::server && binder) {
    failure_ = Failure::wrong_key;
    failure_text_ = "wrong job token (its key binder did not verify)";
  } else if (role_ == Role::client && decrypt_alert) {
    failure_ = Failure::wrong_key;
    failure_text_ = "wrong job token (it did not accept this process's TLS key)";
  } else if (eof && !established_) {
    failure_ = Failure::closed;
    failure_text_ = "the connection closed during the TLS handshake";
  } else if (eof) {
    failure_ = Failure::closed;
    failure_text_ = "connection closed";
  } else if (role_ == Role::server && !established_ && describe_identity(peer_identity_).empty()) {
    failure_ = Failure::not_troupe;
    failure_text_ = "not a troupe peer: no TLS handshake with the job key (" + reasons + ")";
  } else {
    failure_ = Failure::protocol;
    failure_text_ = "TLS error (" + reasons + ")";
  }
  return false;
}

bool PskSession::step() {
  if (failure_ != Failure::none) return false;
  if (established_) return true;
  ERR_clear_error();
  const int r = SSL_do_handshake(ssl_);
  if (r != 1) return fail_from(r);
  // A completed handshake that did not use the job key (a full handshake) proves nothing.
  if (SSL_session_reused(ssl_) != 1) {
    failure_ = Failure::wrong_key;
    failure_text_ = "the peer completed TLS without the job key";
    return false;
  }
  established_ = true;
  wants_write_ = false;
  return true;
}

bool PskSession::read(void* buf, size_t len, size_t& got) {
  got = 0;
  if (!step()) return false;
  if (!established_ || len == 0) return true;
  ERR_clear_error();
  size_t n = 0;
  const int r = SSL_read_ex(ssl_, buf, len, &n);
  if (r == 1) {
    got = n;
    return true;
  }
  return fail_from(r);
}

bool PskSession::write(const void* buf, size_t len, size_t& put) {
  put = 0;
  if (!step()) return false;
  if (!established_ || len == 0) return true;
  ERR_clear_error();
  size_t n = 0;
  const int r = SSL_write_ex(ssl_, buf, len, &n);
  if (r == 1) {
    put = n;
    return true;
  }
  return fail_from(r);
}

size_t PskSession::pending() const {
  return ssl_ != nullptr && established_ ? static_cast<size_t>(SSL_pending(ssl_)) : 0;
}

}  // namespace troupe::comm::tls
