// Megatron-LM's and Megatron-DeepSpeed's command lines as they come: before CLI11 parses the
// flags of `troupe train`, every flag troupe does not register is looked up in the table of theirs
// (apps/cli/megatron_table.hpp, which says what each row means; docs/COMPAT.md prints it):
//   - a no-op: removed, with one line at start-up saying why it changes nothing;
//   - an alias: rewritten to what troupe does, with a line at start-up;
//   - refused or equivalent: a problem naming the feature and what to do; the flags of one row are
//     reported in one problem;
//   - otherwise unknown: a problem with the nearest spelling among troupe's flags and the table's,
//     never a flag's opposite (--no-x for --x).
// Rows with constrained values (--data-impl mmap, --context-parallel-size 1, ...) are no-ops for the
// values that change nothing and refused for the others.
//
// All problems are reported at once: the screen's own, the first value CLI11 cannot convert, and
// every validation problem of what remains (so one run shows everything to fix). Nothing is
// written. Thread-safe (no shared state but the immutable table).
#pragma once
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

struct ScreenedTrainArgs {
  std::vector<std::string> args;   // what CLI11 parses: no-ops removed, aliases rewritten
  std::vector<std::string> notes;  // one line per no-op or alias, for the start-up lines
};

// Whose flags are screened: `troupe train`'s, or `troupe plan`'s model and batch flags (the same
// table; a problem names plan, and the rest of the check waives what a plan does not read: data,
// checkpoints, the run's length).
enum class ScreenFor { train, plan };

// args: the flags of `troupe train` in command-line order (no program or subcommand name).
// world_size: the ranks the job will have (1 in one process), for validation's problems.
// Fails (bad input) with every problem, one per line.
Result<ScreenedTrainArgs> screen_train_args(const std::vector<std::string>& args, int world_size,
                                            ScreenFor screen_for = ScreenFor::train);

// Optimal string alignment distance between two flag names, '-' and '_' counted as equal: the
// measure of "nearest spelling" (exposed for tests).
size_t flag_distance(const std::string& a, const std::string& b);

// The table's flags, one row each, for tests: name, what troupe does with it ("no-op", "alias",
// "refused", "equivalent") and the sentence shown.
struct CompatRow {
  std::string flag, disposition, text;
};
std::vector<CompatRow> compat_table();

// The table as docs/COMPAT.md prints it: one markdown table per section (tests compare the two).
std::string compat_table_markdown();

}  // namespace troupe
