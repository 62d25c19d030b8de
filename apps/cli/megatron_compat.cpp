#include "apps/cli/megatron_compat.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "apps/cli/megatron_table.hpp"
#include "apps/cli/train_options.hpp"
#include "base/spelling.hpp"
#include "storage/hf_import.hpp"

namespace troupe {
namespace {

// A flag of a row, as argparse reads it (apps/cli/megatron_table.hpp's notation).
enum class Arity { none, one, list, optional };

struct Flag {
  std::string name;  // "--cross-entropy-loss-fusion"
  Arity arity = Arity::none;
  const CompatRule* rule = nullptr;
};

Flag parse_flag_spec(const char* spec, const CompatRule* rule) {
  std::string s = spec;
  Flag f;
  f.rule = rule;
  const size_t space = s.find(' ');
  f.name = s.substr(0, space);
  const std::string tail = space == std::string::npos ? "" : s.substr(space + 1);
  f.arity = tail.empty() ? Arity::none : tail == "V" ? Arity::one : tail == "V..." ? Arity::list : Arity::optional;
  return f;
}

std::string normalise(const std::string& flag) {
  std::string s = flag;
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

// Every row's flags by normalised name.
const std::map<std::string, Flag>& table_flags() {
  static const std::map<std::string, Flag> flags = [] {
    std::map<std::string, Flag> out;
    for (const CompatSection& section : compat_sections())
      for (const CompatRule& rule : section.rules)
        for (const char* spec : rule.flags) {
          if (rule.kind == CompatKind::implemented) continue;  // registered: never screened
          Flag f = parse_flag_spec(spec, &rule);
          out.emplace(normalise(f.name), f);
        }
    return out;
  }();
  return flags;
}

bool is_flag(const std::string& token) { return token.size() > 2 && token.compare(0, 2, "--") == 0; }

bool is_number(const std::string& v, double want) {
  double x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  return ec == std::errc() && p == v.data() + v.size() && x == want;
}

// Whether `v` is one of the values `ok` names (apps/cli/megatron_table.hpp).
bool value_ok(const std::string& ok, const std::string& v) {
  if (ok.empty()) return true;
  if (ok == "0" || ok == "1" || ok == "-1") return is_number(v, std::stod(ok));
  size_t start = 0;
  while (start <= ok.size()) {
    const size_t bar = ok.find('|', start);
    if (ok.substr(start, bar == std::string::npos ? std::string::npos : bar - start) == v) return true;
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return false;
}

struct Registered {
  std::set<std::string> names;         // "--num-layers", ...
  std::vector<std::string> spellings;  // names and the table's flags, sorted: what a hint offers
};

// troupe train's flags, read once (add_train_options registers the same ones every time).
const Registered& registered_flags() {
  static const Registered r = [] {
    TrainConfig cfg;
    CLI::App app{"troupe train"};
    add_train_options(&app, &cfg);
    Registered out;
    for (const CLI::Option* o : app.get_options())
      for (const std::string& n : o->get_lnames()) out.names.insert("--" + n);
    out.spellings.assign(out.names.begin(), out.names.end());
    for (const auto& [key, f] : table_flags()) out.spellings.push_back(f.name);
    std::sort(out.spellings.begin(), out.spellings.end());  // ties: the alphabetically first
    return out;
  }();
  return r;
}

// "--no-x" and "--disable-x" say the opposite of "--x" and "--enable-x": a hint must not offer one
// for the other (a script that turns a check off must not be told to turn it on).
bool opposite(const std::string& a, const std::string& b) {
  auto split = [](const std::string& flag) {
    std::string core = normalise(flag).substr(2);
    for (const char* negative : {"no-", "disable-"})
      if (core.rfind(negative, 0) == 0) return std::make_pair(false, core.substr(std::string(negative).size()));
    if (core.rfind("enable-", 0) == 0) return std::make_pair(true, core.substr(7));
    return std::make_pair(true, core);
  };
  const auto [pa, ca] = split(a);
  const auto [pb, cb] = split(b);
  return ca == cb && pa != pb;
}

// The nearest spellings of `flag` among registered flags and the table's (at most two), when near,
// leaving out its opposite.
std::vector<std::string> nearest(const std::string& flag, const Registered& reg) {
  std::vector<std::string> near = nearest_spellings(flag, reg.spellings, reg.spellings.size());
  near.erase(std::remove_if(near.begin(), near.end(), [&](const std::string& n) { return opposite(flag, n); }),
             near.end());
  if (near.size() > 2) near.resize(2);
  return near;
}

std::string last_value(const std::vector<std::string>& args, const std::string& flag) {
  std::string v;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) v = args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0) v = args[i].substr(flag.size() + 1);
  }
  return v;
}

// The values given to `flag` (its last occurrence, a list's every value; '-' and '_' alike), and
// whether it is given at all.
bool given_values(const std::vector<std::string>& args, const std::string& flag, std::vector<std::string>* values) {
  bool found = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!is_flag(args[i])) continue;
    const size_t eq = args[i].find('=');
    if (normalise(args[i].substr(0, eq)) != normalise(flag)) continue;
    found = true;
    values->clear();
    if (eq != std::string::npos) {
      values->push_back(args[i].substr(eq + 1));
      continue;
    }
    for (size_t j = i + 1; j < args.size() && !is_flag(args[j]); ++j) values->push_back(args[j]);
  }
  return found;
}

