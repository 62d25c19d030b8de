// The one spelling of a count in troupe's small machine-written texts (a snapshot's report, a
// shard's coverage): decimal digits only, no sign, no leading zero, at most 19 digits. Their
// parsers are fuzzed; a number spelt otherwise is refused, so each value has one text.
#pragma once
#include <charconv>
#include <cstdint>
#include <string_view>

namespace troupe {

// `s` as a count in [0, max] into *out; false (and *out untouched) when it is spelt otherwise or
// is larger.
inline bool parse_strict_count(std::string_view s, int64_t max, int64_t* out) {
  if (s.empty() || s.size() > 19 || s[0] < '0' || s[0] > '9' || (s.size() > 1 && s[0] == '0')) return false;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0 || v > max) return false;
  *out = v;
  return true;
}

}  // namespace troupe
