#include "inspect/dashboard.hpp"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "inspect/dashboard_request.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "config/validate.hpp"

namespace troupe {

namespace {

constexpr size_t kWorkers = 2;
constexpr size_t kQueued = 16;

// httplib's own pool queues without bound: every accepted connection would hold a descriptor of the
// job's process. Here a full queue makes the accepting thread serve the connection itself, so it
// accepts no more until then and the kernel's backlog holds (and at its end refuses) the rest.
class BoundedQueue final : public httplib::TaskQueue {
 public:
  BoundedQueue() {
    for (size_t i = 0; i < kWorkers; ++i) workers_.emplace_back([this] { run(); });
  }
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (jobs_.size() < kQueued) {
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();
  }
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

DashboardReply dashboard_reply(const InspectHub& hub, const std::string& token, const std::string& method,
                               const std::string& path, const std::multimap<std::string, std::string>& query,
                               const std::string& header_token) {
  const DashboardRoute route = route_dashboard_request(token, method, path, query, header_token);
  if (route.status != 200) return {route.status, "application/json", inspect_error(route.error)};
  if (route.page) return {200, "text/html; charset=utf-8", dashboard_page()};
  return {200, "application/json", hub.answer(route.command)};
}

Dashboard::Dashboard(const InspectHub& hub, std::string host, std::string token)
    : hub_(hub), host_(std::move(host)), token_(std::move(token)), server_(std::make_unique<httplib::Server>()) {}

Result<std::unique_ptr<Dashboard>> Dashboard::bind(const std::string& address, const InspectHub& hub) {
  const auto at = parse_inspect_address(address);
  if (!at) return Status::bad_input("--dashboard " + address + " is not [HOST:]PORT -- use e.g. --dashboard 0");
  auto token = comm::generate_job_token();
  if (!token) return token.status();
  std::unique_ptr<Dashboard> d(new Dashboard(hub, at->host, token.value()));
  httplib::Server& s = *d->server_;
  s.new_task_queue = [] { return new BoundedQueue(); };
  // httplib's default also sets SO_REUSEPORT, with which a second process could bind the same port
  // and take some of the connections: a port in use must be an error instead.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    (void)::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s.set_payload_max_length(4096);
  s.set_read_timeout(5, 0);
  s.set_write_timeout(5, 0);
  s.set_keep_alive_timeout(2);
  s.set_keep_alive_max_count(100);
  Dashboard* self = d.get();
  s.Get(R"(/.*)", [self](const httplib::Request& req, httplib::Response& res) {
    std::string header = req.get_header_value("X-Troupe-Token");
    if (header.empty()) {
      const std::string auth = req.get_header_value("Authorization");
      if (auth.rfind("Bearer ", 0) == 0) header = auth.substr(7);
    }
    const DashboardReply r = dashboard_reply(self->hub_, self->token_, req.method, req.path, req.params, header);
    res.status = r.status;
    res.set_header("Cache-Control", "no-store");
    res.set_header("Referrer-Policy", "no-referrer");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                   "img-src data:; frame-ancestors 'none'");
    res.set_content(r.body, r.content_type.c_str());
  });
  const int port = at->port == 0 ? s.bind_to_any_port(at->host) : (s.bind_to_port(at->host, at->port) ? at->port : -1);
  if (port <= 0)
    return Status::bad_input("--dashboard " + address + ": cannot listen on " + at->host + ":" + std::to_string(at->port) +
                             " (in use, or not an address of this host) -- give another port, or 0 for a free one");
  d->port_ = port;
  return d;
}

Dashboard::~Dashboard() { stop(); }

std::string Dashboard::url() const {
  std::string host = host_;
  if (host == "0.0.0.0" || host == "::") {
    char name[256] = "localhost";
    ::gethostname(name, sizeof name - 1);
    host = name;
  }
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return "http://" + host + ":" + std::to_string(port_) + "/?token=" + token_;
}

void Dashboard::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() closes the socket only once the server runs: wait for that (it is immediate).
  for (int i = 0; i < 2000 && !server_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void Dashboard::stop() {
  // httplib closes a bound socket only from its serving loop: a dashboard bound but never started
  // (the job failed before serving) starts for the moment it takes to stop.
  if (port_ > 0 && !stopped_ && !thread_.joinable()) start();
  stopped_ = true;
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

Result<std::unique_ptr<Dashboard>> bind_dashboard(const TrainConfig& config, bool first_process, const InspectHub& hub) {
  if (config.dashboard.empty() || !first_process) return std::unique_ptr<Dashboard>();
  return Dashboard::bind(config.dashboard, hub);
}

TrainConfig with_dashboard_inspector(const TrainConfig& config) {
  TrainConfig c = config;
  if (c.dashboard.empty() || !c.inspect.empty()) return c;
  const auto at = parse_inspect_address(c.dashboard);
  const std::string host = at ? at->host : "127.0.0.1";
  c.inspect = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":0";
  return c;
}

}  // namespace troupe
