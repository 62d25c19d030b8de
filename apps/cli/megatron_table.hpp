// Megatron-LM's and Megatron-DeepSpeed's flags that `troupe train` does not register, each with
// what troupe does with it (apps/cli/megatron_compat.hpp screens a command line against these rows;
// docs/COMPAT.md prints them). Every flag of both projects' arguments.py is either registered or in
// one row here (tests/apps/test_megatron_flag_lists.cpp walks the two lists); the implemented
// mixture-of-experts flags are both.
//
// A row's flags are written as argparse reads them: "--name" (a switch), "--name V" (one value),
// "--name V..." (a list: every value up to the next flag), "--name [V]" (a value if one follows: the
// two projects disagree). Flags compare with '-' and '_' alike.
//
// What a row says (CompatKind):
//   implemented troupe train registers the flag and reads it (the mixture-of-experts flags,
//               apps/cli/moe_flags.hpp): the row only documents it; the screen never sees it.
//   noop        accepted; it changes nothing in troupe, one start-up note says why. With `ok`, only
//               for those values (each value of a list): "a|b" these strings, "0" / "1" / "-1" a
//               number equal to it; other values are refused with `otherwise`.
//   alias       read as `alias` (placed before the other flags, so that a flag given explicitly wins),
//               "{}" standing for the flag's value; a note says so.
//   refused     troupe does not have its meaning: a problem naming the feature and why.
//   equivalent  troupe has it under another name or command: a problem saying what to give.
// When the decision depends on other flags (CompatWhen):
//   fresh_start  no effect when --load holds no checkpoint (the run starts from scratch), else
//                refused with `otherwise`.
//   no_value     no effect when given without a value (a script's unset variable), else refused
//                with `otherwise`.
// Immutable after first use; thread-safe.
#pragma once
#include <vector>

namespace troupe {

enum class CompatKind { implemented, noop, alias, refused, equivalent };
enum class CompatWhen { always, fresh_start, no_value };

struct CompatRule {
  std::vector<const char*> flags;
  CompatKind kind = CompatKind::noop;
  const char* text = "";
  const char* ok = "";
  const char* otherwise = "";
  std::vector<const char*> alias = {};
  CompatWhen when = CompatWhen::always;
};

// Rows grouped by what they are about (the headings of docs/COMPAT.md's table).
struct CompatSection {
  const char* name;
  std::vector<CompatRule> rules;
};

const std::vector<CompatSection>& compat_sections();

}  // namespace troupe
