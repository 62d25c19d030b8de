#include "storage/hf_regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace troupe {
namespace {

// Backtracking budget of one match: the patterns of real tokenizers need a few hundred steps per
// piece; a hostile pattern ((a+)+$ on a long run) stops here instead of running for hours.
constexpr uint32_t kMatchLimit = 1'000'000;
constexpr uint32_t kDepthLimit = 10'000;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

// Per thread: a match context with the limits and a JIT stack (the default 32 KiB one fails on
// long pieces of patterns with nested groups).
struct MatchScratch {
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
    TROUPE_CHECK(context != nullptr && stack != nullptr,
                 "PCRE2 could not allocate a match context");
    pcre2_set_match_limit(context, kMatchLimit);
    pcre2_set_depth_limit(context, kDepthLimit);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Result<std::string> Regex::translate(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  int depth = 0;  // 0: outside a class; 1: in a class; > 1: in classes nested in it
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return Status::bad_input("the pattern ends in a lone backslash");
      const char e = p[++i];
      if (depth == 0) {
        if (e == 's')
          out += "[\\s\\x{85}]";
        else if (e == 'S')
          out += "[^\\s\\x{85}]";
        else if (e == 'h')
          out += "[0-9a-fA-F]";
        else if (e == 'H')
          out += "[^0-9a-fA-F]";
        else
          out += {c, e};
      } else {
        if (e == 's')
          out += "\\s\\x{85}";
        else if (e == 'h')
          out += "0-9a-fA-F";
        else if (e == 'S' || e == 'H')
          return Status::bad_input(std::string("\\") + e + " inside a character class (offset " +
                                   std::to_string(i - 1) + ") is not supported");
        else
          out += {c, e};
      }
      continue;
    }
    if (depth == 0) {
      out += c;
      if (c == '[') {
        depth = 1;
        // A ']' (after an optional '^') right at the start is a literal member in both syntaxes.
        if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
        if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      }
      continue;
    }
    if (c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] and friends: the same in both
        const size_t close = p.find(":]", i + 2);
        if (close == std::string::npos)
          return Status::bad_input("an unterminated [: class :] in the pattern");
        out.append(p, i, close + 2 - i);
        i = close + 1;
        continue;
      }
      if (i + 1 < p.size() && p[i + 1] == '^')
        return Status::bad_input("a negated class nested in a class (offset " + std::to_string(i) +
                                 ") is not supported");
      ++depth;  // a nested class is a union with its parent: its brackets go
      continue;
    }
    if (c == ']') {
      if (--depth == 0) out += c;
      continue;
    }
    if (c == '&' && i + 1 < p.size() && p[i + 1] == '&')
      return Status::bad_input("a class intersection (&&, offset " + std::to_string(i) +
                               ") is not supported");
    out += c;
  }
  if (depth != 0) return Status::bad_input("a character class is not closed");
  return out;
}

Result<Regex> Regex::compile(const std::string& pattern, bool literal) {
  std::string source = pattern;
  if (!literal) {
    auto translated = translate(pattern);
    if (!translated) return translated.status();
    source = std::move(*translated);
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options =
      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0u);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr)
    return Status::bad_input("PCRE2 cannot compile it: " + pcre2_message(error) + " at offset " +
                             std::to_string(offset));
  // JIT is an optimisation: where it is unavailable the interpreter gives the same matches.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto owned = std::make_shared<Code>();
  owned->code = code;
  Regex r;
  r.code_ = std::move(owned);
  return r;
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  thread_local MatchScratch scratch;
  std::vector<std::pair<size_t, size_t>> spans;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  TROUPE_CHECK(md != nullptr, "PCRE2 could not allocate match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), pos, 0, md, scratch.context);
    if (rc < 0) break;  // no match, or a limit hit: the rest is a gap (see the header)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      spans.emplace_back(begin, end);
      pos = end;
    } else {
      // An empty match (a pattern such as a*): step over one character and search on.
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  pcre2_match_data_free(md);
  return spans;
}

}  // namespace troupe
