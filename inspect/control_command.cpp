#include "inspect/control_command.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iterator>

namespace troupe {

std::string ControlCommand::text() const {
  std::string out = verb;
  for (const std::string& a : args) out += " " + a;
  return out;
}

std::optional<int64_t> whole_number(const std::string& s, int64_t most) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  for (char c : s)
    if (c < '0' || c > '9') return std::nullopt;
  const long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (v <= 0 || v > most) return std::nullopt;
  return v;
}

namespace {

std::optional<double> positive_number(const std::string& s) {
  if (s.empty() || s.size() > 64) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v) || v <= 0) return std::nullopt;
  return v;
}

}  // namespace

Result<ControlCommand> parse_control(const std::string& verb, const std::vector<std::string>& args, bool can_save) {
  ControlCommand c;
  c.verb = verb;
  c.args = args;
  auto no_args = [&](const char* usage) -> Result<ControlCommand> {
    if (!args.empty()) return Status::bad_input(verb + " takes no arguments (" + usage + ")");
    return c;
  };
  if (verb == "pause") return no_args("pause: stop after the current iteration");
  if (verb == "resume") return no_args("resume: go on after a pause");
  if (verb == "stop") return no_args("stop: save (with --save) after the current iteration and end the job");
  if (verb == "save") {
    if (!args.empty()) return Status::bad_input("save takes no arguments: it saves into the job's --save folder");
    if (!can_save) return Status::bad_input("save needs a checkpoint folder: the job was started without --save");
    return c;
  }
  if (verb == "step") {
    if (args.empty()) {
      c.args = {"1"};
      return c;
    }
    if (args.size() != 1 || !whole_number(args[0], 1'000'000'000))
      return Status::bad_input("step takes one whole number of iterations, e.g. step 3 (default 1)");
    return c;
  }
  if (verb == "set") {
    if (args.size() == 2 && args[0] == "lr") {
      if (args[1] == "schedule" || positive_number(args[1])) return c;
      return Status::bad_input("set lr needs a positive number (e.g. set lr 1e-4), or \"schedule\" to return to the "
                               "learning-rate schedule");
    }
    if (args.size() == 2 && args[0] == "log-interval") {
      if (whole_number(args[1], int64_t{1} << 40)) return c;
      return Status::bad_input("set log-interval needs a positive whole number, e.g. set log-interval 10");
    }
    return Status::bad_input("set knows: set lr X (or set lr schedule), set log-interval N");
  }
  if (verb == "tensor") {  // rank 0's inspector builds it (tensor_command): checked for the other processes
    static const char* kinds[] = {"value", "grad", "exp_avg", "exp_avg_sq"};
    if (args.size() == 2 && !args[0].empty() && args[0].size() <= 256 &&
        std::find(std::begin(kinds), std::end(kinds), args[1]) != std::end(kinds))
      return c;
    auto index = [](const std::string& s) { return s == "0" || whole_number(s, 1 << 24).has_value(); };
    if (args.size() == 4 && !args[0].empty() && args[0].size() <= 256 && args[1] == "activation" && index(args[2]) &&
        index(args[3]))
      return c;  // an op's result: the op, "activation", the rank, the micro-batch
    return Status::bad_input("tensor needs a parameter name and what of it (value, grad, exp_avg, exp_avg_sq), or an "
                             "op, activation, a rank and a micro-batch");
  }
  return Status::bad_input("unknown control command \"" + verb + "\" (pause, resume, step [N], set, save, stop)");
}

}  // namespace troupe
