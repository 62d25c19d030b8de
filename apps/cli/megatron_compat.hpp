// Megatron-LM's and Megatron-DeepSpeed's command lines as they come: before CLI11 parses the
// flags of `troupe train`, every flag troupe does not register is looked up in a table of theirs
// (docs/COMPAT.md prints it):
//   - a no-op: a switch that changes nothing in troupe (a fusion, an attention kernel, a data
//     loader's worker count): removed, with one line at start-up saying so;
//   - an alias: an older or other spelling of what troupe does (--checkpoint-activations is
//     --recompute-granularity full): rewritten, with a line at start-up;
//   - refused: a flag whose meaning troupe does not have (--fp16, --squared-relu): a problem naming the
//     reason and what to do;
//   - otherwise unknown: a problem with the nearest registered spelling, or troupe's equivalent of
//     a Megatron flag it lacks.
// Flags with constrained values (--data-impl mmap, --optimizer adam, ...)
// are no-ops for the values that change nothing and refused for the others.
//
// All problems are reported at once: the screen's own, the first value CLI11 cannot convert, and
// every validation problem of what remains (so one run shows everything to fix). Nothing is
// written. Thread-safe (no shared state).
#pragma once
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

struct ScreenedTrainArgs {
  std::vector<std::string> args;   // what CLI11 parses: no-ops removed, aliases rewritten
  std::vector<std::string> notes;  // one line per no-op or alias, for the start-up lines
};

// args: the flags of `troupe train` in command-line order (no program or subcommand name).
// world_size: the ranks the job will have (1 in one process), for validation's problems.
// Fails (bad input) with every problem, one per line.
Result<ScreenedTrainArgs> screen_train_args(const std::vector<std::string>& args, int world_size);

// Optimal string alignment distance between two flag names, '-' and '_' counted as equal: the
// measure of "nearest spelling" (exposed for tests).
size_t flag_distance(const std::string& a, const std::string& b);

// The table's rows, for docs and tests: name, what troupe does with it ("no-op", "alias",
// "refused", "equivalent") and the sentence shown.
struct CompatRow {
  std::string flag, disposition, text;
};
std::vector<CompatRow> compat_table();

}  // namespace troupe
