#include "inspect/job_control.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "inspect/inspector.hpp"
#include "engine/fault_injection.hpp"
#include "engine/tensor_stats.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

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

bool JobControl::wait_paused_after(int64_t iteration, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] {
    return (state_.paused && state_.paused_after >= iteration) || state_.trainer == "finishing";
  });
}

JobControl::State JobControl::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  State s = state_;
  if (saves_in_flight_) s.saves_in_flight = saves_in_flight_->load();
  if (offload_mailbox_) s.offload_mailbox = offload_mailbox_->load();
  return s;
}

void JobControl::set_trainer_phase(std::string phase) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.trainer = std::move(phase);
  changed_.notify_all();
}

void JobControl::set_trainer_mailbox(int64_t messages) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.trainer_mailbox = messages;
}

void JobControl::watch_offload(std::shared_ptr<const std::atomic<int>> saves_in_flight,
                               std::shared_ptr<const std::atomic<int64_t>> mailbox) {
  std::lock_guard<std::mutex> lock(mu_);
  saves_in_flight_ = std::move(saves_in_flight);
  offload_mailbox_ = std::move(mailbox);
}

void JobControl::set_lr_override(std::optional<double> lr) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.lr_override = lr;
}

void JobControl::set_log_interval(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.log_interval = n;
}

void JobControl::put_pieces(int64_t seq, Result<Pieces> pieces) {
  std::lock_guard<std::mutex> lock(mu_);
  pieces_.insert_or_assign(seq, std::move(pieces));
  while (pieces_.size() > 4) pieces_.erase(pieces_.begin());  // nobody came for the oldest
  changed_.notify_all();
}

Result<JobControl::Pieces> JobControl::take_pieces(int64_t seq, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!changed_.wait_for(lock, timeout, [&] { return pieces_.count(seq) > 0; }))
    return Status::error("the ranks did not hand the tensor within " + std::to_string(timeout.count() / 1000) +
                         " s (an iteration takes longer, or the job is paused)");
  auto it = pieces_.find(seq);
  auto out = std::move(it->second);
  pieces_.erase(it);
  return out;
}

void JobControl::set_tensor_names(std::vector<std::string> names) {
  std::lock_guard<std::mutex> lock(mu_);
  names_ = std::move(names);
}

std::vector<std::string> JobControl::tensor_names() const {
  std::lock_guard<std::mutex> lock(mu_);
  return names_;
}

