#include "comm/bootstrap/psk_channel.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "comm/bootstrap/psk_tls.hpp"

namespace troupe::comm {

namespace {

using Clock = std::chrono::steady_clock;

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

bool set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// Waits until fd is readable (or writable) or the deadline passes; false on timeout or stop.
// A signal (the inspector's `stacks` asks every thread with one) is not a timeout: poll again.
bool wait_fd(int fd, bool for_write, Clock::time_point deadline, int stop_fd = -1) {
  pollfd p[2] = {{fd, static_cast<short>(for_write ? POLLOUT : POLLIN), 0}, {stop_fd, POLLIN, 0}};
  int n = -1;
  do {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    n = ::poll(p, stop_fd >= 0 ? 2 : 1, static_cast<int>(left));
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  if (stop_fd >= 0 && (p[1].revents & POLLIN)) return false;
  return true;
}

// Drives a session's handshake to completion within the deadline.
bool handshake(tls::PskSession& s, int fd, Clock::time_point deadline, int stop_fd = -1) {
  while (true) {
    if (!s.step()) return false;
    if (s.established()) return true;
    if (!wait_fd(fd, s.wants_write(), deadline, stop_fd)) return false;
  }
}

bool write_all(tls::PskSession& s, int fd, const std::string& data, Clock::time_point deadline, int stop_fd = -1) {
  size_t at = 0;
  while (at < data.size()) {
    size_t put = 0;
    if (!s.write(data.data() + at, data.size() - at, put)) return false;
    at += put;
    if (at < data.size() && put == 0 && !wait_fd(fd, true, deadline, stop_fd)) return false;
  }
  return true;
}

}  // namespace

struct PskServer::Impl {
  std::shared_ptr<tls::PskContext> context;
  Handler handler;
  Fd listener;
  int stop_pipe[2] = {-1, -1};
  std::thread thread;
  std::atomic<int> refused{0};

  ~Impl() {
    if (stop_pipe[1] >= 0) {
      const char c = 1;
      (void)!::write(stop_pipe[1], &c, 1);
    }
    if (thread.joinable()) thread.join();
    for (int fd : stop_pipe)
      if (fd >= 0) ::close(fd);
  }

  void serve_one(int fd) {
    const auto deadline = Clock::now() + kConnectionTimeout;
    tls::PskSession s(context, tls::PskSession::Role::server, fd, "");
    if (!handshake(s, fd, deadline, stop_pipe[0])) {
      if (s.failure() == tls::Failure::wrong_key || s.failure() == tls::Failure::not_troupe) ++refused;
      return;
    }
    std::string request;
    char buf[1024];
    while (request.find('\n') == std::string::npos) {
      size_t got = 0;
      if (!s.read(buf, sizeof buf, got)) return;
      request.append(buf, got);
      if (request.size() > kMaxRequestBytes) return;
      if (got == 0 && s.pending() == 0 && !wait_fd(fd, false, deadline, stop_pipe[0])) return;
    }
    request.resize(request.find('\n'));
    std::string answer;
    try {
      answer = handler(request);
    } catch (const std::exception& e) {
      answer = std::string("{\"error\": \"the inspector failed\"}");
    }
    (void)write_all(s, fd, answer, deadline, stop_pipe[0]);
  }

