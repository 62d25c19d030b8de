// The bootstrap's transport (comm/bootstrap/psk_tls.hpp, comm/bootstrap/secure_transport.hpp): TLS 1.3 sessions keyed
// by the job token over socket pairs, then hostile peers against a real rank 0 over loopback --
// wrong token, garbage, plain (unencrypted) CAF, idle connections, a flood of them, an
// authenticated peer announcing a 4 GiB message, a gather too large for one message -- and a
// relay that records every byte between two ranks, which must hold neither the token nor the
// blobs in the clear.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap/caf_bootstrap.hpp"
#include "tests/comm/bootstrap_test_util.hpp"
#include "comm/bootstrap/psk_tls.hpp"
#include "comm/bootstrap/secure_transport.hpp"

namespace troupe::comm {
namespace {

using Catch::Contains;
using test::create_ok;
using test::LogSink;
using test::options_with;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const std::string kToken = "5e1c0a7d9b3f4e2a6c8d0b1f3a5e7c9d";
const std::string kOtherToken = "0123456789abcdef0123456789abcdef";

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

struct SocketPair {
  int a = -1, b = -1;
  SocketPair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
    a = fds[0];
    b = fds[1];
  }
  ~SocketPair() {
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
  }
};

std::shared_ptr<tls::PskContext> context(const std::string& token) {
  auto c = tls::PskContext::create(token);
  INFO((c ? "" : c.status().message()));
  REQUIRE(c);
  return std::move(c).value();
}

// Steps both sessions until both are established or one failed (bounded).
void handshake(tls::PskSession& client, tls::PskSession& server) {
  const auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    const bool c = client.step(), s = server.step();
    if (!c || !s || (client.established() && server.established())) return;
    std::this_thread::sleep_for(1ms);
  }
}

// Moves `data` from `from` to `to` (both established), returning what arrived.
std::string transfer(tls::PskSession& from, tls::PskSession& to, const std::string& data) {
  std::string got;
  size_t sent = 0;
  const auto deadline = Clock::now() + 10s;
  std::vector<char> buf(7919);  // odd on purpose: records and reads do not line up
  while (got.size() < data.size() && Clock::now() < deadline) {
    size_t put = 0;
    if (sent < data.size()) REQUIRE(from.write(data.data() + sent, data.size() - sent, put));
    sent += put;
    size_t n = 0;
    do {
      REQUIRE(to.read(buf.data(), buf.size(), n));
      got.append(buf.data(), n);
    } while (n > 0);
  }
  return got;
}

std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(gen());
  return s;
}

