// The dashboard's server (inspect/dashboard.hpp) over real HTTP on a loopback port: nothing without
// its token (401, no data), the page and the inspector's answers with it, bad parameters refused,
// the connections it holds bounded, and nothing served once stopped.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "inspect/dashboard.hpp"
#include "inspect/inspect_stages.hpp"
#include "inspect/inspector.hpp"
#include "tests/test_util.hpp"

using namespace troupe;

namespace {

struct Job {
  std::atomic<int64_t> iteration{3};
  std::vector<std::shared_ptr<const ActivityBoard>> boards;
  std::shared_ptr<IterationHistory> history = std::make_shared<IterationHistory>();
  std::unique_ptr<InspectHub> hub;
  Job() {
    for (int r = 0; r < 2; ++r) {
      auto b = std::make_shared<ActivityBoard>(r, r, 0, 0);
      b->begin_step(4);
      b->set(Doing::forward, 0, 0, 0);
      b->recent().begin_step(1, 0);
      b->recent().add(SpanKind::forward, 0, 0, 10, 100);
      b->recent().end_step(500);
      boards.push_back(b);
    }
    for (int64_t it = 1; it <= 3; ++it) {
      IterationStats s;
      s.iteration = it;
      s.lm_loss = 5.0 - 0.1 * static_cast<double>(it);
      history->add(s);
    }
    hub = std::make_unique<InspectHub>(boards, &iteration);
    sched::ScheduleSpec spec;
    spec.stages = 2;
    spec.micro_batches = 2;
    add_stage_commands(*hub, {boards, sched::make_schedule(spec).value(), false, history});
  }
};

int open_fds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

}  // namespace

TEST_CASE("dashboard: no token, no data; with it, the page and the inspector's answers", "[dashboard]") {
  Job job;
  auto bound = Dashboard::bind("127.0.0.1:0", *job.hub);
  REQUIRE(bound.is_ok());
  Dashboard& d = *bound.value();
  d.start();
  CHECK(d.port() > 0);
  CHECK(d.url() == "http://127.0.0.1:" + std::to_string(d.port()) + "/?token=" + d.token());
  CHECK(d.token().size() == 64);
  httplib::Client client("127.0.0.1", d.port());
  client.set_read_timeout(5, 0);
  for (const char* path : {"/", "/api/status", "/api/stages", "/api/history", "/api/plan", "/api/where"}) {
    INFO(path);
    auto none = client.Get(path);
    REQUIRE(none);
    CHECK(none->status == 401);
    CHECK(none->body.find("ranks") == std::string::npos);
    CHECK(none->body.find("<svg") == std::string::npos);
    auto wrong = client.Get((std::string(path) + "?token=" + std::string(64, 'a')).c_str());
    REQUIRE(wrong);
    CHECK(wrong->status == 401);
    auto header = client.Get(path, {{"X-Troupe-Token", d.token().substr(0, 63) + "b"}});
    REQUIRE(header);
    CHECK(header->status == 401);
  }
  auto page = client.Get(("/?token=" + d.token()).c_str());
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK(page->get_header_value("Content-Type") == "text/html; charset=utf-8");
  CHECK(page->get_header_value("Cache-Control") == "no-store");
  CHECK(page->body == dashboard_page());
  CHECK_THAT(page->body, Catch::Contains("id=\"lanes\"") && Catch::Contains("/api/stages"));
  const httplib::Headers auth = {{"X-Troupe-Token", d.token()}};
  auto status = client.Get("/api/status", auth);
  REQUIRE(status);
  CHECK(status->status == 200);
  const auto s = nlohmann::json::parse(status->body);
  CHECK(s["iteration"] == 3);
  CHECK(s["ranks"].size() == 2);
  auto bearer = client.Get("/api/history?since=1", {{"Authorization", "Bearer " + d.token()}});
  REQUIRE(bearer);
  CHECK(bearer->status == 200);
  CHECK(nlohmann::json::parse(bearer->body)["iteration"] == nlohmann::json::array({2, 3}));
  auto stages = client.Get("/api/stages?last=1", auth);
  REQUIRE(stages);
  const auto st = nlohmann::json::parse(stages->body);
  CHECK(st["iterations"] == nlohmann::json::array({1}));
  CHECK(st["ranks"][0]["steps"][0]["spans"].size() == 1);  // the dashboard's lanes get the spans
  auto plan = client.Get("/api/plan?rank=1", auth);
  REQUIRE(plan);
  CHECK(nlohmann::json::parse(plan->body)["stages"].size() == 1);
  // Parameters reach the command line only as numbers.
  auto bad = client.Get("/api/stages?last=1%20--spans", auth);
  REQUIRE(bad);
  CHECK(bad->status == 400);
  CHECK_THAT(bad->body, Catch::Contains("?last= takes a whole number"));
  auto unknown = client.Get("/etc/passwd", auth);
  REQUIRE(unknown);
  CHECK(unknown->status == 404);
  auto post = client.Post("/api/status", auth, "x", "text/plain");
  REQUIRE(post);
  CHECK(post->status != 200);
  d.stop();
  httplib::Client after("127.0.0.1", d.port());
  after.set_connection_timeout(1, 0);
  CHECK_FALSE(after.Get("/api/status", auth));  // stopped: nothing listens
}