// The ZeRO stage Megatron FSDP's sharding strategy (or FSDP2's resharding) stands for; -1 for a
// strategy Megatron does not know.
int fsdp_zero_stage(const std::string& flag, const std::vector<std::string>& args) {
  std::vector<std::string> v;
  if (normalise(flag) == "--use-torch-fsdp2")
    return given_values(args, "--torch-fsdp2-no-reshard-after-forward", &v) ? 2 : 3;
  if (!given_values(args, "--data-parallel-sharding-strategy", &v) || v.empty()) return 3;
  const std::string& s = v.back();
  return s == "no_shard" ? 0 : s == "optim" ? 1 : s == "optim_grads" ? 2 : s == "optim_grads_params" ? 3 : -1;
}

// "N problems:\n  - a\n  - b" (validation's) as its items; any other message as one.
void append_problems(std::vector<std::string>& problems, const std::string& message) {
  const std::string sep = "\n  - ";
  if (message.find(" problems:" + sep) == std::string::npos) {
    problems.push_back(message);
    return;
  }
  size_t at = message.find(sep);
  while (at != std::string::npos) {
    const size_t next = message.find(sep, at + sep.size());
    problems.push_back(message.substr(at + sep.size(), next == std::string::npos ? std::string::npos : next - at - sep.size()));
    at = next;
  }
}

// Megatron's --load of a folder that holds no checkpoint (missing, or empty: the first run of a
// script that passes --save X --load X) warns and starts from scratch; so does troupe, with a note.
// A folder with iter_* entries but no latest_checkpointed_iteration.txt stays an error
// (validation's): an unfinished save is not a fresh start. --exit-on-missing-checkpoint keeps
// Megatron's exit instead.
void fresh_start_if_nothing_to_load(std::vector<std::string>& args, std::vector<std::string>& notes) {
  namespace fs = std::filesystem;
  const std::string load = last_value(args, "--load");
  if (load.empty()) return;
  for (const std::string& a : args)
    if (a == "--exit-on-missing-checkpoint") return;
  std::error_code ec;
  const fs::file_status st = fs::status(load, ec);
  bool nothing = false;
  if (st.type() == fs::file_type::not_found) {
    nothing = true;
  } else if (st.type() == fs::file_type::directory) {
    nothing = !fs::exists(fs::path(load) / "latest_checkpointed_iteration.txt", ec) && !is_hf_folder(load);
    for (fs::directory_iterator it(load, ec), end; nothing && !ec && it != end; it.increment(ec))
      if (it->path().filename().string().rfind("iter_", 0) == 0) nothing = false;
  }
  if (!nothing) return;
  std::vector<std::string> kept;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--load" && i + 1 < args.size()) {
      ++i;
      continue;
    }
    if (args[i].rfind("--load=", 0) == 0) continue;
    kept.push_back(args[i]);
  }
  args = std::move(kept);
  notes.push_back("--load " + load + ": no checkpoint there yet, so training starts from scratch (as Megatron does; "
                  "--exit-on-missing-checkpoint stops instead)");
}

}  // namespace

size_t flag_distance(const std::string& a, const std::string& b) { return spelling_distance(a, b); }

