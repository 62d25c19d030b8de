// One request, one answer over TLS 1.3 keyed by the job token (comm/bootstrap/psk_tls.hpp): how
// `troupe inspect` asks a running job (the job's inspector serves, the client asks). A peer
// without the token cannot complete the handshake and is never served.
//
// Protocol: the client sends one line (at most kMaxRequestBytes, ending in '\n'); the server
// answers with the handler's text and closes the connection. The server handles one connection at
// a time on its own thread, each bounded by kConnectionTimeout (a slow or hostile client delays the
// next by at most that), so it never blocks the job.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "troupe/status.hpp"

namespace troupe::comm {

inline constexpr size_t kMaxRequestBytes = 4096;
inline constexpr size_t kMaxAnswerBytes = size_t{64} << 20;
inline constexpr std::chrono::milliseconds kConnectionTimeout{5000};

class PskServer {
 public:
  // Called on the server's thread with the request line (without '\n'); returns the answer.
  using Handler = std::function<std::string(const std::string& request)>;
  // host: an address to listen on ("127.0.0.1", "0.0.0.0", "::1"); port 0 picks a free one. what:
  // the flag or role that named the address, for the messages.
  static Result<std::unique_ptr<PskServer>> start(const std::string& host, int port, const std::string& token,
                                                  Handler handler, const std::string& what = "--inspect");
  ~PskServer();  // stops the thread (a connection in progress is cut)
  PskServer(const PskServer&) = delete;
  PskServer& operator=(const PskServer&) = delete;
  const std::string& host() const { return host_; }
  int port() const { return port_; }
  // Connections refused because the client could not prove the token.
  int refused() const;

 private:
  struct Impl;
  PskServer() = default;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  int port_ = 0;
};

// Asks the server at host:port. Fails naming the reason: not reachable, wrong token (the
// handshake fails), no answer within `timeout`, an answer larger than kMaxAnswerBytes.
Result<std::string> psk_request(const std::string& host, int port, const std::string& token, const std::string& request,
                                std::chrono::milliseconds timeout = kConnectionTimeout);

}  // namespace troupe::comm
