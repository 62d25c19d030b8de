// troupe inspect TARGET --exec CMD [--json]: asks a running job's inspector (troupe train --inspect).
// TARGET: the job's inspect file (address and token), or HOST:PORT with the token in
// TROUPE_JOB_TOKEN. docs/INSPECT.md has the commands and the JSON schema.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <iostream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>
#include <readline/history.h>
#include <readline/readline.h>

#include <nlohmann/json.hpp>

#include "apps/commands.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "comm/bootstrap/psk_channel.hpp"
#include "config/inspect_file.hpp"
#include "config/validate.hpp"
#include "engine/tensor_stats.hpp"
#include "storage/durable.hpp"
#include "storage/tensor_dump.hpp"

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

// ", cp 1" for a rank of a context-parallel job (its documents carry "cp"), else nothing.
std::string cp_text(const nlohmann::json& r) {
  return r.contains("cp") && r["cp"].is_number_integer() ? ", cp " + std::to_string(r["cp"].get<int64_t>())
                                                          : std::string();
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
           std::to_string(r.value("tp", 0)) + ", dp " + std::to_string(r.value("dp", 0)) + cp_text(r) + "): busy " +
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

// moe: per layer a summary line, then per expert the tokens routed and kept, its share of the
// layer's tokens and a bar (40 characters for the busiest expert).
std::string human_moe(const nlohmann::json& j) {
  const auto& layers = j["layers"];
  if (layers.empty()) return "no MoE layers have reported (a dense model, or no iteration finished yet)\n";
  std::string out = fmt::format("MoE load of iteration {} (moe loss {:.6E})\n", j.value("iteration", int64_t{0}),
                                j["moe_loss"].is_number() ? j["moe_loss"].get<double>() : NAN);
  for (const auto& l : layers) {
    const std::vector<int64_t> routed = l["routed"].get<std::vector<int64_t>>();
    const std::vector<int64_t> kept = l["kept"].get<std::vector<int64_t>>();
    int64_t total = 0, most = 1;
    for (int64_t r : routed) total += r, most = std::max(most, r);
    const int64_t dropped = l.value("dropped", int64_t{0});
    auto num = [&](const char* key) { return l[key].is_number() ? l[key].get<double>() : NAN; };
    out += fmt::format("layer {}: {} experts, {} micro-batches, {} tokens routed, {} dropped ({:.1f}%); lb loss {:.6g}, "
                       "z loss {:.6g}\n",
                       l.value("layer", 0), routed.size(), l.value("micro_batches", int64_t{0}), total, dropped,
                       total > 0 ? 100.0 * static_cast<double>(dropped) / static_cast<double>(total) : 0.0,
                       num("lb_loss"), num("z_loss"));
    out += "  expert    routed      kept   share\n";
    for (size_t e = 0; e < routed.size(); ++e)
      out += fmt::format("  {:>6} {:>9} {:>9} {:>6.1f}% {}\n", e, routed[e], e < kept.size() ? kept[e] : 0,
                         total > 0 ? 100.0 * static_cast<double>(routed[e]) / static_cast<double>(total) : 0.0,
                         std::string(static_cast<size_t>(40 * routed[e] / most), '#'));
  }
  return out;
}

// stragglers: a line per rank, lowest relative score first, the stragglers marked.
std::string human_stragglers(const nlohmann::json& j) {
  const auto& ranks = j["ranks"];
  if (ranks.empty()) return "no straggler scores yet (a job of one rank, or no iteration finished yet)\n";
  auto num = [](const nlohmann::json& r, const char* key) { return r[key].is_number() ? r[key].get<double>() : NAN; };
  std::string out = fmt::format("straggler scores of iteration {} (a straggler: below {:.2f} of its stage's fastest)\n",
                                j.value("iteration", int64_t{0}), j["threshold"].is_number() ? j["threshold"].get<double>() : NAN);
  out += "  rank stage relative individual  compute ms  where\n";
  for (const auto& r : ranks) {
    std::string where = r.value("section", std::string());
    if (!where.empty()) where += fmt::format(" {:.1f} ms against {:.1f} ms", num(r, "section_ms"), num(r, "fastest_section_ms"));
    out += fmt::format("  {:>4} {:>5} {:>8.2f} {:>10.2f} {:>11.1f}  {}{}\n", r.value("rank", 0), r.value("stage", 0),
                       num(r, "relative_score"), num(r, "individual_score"), num(r, "compute_ms"), where,
                       r.value("straggler", false) ? "  <- straggler" : "");
  }
  return out;
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
  if ((verb == "flight" && j.contains("ranks")) || (verb == "stacks" && j.contains("processes"))) {
    try {  // the job's bytes: a document of another shape is shown as it is
      return verb == "flight" ? human_flight(j) : human_stacks(j);
    } catch (const nlohmann::json::exception&) {
      return j.dump(1) + "\n";
    }
  }
  if (verb == "status") {
    out += "iteration " + std::to_string(j.value("iteration", int64_t{0}));
    if (j.contains("job") && j["job"].is_object()) {
      const auto& job = j["job"];
      out += " -- trainer: " + job.value("trainer", std::string("?"));
      const int saves = job.contains("offload") ? job["offload"].value("saves_in_flight", 0) : 0;
      if (saves > 0) out += "; offload actor: " + std::to_string(saves) + " checkpoint(s) being written";
      if (const int64_t queued = job.contains("offload") ? job["offload"].value("mailbox", int64_t{0}) : 0; queued > 0)
        out += " (" + std::to_string(queued) + " message(s) in its mailbox)";
      if (job.contains("lr_override")) out += "; learning rate fixed at " + job["lr_override"].dump();
    }
    out += "\n";
    for (const auto& r : j["ranks"]) out += "  " + r.value("describe", std::string()) + "\n";
  } else if (verb == "tensor" && j.contains("shape")) {
    auto num = [&](const char* key) { return fmt::format("{:.6g}", j.value(key, 0.0)); };
    std::string shape;
    for (const auto& d : j["shape"]) shape += (shape.empty() ? "" : ", ") + d.dump();
    if (j.value("kind", std::string()) == "activation")
      out += fmt::format("{} of iteration {}, micro-batch {}, on rank {}: shape ({}) f32, {} elements\n",
                         j.value("name", std::string()), j.value("iteration", int64_t{0}), j.value("micro_batch", 0),
                         j.value("rank", 0), shape, j.value("elements", int64_t{0}));
    else
      out += fmt::format("{} ({}) after iteration {}: shape ({}) f32, {} elements{}\n", j.value("name", std::string()),
                         j.value("kind", std::string()), j.value("iteration", int64_t{0}), shape,
                         j.value("elements", int64_t{0}),
                         j.contains("rank") ? " held by rank " + j["rank"].dump() : "");
    out += "  norm " + num("norm") + "  min " + num("min") + "  max " + num("max") + "  mean " + num("mean") + "  std " +
           num("std") + "  nan " + j["nan"].dump() + "  inf " + j["inf"].dump() + "\n";
    const auto& counts = j["histogram"]["counts"];
    int64_t most = 1;
    for (const auto& c : counts) most = std::max<int64_t>(most, c.get<int64_t>());
    const double lo = j["histogram"].value("min", 0.0), hi = j["histogram"].value("max", 0.0);
    const double width = counts.empty() ? 0 : (hi - lo) / static_cast<double>(counts.size());
    for (size_t b = 0; b < counts.size(); ++b) {
      const int64_t c = counts[b].get<int64_t>();
      out += fmt::format("  {:>12.5g} {:>9} {}\n", lo + width * static_cast<double>(b), c,
                         std::string(static_cast<size_t>(40 * c / most), '#'));
    }
  } else if (verb == "trace" && j.value("tracing", false)) {
    out += "tracing from iteration " + std::to_string(j.value("from_iteration", int64_t{0}) + 1) +
           "; trace stop " + (j.value("file", std::string()).empty() ? "FILE" : j.value("file", std::string())) +
           " writes the Chrome trace\n";
  } else if (verb == "names" && j.contains("names")) {
    for (const auto& n : j["names"]) out += "  " + n.get<std::string>() + "\n";
  } else if (verb == "where") {
    out += j.value("summary", std::string()) + "\n";
    for (const auto& e : j["edges"])
      out += "  rank " + std::to_string(e.value("from", 0)) + " -> rank " + std::to_string(e.value("to", 0)) + ": " +
             e.value("what", std::string()) + "\n";
  } else if (verb == "stages" && j.contains("ranks")) {
    out = human_stages(j);
  } else if (verb == "plan" && j.contains("stages")) {
    out = human_plan(j);
  } else if (verb == "history" && j.contains("iteration")) {
    out = human_history(j);
  } else if (verb == "moe" && j.contains("layers")) {
    out = human_moe(j);
  } else if (verb == "stragglers" && j.contains("ranks")) {
    out = human_stragglers(j);
  } else {
    out = j.dump(1) + "\n";
  }
  if (j.contains("unreachable"))
    for (const auto& u : j["unreachable"]) out += "  unreachable: " + u.get<std::string>() + "\n";
  return out;
}

// One connection's worth of asking: every request is a fresh TLS-PSK connection (the server
// answers one request per connection).
struct Session {
  Target target;
  Result<nlohmann::json> ask(const std::string& line) const {
    auto answer = comm::psk_request(target.host, target.port, target.token, line, std::chrono::milliseconds(150'000));
    if (!answer) return answer.status();
    auto j = nlohmann::json::parse(answer.value(), nullptr, false);
    if (j.is_discarded()) return Status::error("the job's answer is not JSON");
    return j;
  }
};

std::vector<std::string> words_of(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted = true; }

// top [--count N] [--interval S]: status as a table, redrawn until Ctrl-C (or N times).
int run_top(const Session& session, const std::vector<std::string>& args, bool json) {
  int64_t count = -1;
  double interval = 1.0;
  for (size_t i = 1; i + 1 < args.size(); i += 2) {
    if (args[i] == "--count") count = std::atoll(args[i + 1].c_str());
    if (args[i] == "--interval") interval = std::max(0.1, std::atof(args[i + 1].c_str()));
  }
  g_interrupted = false;
  auto old = std::signal(SIGINT, on_interrupt);
  const bool tty = isatty(STDOUT_FILENO) == 1 && !json;
  int rc = kExitOk;
  for (int64_t n = 0; (count < 0 || n < count) && !g_interrupted; ++n) {
    auto j = session.ask("status");
    if (!j) {
      std::fprintf(stderr, "troupe inspect: error: %s\n", j.status().message().c_str());
      rc = exit_code_for(j.status());
      break;
    }
    std::string screen = tty ? "\033[H\033[2J" : "";
    const auto& s = j.value();
    if (json) {
      screen = s.dump() + "\n";
    } else {
      screen += fmt::format("troupe top -- iteration {}{}   (Ctrl-C to leave)\n", s.value("iteration", int64_t{0}),
                            s.contains("job") && s["job"].value("paused", false) ? " (paused)" : "");
      screen += fmt::format("{:>5} {:>4} {:>4} {:>4} {:>6}  {:<22} {:>9}  {}\n", "rank", "pp", "tp", "dp", "step", "doing",
                            "for (s)", "waiting for");
      for (const auto& r : s["ranks"]) {
        const std::string doing = r.value("doing", std::string()) +
                                  (r.value("micro_batch", -1) >= 0 ? " mb " + std::to_string(r.value("micro_batch", -1)) : "");
        screen += fmt::format("{:>5} {:>4} {:>4} {:>4} {:>6}  {:<22} {:>9.2f}  {}\n", r.value("rank", 0), r.value("pp", 0),
                              r.value("tp", 0), r.value("dp", 0), r.value("step", int64_t{0}),
                              doing + (r.contains("cp") ? " (cp " + std::to_string(r.value("cp", 0)) + ")" : ""),
                              r.value("seconds_in_state", 0.0), r.value("waiting_for", std::string()));
      }
    }
    std::fputs(screen.c_str(), stdout);
    std::fflush(stdout);
    if (count >= 0 && n + 1 >= count) break;
    for (double slept = 0; slept < interval && !g_interrupted; slept += 0.05)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::signal(SIGINT, old);
  return rc;
}

// dump NAME FILE.h5 [--rank R]: the tensor's values, written here by the client.
int run_dump(const Session& session, const std::vector<std::string>& args, bool json) {
  if (args.size() < 3)
    return std::fprintf(stderr, "troupe inspect: error: dump needs a tensor and a file: dump NAME FILE.h5 [--rank R]\n"),
           kExitUsage;
  std::string line = "tensor " + args[1] + " --data";
  for (size_t i = 3; i < args.size(); ++i) line += " " + args[i];
  auto j = session.ask(line);
  if (!j) return std::fprintf(stderr, "troupe inspect: error: %s\n", j.status().message().c_str()), exit_code_for(j.status());
  const auto& t = j.value();
  if (t.contains("error"))
    return std::fprintf(stdout, "%s", json ? (t.dump() + "\n").c_str() : human("tensor", t).c_str()), kExitUsage;
  auto bytes = base64_decode(t.value("values", std::string()));
  if (!bytes) return std::fprintf(stderr, "troupe inspect: error: the job's values: %s\n", bytes.status().message().c_str()), 1;
  std::vector<int64_t> dims = t["shape"].get<std::vector<int64_t>>();
  Shape shape(dims.begin(), dims.end());
  const int64_t n = static_cast<int64_t>(bytes.value().size() / sizeof(float));
  if (t.contains("rank") && t.value("kind", std::string()) != "activation")
    shape = Shape{n};  // one rank's elements of a parameter, in global order
  if (shape.numel() != n) return std::fprintf(stderr, "troupe inspect: error: the job sent %lld values for a shape of %lld\n",
                                              static_cast<long long>(n), static_cast<long long>(shape.numel())), 1;
  std::vector<float> values(static_cast<size_t>(n));
  std::memcpy(values.data(), bytes.value().data(), bytes.value().size());
  const std::string name = t.value("name", std::string());
  std::map<std::string, std::string> text{{"parameter", t.value("parameter", std::string())}, {"kind", t.value("kind", std::string())}};
  std::map<std::string, int64_t> ints{{"iteration", t.value("iteration", int64_t{0})}};
  if (t.contains("rank")) ints["rank"] = t["rank"].get<int64_t>();
  if (Status st = write_tensor_h5(args[2], name, shape, values.data(), text, ints); !st)
    return std::fprintf(stderr, "troupe inspect: error: %s\n", st.message().c_str()), 1;
  nlohmann::json out = t;
  out.erase("values");
  out["file"] = args[2];
  out["dataset"] = name;
  if (json)
    std::fputs((out.dump(1) + "\n").c_str(), stdout);
  else
    std::printf("%swrote %s to %s (dataset \"%s\")\n", human("tensor", out).c_str(), name.c_str(), args[2].c_str(),
                name.c_str());
  return kExitOk;
}

// trace stop: the job's spans of the window as a Chrome trace (one process per rank, its passes,
// waits and reductions on one track, each iteration as a span around them).
int write_trace(const nlohmann::json& t, bool json) {
  nlohmann::json events = nlohmann::json::array();
  size_t spans = 0;
  int64_t first = -1;  // the oldest iteration some rank still had
  for (const auto& r : t["ranks"]) {
    const int rank = r.value("rank", 0);
    const std::string label = fmt::format("rank {} (pp {}, tp {}, dp {}{})", rank, r.value("pp", 0), r.value("tp", 0),
                                          r.value("dp", 0), cp_text(r));
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", label}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
    for (const auto& s : r["steps"]) {
      const double at = s.value("start_us", 0.0);
      const int64_t iteration = s.value("iteration", int64_t{0});
      first = first < 0 ? iteration : std::min(first, iteration);
      events.push_back({{"name", "iteration " + std::to_string(iteration)}, {"cat", "step"}, {"ph", "X"}, {"ts", at},
                        {"dur", s.value("dur_us", 0.0)}, {"pid", rank}, {"tid", 0}});
      for (const auto& sp : s["spans"]) {
        const std::string kind = sp.at(0).get<std::string>();
        const int micro = sp.at(1).get<int>(), chunk = sp.at(2).get<int>();
        std::string name = kind;
        if (kind == "forward" || kind == "backward" || kind == "weight")
          name = std::string(1, static_cast<char>(std::toupper(kind[0]))) + std::to_string(micro) +
                 (chunk > 0 ? "." + std::to_string(chunk) : "");
        else if (micro >= 0)
          name += " (micro-batch " + std::to_string(micro) + ")";
        events.push_back({{"name", name},
                          {"cat", kind},
                          {"ph", "X"},
                          {"ts", at + sp.at(3).get<double>()},
                          {"dur", sp.at(4).get<double>()},
                          {"pid", rank},
                          {"tid", 1},
                          {"args", {{"iteration", iteration}, {"micro_batch", micro}, {"chunk", chunk}}}});
        ++spans;
      }
    }
  }
  const std::string file = t.value("file", std::string());
  const std::string text = nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
  if (Status st = write_text_atomically(file, text); !st) {
    std::fprintf(stderr, "troupe inspect: error: %s\n", st.message().c_str());
    return exit_code_for(st);
  }
  nlohmann::json summary{{"file", file},
                         {"from_iteration", t.value("from_iteration", int64_t{0})},
                         {"to_iteration", t.value("to_iteration", int64_t{0})},
                         {"ranks", t["ranks"].size()},
                         {"spans", spans}};
  if (t.contains("unreachable")) summary["unreachable"] = t["unreachable"];
  if (first > summary["from_iteration"].get<int64_t>() + 1)
    summary["note"] = "the ranks keep their last 64 steps: the trace starts at iteration " + std::to_string(first);
  if (json)
    std::fputs((summary.dump(1) + "\n").c_str(), stdout);
  else
    std::printf("wrote %s: %zu spans of %zu rank(s), iterations %lld to %lld (open it in chrome://tracing or Perfetto)\n",
                file.c_str(), spans, t["ranks"].size(), static_cast<long long>(summary["from_iteration"].get<int64_t>() + 1),
                static_cast<long long>(summary["to_iteration"].get<int64_t>()));
  if (!json && summary.contains("note")) std::printf("  (%s)\n", summary["note"].get<std::string>().c_str());
  return kExitOk;
}

// One command line: printed for people, or as JSON; the exit code (2: the job refused it).
int run_line(const Session& session, const std::string& line, bool json) {
  const std::vector<std::string> args = words_of(line);
  if (args.empty()) return kExitOk;
  if (args[0] == "top" || args[0] == "dump") {
    try {  // the job's answers are outside bytes
      return args[0] == "top" ? run_top(session, args, json) : run_dump(session, args, json);
    } catch (const nlohmann::json::exception& e) {
      std::fprintf(stderr, "troupe inspect: error: the job's answer has an unexpected shape (%s)\n", e.what());
      return kExitFailure;
    }
  }
  auto j = session.ask(line);
  if (!j) {
    std::fprintf(stderr, "troupe inspect: error: %s\n", j.status().message().c_str());
    return exit_code_for(j.status());
  }
  std::string text;
  try {  // the job's answer is outside bytes: a field of another type must not end the client
    if (args[0] == "trace" && j.value().contains("trace") && j.value().contains("ranks")) return write_trace(j.value(), json);
    text = json ? j.value().dump(1) + "\n" : human(line, j.value());
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "troupe inspect: error: the job's answer has an unexpected shape (%s) -- ask with --json to see it\n",
                 e.what());
    return kExitFailure;
  }
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  return j.value().contains("error") ? kExitUsage : kExitOk;
}

// Completion in the REPL: command words, then parameter names (with .grad/.exp_avg/.exp_avg_sq).
std::vector<std::string> g_commands, g_names;
char* complete_next(const char* text, int state) {
  static size_t index;
  static std::vector<std::string> matches;
  if (state == 0) {
    matches.clear();
    index = 0;
    const std::string prefix = text;
    const std::string before(rl_line_buffer, static_cast<size_t>(rl_point));
    const bool first_word = before.find_first_not_of(' ') == std::string::npos ||
                            before.find(' ', before.find_first_not_of(' ')) == std::string::npos;
    if (first_word) {
      for (const std::string& c : g_commands)
        if (c.rfind(prefix, 0) == 0) matches.push_back(c);
    } else {
      for (const std::string& n : g_names)
        for (const char* suffix : {"", ".grad", ".exp_avg", ".exp_avg_sq"}) {
          const std::string full = n + suffix;
          if (full.rfind(prefix, 0) == 0 && (prefix.size() > n.size() || *suffix == '\0' || prefix == n))
            matches.push_back(full);
        }
    }
  }
  if (index >= matches.size()) return nullptr;
  return strdup(matches[index++].c_str());
}
char** complete(const char* text, int, int) {
  rl_attempted_completion_over = 1;
  return rl_completion_matches(text, complete_next);
}

// The REPL: readline (line editing, history in ~/.troupe_inspect_history, Tab completion) on a
// terminal; one command per line from a pipe.
int run_repl(const Session& session, bool json) {
  if (isatty(STDIN_FILENO) != 1) {
    int rc = kExitOk;
    for (std::string line; std::getline(std::cin, line);) {
      if (line == "quit" || line == "exit") break;
      if (int r = run_line(session, line, json); r != kExitOk) rc = r;
    }
    return rc;
  }
  if (auto h = session.ask("help"); h && h.value().contains("commands"))
    for (const auto& c : h.value()["commands"]) g_commands.push_back(c.value("name", std::string()));
  for (const char* extra : {"dump", "top", "quit"}) g_commands.push_back(extra);
  if (auto n = session.ask("names"); n && n.value().contains("names"))
    for (const auto& name : n.value()["names"]) g_names.push_back(name.get<std::string>());
  const char* home = std::getenv("HOME");
  const std::string history = std::string(home ? home : ".") + "/.troupe_inspect_history";
  read_history(history.c_str());
  rl_attempted_completion_function = complete;
  std::printf("troupe inspect %s:%d -- help lists the commands, Tab completes, quit leaves\n", session.target.host.c_str(),
              session.target.port);
  while (char* raw = readline("troupe> ")) {
    std::string line = raw;
    std::free(raw);
    if (line.find_first_not_of(' ') == std::string::npos) continue;
    add_history(line.c_str());
    if (line == "quit" || line == "exit") break;
    run_line(session, line, json);
  }
  write_history(history.c_str());
  history_truncate_file(history.c_str(), 1000);
  return kExitOk;
}

}  // namespace

void add_inspect_command(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("inspect", "Ask a running job (troupe train --inspect) what its ranks are doing");
  auto target = std::make_shared<std::string>();
  auto command = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("target", *target, "The job's inspect file, or HOST:PORT with TROUPE_JOB_TOKEN set")->required();
  cmd->add_option("--exec", *command,
                  "One command, then exit (for scripts): status, where, pause, step N, resume, set lr X, save, "
                  "tensor NAME, dump NAME FILE.h5, stages, plan, history, moe, stragglers, flight [RANK], stacks, trace, top, help... Without it: an interactive prompt");
  cmd->add_flag("--json", *json, "Print the answers as JSON (docs/INSPECT.md)");
  cmd->callback([=] {
    auto t = resolve_target(*target);
    if (!t) {
      std::fprintf(stderr, "troupe inspect: error: %s\n", t.status().message().c_str());
      *exit_code = exit_code_for(t.status());
      return;
    }
    if (Status st = comm::validate_job_token(t.value().token, "the token"); !st) {
      std::fprintf(stderr, "troupe inspect: error: %s\n", st.message().c_str());
      *exit_code = kExitUsage;
      return;
    }
    Session session{t.value()};
    *exit_code = command->empty() ? run_repl(session, *json) : run_line(session, *command, *json);
  });
}

}  // namespace troupe::apps