namespace {

const char* kind_name(CompatKind kind) {
  return kind == CompatKind::implemented ? "implemented"
         : kind == CompatKind::noop      ? "no-op"
         : kind == CompatKind::alias   ? "alias"
         : kind == CompatKind::refused ? "refused"
                                       : "equivalent";
}

// "--flag v1 v2" as given, for messages.
std::string shown(const std::string& flag, const std::vector<std::string>& values) {
  std::string s = flag;
  for (const std::string& v : values) s += " " + v;
  return s;
}

// Where a screened row lands: the problems of one row (or of mixture of experts) go into one line.
struct Refusals {
  std::vector<std::pair<std::string, std::vector<std::string>>> lines;  // (reason, flags as given)
  void add(const std::string& reason, const std::string& given) {
    for (auto& [r, flags] : lines)
      if (r == reason) {
        flags.push_back(given);
        return;
      }
    lines.push_back({reason, {given}});
  }
  void into(std::vector<std::string>& problems) const {
    for (const auto& [reason, flags] : lines) {
      std::string p;
      for (const std::string& f : flags) p += (p.empty() ? "" : ", ") + f;
      problems.push_back(p + ": " + reason);
    }
  }
};

}  // namespace

std::vector<CompatRow> compat_table() {
  std::vector<CompatRow> rows;
  for (const CompatSection& section : compat_sections())
    for (const CompatRule& rule : section.rules)
      for (const char* spec : rule.flags)
        rows.push_back({parse_flag_spec(spec, &rule).name, kind_name(rule.kind), rule.text});
  return rows;
}

std::string compat_table_markdown() {
  std::string out;
  for (const CompatSection& section : compat_sections()) {
    out += fmt::format("\n#### {}\n\n| flags | troupe | why, or what to give |\n|---|---|---|\n", section.name);
    for (const CompatRule& rule : section.rules) {
      std::string flags;
      for (const char* spec : rule.flags) flags += (flags.empty() ? "`" : " `") + std::string(spec) + "`";
      std::string what = kind_name(rule.kind);
      if (rule.kind == CompatKind::alias) {
        std::string as;
        for (const char* a : rule.alias) as += (as.empty() ? "" : " ") + std::string(a);
        what = "alias of `" + as + "`";
      }
      std::string why = rule.text;
      if (rule.when == CompatWhen::no_value) {
        what += " without a value, else refused";
        why += "; with values: " + std::string(rule.otherwise);
      } else if (rule.when == CompatWhen::fresh_start) {
        what += " when `--load` holds no checkpoint, else refused";
        why += "; with a checkpoint to load: " + std::string(rule.otherwise);
      } else if (*rule.ok != '\0') {
        std::string ok;
        for (const char* c = rule.ok; *c != '\0'; ++c) ok += *c == '|' ? std::string("`, `") : std::string(1, *c);
        what += " for `" + ok + "`, else refused";
        why += "; other values: " + std::string(rule.otherwise);
      }
      out += "| " + flags + " | " + what + " | " + why + " |\n";
    }
  }
  return out;
}

