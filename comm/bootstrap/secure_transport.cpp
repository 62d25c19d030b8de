#include "comm/bootstrap/secure_transport.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

namespace troupe::comm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kLogWindow{10};
using caf::io::network::default_multiplexer;
using caf::io::network::native_socket;
using caf::io::network::rw_state;

std::string seconds_text(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

std::string peer_of(native_socket fd) {
  auto addr = caf::io::network::remote_addr_of_fd(fd);
  auto port = caf::io::network::remote_port_of_fd(fd);
  if (!addr) return "an unknown address";
  return *addr + ":" + (port ? std::to_string(*port) : std::string("?"));
}

// A non-blocking TCP connect bounded by `timeout` (CAF's own connect blocks for as long as the
// kernel retries SYNs, minutes on a dead link). Returns the connected socket, non-blocking.
caf::expected<native_socket> tcp_connect(const std::string& host, uint16_t port,
                                         std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list); rc != 0)
    return caf::make_error(caf::sec::cannot_connect_to_node, "cannot resolve " + host,
                           std::string(gai_strerror(rc)));
  std::string why = "no address";
  const auto deadline = Clock::now() + timeout;
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int err = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{fd, POLLOUT, 0};
      int ready = ::poll(&p, 1, static_cast<int>(std::max<long long>(left, 1)));
      while (ready < 0 && errno == EINTR) {  // a signal, not a failure: wait out the rest
        const auto rest = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        ready = ::poll(&p, 1, static_cast<int>(std::max<long long>(rest, 1)));
      }
      if (ready == 1) {
        socklen_t len = sizeof err;
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      } else {
        err = ready == 0 ? ETIMEDOUT : errno;
      }
    }
    if (err == 0) {
      ::freeaddrinfo(list);
      return fd;
    }
    why = std::strerror(err);
    ::close(fd);
  }
  ::freeaddrinfo(list);
  return caf::make_error(caf::sec::cannot_connect_to_node, "ip_connect failed", host, port, why);
}

}  // namespace

// ---- State shared by the transport, its connections and the deadline thread -------------------

struct SecureTransport::Shared {
  SecureTransportOptions options;
  std::shared_ptr<const tls::PskContext> tls;

  struct Watch {
    int fd = -1;
    bool incoming = false;
    bool expired = false;
    Clock::time_point deadline;
    std::string peer;
  };

  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Watch> watched;  // connections in their handshake; fd valid while listed
  uint64_t next_id = 1;
  SecureTransportStats stats;
  std::pair<tls::Failure, std::string> client_failure{tls::Failure::none, ""};
  bool stopping = false;
  std::thread reaper;

  struct Limiter {
    Clock::time_point window;
    int lines = 0;
    uint64_t suppressed = 0;
  };
  std::map<std::string, Limiter> limiters;  // by kind of line

  // Says how many lines of each kind were left out in a window that has ended (called by the
  // deadline thread, which wakes up for it).
  std::vector<std::string> summaries(Clock::time_point now) {
    std::vector<std::string> out;
    for (auto& [kind, l] : limiters) {
      if (l.suppressed == 0 || now - l.window < kLogWindow) continue;
      out.push_back("and " + std::to_string(l.suppressed) + " more " + kind + " in " +
                    seconds_text(kLogWindow) + " (not logged one by one)");
      l.suppressed = 0;
    }
    return out;
  }

  void log(const std::string& line) const {
    if (options.log) {
      options.log(line);
    } else {
      std::fprintf(stderr, "troupe bootstrap: %s\n", line.c_str());
      std::fflush(stderr);
    }
  }

  // At most 5 lines per kind per window; the deadline thread reports what was left out.
  void note(const std::string& kind, const std::string& line) {
    std::vector<std::string> out;
    {
      std::lock_guard<std::mutex> lock(mu);
      const auto now = Clock::now();
      out = summaries(now);
      Limiter& l = limiters[kind];
      if (now - l.window >= kLogWindow) {
        l.window = now;
        l.lines = 0;
      }
      if (l.lines >= 5) {
        ++l.suppressed;
        cv.notify_all();  // the deadline thread reports the count when the window ends
      } else {
        ++l.lines;
        out.push_back(line);
      }
    }
    for (const auto& s : out) log(s);
  }

