// troupe inspect TARGET --exec CMD [--json]: asks a running job's inspector (troupe train --inspect).
// TARGET: the job's inspect file (address and token), or HOST:PORT with the token in
// TROUPE_JOB_TOKEN. docs/INSPECT.md has the commands and the JSON schema.
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "apps/commands.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "comm/bootstrap/psk_channel.hpp"
#include "config/inspect_file.hpp"
#include "config/validate.hpp"

namespace troupe::apps {

namespace {

struct Target {
  std::string host, token;
  int port = 0;
};

Result<Target> resolve_target(const std::string& target) {
  Target t;
  if (const auto at = parse_inspect_address(target); at && target.find(':') != std::string::npos) {
    t.host = at->host;
    t.port = at->port;
    const char* token = std::getenv("TROUPE_JOB_TOKEN");
    if (token == nullptr)
      return Status::bad_input("TARGET " + target + " is an address, but TROUPE_JOB_TOKEN is not set -- export the job's "
                               "token, or give the job's inspect file instead");
    t.token = token;
    return t;
  }
  std::ifstream in(target, std::ios::binary);
  if (!in) return Status::bad_input("TARGET " + target + ": no such inspect file, and not HOST:PORT -- give the file the "
                                    "job printed (--inspect-file) or its address");
  std::string text(kMaxInspectFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  auto parsed = parse_inspect_file(text);
  if (!parsed) return parsed.status().with_context(target + ": ");
  t.host = parsed->host;
  t.port = parsed->port;
  t.token = parsed->token;
  return t;
}

std::string rank_list(const nlohmann::json& ranks) {
  std::string s;
  for (const auto& r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r.get<int>());
  return s;
}

std::string unreachable_lines(const nlohmann::json& j) {
  std::string out;
  if (j.contains("unreachable"))
    for (const auto& u : j["unreachable"]) out += "unreachable: " + u.get<std::string>() + "\n";
  return out;
}

// "79.1 us", or "3.17 s" from a second on.
std::string micros(double us) {
  char text[48];
  if (us >= 1e6)
    std::snprintf(text, sizeof text, "%.2f s", us / 1e6);
  else
    std::snprintf(text, sizeof text, "%.1f us", us);
  return text;
}

// flight: one line per operation, "  tp [0, 1] seq 17 all_reduce f32 18432 B sum: completed, 79.1 us (waited 76.2 us)".
std::string human_flight(const nlohmann::json& j) {
  std::string out;
  for (const auto& r : j["ranks"]) {
    const auto& ops = r["ops"];
    out += "rank " + std::to_string(r.value("rank", -1)) + ": " + std::to_string(r.value("recorded", uint64_t{0})) +
           " operations recorded, the last " + std::to_string(ops.size()) + ":\n";
    for (const auto& op : ops) {
      const std::string kind = op.value("kind", std::string("?"));
      std::string line = "  " + op.value("group", std::string("?")) + " [" + rank_list(op["members"]) + "] seq " +
                         std::to_string(op.value("seq", uint64_t{0})) + " " + kind;
      if (op["peer"].is_number()) line += (kind == "send" ? " to " : " from ") + std::to_string(op["peer"].get<int>());
      if (op["tag"].is_number()) line += " tag " + std::to_string(op["tag"].get<uint64_t>());
      if (op["root"].is_number()) line += " root " + std::to_string(op["root"].get<int>());
      line += " " + op.value("dtype", std::string("?")) + " " + std::to_string(op.value("bytes", uint64_t{0})) + " B";
      if (op["op"].is_string()) line += " " + op["op"].get<std::string>();
      line += ": " + op.value("state", std::string("?")) + ", " + micros(op.value("duration_us", 0.0));
      if (op["wait_us"].is_number()) line += " (waited " + micros(op["wait_us"].get<double>()) + ")";
      out += line + "\n";
    }
  }
  return out + unreachable_lines(j);
}

// stacks: every process, its threads, one line per frame.
std::string human_stacks(const nlohmann::json& j) {
  std::string out;
  for (const auto& p : j["processes"]) {
    out += "process " + std::to_string(p.value("pid", 0)) + " on " + p.value("host", std::string("?")) + " (ranks " +
           rank_list(p["ranks"]) + "): " + std::to_string(p["threads"].size()) + " threads\n";
    if (p.contains("error")) out += "  " + p.value("error", std::string()) + "\n";
    for (const auto& t : p["threads"]) {
      out += "  thread " + std::to_string(t.value("tid", 0)) + " \"" + t.value("name", std::string()) + "\"" +
             (t.value("caller", false) ? " (the inspector)" : "") + (t.value("answered", false) ? ":" : ": no answer") + "\n";
      int n = 0;
      for (const auto& f : t["frames"]) {
        const std::string fn = f["function"].is_string() ? f["function"].get<std::string>() + "+" +
                                                               f.value("function_offset", std::string("0x0"))
                                                         : "??";
        out += "    #" + std::to_string(n++) + " " + fn + " (" + f.value("module", std::string("?")) + "+" +
               f.value("module_offset", std::string("0x0")) + ")\n";
      }
    }
  }
  return out + unreachable_lines(j);
}

// The answer for people: one line per rank for status, the culprit and the edges for where, one
// line per operation for flight, per frame for stacks.
std::string human(const std::string& line, const nlohmann::json& j) {
  std::string out;
  if (j.contains("error")) return "error: " + j["error"].get<std::string>() + "\n";
  const std::string command = line.substr(0, line.find(' '));
  if ((command == "flight" && j.contains("ranks")) || (command == "stacks" && j.contains("processes"))) {
    try {  // the job's bytes: a document of another shape is shown as it is
      out = command == "flight" ? human_flight(j) : human_stacks(j);
    } catch (const nlohmann::json::exception&) {
      out = j.dump(1) + "\n";
    }
  } else if (command == "status") {
    out += "iteration " + std::to_string(j.value("iteration", int64_t{0})) + "\n";
    for (const auto& r : j["ranks"]) out += "  " + r.value("describe", std::string()) + "\n";
  } else if (command == "where") {
    out += j.value("summary", std::string()) + "\n";
    for (const auto& e : j["edges"])
      out += "  rank " + std::to_string(e.value("from", 0)) + " -> rank " + std::to_string(e.value("to", 0)) + ": " +
             e.value("what", std::string()) + "\n";
  } else {
    out = j.dump(1) + "\n";
  }
  return out;
}

}  // namespace

void add_inspect_command(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("inspect", "Ask a running job (troupe train --inspect) what its ranks are doing");
  auto target = std::make_shared<std::string>();
  auto command = std::make_shared<std::string>("status");
  auto json = std::make_shared<bool>(false);
  cmd->add_option("target", *target, "The job's inspect file, or HOST:PORT with TROUPE_JOB_TOKEN set")->required();
  cmd->add_option("--exec", *command, "The command: status (every rank: what it does now), where (who waits on "
                                      "whom, and the culprit of a stall), flight [RANK] [--last N] (the ranks' last "
                                      "communication operations), stacks (every thread's stack), help");
  cmd->add_flag("--json", *json, "Print the answer as JSON (docs/INSPECT.md)");
  cmd->callback([=] {
    auto fail = [&](const Status& st) {
      std::fprintf(stderr, "troupe inspect: error: %s\n", st.message().c_str());
      *exit_code = exit_code_for(st);
    };
    auto t = resolve_target(*target);
    if (!t) return fail(t.status());
    if (Status st = comm::validate_job_token(t.value().token, "the token"); !st) return fail(st.as_bad_input());
    auto answer = comm::psk_request(t.value().host, t.value().port, t.value().token, *command);
    if (!answer) return fail(answer.status());
    const auto j = nlohmann::json::parse(answer.value(), nullptr, false);
    if (j.is_discarded()) return fail(Status::error("the job's answer is not JSON"));
    if (*json) {
      std::fputs(answer.value().c_str(), stdout);
    } else {
      std::fputs(human(*command, j).c_str(), stdout);
    }
    *exit_code = j.contains("error") ? kExitUsage : kExitOk;
  });
}

}  // namespace troupe::apps
