// What a request to the dashboard (inspect/dashboard.hpp) asks for, decided before anything is
// read: refused (no or a wrong token, not GET, an unknown path, a parameter that is not a number),
// the page, or one inspector command line built from the path and the numeric parameters, so no
// byte of a request reaches the command's words except digits. A reader of network input (fuzzed:
// fuzz/targets/dashboard_request.cpp); cpp-httplib has parsed the HTTP around it.
#pragma once
#include <map>
#include <string>

namespace troupe {

struct DashboardRoute {
  int status = 200;     // 200: answer; else the refusal's HTTP status (401, 400, 404, 405)
  bool page = false;    // the page itself
  std::string command;  // else the inspector command whose answer is the body
  std::string error;    // why it was refused
};

// token: the dashboard's (an empty one refuses everything). header_token: X-Troupe-Token's value,
// or Authorization's bearer token; else the query's "token" counts.
DashboardRoute route_dashboard_request(const std::string& token, const std::string& method, const std::string& path,
                                       const std::multimap<std::string, std::string>& query,
                                       const std::string& header_token);

}  // namespace troupe