TEST_CASE("HKDF-SHA256 gives RFC 5869's test vector; the job key depends on the token only",
          "[tls]") {
  // RFC 5869, A.1.
  const std::string ikm(22, '\x0b');
  const std::string salt = unhex("000102030405060708090a0b0c");
  const std::string info = unhex("f0f1f2f3f4f5f6f7f8f9");
  CHECK(hex(tls::hkdf_sha256(ikm, salt, info, 42)) ==
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  CHECK(tls::derive_psk(kToken) == tls::derive_psk(kToken));
  CHECK(tls::derive_psk(kToken) != tls::derive_psk(kOtherToken));
  const auto key = tls::derive_psk(kToken);
  CHECK(std::string(key.begin(), key.end()).find(kToken.substr(0, 8)) == std::string::npos);
}

TEST_CASE("identities are printable and bounded whatever the peer sends", "[tls]") {
  const std::string id = tls::make_identity(3, 8, "node 7\x01", 4711);
  CHECK(id == "troupe1 rank=3 world=8 host=node_7_ pid=4711");
  CHECK(tls::describe_identity(id) == "a peer claiming rank 3 of 8 (host node_7_, pid 4711)");
  CHECK(tls::describe_identity("GET / HTTP/1.1") == "");
  std::string hostile = "troupe1 rank=\x1b[31m world=" + std::string(5000, 'x');
  const std::string d = tls::describe_identity(hostile);
  CHECK(d.size() < 300);
  for (char c : d) CHECK((c >= 0x20 && c < 0x7f));
}

TEST_CASE("sessions with the same token complete TLS 1.3 and move bytes both ways intact",
          "[tls]") {
  auto ctx = context(kToken);
  SocketPair sp;
  const std::string id = tls::make_identity(1, 2, "h1", 42);
  tls::PskSession client(ctx, tls::PskSession::Role::client, sp.a, id);
  tls::PskSession server(ctx, tls::PskSession::Role::server, sp.b, "");
  handshake(client, server);
  INFO(client.failure_text() << " / " << server.failure_text());
  REQUIRE(client.established());
  REQUIRE(server.established());
  CHECK(server.peer_identity() == id);
  const std::string up = random_bytes(300'001, 1), down = random_bytes(65'537, 2);
  CHECK(transfer(client, server, up) == up);
  CHECK(transfer(server, client, down) == down);
}

TEST_CASE("a wrong token fails the handshake on both sides before any byte is delivered", "[tls]") {
  SocketPair sp;
  tls::PskSession client(context(kOtherToken), tls::PskSession::Role::client, sp.a,
                         tls::make_identity(1, 2, "h1", 42));
  tls::PskSession server(context(kToken), tls::PskSession::Role::server, sp.b, "");
  handshake(client, server);
  CHECK_FALSE(server.established());
  CHECK(server.failure() == tls::Failure::wrong_key);
  // The client learns it from the server's alert.
  const auto deadline = Clock::now() + 5s;
  while (client.failure() == tls::Failure::none && Clock::now() < deadline) {
    client.step();
    std::this_thread::sleep_for(1ms);
  }
  CHECK(client.failure() == tls::Failure::wrong_key);
  CHECK_THAT(client.failure_text(), Contains("wrong job token"));
  char buf[64];
  size_t n = 0;
  CHECK_FALSE(server.read(buf, sizeof buf, n));
  CHECK(n == 0);
}

TEST_CASE("garbage, an HTTP request and a raw BASP header are not troupe peers", "[tls]") {
  std::string basp(32, '\0');  // client handshake claiming a 0xF0000000-byte payload
  basp[0] = 1;
  basp[4] = '\xf0';
  const std::vector<std::string> inputs = {random_bytes(4096, 7), "GET / HTTP/1.1\r\n\r\n", basp};
  for (const auto& input : inputs) {
    SocketPair sp;
    tls::PskSession server(context(kToken), tls::PskSession::Role::server, sp.b, "");
    REQUIRE(::send(sp.a, input.data(), input.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(input.size()));
    CHECK_FALSE(server.step());
    CHECK(server.failure() == tls::Failure::not_troupe);
    CHECK_THAT(server.failure_text(), Contains("not a troupe peer"));
  }
  // A truncated ClientHello: the server waits for the rest (the deadline is the transport's).
  SocketPair sp;
  tls::PskSession server(context(kToken), tls::PskSession::Role::server, sp.b, "");
  const std::string start("\x16\x03\x01\x01\x00\x01\x00\x00\xfc\x03\x03", 11);
  REQUIRE(::send(sp.a, start.data(), start.size(), MSG_NOSIGNAL) == 11);
  CHECK(server.step());
  CHECK_FALSE(server.established());
  ::close(sp.a);
  sp.a = -1;
  CHECK_FALSE(server.step());
  CHECK(server.failure() == tls::Failure::closed);
}

// ---- Against a real rank 0 over loopback ------------------------------------------------------


LaunchEnv make_env(int rank, int world, int port, const std::string& token = kToken) {
  return test::make_env(rank, world, port, token);
}


int tcp_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// True once the server has closed `fd` (EOF or reset), waiting up to `timeout`.
bool closed_by_peer(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (::poll(&p, 1, 50) == 1) {
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    }
  }
  return false;
}

// The two remaining ranks of a 2-rank job meet: rank 1 joins, waits `pause` and they gather.
void job_still_works(CafBootstrap& r0, int port, const CafBootstrapOptions& o,
                     std::chrono::milliseconds pause = 0ms) {
  std::vector<std::string> got1;
  std::thread t([&] {
    auto r1 = create_caf_bootstrap(make_env(1, 2, port), o);
    if (!r1) {
      got1 = {"join failed: " + r1.status().message()};
      return;
    }
    std::this_thread::sleep_for(pause);
    auto a = (*r1)->all_gather("after", "one");
    if (a) got1 = *a;
  });
  auto a0 = r0.all_gather("after", "zero");
  t.join();
  REQUIRE(a0);
  CHECK(*a0 == std::vector<std::string>{"zero", "one"});
  CHECK(got1 == std::vector<std::string>{"zero", "one"});
}

size_t peak_rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}