TEST_CASE("dashboard: the page compiled in is inspect/dashboard_page.html, byte for byte", "[dashboard]") {
  std::ifstream in(std::string(troupe::test::source_dir()) + "/inspect/dashboard_page.html", std::ios::binary);
  REQUIRE(in);
  std::ostringstream file;
  file << in.rdbuf();
  CHECK(dashboard_page() == file.str());
  // Self-contained: nothing is fetched from elsewhere.
  CHECK(dashboard_page().find("src=\"http") == std::string::npos);
  CHECK(dashboard_page().find("href=\"http") == std::string::npos);
  CHECK(dashboard_page().find("@import") == std::string::npos);
}

TEST_CASE("dashboard: the reply to a request, apart from HTTP", "[dashboard]") {
  Job job;
  const std::string token(64, 'c');
  auto reply = [&](const std::string& method, const std::string& path, std::multimap<std::string, std::string> q,
                   const std::string& header = "") { return dashboard_reply(*job.hub, token, method, path, q, header); };
  CHECK(reply("GET", "/api/status", {}).status == 401);
  CHECK(reply("GET", "/api/status", {{"token", ""}}).status == 401);
  CHECK(reply("GET", "/api/status", {{"token", token + "c"}}).status == 401);
  CHECK(reply("GET", "/api/status", {{"token", token}}).status == 200);
  CHECK(reply("PUT", "/api/status", {{"token", token}}).status == 405);
  CHECK(reply("GET", "/api/history", {{"token", token}, {"last", "99999999999999"}}).status == 400);
  // A number out of the command's range reaches the command, which refuses it in its own words.
  CHECK_THAT(reply("GET", "/api/stages", {{"last", "99"}}, token).body, Catch::Contains("--last takes a whole number"));
  CHECK_THAT(reply("GET", "/api/plan", {{"rank", "7"}}, token).body, Catch::Contains("is not a rank of the job"));
  // No token at all: the server's own token must never be empty.
  CHECK(dashboard_reply(*job.hub, "", "GET", "/api/status", {}, "").status == 401);
}