  // Registers a connection in its handshake; 0 when an incoming one must be refused (too many
  // pending).
  uint64_t watch(int fd, bool incoming, const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu);
    if (incoming && stats.pending >= options.max_pending_handshakes) {
      ++stats.refused_busy;
      return 0;
    }
    const uint64_t id = next_id++;
    watched[id] = Watch{fd, incoming, false, Clock::now() + options.handshake_timeout, peer};
    if (incoming) {
      ++stats.pending;
      ++stats.accepted;
    }
    cv.notify_all();
    return id;
  }

  // Whether the deadline thread closed this connection (its failure is then reported already).
  bool expired(uint64_t id) const {
    std::lock_guard<std::mutex> lock(mu);
    auto it = watched.find(id);
    return it != watched.end() && it->second.expired;
  }

  // The connection finished its handshake or is about to close its socket.
  void unwatch(uint64_t id) {
    if (id == 0) return;
    std::lock_guard<std::mutex> lock(mu);
    auto it = watched.find(id);
    if (it == watched.end()) return;
    if (it->second.incoming) --stats.pending;
    watched.erase(it);
  }

  void count(uint64_t SecureTransportStats::*counter) {
    std::lock_guard<std::mutex> lock(mu);
    ++(stats.*counter);
  }

  // The deadline thread: shuts down the sockets of handshakes past their deadline; CAF's
  // multiplexer then sees the socket fail and closes the connection. shutdown(2) from this thread
  // is safe because a socket stays listed (and open) until its connection unwatches it, which
  // happens before CAF closes it.
  void reap() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      auto next = Clock::now() + std::chrono::hours(1);
      for (const auto& [id, w] : watched)
        if (!w.expired) next = std::min(next, w.deadline);
      for (const auto& [kind, l] : limiters)
        if (l.suppressed > 0) next = std::min(next, l.window + kLogWindow);
      cv.wait_until(lock, next);
      const auto now = Clock::now();
      const std::vector<std::string> counts = summaries(now);
      std::vector<std::string> lines;
      for (auto& [id, w] : watched) {
        if (w.expired || w.deadline > now) continue;
        w.expired = true;
        ::shutdown(w.fd, SHUT_RDWR);
        ++stats.timed_out;
        lines.push_back(
            (w.incoming ? "closed the connection from " : "gave up the connection to ") + w.peer +
            ": no TLS handshake with the job key within " +
            seconds_text(options.handshake_timeout));
      }
      lock.unlock();
      for (const auto& line : counts) log(line);
      for (const auto& line : lines) note("connections closed at the handshake deadline", line);
      lock.lock();
    }
  }
};

namespace {

using SharedPtr = std::shared_ptr<SecureTransport::Shared>;

// One TCP connection's TLS session and bounds; owned by its stream's policy (so it is destroyed
// before CAF closes the socket).
class Connection {
 public:
  Connection(SharedPtr shared, int fd, tls::PskSession::Role role, uint64_t watch_id,
             std::string peer)
      : shared_(std::move(shared)),
        fd_(fd),
        role_(role),
        watch_id_(watch_id),
        peer_(std::move(peer)),
        session_(shared_->tls, role, fd, shared_->options.identity) {}
  ~Connection() { shared_->unwatch(watch_id_); }

  tls::PskSession& session() { return session_; }
  bool poisoned() const { return poisoned_; }
  size_t max_message_bytes() const { return shared_->options.max_message_bytes; }
  const std::string& peer() const { return peer_; }

  std::function<void()> on_established;  // set by the scribe: flush what BASP wrote meanwhile
  std::function<void()> on_wants_write;  // set by the scribe: the handshake waits to write

  // After a session call: reports a completed handshake or a failure once.
  void after_io(bool ok, bool was_established) {
    if (!ok) {
      report_failure();
      return;
    }
    if (!was_established && session_.established()) {
      shared_->unwatch(watch_id_);
      watch_id_ = 0;
      shared_->count(&SecureTransportStats::established);
      if (on_established) on_established();
    }
    if (session_.wants_write() && on_wants_write) on_wants_write();
  }

  // BASP asked for `bytes` at once: refuse instead of allocating them.
  void refuse_message(size_t bytes) {
    if (poisoned_) return;
    poisoned_ = true;
    shared_->count(&SecureTransportStats::oversized);
    shared_->note("connections closed for an oversized message",
                  "closed the connection " +
                      std::string(role_ == tls::PskSession::Role::server ? "from " : "to ") +
                      peer_ + ": it announced a message of " + std::to_string(bytes) +
                      " bytes, above the bootstrap's limit of " +
                      std::to_string(max_message_bytes()) + " bytes");
    ::shutdown(fd_, SHUT_RDWR);  // the next read fails, and CAF closes the connection
  }

