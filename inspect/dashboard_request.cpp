#include "inspect/dashboard_request.hpp"

#include "comm/bootstrap/launch_env.hpp"

namespace troupe {

namespace {

DashboardRoute refuse(int status, std::string why) {
  DashboardRoute r;
  r.status = status;
  r.error = std::move(why);
  return r;
}

// ?name=N appended to the command as "FLAG N" (or " N" without a flag): digits only.
bool number_param(const std::multimap<std::string, std::string>& query, const char* name, const std::string& flag,
                  DashboardRoute& r) {
  const auto it = query.find(name);
  if (it == query.end()) return true;
  const std::string& v = it->second;
  if (v.empty() || v.size() > 12 || v.find_first_not_of("0123456789") != std::string::npos) {
    r = refuse(400, std::string("?") + name + "= takes a whole number, got \"" + v.substr(0, 32) + "\"");
    return false;
  }
  r.command += (flag.empty() ? " " : " " + flag + " ") + v;
  return true;
}

}  // namespace

DashboardRoute route_dashboard_request(const std::string& token, const std::string& method, const std::string& path,
                                       const std::multimap<std::string, std::string>& query,
                                       const std::string& header_token) {
  if (method != "GET" && method != "HEAD")
    return refuse(405, "the dashboard answers GET only (" + method.substr(0, 16) + " refused)");
  std::string given = header_token;
  if (given.empty())
    if (const auto it = query.find("token"); it != query.end()) given = it->second;
  if (token.empty() || !comm::constant_time_equal(given, token))
    return refuse(401, given.empty() ? "no token -- open the URL the job printed (it carries ?token=...)"
                                     : "a wrong token -- open the URL the job printed, or its inspect file's "
                                       "\"dashboard\"");
  DashboardRoute r;
  if (path == "/" || path == "/index.html") {
    r.page = true;
  } else if (path == "/api/status") {
    r.command = "status";
  } else if (path == "/api/where") {
    r.command = "where";
  } else if (path == "/api/stages") {
    r.command = "stages --spans 2";  // the page draws the last two
    number_param(query, "last", "--last", r);
  } else if (path == "/api/plan") {
    r.command = "plan";
    number_param(query, "rank", "", r);
  } else if (path == "/api/history") {
    r.command = "history";
    if (number_param(query, "since", "--since", r)) number_param(query, "last", "--last", r);
  } else if (path == "/api/moe") {
    r.command = "moe";
  } else if (path == "/api/stragglers") {
    r.command = "stragglers";
  } else {
    return refuse(404, "no such page: " + path.substr(0, 64) +
                           " (the dashboard serves /, /api/status, /api/where, /api/stages, /api/plan, /api/history, "
                           "/api/moe, /api/stragglers)");
  }
  return r;
}

}  // namespace troupe
