// The live dashboard (troupe train --dashboard [HOST:]PORT; docs/INSPECT.md): one self-contained
// web page, served by rank 0's process with cpp-httplib while the job runs, that polls JSON
// endpoints every second and draws each rank's measured timeline beside the planned schedule, the
// loss, learning-rate and gradient-norm curves, each rank's utilisation, the wait-for graph when
// ranks wait, and each MoE layer's expert load when the model has MoE layers. The endpoints are the
// inspector's answers (inspect/inspector.hpp), so the page shows what `troupe inspect` shows:
//   GET /                  the page (inspect/dashboard_page.html, compiled in)
//   GET /api/status        status             GET /api/where    where
//   GET /api/stages        stages --spans 2 [--last N from ?last=N]
//   GET /api/plan          plan [RANK from ?rank=N]
//   GET /api/history       history [--since ITERATION from ?since=N] [--last N from ?last=N]
//   GET /api/moe           moe                (each MoE layer's load in the last iteration)
//
// Security: every request, the page included, needs the dashboard's token: a fresh one, not the job
// token (the dashboard only shows; the inspector also controls the job), in the query (?token=...,
// as in the URL the job prints and writes into the inspect file) or the X-Troupe-Token header
// (what the page sends). Without it, or with another, the answer is 401 and no data; tokens are
// compared in constant time. Bounded: two worker threads (more connections wait in a queue of 16,
// then on the accepting thread, then in the kernel's backlog), requests of at most 8 KiB of headers
// and 4 KiB of body, 5 s to read or write, GET only. A slow client delays other clients, never the
// training: handlers only read what the ranks publish.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "inspect/inspector.hpp"
#include "troupe/status.hpp"

namespace httplib {
class Server;
}

namespace troupe {

struct DashboardReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// What a request answers, apart from HTTP (the server's handler): route_dashboard_request
// (inspect/dashboard_request.hpp) decides, then the page or the hub's answer. `query`: the decoded
// query string's parameters; `header_token`: X-Troupe-Token's value (or Authorization's bearer
// token); `token`: the dashboard's.
DashboardReply dashboard_reply(const InspectHub& hub, const std::string& token, const std::string& method,
                               const std::string& path, const std::multimap<std::string, std::string>& query,
                               const std::string& header_token);

// The page (inspect/dashboard_page.html).
const std::string& dashboard_page();

class Dashboard {
 public:
  // Binds `address` ([HOST:]PORT as --inspect takes it; port 0 picks a free one) with a fresh
  // token; serving begins with start(). Errors name the address.
  static Result<std::unique_ptr<Dashboard>> bind(const std::string& address, const InspectHub& hub);
  ~Dashboard();  // stop()
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // "http://127.0.0.1:PORT/?token=..." (IPv6 hosts in brackets; 0.0.0.0 shown as this host's name).
  std::string url() const;
  int port() const { return port_; }
  const std::string& token() const { return token_; }
  void start();  // returns once the server accepts connections
  void stop();   // closes the socket, waits for the requests in progress (each bounded), joins

 private:
  Dashboard(const InspectHub& hub, std::string host, std::string token);
  const InspectHub& hub_;
  std::string host_, token_;
  int port_ = 0;
  bool stopped_ = false;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

// --dashboard in the job's first process (rank 0's): the dashboard bound to config.dashboard, not
// serving yet (its URL goes into the inspect file first); null without --dashboard or in another
// process.
Result<std::unique_ptr<Dashboard>> bind_dashboard(const TrainConfig& config, bool first_process, const InspectHub& hub);
// What start_inspector gets: the dashboard shows the inspector's answers, which the other processes'
// inspectors give, so --dashboard without --inspect adds one on a free port of the dashboard's host.
TrainConfig with_dashboard_inspector(const TrainConfig& config);

}  // namespace troupe
