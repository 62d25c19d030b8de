// The inspect file a job with --inspect writes (mode 0600) and `troupe inspect` reads: where the
// job's inspector listens and the job token that opens it.
//   {"address": "127.0.0.1:40171", "token": "<64 hex digits>", "pid": 12345,
//    "dashboard": "http://127.0.0.1:40172/?token=<64 hex digits>"}   (with --dashboard only)
// Outside bytes to the reader: at most kMaxInspectFileBytes, checked field by field.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/status.hpp"

namespace troupe {

inline constexpr size_t kMaxInspectFileBytes = 64 * 1024;

struct InspectTarget {
  std::string host;  // as it connects: "127.0.0.1", "::1"
  int port = 0;
  std::string token;
  int64_t pid = 0;
  std::string dashboard;  // the dashboard's URL, token included; empty: none
};

inline constexpr size_t kMaxDashboardUrlBytes = 1024;

// dashboard: the dashboard's URL (empty: no such field).
std::string inspect_file_text(const std::string& host, int port, const std::string& token, int64_t pid,
                              const std::string& dashboard = "");
// Every problem as bad input naming the file's field; the token's characters are checked where it
// is used (comm/bootstrap/launch_env.hpp validate_job_token).
Result<InspectTarget> parse_inspect_file(std::string_view text);

}  // namespace troupe
