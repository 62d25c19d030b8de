// What the dashboard reads of an HTTP request (route_dashboard_request, inspect/dashboard_request.hpp;
// cpp-httplib parsed the HTTP). The input, one field per line: the method, the path, the
// X-Troupe-Token header, then the query's "key=value" pairs. The dashboard's token is kToken below.
// Properties: nothing but a request carrying exactly that token is answered; an answered command
// is one of the dashboard's, with digits only as arguments.
#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "inspect/dashboard_request.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "troupe/check.hpp"

namespace troupe::fuzz {

namespace {

constexpr std::string_view kToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

bool digits(std::string_view s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos; }

// "stages --spans 2 --last 3", "plan 2", "history --since 4 --last 9", "status", "where", "moe".
bool a_dashboard_command(std::string_view c) {
  auto take = [&](std::string_view word) {
    if (c.substr(0, word.size()) != word) return false;
    c.remove_prefix(word.size());
    return true;
  };
  auto number = [&] {
    if (!take(" ")) return false;
    const size_t n = c.find(' ');
    const std::string_view d = c.substr(0, n);
    c.remove_prefix(d.size());
    return digits(d);
  };
  if (c == "status" || c == "where" || c == "moe") return true;
  if (take("stages --spans 2")) return c.empty() || (take(" --last") && number() && c.empty());
  if (take("plan")) return c.empty() || (number() && c.empty());
  if (take("history")) {
    if (take(" --since") && !number()) return false;
    if (take(" --last") && !number()) return false;
    return c.empty();
  }
  return false;
}

}  // namespace

Status dashboard_request(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> fields;
  for (size_t at = 0; at <= text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    fields.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  while (fields.size() < 3) fields.emplace_back();
  std::multimap<std::string, std::string> query;
  for (size_t i = 3; i < fields.size(); ++i) {
    const size_t eq = fields[i].find('=');
    query.emplace(fields[i].substr(0, eq), eq == std::string::npos ? "" : fields[i].substr(eq + 1));
  }
  const std::string token(kToken);
  const DashboardRoute r = route_dashboard_request(token, fields[0], fields[1], query, fields[2]);
  const std::string given = !fields[2].empty() ? fields[2] : query.count("token") ? query.find("token")->second : "";
  if (r.status != 200) {
    TROUPE_CHECK(!r.error.empty() && !r.page && r.command.empty(), "a refused request carries an answer or no reason");
    return Status::error(r.error);
  }
  TROUPE_CHECK(given == token, "a request without the dashboard's token was answered");
  TROUPE_CHECK(r.page != !r.command.empty(), "an answered request is the page or one command");
  TROUPE_CHECK(r.page || a_dashboard_command(r.command), "the dashboard built a command it does not serve: " + r.command);
  return Status::ok();
}

}  // namespace troupe::fuzz
