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

// The answer for people: one line per rank for status, the culprit and the edges for where.
std::string human(const std::string& command, const nlohmann::json& j) {
  std::string out;
  if (j.contains("error")) return "error: " + j["error"].get<std::string>() + "\n";
  const std::string verb = command.substr(0, command.find(' '));
  if (j.contains("command") && j.contains("applied")) {  // pause, resume, step, set, save
    out += j.value("command", std::string()) + ": " + (j.value("applied", false) ? "done" : "pending") + ", ";
    out += j.value("paused", false) ? "paused after iteration " + std::to_string(j.value("paused_after", int64_t{0}))
                                    : "running, iteration " + std::to_string(j.value("iteration", int64_t{0}));
    if (j.contains("lr_override")) out += ", learning rate fixed at " + j["lr_override"].dump();
    if (j.contains("note")) out += " (" + j.value("note", std::string()) + ")";
    return out + "\n";
  }
  if (verb == "help" && j.contains("commands")) {
    for (const auto& c : j["commands"])
      out += "  " + c.value("usage", std::string()) + "\n      " + c.value("help", std::string()) + "\n";
    return out;
  }
  if (verb == "status") {
    out += "iteration " + std::to_string(j.value("iteration", int64_t{0}));
    if (j.contains("job") && j["job"].value("paused", false))
      out += " (paused after iteration " + std::to_string(j["job"].value("paused_after", int64_t{0})) + ")";
    out += "\n";
    for (const auto& r : j["ranks"]) out += "  " + r.value("describe", std::string()) + "\n";
  } else if (verb == "where") {
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
                                      "whom, and the culprit of a stall), help");
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
