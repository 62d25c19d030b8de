#include "inspect/inspector.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "comm/bootstrap.hpp"
#include "config/inspect_file.hpp"
#include "config/validate.hpp"

namespace troupe {

std::string inspect_error(const std::string& message) { return nlohmann::json{{"error", message}}.dump() + "\n"; }

std::string with_unreachable(std::string json, const std::vector<std::string>& unreachable) {
  if (unreachable.empty()) return json;
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return json;
  j["unreachable"] = unreachable;
  return j.dump(1) + "\n";
}

InspectHub::InspectHub(std::vector<std::shared_ptr<const ActivityBoard>> boards, const std::atomic<int64_t>* iteration_now)
    : boards_(std::move(boards)), iteration_(iteration_now) {
  add("status", "status", "every rank of the job: what it does now, its step, how long since it progressed",
      [this](const InspectCall& call) {
        if (call.local) return status_json(local_activities(), iteration());
        std::vector<std::string> unreachable;
        std::string answer = status_json(job_activities(unreachable), iteration());
        std::function<std::string()> job_state;
        {
          std::lock_guard<std::mutex> lock(mu_);
          job_state = job_state_;
        }
        if (job_state) {
          auto j = nlohmann::json::parse(answer);
          j["job"] = nlohmann::json::parse(job_state());
          // The job's state may know a later iteration than the driver's last progress (a pause).
          if (j["job"].contains("iteration") && j["job"]["iteration"].is_number_integer() &&
              j["job"]["iteration"].get<int64_t>() > j.value("iteration", int64_t{0}))
            j["iteration"] = j["job"]["iteration"];
          answer = j.dump(1) + "\n";
        }
        return with_unreachable(std::move(answer), unreachable);
      });
  add("where", "where", "the wait-for graph now (who waits on whom for what) and the culprit(s) of a stall",
      [this](const InspectCall&) {
        std::vector<std::string> unreachable;
        const std::vector<Activity> all = job_activities(unreachable);
        return with_unreachable(where_json(all, wait_graph(all, stall_threshold(all))), unreachable);
      });
  add("help", "help", "the commands this job's inspector knows", [this](const InspectCall&) {
    nlohmann::json list = nlohmann::json::array();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, c] : commands_)
      if (!c.internal) list.push_back({{"name", name}, {"usage", c.usage}, {"help", c.help}});
    return nlohmann::json{{"commands", list}}.dump(1) + "\n";
  });
}

void InspectHub::add(const std::string& name, const std::string& usage, const std::string& help, Handler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  commands_[name] = Command{usage, help, std::move(handler)};
}

void InspectHub::add_internal(const std::string& name, const std::string& usage, Handler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  commands_[name] = Command{usage, "", std::move(handler), true};
}

void InspectHub::set_job_state(std::function<std::string()> job_state) {
  std::lock_guard<std::mutex> lock(mu_);
  job_state_ = std::move(job_state);
}

void InspectHub::set_peers(std::vector<std::pair<std::string, int>> peers, std::string token, bool first) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_ = std::move(peers);
  token_ = std::move(token);
  first_ = first;
}

std::string InspectHub::answer(const std::string& request) const {
  InspectCall call;
  call.line = request;
  if (call.line.rfind("local ", 0) == 0) {
    call.local = true;
    call.line = call.line.substr(6);
  }
  std::istringstream words(call.line);
  std::string name;
  words >> name;
  for (std::string w; words >> w;) call.args.push_back(w);
  Handler handler;
  std::string known;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = commands_.find(name); it != commands_.end()) handler = it->second.handler;
    for (const auto& [n, c] : commands_)
      if (!c.internal) known += (known.empty() ? "" : ", ") + n;
  }
  if (!handler) return inspect_error("unknown command \"" + name + "\" (the inspector knows " + known + ")");
  try {
    return handler(call);
  } catch (const std::exception& e) {
    return inspect_error(name + ": " + e.what());
  }
}

