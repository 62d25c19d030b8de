#include "engine/fault_injection.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

namespace troupe {

namespace {

bool restarted_process() {
  const char* r = std::getenv("TROUPE_RESTART_COUNT");
  return r != nullptr && std::strtol(r, nullptr, 10) > 0;
}

}  // namespace

void throw_if_asked(const std::string& kind, int index, int64_t iteration) {
  static std::atomic<bool> fired{false};
  const char* spec = std::getenv("TROUPE_FAULT_THROW");
  if (spec == nullptr || fired.load() || restarted_process()) return;
  const std::string want = spec;
  const std::string self =
      (index >= 0 ? kind + std::to_string(index) : kind) + "@" + std::to_string(iteration);
  if (want != self || fired.exchange(true)) return;
  throw std::runtime_error("fault injected by TROUPE_FAULT_THROW=" + want);
}

void hang_if_asked(const std::string& kind, int index, int64_t iteration) {
  const char* spec = std::getenv("TROUPE_FAULT_HANG");
  if (spec == nullptr || restarted_process()) return;
  const std::string self =
      (index >= 0 ? kind + std::to_string(index) : kind) + "@" + std::to_string(iteration);
  if (spec != self) return;
  std::fprintf(stderr, "troupe: TROUPE_FAULT_HANG=%s: this actor stops answering\n", spec);
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void crash_if_asked(int64_t iteration) {
  const char* v = std::getenv("TROUPE_FAULT_KILL_AFTER_SHARD");
  if (v == nullptr || restarted_process() || std::strtoll(v, nullptr, 10) != iteration) return;
  std::fprintf(stderr,
               "troupe: TROUPE_FAULT_KILL_AFTER_SHARD=%s: killing this process during the save\n",
               v);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

double slow_forward_ms(int rank) {
  const char* spec = std::getenv("TROUPE_FAULT_SLOW");
  if (spec == nullptr || restarted_process()) return 0;
  int r = -1;
  double ms = 0;
  if (std::sscanf(spec, "rank%d:%lf", &r, &ms) != 2 || r != rank || !(ms > 0 && ms < 3.6e6)) return 0;
  return ms;
}

}  // namespace troupe

namespace troupe {

namespace {

std::string valid_names() {
  std::string out = "[rankN/]WHERE:TENSOR[:forward|:backward|:weight]@ITERATION[/MICRO] (e.g. layer2:mlp_fc1@4, "
                    "rank1/layer1:attention_scores:backward@3) or [rankN/]optimizer@ITERATION; WHERE is layerN, "
                    "embedding, head or custom.BLOCK; the tensors:";
  std::string where;
  for (const ProbeName& n : gpt_probe_names()) {
    if (where != n.where) {
      where = n.where;
      out += std::string(where == "layer" ? "" : ";") + " " + (where == "layer" ? "layerN" : where) + ":";
    } else {
      out += ",";
    }
    out += std::string(" ") + n.tensor + " (";
    std::string dirs;
    if (n.forward) dirs += "forward";
    if (n.backward) dirs += std::string(dirs.empty() ? "" : " ") + "backward";
    if (n.weight) dirs += std::string(dirs.empty() ? "" : " ") + "weight";
    out += dirs + ")";
  }
  return out + "; custom.BLOCK: its output and input tensors' names, loss, params (weight)";
}

bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty() || s.size() > 12) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  out = std::stoll(s);
  return true;
}

}  // namespace

bool NanFault::matches(const ProbePoint& at) const {
  if (optimizer || at.layer != layer || at.dir != dir || tensor != at.tensor) return false;
  return layer != kCustomProbe || block == at.block;
}

Result<NanFault> parse_nan_fault(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Status::bad_input("TROUPE_FAULT_NAN=" + text + ": " + why + " -- write " + valid_names());
  };
  NanFault f;
  f.text = text;
  std::string rest = text;
  if (rest.rfind("rank", 0) == 0 && rest.find('/') != std::string::npos && rest.find('/') < rest.find('@')) {
    int64_t r = 0;
    if (!parse_int(rest.substr(4, rest.find('/') - 4), r)) return bad("the rank is not rankN");
    f.rank = static_cast<int>(r);
    rest = rest.substr(rest.find('/') + 1);
  }
  const size_t at = rest.rfind('@');
  if (at == std::string::npos) return bad("no @ITERATION");
  std::string when = rest.substr(at + 1);
  rest = rest.substr(0, at);
  int64_t it = 0, micro = 0;
  if (const size_t slash = when.find('/'); slash != std::string::npos) {
    if (!parse_int(when.substr(slash + 1), micro)) return bad("the micro-batch after / is not a number");
    when = when.substr(0, slash);
  }
  if (!parse_int(when, it) || it < 1) return bad("the iteration after @ is not a number from 1");
  f.iteration = it;
  f.micro_batch = static_cast<int>(micro);
  if (rest == "optimizer") {
    f.optimizer = true;
    return f;
  }
  std::vector<std::string> parts;
  for (size_t from = 0;;) {
    const size_t colon = rest.find(':', from);
    parts.push_back(rest.substr(from, colon == std::string::npos ? std::string::npos : colon - from));
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  if (parts.size() < 2 || parts.size() > 3) return bad("expected WHERE:TENSOR or WHERE:TENSOR:DIRECTION");
  if (parts.size() == 3) {
    if (parts[2] == "forward") f.dir = ProbeDir::forward;
    else if (parts[2] == "backward") f.dir = ProbeDir::backward;
    else if (parts[2] == "weight") f.dir = ProbeDir::weight;
    else return bad("the direction \"" + parts[2] + "\" is not forward, backward or weight");
  }
  const std::string& where = parts[0];
  f.tensor = parts[1];
  std::string kind;
  if (where.rfind("layer", 0) == 0) {
    int64_t l = 0;
    if (!parse_int(where.substr(5), l)) return bad("\"" + where + "\" is not layerN");
    f.layer = static_cast<int>(l);
    kind = "layer";
  } else if (where == "embedding" || where == "head") {
    f.layer = where == "embedding" ? kEmbeddingProbe : kHeadProbe;
    kind = where;
  } else if (where.rfind("custom.", 0) == 0 && where.size() > 7) {
    f.layer = kCustomProbe;
    f.block = where.substr(7);
    if (f.tensor.empty()) return bad("no tensor name after " + where + ":");
    return f;  // the block's tensors are the model's to know
  } else {
    return bad("\"" + where + "\" is not layerN, embedding, head or custom.BLOCK");
  }
  for (const ProbeName& n : gpt_probe_names()) {
    if (kind != n.where || f.tensor != n.tensor) continue;
    const bool has = f.dir == ProbeDir::forward ? n.forward : f.dir == ProbeDir::backward ? n.backward : n.weight;
    if (!has) return bad(kind + " " + f.tensor + " has no " + probe_dir_name(f.dir) + " tensor");
    return f;
  }
  return bad("\"" + f.tensor + "\" is not a tensor of " + (kind == "layer" ? "a layer" : "the " + kind));
}

Result<std::optional<NanFault>> nan_fault_from_env() {
  const char* spec = std::getenv("TROUPE_FAULT_NAN");
  if (spec == nullptr || restarted_process()) return std::optional<NanFault>();
  auto f = parse_nan_fault(spec);
  if (!f) return f.status();
  return std::optional<NanFault>(std::move(f).value());
}

Status check_nan_fault(const NanFault& f, int num_layers, int world_size) {
  if (f.rank >= world_size)
    return Status::bad_input("TROUPE_FAULT_NAN=" + f.text + ": rank " + std::to_string(f.rank) + " but the job has " +
                             std::to_string(world_size) + " ranks -- name a rank from 0 to " +
                             std::to_string(world_size - 1));
  if (!f.optimizer && f.layer >= num_layers)
    return Status::bad_input("TROUPE_FAULT_NAN=" + f.text + ": layer " + std::to_string(f.layer) +
                             " but the model has " + std::to_string(num_layers) + " layers -- name a layer from 0 to " +
                             std::to_string(num_layers - 1));
  return Status::ok();
}

}  // namespace troupe
