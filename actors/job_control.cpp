#include "actors/job_control.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "actors/inspector.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

std::string ControlCommand::text() const {
  std::string out = verb;
  for (const std::string& a : args) out += " " + a;
  return out;
}

namespace {

std::optional<int64_t> whole_number(const std::string& s, int64_t most) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  for (char c : s)
    if (c < '0' || c > '9') return std::nullopt;
  const long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (v <= 0 || v > most) return std::nullopt;
  return v;
}

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
  return Status::bad_input("unknown control command \"" + verb + "\" (pause, resume, step [N], set, save)");
}

int64_t JobControl::next_seq() {
  std::lock_guard<std::mutex> lock(mu_);
  return ++last_seq_;
}

void JobControl::deliver(ControlCommand command) {
  std::function<void()> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    delivered_ = std::max(delivered_, command.seq);
    last_seq_ = std::max(last_seq_, command.seq);
    pending_.push_back(std::move(command));
    wake = wake_;
  }
  if (wake) wake();
}

void JobControl::set_wake(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = std::move(wake);
}

int64_t JobControl::vote() const {
  std::lock_guard<std::mutex> lock(mu_);
  return delivered_;
}

std::vector<ControlCommand> JobControl::take_through(int64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ControlCommand> out;
  while (!pending_.empty() && pending_.front().seq <= seq) {
    out.push_back(std::move(pending_.front()));
    pending_.pop_front();
  }
  return out;
}

std::vector<ControlCommand> JobControl::take_all() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ControlCommand> out(std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
  pending_.clear();
  return out;
}

void JobControl::applied(int64_t seq, int64_t iteration) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.applied_seq = std::max(state_.applied_seq, seq);
  state_.last_applied_iteration = iteration;
  changed_.notify_all();
}

void JobControl::set_paused(bool paused, int64_t iteration) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.paused = paused;
  state_.paused_after = paused ? iteration : -1;
  changed_.notify_all();
}

bool JobControl::paused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.paused;
}

bool JobControl::wait_applied(int64_t seq, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] { return state_.applied_seq >= seq; });
}

bool JobControl::wait_paused(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] { return state_.paused; });
}

JobControl::State JobControl::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void JobControl::set_lr_override(std::optional<double> lr) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.lr_override = lr;
}

void JobControl::set_log_interval(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.log_interval = n;
}

namespace {

nlohmann::json state_json(const JobControl& control, int64_t iteration) {
  const JobControl::State s = control.state();
  nlohmann::json j{{"iteration", iteration}, {"paused", s.paused}};
  if (s.paused) j["paused_after"] = s.paused_after;
  if (s.lr_override) j["lr_override"] = *s.lr_override;
  if (s.log_interval) j["log_interval"] = *s.log_interval;
  return j;
}

// How long the inspector waits for a command to take effect before answering "pending": an
// iteration of a large model may take longer (the command still applies after it).
constexpr std::chrono::seconds kApplyWait{30};

}  // namespace

void add_control_commands(InspectHub& hub, JobControl& control, const TrainConfig& config) {
  const bool can_save = !config.save.empty();
  struct Verb {
    const char* name;
    const char* usage;
    const char* help;
  };
  const Verb verbs[] = {
      {"pause", "pause", "stop after the current iteration (checkpoints and watchdogs keep working)"},
      {"resume", "resume", "go on after a pause"},
      {"step", "step [N]", "while paused: run N iterations (default 1), then pause again"},
      {"set", "set lr X | set lr schedule | set log-interval N",
       "from the next iteration on: a fixed learning rate (or the schedule's again), how often progress is printed"},
      {"save", "save", "a checkpoint after the current iteration (or now, while paused), into --save"},
  };
  hub.set_job_state([&hub, &control] { return state_json(control, hub.iteration()).dump(); });
  for (const Verb& v : verbs) {
    const std::string verb = v.name;
    hub.add(verb, v.usage, v.help, [&hub, &control, can_save, verb](const InspectCall& call) {
      auto command = parse_control(verb, call.args, can_save);
      if (!command) return inspect_error(command.status().message());
      if (call.local || !hub.first()) return inspect_error(verb + ": ask the inspector of rank 0's process");
      const bool paused = control.paused();
      if ((verb == "resume" || verb == "step") && !paused)
        return inspect_error(verb + ": the job is not paused (pause it first)");
      if (verb == "pause" && paused) {
        nlohmann::json j = state_json(control, hub.iteration());
        j["command"] = "pause";
        j["applied"] = true;
        j["note"] = "already paused";
        return j.dump(1) + "\n";
      }
      ControlCommand c = std::move(command).value();
      c.seq = control.next_seq();
      // Every other process holds the command before this process's trainer can vote for it.
      std::vector<std::string> unreachable;
      for (const std::string& answer : hub.ask_peers("control " + std::to_string(c.seq) + " " + c.text(), unreachable)) {
        const auto j = nlohmann::json::parse(answer, nullptr, false);
        if (j.is_discarded() || !j.is_object() || j.contains("error"))
          unreachable.push_back("a process refused the command: " + (j.is_object() && j.contains("error") && j["error"].is_string()
                                                                          ? j["error"].get<std::string>()
                                                                          : answer.substr(0, 200)));
      }
      if (!unreachable.empty()) {
        // The others may hold it: deliver it here too, so a later command does not skip it.
        control.deliver(c);
        return with_unreachable(inspect_error(verb + ": not every process took the command"), unreachable);
      }
      const int64_t seq = c.seq;
      const std::string text = c.text();
      control.deliver(std::move(c));
      bool done = control.wait_applied(seq, kApplyWait);
      if (done && verb == "pause") done = control.wait_paused(std::chrono::milliseconds(2000));
      nlohmann::json j = state_json(control, hub.iteration());
      j["command"] = text;
      j["seq"] = seq;
      j["applied"] = done;
      if (!done) j["note"] = "pending: it applies after the current iteration";
      return j.dump(1) + "\n";
    });
  }
  // Between inspectors: a numbered command from rank 0's inspector for this process's trainer.
  hub.add("control", "control SEQ COMMAND...", "(from rank 0's inspector to the others) a numbered command",
          [&control, can_save](const InspectCall& call) {
            if (!call.local) return inspect_error("control is how rank 0's inspector tells the others; use the commands");
            if (call.args.size() < 2) return inspect_error("control needs SEQ and a command");
            const auto seq = whole_number(call.args[0], int64_t{1} << 52);
            if (!seq) return inspect_error("control: bad sequence number");
            auto command = parse_control(call.args[1], {call.args.begin() + 2, call.args.end()}, can_save);
            if (!command) return inspect_error(command.status().message());
            ControlCommand c = std::move(command).value();
            c.seq = *seq;
            control.deliver(std::move(c));
            return std::string("{\"ok\": true}\n");
          });
}

}  // namespace troupe