TEST_CASE("dashboard: /api/moe answers the inspector's moe, the last MoE iteration's load per layer",
          "[dashboard][moe]") {
  Job job;
  const std::string token(64, 'd');
  auto reply = [&](const std::string& path) { return dashboard_reply(*job.hub, token, "GET", path, {}, token); };
  // A dense job (or none reported yet): no layers, and the page hides its MoE panel.
  auto dense = reply("/api/moe");
  CHECK(dense.status == 200);
  CHECK(nlohmann::json::parse(dense.body) ==
        nlohmann::json::parse(R"({"iteration": 0, "moe_loss": 0.0, "layers": []})"));
  IterationStats s;
  s.iteration = 4;
  s.moe_loss = 0.0125;
  s.moe = {MoeLayerLoad{1, 6, {30, 12, 0, 42}, {28, 12, 0, 40}, 4, 1.25, 3.5},
           MoeLayerLoad{3, 6, {40, 44}, {40, 40}, 4, 1.0, 2.0}};
  job.history->add(s);
  IterationStats dense_after;  // an iteration without loads (none in an MoE job) leaves the last ones
  dense_after.iteration = 5;
  job.history->add(dense_after);
  auto moe = reply("/api/moe");
  REQUIRE(moe.status == 200);
  const auto j = nlohmann::json::parse(moe.body);
  CHECK(j["iteration"] == 4);
  CHECK(j["moe_loss"] == 0.0125);
  REQUIRE(j["layers"].size() == 2);
  CHECK(j["layers"][0] == nlohmann::json::parse(R"({"layer": 1, "experts": 4, "micro_batches": 6,
      "routed": [30, 12, 0, 42], "kept": [28, 12, 0, 40], "dropped": 4, "lb_loss": 1.25, "z_loss": 3.5})"));
  CHECK(j["layers"][1]["experts"] == 2);
  CHECK(job.hub->answer("moe") == moe.body);
  CHECK_THAT(job.hub->answer("moe 1"), Catch::Contains("takes no arguments"));
  CHECK_THAT(job.hub->answer("help"), Catch::Contains("\"moe\""));
  // The page polls it and has the panel the chart goes into.
  CHECK_THAT(dashboard_page(), Catch::Contains("/api/moe") && Catch::Contains("id=\"moe-box\" hidden"));
}

TEST_CASE("dashboard: connections that say nothing hold a bounded number of descriptors", "[dashboard]") {
  Job job;
  auto bound = Dashboard::bind("127.0.0.1:0", *job.hub);
  REQUIRE(bound.is_ok());
  Dashboard& d = *bound.value();
  d.start();
  const int before = open_fds();
  constexpr int kClients = 40;
  std::vector<int> clients;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(d.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < kClients; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    // Connected, so the server may accept it before the next one (or the backlog is full: then the
    // handshake waits, and the wait ends here).
    pollfd p{fd, POLLOUT, 0};
    (void)::poll(&p, 1, 50);
    clients.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Ours are kClients; the server's: two served, 16 queued, one on the accepting thread (+ slack).
  const int held = open_fds() - before - kClients;
  CHECK(held <= 2 + 16 + 1 + 2);
  for (int fd : clients) ::close(fd);  // the server reads their end and lets them go
  const auto t0 = std::chrono::steady_clock::now();
  d.stop();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8));
}

TEST_CASE("dashboard: /api/stragglers answers the inspector's stragglers, and the page has their panel",
          "[dashboard][stragglers]") {
  Job job;
  const std::string token(64, 'e');
  auto reply = [&](const std::string& path) { return dashboard_reply(*job.hub, token, "GET", path, {}, token); };
  IterationStats s;
  s.iteration = 7;
  s.straggler_threshold = 0.75;
  StragglerScore slow, fast;
  slow.rank = 1;
  slow.relative = 0.2;
  slow.individual = 0.9;
  slow.section = "forward-compute";
  slow.section_ms = 85;
  slow.fastest_section_ms = 2;
  slow.compute_ms = 90;
  fast.rank = 0;
  fast.compute_ms = 7;
  s.rank_scores = {slow, fast};
  job.history->add(s);
  auto r = reply("/api/stragglers");
  REQUIRE(r.status == 200);
  CHECK(r.body == job.hub->answer("stragglers"));
  const auto j = nlohmann::json::parse(r.body);
  CHECK(j["iteration"] == 7);
  REQUIRE(j["ranks"].size() == 2);
  CHECK(j["ranks"][0]["rank"] == 1);
  CHECK(j["ranks"][0]["straggler"] == true);
  CHECK(j["ranks"][1]["straggler"] == false);
  CHECK_THAT(dashboard_page(),
             Catch::Contains("/api/stragglers") && Catch::Contains("id=\"stragglers-box\" hidden"));
}