 private:
  void report_failure() {
    if (reported_) return;
    reported_ = true;
    const tls::Failure f = session_.failure();
    if (role_ == tls::PskSession::Role::client) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!session_.established()) shared_->client_failure = {f, session_.failure_text()};
      return;
    }
    if (session_.established()) return;       // a member's connection closing: BASP reports it
    if (shared_->expired(watch_id_)) return;  // closed by the deadline, which said so
    if (f == tls::Failure::wrong_key) {
      shared_->count(&SecureTransportStats::refused_key);
      const std::string claim = tls::describe_identity(session_.peer_identity());
      shared_->note("peers refused for a wrong job token",
                    "refused " + (claim.empty() ? "a peer" : claim) + ": wrong job token from " +
                        peer_ + " (its TLS key binder did not verify)");
    } else {
      shared_->count(&SecureTransportStats::refused_other);
      shared_->note("connections refused without a TLS handshake with the job key",
                    "refused the connection from " + peer_ + ": " + session_.failure_text());
    }
  }

  SharedPtr shared_;
  int fd_;
  tls::PskSession::Role role_;
  uint64_t watch_id_;
  std::string peer_;
  tls::PskSession session_;
  bool poisoned_ = false;
  bool reported_ = false;
};

// The policy of io::network::stream_impl: socket I/O through the connection's TLS session.
class TlsPolicy {
 public:
  explicit TlsPolicy(std::shared_ptr<Connection> c) : c_(std::move(c)) {}

  rw_state read_some(size_t& result, native_socket, void* buf, size_t len) {
    result = 0;
    if (c_->poisoned()) return rw_state::failure;
    const bool was = c_->session().established();
    const bool ok = c_->session().read(buf, len, result);
    c_->after_io(ok, was);
    return ok ? rw_state::success : rw_state::failure;
  }

  rw_state write_some(size_t& result, native_socket, const void* buf, size_t len) {
    result = 0;
    if (c_->poisoned()) return rw_state::failure;
    const bool was = c_->session().established();
    const bool ok = c_->session().write(buf, len, result);
    c_->after_io(ok, was);
    if (!ok) return rw_state::failure;
    // An empty write is a nudge for the handshake: nothing to send, stop polling for writes.
    return len == 0 ? rw_state::indeterminate : rw_state::success;
  }

  bool try_accept(native_socket&, native_socket) { return false; }  // streams never accept

  // Decrypted bytes already inside OpenSSL: poll would not report them.
  bool must_read_more(native_socket, size_t) { return c_->session().pending() > 0; }

 private:
  std::shared_ptr<Connection> c_;
};

class TlsScribe final : public caf::io::scribe {
 public:
  // The stream's policy owns `c` (it must go before CAF closes the socket); c_ is a view.
  TlsScribe(default_multiplexer& mpx, native_socket fd, std::shared_ptr<Connection> c)
      : caf::io::scribe(caf::io::network::conn_hdl_from_socket(fd)),
        c_(c.get()),
        stream_(mpx, fd, std::move(c)) {
    c_->on_established = [this] {
      if (!flush_waiting_) return;
      flush_waiting_ = false;
      stream_.flush(this);
    };
    c_->on_wants_write = [this] { stream_.force_empty_write(this); };
  }
  ~TlsScribe() override {
    c_->on_established = nullptr;
    c_->on_wants_write = nullptr;
  }

  void configure_read(caf::io::receive_policy::config config) override {
    if (config.second > c_->max_message_bytes()) {
      c_->refuse_message(config.second);
      config = caf::io::receive_policy::at_most(1);
    }
    stream_.configure_read(config);
    if (!launched_) {
      launched_ = true;
      stream_.start(this);
    }
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  // BASP writes its handshake as soon as a connection exists; it stays in the buffer until the
  // peer has proven the key (nothing leaves for a peer that has not).
  void flush() override {
    if (!c_->session().established()) {
      flush_waiting_ = true;
      return;
    }
    stream_.flush(this);
  }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  Connection* c_;
  caf::io::network::stream_impl<TlsPolicy> stream_;
  bool launched_ = false;
  bool flush_waiting_ = false;
};

class TlsDoorman final : public caf::io::network::doorman_impl {
 public:
  TlsDoorman(default_multiplexer& mpx, native_socket fd, SharedPtr shared)
      : caf::io::network::doorman_impl(mpx, fd), shared_(std::move(shared)) {}