Result<ScreenedTrainArgs> screen_train_args(const std::vector<std::string>& args, int world_size, ScreenFor screen_for) {
  const char* command = screen_for == ScreenFor::plan ? "troupe plan" : "troupe train";
  const Registered& reg = registered_flags();
  const std::map<std::string, Flag>& table = table_flags();
  ScreenedTrainArgs out;
  std::vector<std::string> front;  // the aliases' flags: first, so that explicit flags win
  std::vector<std::string> problems;
  Refusals refusals;
  std::vector<std::pair<const Flag*, std::string>> fresh_only;  // accepted only without a checkpoint to load
  std::set<std::string> noted;
  for (size_t i = 0; i < args.size();) {
    const std::string& token = args[i];
    if (!is_flag(token)) {  // a value of a registered flag, or a stray word CLI11 reports
      out.args.push_back(token);
      ++i;
      continue;
    }
    const size_t eq = token.find('=');
    const std::string flag = token.substr(0, eq);
    std::optional<std::string> inline_value;
    if (eq != std::string::npos) inline_value = token.substr(eq + 1);
    // The values that follow this flag: up to the next flag.
    size_t next = i + 1;
    while (next < args.size() && !is_flag(args[next])) ++next;
    if (reg.names.count(flag) > 0) {
      out.args.insert(out.args.end(), args.begin() + static_cast<std::ptrdiff_t>(i),
                      args.begin() + static_cast<std::ptrdiff_t>(next));
      i = next;
      continue;
    }
    const auto it = table.find(normalise(flag));
    if (it == table.end()) {
      const std::vector<std::string> near = nearest(flag, reg);
      std::string p = flag + ": not a flag of " + command;
      if (!near.empty()) p += " -- did you mean " + near[0] + (near.size() > 1 ? " or " + near[1] : "") + "?";
      else p += std::string(" -- ") + command + " --help lists the flags, docs/COMPAT.md Megatron's and DeepSpeed's";
      problems.push_back(p);
      i = next;
      continue;
    }
    const Flag& f = it->second;
    const CompatRule& rule = *f.rule;
    // The row's values: inline (--flag=v) or the tokens that follow, as many as argparse takes.
    std::vector<std::string> values;
    size_t j = i + 1;
    if (inline_value) {
      values.push_back(*inline_value);
    } else if (f.arity == Arity::one || f.arity == Arity::optional) {
      if (j < next) values.push_back(args[j++]);
    } else if (f.arity == Arity::list) {
      for (; j < next; ++j) values.push_back(args[j]);
    }
    i = j;
    if (f.arity == Arity::one && values.empty()) {
      problems.push_back(flag + ": needs a value");
      continue;
    }
    if (f.arity == Arity::none && inline_value) {
      problems.push_back(flag + "=" + *inline_value + ": " + flag + " is a switch and takes no value");
      continue;
    }
    const std::string given = shown(flag, values);
    bool ok = true;
    for (const std::string& v : values) ok = ok && value_ok(rule.ok, v);
    if (rule.when == CompatWhen::no_value && !values.empty()) {
      refusals.add(rule.otherwise, given);
      continue;
    }
    if (rule.kind == CompatKind::refused || rule.kind == CompatKind::equivalent) {
      refusals.add(rule.text, given);
      continue;
    } else if (!ok) {
      refusals.add(rule.otherwise, given);
      continue;
    }
    if (rule.when == CompatWhen::fresh_start) fresh_only.push_back({&f, given});
    std::vector<std::string> alias;
    for (const char* a : rule.alias) {
      std::string s = a;
      if (s == "{}") s = values.empty() ? "" : values.back();
      if (s == "{fsdp}") {
        const int stage = fsdp_zero_stage(flag, args);
        if (stage < 0) {
          refusals.add("Megatron knows the sharding strategies no_shard, optim, optim_grads and optim_grads_params",
                       "--data-parallel-sharding-strategy " + last_value(args, "--data-parallel-sharding-strategy"));
          alias.clear();
          break;
        }
        s = std::to_string(stage);
      }
      alias.push_back(s);
    }
    if (noted.insert(normalise(flag)).second) {
      std::string note = given + ": ";
      if (rule.kind == CompatKind::alias) {
        std::string as;
        for (const std::string& a : alias) as += (as.empty() ? "" : " ") + a;
        note += "read as " + as + " -- " + rule.text;
      } else {
        note += "no effect -- " + std::string(rule.text);
      }
      out.notes.push_back(note);
    }
    if (rule.kind == CompatKind::alias) front.insert(front.end(), alias.begin(), alias.end());
  }
  out.args.insert(out.args.begin(), front.begin(), front.end());
  fresh_start_if_nothing_to_load(out.args, out.notes);
  // A row accepted only when nothing is loaded: a --load left after the fresh-start check loads one.
  if (!last_value(out.args, "--load").empty())
    for (const auto& [f, given] : fresh_only) {
      refusals.add(f->rule->otherwise, given);
      const std::string prefix = given + ": ";  // (a lambda cannot capture a structured binding in clang 14)
      out.notes.erase(std::remove_if(out.notes.begin(), out.notes.end(),
                                     [&](const std::string& n) { return n.rfind(prefix, 0) == 0; }),
                      out.notes.end());
    }
  refusals.into(problems);
  if (problems.empty()) return out;
  // Everything else wrong too, so that one run lists it all: the first value CLI11 cannot read,
  // or else validation's problems.
  TrainConfig cfg;
  CLI::App app{command};
  add_train_options(&app, &cfg);
  std::vector<std::string> reversed(out.args.rbegin(), out.args.rend());
  try {
    app.parse(reversed);
    if (screen_for == ScreenFor::plan) waive_run_inputs_for_plan(&cfg);
    if (Status st = finalize_train_config(app, &cfg, world_size); !st) append_problems(problems, st.message());
  } catch (const CLI::CallForHelp&) {
  } catch (const CLI::ParseError& e) {
    problems.push_back(e.what());
  }
  std::string message = problems.size() == 1 ? problems[0] : fmt::format("{} problems with the flags:", problems.size());
  if (problems.size() > 1)
    for (const std::string& p : problems) message += "\n  - " + p;
  return Status::bad_input(message);
}

}  // namespace troupe
