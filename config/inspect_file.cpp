#include "config/inspect_file.hpp"

#include <nlohmann/json.hpp>

#include "config/validate.hpp"

namespace troupe {

std::string inspect_file_text(const std::string& host, int port, const std::string& token, int64_t pid,
                              const std::string& dashboard) {
  nlohmann::json j;
  j["address"] = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  j["token"] = token;
  j["pid"] = pid;
  if (!dashboard.empty()) j["dashboard"] = dashboard;
  return j.dump() + "\n";
}

Result<InspectTarget> parse_inspect_file(std::string_view text) {
  if (text.size() > kMaxInspectFileBytes)
    return Status::bad_input("the inspect file is larger than 64 KiB -- give the file troupe train --inspect wrote");
  const auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::bad_input("the inspect file is not a JSON object -- give the file troupe train --inspect wrote");
  std::string problems;
  auto problem = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  InspectTarget t;
  const auto address = j.find("address");
  if (address == j.end() || !address->is_string()) {
    problem("\"address\" is missing or not a string");
  } else if (const auto at = parse_inspect_address(address->get<std::string>());
             !at || address->get<std::string>().find(':') == std::string::npos) {
    problem("\"address\" is not HOST:PORT");
  } else {
    t.host = at->host;
    t.port = at->port;
  }
  const auto token = j.find("token");
  if (token == j.end() || !token->is_string() || token->get<std::string>().empty())
    problem("\"token\" is missing or not a string");
  else
    t.token = token->get<std::string>();
  if (const auto pid = j.find("pid"); pid != j.end()) {
    if (!pid->is_number_integer())
      problem("\"pid\" is not an integer");
    else
      t.pid = pid->get<int64_t>();
  }
  if (const auto url = j.find("dashboard"); url != j.end()) {
    if (!url->is_string() || url->get<std::string>().rfind("http://", 0) != 0 ||
        url->get<std::string>().size() > kMaxDashboardUrlBytes)
      problem("\"dashboard\" is not an http:// URL of at most 1 KiB");
    else
      t.dashboard = url->get<std::string>();
  }
  if (!problems.empty())
    return Status::bad_input("the inspect file: " + problems + " -- give the file troupe train --inspect wrote");
  return t;
}

}  // namespace troupe