std::vector<std::string> InspectHub::ask_peers(const std::string& line, std::vector<std::string>& unreachable,
                                               std::chrono::milliseconds timeout) const {
  std::vector<std::pair<std::string, int>> peers;
  std::string token;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers = peers_;
    token = token_;
  }
  std::vector<std::string> answers;
  for (const auto& [host, port] : peers) {
    auto answer = comm::psk_request(host, port, token, "local " + line, timeout);
    if (!answer) {
      unreachable.push_back(host + ":" + std::to_string(port) + ": " + answer.status().message());
      continue;
    }
    answers.push_back(std::move(answer).value());
  }
  return answers;
}

std::vector<Activity> InspectHub::local_activities() const {
  std::vector<Activity> now;
  for (const auto& board : boards_) now.push_back(board->snapshot());
  return now;
}

std::vector<Activity> InspectHub::job_activities(std::vector<std::string>& unreachable) const {
  std::vector<Activity> all = local_activities();
  for (const std::string& answer : ask_peers("status", unreachable)) {
    auto ranks = activities_from_status_json(answer);
    if (!ranks) {
      unreachable.push_back("a peer's status: " + ranks.status().message());
      continue;
    }
    for (Activity& a : ranks.value()) all.push_back(std::move(a));
  }
  std::sort(all.begin(), all.end(), [](const Activity& x, const Activity& y) { return x.rank < y.rank; });
  return all;
}

Result<InspectServer> start_inspector(const TrainConfig& config, comm::Bootstrap* bootstrap, const std::string& token,
                                      InspectHub& hub, const std::function<void(const std::string&)>& note,
                                      const std::string& dashboard_url) {
  InspectServer out;
  if (config.inspect.empty()) return out;
  const auto at = parse_inspect_address(config.inspect);
  if (!at) return Status::bad_input("--inspect " + config.inspect + " is not [HOST:]PORT");
  if (token.empty()) return Status::error("--inspect: the job has no token");
  const bool first = bootstrap == nullptr || bootstrap->rank() == 0;
  const bool loopback = at->host == "127.0.0.1" || at->host == "::1" || at->host == "localhost";
  // The other processes listen on a free port, on loopback when rank 0 does, else on every address.
  const std::string host = first ? at->host : loopback ? at->host : "0.0.0.0";
  auto server = comm::PskServer::start(host, first ? at->port : 0, token,
                                       [&hub](const std::string& request) { return hub.answer(request); });
  if (!server) return server.status();
  out.server = std::move(server).value();
  std::vector<std::pair<std::string, int>> peers;
  if (bootstrap != nullptr && bootstrap->world_size() > 1) {
    char name[256] = "localhost";
    if (!loopback) ::gethostname(name, sizeof name - 1);
    const std::string mine = (loopback ? at->host : std::string(name)) + " " + std::to_string(out.server->port());
    auto all = bootstrap->all_gather("inspect", mine);
    if (!all) return all.status();
    if (first)
      for (size_t r = 1; r < all.value().size(); ++r) {
        const std::string& entry = all.value()[r];
        const size_t space = entry.rfind(' ');
        if (space == std::string::npos) continue;
        peers.emplace_back(entry.substr(0, space), std::atoi(entry.c_str() + space + 1));
      }
  }
  hub.set_peers(std::move(peers), token, first);
  if (!first) return out;
  out.file = !config.inspect_file.empty() ? config.inspect_file
             : !config.save.empty()       ? (std::filesystem::path(config.save) / "troupe-inspect.json").string()
                                          : "troupe-inspect-" + std::to_string(::getpid()) + ".json";
  const std::string shown = at->host.find(':') != std::string::npos ? "[" + at->host + "]" : at->host;
  const std::string address = shown + ":" + std::to_string(out.server->port());
  std::error_code ec;
  if (const auto parent = std::filesystem::path(out.file).parent_path(); !parent.empty())
    std::filesystem::create_directories(parent, ec);
  // Mode 0600 from the start: the token is the job's secret.
  const int fd = ::open(out.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::fchmod(fd, 0600) != 0) {
    if (fd >= 0) ::close(fd);
    return Status::bad_input("--inspect-file " + out.file + " cannot be written -- give a writable path");
  }
  const std::string text = inspect_file_text(at->host, out.server->port(), token, ::getpid(), dashboard_url);
  const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (::close(fd) != 0 || !wrote) return Status::bad_input("--inspect-file " + out.file + " could not be written");
  note("inspector on " + address + ": troupe inspect " + out.file + " --exec status");
  return out;
}

}  // namespace troupe
