// The Split pre-tokenizer's regex of a Hugging Face tokenizer.json, run by PCRE2.
//
// Hugging Face's tokenizers compiles these patterns with Oniguruma (Ruby syntax). PCRE2 (UTF + UCP)
// reads the same patterns alike except for three constructs, which compile() rewrites:
//   - a class nested in a class, as in BLOOM's ` ?[^(\s|[.,!?…。，、।۔،])]+`: Oniguruma takes the
//   inner
//     class as a union with the outer one (PCRE2 would read `[` as a literal and fail on the `)`);
//     its brackets are dropped. A nested negated class or an intersection (&&) is refused.
//   - \s / \S: Oniguruma's (and Python regex's) \s is Unicode's White_Space, which counts U+0085;
//     PCRE2's \s does not. Rewritten as [\s\x{85}] / [^\s\x{85}] (inside a class: \s\x{85};
//     \S inside a class is refused).
//   - \h: a hexadecimal digit in Oniguruma, horizontal space in PCRE2: rewritten as [0-9a-fA-F].
// Bytes that are not valid UTF-8 never match (PCRE2_MATCH_INVALID_UTF): they fall into the gaps
// between matches. A match that exceeds the match limit (a pattern with catastrophic backtracking,
// from a hostile file) ends the search: the rest of the text is one gap.
//
// Thread safety: a compiled Regex is immutable; find() may be called from any number of threads.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

class Regex {
 public:
  // pattern: tokenizer.json's {"Regex": ...} (literal false) or {"String": ...} (literal true).
  // Fails with a message naming the construct or PCRE2's error and its offset.
  static Result<Regex> compile(const std::string& pattern, bool literal);

  // The [begin, end) byte spans of the non-empty, non-overlapping matches in text, left to right.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  // The Oniguruma -> PCRE2 rewrite described above (for tests), or the reason it is refused.
  static Result<std::string> translate(const std::string& oniguruma);

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

}  // namespace troupe
