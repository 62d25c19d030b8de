// A command of the job's inspector for the trainer (inspect/job_control.hpp): what rank 0's inspector
// hands the other processes' as "control SEQ VERB ARGS..." and each checks again (parse_control):
// network input. No CAF here (the flag fuzzers link it).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

struct ControlCommand {
  int64_t seq = 0;
  std::string verb;               // pause, resume, step, set, save, tensor
  std::vector<std::string> args;  // step: [N]; set: [name, value]; tensor: [name, value|grad|exp_avg|exp_avg_sq]
  std::string text() const;       // "set lr 0.0001"
};

// A command line the trainer understands, checked: the command or what is wrong with it ("set lr
// needs a positive number, e.g. set lr 1e-4"). `can_save`: the job has --save.
Result<ControlCommand> parse_control(const std::string& verb, const std::vector<std::string>& args, bool can_save);

// A whole number in [1, most] written in decimal digits only; nullopt otherwise.
std::optional<int64_t> whole_number(const std::string& s, int64_t most);

}  // namespace troupe