  bool new_connection() override {
    if (detached()) return false;
    auto& mpx = acceptor_.backend();
    const native_socket fd = acceptor_.accepted_socket();
    const std::string peer = peer_of(fd);
    const uint64_t id = shared_->watch(fd, true, peer);
    if (id == 0) {
      caf::io::network::close_socket(fd);
      shared_->note("connections refused at once (too many pending handshakes)",
                    "refused the connection from " + peer +
                        " at once: " + std::to_string(shared_->options.max_pending_handshakes) +
                        " TLS handshakes are pending already (a flood of connections?)");
      return false;
    }
    caf::io::network::nonblocking(fd, true);
    auto c = std::make_shared<Connection>(shared_, fd, tls::PskSession::Role::server, id, peer);
    auto scribe = caf::make_counted<TlsScribe>(mpx, fd, std::move(c));
    const auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return doorman::new_connection(&mpx, hdl);
  }

 private:
  SharedPtr shared_;
};

class TlsMiddleman final : public caf::io::middleman_actor_impl {
 public:
  TlsMiddleman(caf::actor_config& cfg, caf::actor broker, SharedPtr shared)
      : caf::io::middleman_actor_impl(cfg, std::move(broker)), shared_(std::move(shared)) {}
  const char* name() const override { return "troupe.tls_middleman"; }

 protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, uint16_t port) override {
    auto fd = tcp_connect(host, port, shared_->options.tcp_connect_timeout);
    if (!fd) return std::move(fd.error());
    const std::string peer = host + ":" + std::to_string(port);
    const uint64_t id = shared_->watch(*fd, false, peer);
    auto c = std::make_shared<Connection>(shared_, *fd, tls::PskSession::Role::client, id, peer);
    // The ClientHello went out in the constructor; on loopback the server may answer before the
    // constructor returns, so the handshake may already be done, or refused.
    c->after_io(c->session().failure() == tls::Failure::none, false);
    if (c->session().failure() != tls::Failure::none) {
      const std::string why = c->session().failure_text();
      c.reset();  // unwatches the socket before it closes
      caf::io::network::close_socket(*fd);
      return caf::make_error(caf::sec::cannot_connect_to_node, why);
    }
    return caf::make_counted<TlsScribe>(mpx(), *fd, std::move(c));
  }

  caf::expected<caf::io::doorman_ptr> open(uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    return caf::make_counted<TlsDoorman>(mpx(), *fd, shared_);
  }

 private:
  default_multiplexer& mpx() {
    return static_cast<default_multiplexer&>(system().middleman().backend());
  }
  SharedPtr shared_;
};

}  // namespace

Result<std::shared_ptr<SecureTransport>> SecureTransport::create(SecureTransportOptions options) {
  if (options.token.empty()) return Status::error("the secure transport needs the job token");
  if (options.max_pending_handshakes < 1 || options.max_message_bytes < 1024 ||
      options.handshake_timeout.count() <= 0 || options.tcp_connect_timeout.count() <= 0)
    return Status::error(
        "secure transport: max_pending_handshakes must be >= 1, max_message_bytes >= 1024 and "
        "the timeouts positive");
  auto context = tls::PskContext::create(options.token);
  if (!context) return context.status();
  auto shared = std::make_shared<Shared>();
  shared->options = std::move(options);
  shared->tls = std::move(context).value();
  shared->reaper = std::thread([raw = shared.get()] { raw->reap(); });
  return std::shared_ptr<SecureTransport>(new SecureTransport(std::move(shared)));
}

SecureTransport::SecureTransport(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

SecureTransport::~SecureTransport() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stopping = true;
  }
  shared_->cv.notify_all();
  if (shared_->reaper.joinable()) shared_->reaper.join();
}

caf::io::middleman_actor SecureTransport::spawn_middleman(caf::actor_system& sys) {
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  return sys.spawn<TlsMiddleman, caf::detached + caf::hidden>(std::move(broker), shared_);
}

SecureTransportStats SecureTransport::stats() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->stats;
}

std::pair<tls::Failure, std::string> SecureTransport::take_client_failure() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  auto out = shared_->client_failure;
  shared_->client_failure = {tls::Failure::none, ""};
  return out;
}

const SecureTransportOptions& SecureTransport::options() const {
  return shared_->options;
}

}  // namespace troupe::comm
