// The prompts file of `troupe generate --prompts-file` (docs/SERVE.md): JSONL, one prompt per line, a
// JSON string or an object with a "prompt" string (other keys ignored); blank lines skipped.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

// The prompts of `text` (the file's bytes; `name` for messages). Bad input naming the lines that are
// not prompts (the first ten) and the fix.
Result<std::vector<std::string>> parse_prompts_jsonl(std::string_view text, const std::string& name);

// Reads and parses the file (at most 1 GiB: a larger file is refused, not read).
Result<std::vector<std::string>> read_prompts_file(const std::string& path);

}  // namespace troupe
