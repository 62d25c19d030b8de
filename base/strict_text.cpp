// base/strict_text.hpp: the strict spelling of troupe's small machine-written texts.
#include "base/strict_text.hpp"

#include <algorithm>
#include <charconv>

namespace troupe {

bool parse_strict_count(std::string_view s, int64_t max, int64_t* out) {
  if (s.empty() || s.size() > 19 || s[0] < '0' || s[0] > '9' || (s.size() > 1 && s[0] == '0'))
    return false;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0 || v > max) return false;
  *out = v;
  return true;
}

std::vector<std::string_view> split_fields(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

bool is_lower_hex(std::string_view s, size_t min, size_t max) {
  return s.size() >= min && s.size() <= max && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool is_printable_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

}  // namespace troupe