TEST_CASE("rank 0 closes connections that do not finish the handshake in time", "[transport]") {
  LogSink sink;
  auto o = options_with(sink);
  o.handshake_timeout = 300ms;
  auto r0 = create_ok(make_env(0, 2, 0), o);
  const int idle = tcp_connect(r0->port());
  const int truncated = tcp_connect(r0->port());
  const std::string start("\x16\x03\x01\x01\x00\x01", 6);  // a ClientHello that never ends
  REQUIRE(::send(truncated, start.data(), start.size(), MSG_NOSIGNAL) == 6);
  CHECK(closed_by_peer(idle, 5s));
  CHECK(closed_by_peer(truncated, 5s));
  ::close(idle);
  ::close(truncated);
  CHECK(r0->transport_stats().timed_out == 2);
  CHECK_THAT(sink.wait_for("no TLS handshake with the job key within 0.3 s"),
             Contains("closed the connection from 127.0.0.1:"));
  // Established connections are not subject to the deadline, on either side (also when the
  // handshake completes before the connecting side's first poll).
  job_still_works(*r0, r0->port(), o, 1000ms);
  CHECK(r0->transport_stats().timed_out == 2);
  CHECK(sink.wait_for("gave up the connection", 0ms) == "");
}

TEST_CASE("beyond max_pending_handshakes incoming connections are closed at once", "[transport]") {
  LogSink sink;
  auto o = options_with(sink);
  o.max_pending_handshakes = 4;
  o.handshake_timeout = 60s;  // only the cap can close them within the test
  auto r0 = create_ok(make_env(0, 2, 0), o);
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(tcp_connect(r0->port()));
  int closed = 0;
  for (int fd : fds) closed += closed_by_peer(fd, 300ms) ? 1 : 0;
  CHECK(closed == 6);
  const auto stats = r0->transport_stats();
  CHECK(stats.refused_busy == 6);
  CHECK(stats.pending == 4);
  CHECK_THAT(sink.wait_for("at once"), Contains("4 TLS handshakes are pending already"));
  for (int fd : fds) ::close(fd);  // the idle peers give up: their slots free up
  const auto deadline = Clock::now() + 5s;
  while (r0->transport_stats().pending > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  CHECK(r0->transport_stats().pending == 0);
  job_still_works(*r0, r0->port(), o);
}

TEST_CASE("garbage and plain CAF (unencrypted BASP) never reach rank 0's actors", "[transport]") {
  LogSink sink;
  const auto o = options_with(sink);
  auto r0 = create_ok(make_env(0, 2, 0), o);
  const int port = r0->port();
  {
    const int fd = tcp_connect(port);
    const std::string junk = random_bytes(10'000, 3);
    ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    CHECK(closed_by_peer(fd, 5s));
    ::close(fd);
  }
  {
    caf::actor_system_config cfg;
    configure_for_bootstrap(cfg);
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    bool connected = false;
    self->request(sys.middleman().actor_handle(), 5s, caf::connect_atom::value,
                  std::string("127.0.0.1"), static_cast<uint16_t>(port))
        .receive([&](const caf::node_id&, caf::strong_actor_ptr& p,
                     const std::set<std::string>&) { connected = p != nullptr; },
                 [&](caf::error&) {});
    CHECK_FALSE(connected);
  }
  CHECK(r0->transport_stats().refused_other >= 2);
  CHECK(sink.wait_for("not a troupe peer") != "");
  job_still_works(*r0, port, o);
}

TEST_CASE("a peer with the token that announces a 4 GiB message is cut off before allocation",
          "[transport]") {
  LogSink sink;
  const auto o = options_with(sink);
  auto r0 = create_ok(make_env(0, 2, 0), o);
  const size_t before = peak_rss_kib();
  const int fd = tcp_connect(r0->port());
  REQUIRE(::fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
  tls::PskSession s(context(kToken), tls::PskSession::Role::client, fd,
                    tls::make_identity(1, 2, "attacker", 1));
  const auto deadline = Clock::now() + 5s;
  char buf[4096];
  size_t n = 0;
  while (!s.established() && s.read(buf, sizeof buf, n) && Clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  REQUIRE(s.established());
  // A BASP client handshake header (32 bytes, big-endian) claiming 0xF0000000 payload bytes.
  std::string header(32, '\0');
  header[0] = 1;
  header[4] = '\xf0';
  size_t put = 0;
  REQUIRE(s.write(header.data(), header.size(), put));
  REQUIRE(put == header.size());
  bool open = true;
  while (open && Clock::now() < deadline + 5s) {
    open = s.read(buf, sizeof buf, n);
    std::this_thread::sleep_for(1ms);
  }
  CHECK_FALSE(open);  // rank 0 closed the connection
  ::close(fd);
  CHECK(r0->transport_stats().oversized == 1);
  CHECK_THAT(sink.wait_for("announced a message of"),
             Contains("4026531840 bytes, above the bootstrap's limit of 16777216 bytes"));
  CHECK(peak_rss_kib() < before + 256 * 1024);  // nowhere near the 3.75 GiB asked for
  job_still_works(*r0, r0->port(), o);
}

TEST_CASE("the blobs of one gather must fit one message", "[transport]") {
  LogSink sink;
  auto small = options_with(sink);
  small.max_message_bytes = 256 << 10;  // rank 0's budget: 256 KiB - framing
  auto r0 = create_ok(make_env(0, 2, 0), small);
  // A blob that cannot fit world_size times is refused before it is sent.
  auto too_big = r0->all_gather("k0", std::string(150 << 10, 'x'));
  REQUIRE_FALSE(too_big);
  CHECK_THAT(too_big.status().message(), Contains("too large for the bootstrap"));
  // A rank configured with a larger limit cannot make rank 0 assemble more than its budget.
  std::string error1;
  std::thread t([&] {
    auto r1 = create_caf_bootstrap(make_env(1, 2, r0->port()), options_with(sink));
    if (!r1) return;
    auto a = (*r1)->all_gather("k1", std::string(150 << 10, 'y'));
    error1 = a ? "completed" : a.status().message();
  });
  auto a0 = r0->all_gather("k1", std::string(50 << 10, 'z'));
  t.join();
  REQUIRE_FALSE(a0);
  CHECK_THAT(a0.status().message(), Contains("too many for one bootstrap message"));
  CHECK_THAT(error1, Contains("too many for one bootstrap message"));
}

// Relays one TCP connection and records every byte in both directions.
class RecordingRelay {
 public:
  explicit RecordingRelay(int target_port) : target_(target_port) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    ::setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    REQUIRE(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listen_, 4) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~RecordingRelay() {
    stop_ = true;
    thread_.join();
    ::close(listen_);
  }
  int port() const { return port_; }
  std::string bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  void run() {
    std::vector<std::pair<int, int>> pairs;  // (client, server)
    while (!stop_) {
      std::vector<pollfd> fds{{listen_, POLLIN, 0}};
      for (auto [c, s] : pairs) {
        fds.push_back({c, POLLIN, 0});
        fds.push_back({s, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) pairs.emplace_back(c, tcp_connect_raw(target_));
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        auto& p = pairs[(i - 1) / 2];
        const int from = (i % 2 == 1) ? p.first : p.second;
        const int to = (i % 2 == 1) ? p.second : p.first;
        char buf[65536];
        const ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            seen_.append(buf, static_cast<size_t>(n));
          }
          ::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
        } else if (n == 0) {
          ::shutdown(to, SHUT_WR);
        }
      }
    }
    for (auto [c, s] : pairs) {
      ::close(c);
      ::close(s);
    }
  }
  static int tcp_connect_raw(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    return fd;
  }

  int target_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string seen_;
};

TEST_CASE("neither the token nor the blobs cross the wire in the clear", "[transport]") {
  LogSink sink;
  const auto o = options_with(sink);
  auto r0 = create_ok(make_env(0, 2, 0), o);
  RecordingRelay relay(r0->port());
  const std::string blob0 = "BLOB-OF-RANK-ZERO-" + random_bytes(8, 11);
  const std::string blob1 = "BLOB-OF-RANK-ONE-" + random_bytes(8, 12);
  std::vector<std::string> got1;
  std::thread t([&] {
    auto r1 = create_caf_bootstrap(make_env(1, 2, relay.port()), o);  // through the relay
    if (!r1) return;
    auto a = (*r1)->all_gather("secret", blob1);
    if (a) got1 = *a;
    (void)(*r1)->barrier("done");
  });
  auto a0 = r0->all_gather("secret", blob0);
  REQUIRE(r0->barrier("done"));
  t.join();
  REQUIRE(a0);
  CHECK(*a0 == std::vector<std::string>{blob0, blob1});
  CHECK(got1 == *a0);
  const std::string wire = relay.bytes();
  CHECK(wire.size() > 1000);  // the handshake and the messages did pass through
  const auto key = tls::derive_psk(kToken);
  for (const std::string& secret :
       {kToken, unhex(kToken), std::string(key.begin(), key.end()), std::string("BLOB-OF-RANK"),
        std::string("troupe.JoinRequest2"), std::string("gather/secret")}) {
    INFO("looking for " << hex(secret));
    CHECK(wire.find(secret) == std::string::npos);
  }
  CHECK(wire.find("troupe1 rank=1 world=2") != std::string::npos);  // the identity is plain text
}

}  // namespace
}  // namespace troupe::comm
