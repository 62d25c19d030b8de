// troupe inspect TARGET --exec CMD [--json]: asks a running job's inspector (troupe train --inspect).
// TARGET: the job's inspect file (address and token), or HOST:PORT with the token in
// TROUPE_JOB_TOKEN. docs/INSPECT.md has the commands and the JSON schema.
#include <algorithm>
#include <cmath>
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

std::string percent(const nlohmann::json& v) {
  if (!v.is_number()) return "-";
  char s[32];
  std::snprintf(s, sizeof s, "%.1f%%", 100 * v.get<double>());
  return s;
}

std::string number(const char* format, const nlohmann::json& v) {
  if (!v.is_number()) return "-";
  char s[48];
  std::snprintf(s, sizeof s, format, v.get<double>());
  return s;
}

// stages: the job's bubble beside the prediction, then one line per rank.
std::string human_stages(const nlohmann::json& j) {
  const auto& its = j["iterations"];
  if (its.empty()) return "no iteration completed by every rank yet\n";
  const auto& p = j["predicted"];
  std::string out = "iterations " + std::to_string(its.front().get<int64_t>()) + " to " +
                    std::to_string(its.back().get<int64_t>()) + ": the job's bubble " + percent(j["bubble"]) +
                    ", predicted " + percent(p["bubble"]) + " (the table simulated" +
                    (p["formula"].is_number() ? "; formula " + percent(p["formula"]) : "") +
                    (p["at_measured_costs"].is_number() ? "; at the measured costs " + percent(p["at_measured_costs"]) : "") +
                    ")\n";
  const auto& pass = j["pass_ms"];
  out += "  one pass: F " + number("%.2f", pass["F"]) + " ms, B " + number("%.2f", pass["B"]) + " ms" +
         (pass["W"].get<double>() > 0 ? ", W " + number("%.2f", pass["W"]) + " ms" : "") + "\n";
  for (const auto& r : j["ranks"]) {
    out += "  rank " + std::to_string(r.value("rank", 0)) + " (pp " + std::to_string(r.value("pp", 0)) + ", tp " +
           std::to_string(r.value("tp", 0)) + ", dp " + std::to_string(r.value("dp", 0)) + "): busy " +
           percent(r["busy"]) + ", idle " + percent(r["idle"]) + ", bubble " + percent(r["bubble"]) + " (predicted " +
           percent(r["predicted_bubble"]) + ") | per iteration " + number("%.2f", r["step_ms"]) + " ms: F " +
           number("%.2f", r["f_ms"]) + ", B " + number("%.2f", r["b_ms"]) +
           (r["w_ms"].get<double>() > 0 ? ", W " + number("%.2f", r["w_ms"]) : "") + ", waits " +
           number("%.2f", r["wait_ms"]) + ", reduce " + number("%.2f", r["reduce_ms"]) + ", optimizer " +
           number("%.2f", r["optimizer_ms"]) + " ms\n";
  }
  return out;
}

// plan: each stage's table in one line, the actions where its ranks are now in brackets, then the
// ranks.
std::string human_plan(const nlohmann::json& j) {
  const auto& sc = j["schedule"];
  const auto& p = j["predicted"];
  std::string out = "schedule " + sc.value("name", std::string()) + ": " + std::to_string(sc.value("stages", 0)) +
                    " stages, " + std::to_string(sc.value("micro_batches", 0)) + " micro-batches, " +
                    std::to_string(sc.value("chunks", 0)) + " chunk(s) per stage; predicted bubble " +
                    percent(p["bubble"]) + (p["formula"].is_number() ? " (formula " + percent(p["formula"]) + ")" : "") +
                    "\n";
  const bool chunks = sc.value("chunks", 1) > 1;
  for (const auto& st : j["stages"]) {
    std::vector<int> at;
    for (const auto& a : st["at"]) at.push_back(a.value("action", -1));
    out += "stage " + std::to_string(st.value("stage", 0)) + ":";
    for (const auto& a : st["actions"]) {
      std::string name = a.value("kind", std::string()) + std::to_string(a.value("micro", 0));
      if (chunks) name += "." + std::to_string(a.value("chunk", 0));
      const bool here = std::find(at.begin(), at.end(), a.value("index", -2)) != at.end();
      out += " " + (here ? "[" + name + "]" : name);
    }
    out += "\n";
    for (const auto& a : st["at"]) out += "  " + a.value("describe", std::string()) + "\n";
  }
  return out;
}

std::string human_history(const nlohmann::json& j) {
  std::string out = " iteration |      lm loss |           lr |  grad norm |   ms/iter\n";
  const auto& it = j["iteration"];
  for (size_t i = 0; i < it.size(); ++i) {
    char line[160];
    auto num = [&](const char* key) { return j[key][i].is_number() ? j[key][i].get<double>() : NAN; };
    std::snprintf(line, sizeof line, "%10lld | %12.6E | %12.6E | %10.3f | %9.1f\n",
                  static_cast<long long>(it[i].get<int64_t>()), num("loss"), num("lr"), num("grad_norm"), num("ms"));
    out += line;
  }
  return out;
}

// The answer for people: one line per rank for status, the culprit and the edges for where.
std::string human(const std::string& command, const nlohmann::json& j) {
  const std::string name = command.substr(0, command.find(' '));
  std::string out;
  if (j.contains("error")) return "error: " + j["error"].get<std::string>() + "\n";
  if (name == "status") {
    out += "iteration " + std::to_string(j.value("iteration", int64_t{0})) + "\n";
    for (const auto& r : j["ranks"]) out += "  " + r.value("describe", std::string()) + "\n";
  } else if (name == "where") {
    out += j.value("summary", std::string()) + "\n";
    for (const auto& e : j["edges"])
      out += "  rank " + std::to_string(e.value("from", 0)) + " -> rank " + std::to_string(e.value("to", 0)) + ": " +
             e.value("what", std::string()) + "\n";
  } else if (name == "stages" && j.contains("ranks")) {
    out = human_stages(j);
  } else if (name == "plan" && j.contains("stages")) {
    out = human_plan(j);
  } else if (name == "history" && j.contains("iteration")) {
    out = human_history(j);
  } else {
    out = j.dump(1) + "\n";
  }
  if (j.contains("unreachable"))
    for (const auto& u : j["unreachable"]) out += "  unreachable: " + u.get<std::string>() + "\n";
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
                                      "whom, and the culprit of a stall), stages [--last N] (busy, idle and bubble "
                                      "per rank beside the schedule's prediction), plan [RANK] (the schedule table "
                                      "and where the ranks are in it), history [--last N], help");
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
      std::string text;
      try {  // the job's answer is outside bytes: a field of another type must not end the client
        text = human(*command, j);
      } catch (const nlohmann::json::exception& e) {
        return fail(Status::error(std::string("the job's answer has an unexpected shape (") + e.what() +
                                  ") -- ask with --json to see it"));
      }
      std::fputs(text.c_str(), stdout);
    }
    *exit_code = j.contains("error") ? kExitUsage : kExitOk;
  });
}

}  // namespace troupe::apps