  void run() {
    while (true) {
      pollfd p[2] = {{listener.fd, POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents & POLLIN) return;
      if (!(p[0].revents & POLLIN)) continue;
      Fd conn(::accept(listener.fd, nullptr, nullptr));
      if (conn.fd < 0 || !set_nonblocking(conn.fd)) continue;
      serve_one(conn.fd);
    }
  }
};

Result<std::unique_ptr<PskServer>> PskServer::start(const std::string& host, int port, const std::string& token,
                                                    Handler handler, const std::string& what) {
  auto context = tls::PskContext::create(token);
  if (!context) return context.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || found == nullptr)
    return Status::bad_input(what + " " + host + ":" + service + ": not a numeric address to listen on -- use e.g. "
                             "127.0.0.1:0 (loopback, a free port) or 0.0.0.0:29600");
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(found, ::freeaddrinfo);
  Fd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.fd < 0) return Status::error(std::string("inspector: socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.fd, found->ai_addr, found->ai_addrlen) != 0)
    return Status::bad_input(what + " " + host + ":" + service + ": cannot listen there (" + std::strerror(errno) +
                             ") -- pick another port, or 0 for a free one");
  if (::listen(fd.fd, 8) != 0) return Status::error(std::string("inspector: listen: ") + std::strerror(errno));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd.fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int actual = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                 : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::unique_ptr<PskServer> server(new PskServer());
  server->impl_ = std::make_unique<Impl>();
  Impl& m = *server->impl_;
  m.context = std::move(context).value();
  m.handler = std::move(handler);
  if (::pipe2(m.stop_pipe, O_CLOEXEC) != 0) return Status::error(std::string("inspector: pipe: ") + std::strerror(errno));
  m.listener.fd = fd.fd;
  fd.fd = -1;
  server->host_ = host;
  server->port_ = actual;
  m.thread = std::thread([&m] { m.run(); });
  return server;
}

PskServer::~PskServer() = default;

int PskServer::refused() const { return impl_->refused.load(); }

Result<std::string> psk_request(const std::string& host, int port, const std::string& token, const std::string& request,
                                std::chrono::milliseconds timeout) {
  if (request.size() >= kMaxRequestBytes || request.find('\n') != std::string::npos)
    return Status::bad_input("the request must be one line of less than " + std::to_string(kMaxRequestBytes) + " bytes");
  auto context = tls::PskContext::create(token);
  if (!context) return context.status();
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr)
    return Status::bad_input(where + ": unknown host -- give the inspect file or HOST:PORT the job printed");
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(found, ::freeaddrinfo);
  Fd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.fd < 0 || !set_nonblocking(fd.fd)) return Status::error(std::string("socket: ") + std::strerror(errno));
  const auto deadline = Clock::now() + timeout;
  if (::connect(fd.fd, found->ai_addr, found->ai_addrlen) != 0 && errno != EINPROGRESS)
    return Status::error(where + ": cannot connect (" + std::strerror(errno) + ") -- is the job still running?");
  if (!wait_fd(fd.fd, true, deadline)) return Status::error(where + ": no connection within the timeout");
  int err = 0;
  socklen_t elen = sizeof err;
  ::getsockopt(fd.fd, SOL_SOCKET, SO_ERROR, &err, &elen);
  if (err != 0) return Status::error(where + ": cannot connect (" + std::strerror(err) + ") -- is the job still running?");
  tls::PskSession s(context.value(), tls::PskSession::Role::client, fd.fd, tls::make_identity(-1, 0, "inspect", ::getpid()));
  if (!handshake(s, fd.fd, deadline)) {
    if (s.failure() == tls::Failure::wrong_key || s.failure() == tls::Failure::closed)
      return Status::bad_input(where + ": the job refused the connection (" + s.failure_text() +
                               ") -- use the token of that job (its inspect file, or TROUPE_JOB_TOKEN)");
    return Status::error(where + ": TLS handshake failed: " + s.failure_text());
  }
  if (!write_all(s, fd.fd, request + "\n", deadline)) return Status::error(where + ": the request could not be sent");
  std::string answer;
  char buf[16384];
  while (true) {
    size_t got = 0;
    if (!s.read(buf, sizeof buf, got)) break;  // closed: the whole answer is in
    answer.append(buf, got);
    if (answer.size() > kMaxAnswerBytes) return Status::error(where + ": the answer is larger than 64 MiB");
    if (got == 0 && s.pending() == 0 && !wait_fd(fd.fd, false, deadline))
      return Status::error(where + ": no complete answer within the timeout");
  }
  return answer;
}

}  // namespace troupe::comm