namespace {

nlohmann::json state_json(const JobControl& control, int64_t iteration) {
  const JobControl::State s = control.state();
  // The trainer pauses before the driver hears of the iteration it paused after: while paused, that
  // iteration is the job's (an answer must not show the state before its command).
  if (s.paused) iteration = std::max(iteration, s.paused_after);
  nlohmann::json j{{"iteration", iteration},
                   {"paused", s.paused},
                   {"trainer", s.trainer},
                   {"trainer_mailbox", s.trainer_mailbox},
                   {"offload", {{"saves_in_flight", s.saves_in_flight}, {"mailbox", s.offload_mailbox}}}};
  if (s.paused) j["paused_after"] = s.paused_after;
  if (s.lr_override) j["lr_override"] = *s.lr_override;
  if (s.log_interval) j["log_interval"] = *s.log_interval;
  return j;
}

// How long the inspector waits for a command to take effect before answering "pending": an
// iteration of a large model may take longer (the command still applies after it).
constexpr std::chrono::seconds kApplyWait{30};
// How long `step N` waits for its iterations to run (troupe inspect waits 150 s for an answer).
constexpr std::chrono::seconds kStepWait{120};

// Rank 0's inspector: numbers `c` and hands it to every process, the others first (so they hold it
// before this process's trainer can vote for it). An empty string, or what went wrong.
std::string submit(const InspectHub& hub, JobControl& control, ControlCommand& c, std::vector<std::string>& unreachable) {
  c.seq = control.next_seq();
  for (const std::string& answer : hub.ask_peers("control " + std::to_string(c.seq) + " " + c.text(), unreachable)) {
    const auto j = nlohmann::json::parse(answer, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.contains("error"))
      unreachable.push_back("a process refused the command: " +
                            (j.is_object() && j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>()
                                                                                           : answer.substr(0, 200)));
  }
  // Even when some did not take it, this process holds it: a later command must not skip it.
  control.deliver(c);
  return unreachable.empty() ? "" : c.verb + ": not every process took the command";
}

// The parameters of the whole job (each process knows its own ranks').
std::vector<std::string> job_tensor_names(const InspectHub& hub, const JobControl& control) {
  std::vector<std::string> names = control.tensor_names();
  std::vector<std::string> unreachable;
  for (const std::string& answer : hub.ask_peers("names", unreachable)) {
    const auto j = nlohmann::json::parse(answer, nullptr, false);
    if (j.is_object() && j.contains("names") && j["names"].is_array())
      for (const auto& n : j["names"])
        if (n.is_string()) names.push_back(n.get<std::string>());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

struct TensorAsk {
  std::string name;  // as asked, with its suffix
  std::string parameter;
  std::string kind = "value";
  std::optional<int> rank;
  int micro = 0;  // an activation's micro-batch
  int bins = 20;
  bool data = false;
  bool activation() const { return kind == "activation"; }
};

Result<TensorAsk> parse_tensor_ask(const std::vector<std::string>& args) {
  const char* usage =
      " (tensor NAME[.grad|.exp_avg|.exp_avg_sq] [--rank R] [--bins N], or tensor OP --rank R [--micro-batch K])";
  if (args.empty()) return Status::bad_input(std::string("tensor needs a parameter's name") + usage);
  TensorAsk t;
  t.name = t.parameter = args[0];
  if (t.name.find(':') != std::string::npos) t.kind = "activation";  // an op: layer3:mlp_fc1[:backward]
  for (const char* kind : {"grad", "exp_avg_sq", "exp_avg"}) {
    if (t.activation()) break;
    const std::string suffix = std::string(".") + kind;
    if (t.name.size() > suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      t.parameter = t.name.substr(0, t.name.size() - suffix.size());
      t.kind = kind;
      break;
    }
  }
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--data") {
      t.data = true;
    } else if (args[i] == "--micro-batch" && i + 1 < args.size()) {
      const auto v = whole_number(args[i + 1], 1 << 24);
      if (!v && args[i + 1] != "0") return Status::bad_input("--micro-batch needs a whole number" + std::string(usage));
      t.micro = v ? static_cast<int>(*v) : 0;
      ++i;
    } else if ((args[i] == "--rank" || args[i] == "--bins") && i + 1 < args.size()) {
      const auto v = args[i] == "--rank" ? whole_number(args[i + 1], 1 << 24) : whole_number(args[i + 1], 1000);
      if (!v && !(args[i] == "--rank" && args[i + 1] == "0"))
        return Status::bad_input(args[i] + " needs a whole number" + (args[i] == "--bins" ? " from 1 to 1000" : "") + usage);
      if (args[i] == "--rank")
        t.rank = v ? static_cast<int>(*v) : 0;
      else
        t.bins = static_cast<int>(*v);
      ++i;
    } else {
      return Status::bad_input("tensor does not know " + args[i] + usage);
    }
  }
  if (t.activation()) {
    if (!t.rank) return Status::bad_input("an op's result lives on one rank: tensor " + t.name + " --rank R" + usage);
    // The op's name as TROUPE_FAULT_NAN writes it (engine/fault_injection.hpp): checked the same way.
    auto spec = parse_nan_fault(t.name + "@1/" + std::to_string(t.micro));
    if (!spec) {
      std::string why = spec.status().message();
      const std::string prefix = "TROUPE_FAULT_NAN=" + t.name + "@1/" + std::to_string(t.micro) + ": ";
      if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
      return Status::bad_input("tensor " + t.name + ": " + why);
    }
  }
  return t;
}

std::string tensor_answer(const InspectHub& hub, JobControl& control, const InspectCall& call) {
  auto parsed = parse_tensor_ask(call.args);
  if (!parsed) return inspect_error(parsed.status().message());
  const TensorAsk& t = parsed.value();
  const std::vector<std::string> names = t.activation() ? std::vector<std::string>{} : job_tensor_names(hub, control);
  if (!t.activation() && !std::binary_search(names.begin(), names.end(), t.parameter)) {
    std::string near;
    int shown = 0;
    for (const std::string& n : names)
      if (n.find(t.parameter) != std::string::npos && shown++ < 8) near += (near.empty() ? "" : ", ") + n;
    return inspect_error("no parameter " + t.parameter + (near.empty() ? " (`names` lists them)" : "; did you mean " + near + "?"));
  }
  if ((t.kind == "grad" || t.activation()) && control.paused())
    return inspect_error(std::string(t.activation() ? "an op's result" : "a gradient") +
                         " is handed during a step and the job is paused: ask while it runs (or step)");
  ControlCommand c;
  c.verb = "tensor";
  c.args = {t.parameter, t.kind};
  if (t.activation()) c.args = {t.parameter, t.kind, std::to_string(*t.rank), std::to_string(t.micro)};
  std::vector<std::string> unreachable;
  if (std::string why = submit(hub, control, c, unreachable); !why.empty())
    return with_unreachable(inspect_error(why), unreachable);
  auto local = control.take_pieces(c.seq, std::chrono::seconds(t.kind == "grad" || t.activation() ? 120 : 60));
  if (!local) return inspect_error(local.status().message());
  std::vector<RankPieces> parts = std::move(local.value().parts);
  for (const std::string& answer : hub.ask_peers("tensor-part " + std::to_string(c.seq), unreachable, std::chrono::seconds(15))) {
    auto more = pieces_from_json(answer);
    if (!more) {
      unreachable.push_back(more.status().message());
      continue;
    }
    for (RankPieces& p : more.value()) parts.push_back(std::move(p));
  }
  if (!unreachable.empty()) return with_unreachable(inspect_error("not every process handed its part of " + t.name), unreachable);
  std::sort(parts.begin(), parts.end(), [](const RankPieces& a, const RankPieces& b) { return a.rank < b.rank; });
  auto whole = assemble_pieces(parts, t.rank);
  if (!whole && t.activation())
    return inspect_error(t.name + ": rank " + std::to_string(*t.rank) + " did not compute it in micro-batch " +
                         std::to_string(t.micro) + " (its stage holds other layers, there is no such rank or micro-batch)");
  if (!whole) return inspect_error(t.name + ": " + whole.status().message());
  const AssembledTensor& a = whole.value();
  std::vector<float> held;  // one rank's elements, in global order
  if (t.rank) {
    for (const RankPieces& part : parts)
      if (part.rank == *t.rank)
        for (const TensorPiece& p : part.pieces)
          for (const GlobalRun& r : p.runs)
            held.insert(held.end(), a.values.begin() + r.start, a.values.begin() + r.start + r.length);
  } else if (a.covered != a.shape.numel()) {
    return inspect_error(t.name + ": the ranks' pieces cover " + std::to_string(a.covered) + " of " +
                         std::to_string(a.shape.numel()) + " elements");
  }
  const std::vector<float>& values = t.rank ? held : a.values;
  const TensorStats s = tensor_stats(values.data(), static_cast<int64_t>(values.size()), t.bins);
  nlohmann::json j{{"name", t.name},
                   {"parameter", t.parameter},
                   {"kind", t.kind},
                   {"shape", std::vector<int64_t>(a.shape.begin(), a.shape.end())},
                   {"dtype", "f32"},
                   {"iteration", local.value().iteration},
                   {"ranks", a.ranks},
                   {"elements", s.count},
                   {"nan", s.nan},
                   {"inf", s.inf},
                   {"min", s.min},
                   {"max", s.max},
                   {"mean", s.mean},
                   {"std", s.std},
                   {"norm", s.norm},
                   {"histogram", {{"min", s.min}, {"max", s.max}, {"counts", s.histogram}}}};
  if (t.rank) j["rank"] = *t.rank;
  if (t.activation()) j["micro_batch"] = t.micro;
  if (t.data) j["values"] = base64_encode(values.data(), values.size() * sizeof(float));
  return j.dump(1) + "\n";
}

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
      {"stop", "stop", "end the job after the current iteration (or now, while paused), saving into --save first, "
                       "as Ctrl-C does"},
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
      std::vector<std::string> unreachable;
      if (std::string why = submit(hub, control, c, unreachable); !why.empty())
        return with_unreachable(inspect_error(why), unreachable);
      const int64_t seq = c.seq;
      const std::string text = c.text();
      bool done = control.wait_applied(seq, kApplyWait);
      if (done && verb == "pause") done = control.wait_paused(std::chrono::milliseconds(2000));
      std::string note = done ? "" : "pending: it applies after the current iteration";
      if (done && verb == "step") {  // answers once its iterations ran and the job paused again
        const int64_t target = control.state().last_applied_iteration + std::stoll(c.args.at(0));
        if (!control.wait_paused_after(target, kStepWait)) {
          done = false;
          note = "pending: the job pauses again after iteration " + std::to_string(target) + " (it is at " +
                 std::to_string(hub.iteration()) + ")";
        }
      }
      nlohmann::json j = state_json(control, hub.iteration());
      j["command"] = text;
      j["seq"] = seq;
      j["applied"] = done;
      if (done && verb == "stop") note = "stopping: the job saves (with --save) and ends";
      if (!note.empty()) j["note"] = note;
      return j.dump(1) + "\n";
    });
  }
  hub.add("tensor",
          "tensor NAME[.grad|.exp_avg|.exp_avg_sq] [--rank R] [--bins N] | tensor OP --rank R [--micro-batch K]",
          "a parameter (its gradient from the next step, its Adam moments), or an op's result in the next step "
          "(OP as layer3:mlp_fc1, layer3:ln2:backward, head:logits): shape, norm, min, max, mean, std, NaN/Inf, "
          "histogram; `dump NAME FILE.h5` writes it",
          [&hub, &control](const InspectCall& call) {
            if (call.local || !hub.first()) return inspect_error("tensor: ask the inspector of rank 0's process");
            return tensor_answer(hub, control, call);
          });
  hub.add("names", "names", "every parameter's global name", [&hub, &control](const InspectCall& call) {
    return nlohmann::json{{"names", call.local ? control.tensor_names() : job_tensor_names(hub, control)}}.dump() + "\n";
  });
  // Between inspectors: this process's pieces of a tensor, for rank 0's.
  hub.add_internal("tensor-part", "tensor-part SEQ",
          [&control](const InspectCall& call) {
            if (!call.local || call.args.size() != 1) return inspect_error("tensor-part is between inspectors");
            const auto seq = whole_number(call.args[0], int64_t{1} << 52);
            if (!seq) return inspect_error("tensor-part: bad sequence number");
            auto pieces = control.take_pieces(*seq, std::chrono::seconds(12));
            if (!pieces) return inspect_error(pieces.status().message());
            return pieces_to_json(pieces.value().parts);
          });
  // Between inspectors: a numbered command from rank 0's inspector for this process's trainer.
  hub.add_internal("control", "control SEQ COMMAND...",
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
