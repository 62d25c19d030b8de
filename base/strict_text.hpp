// The one spelling of troupe's small machine-written texts (a snapshot's report, a shard's
// coverage, the rendezvous hint, the elastic rendezvous's lines): fields one separator apart,
// counts in decimal digits only (no sign, no leading zero, at most 19 digits), ids in lowercase
// hex. Their parsers are fuzzed; a value spelt otherwise is refused, so each value has one text.
// Pure functions, thread-safe.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace troupe {

// `s` as a count in [0, max] into *out; false (and *out untouched) when it is spelt otherwise or
// is larger.
bool parse_strict_count(std::string_view s, int64_t max, int64_t* out);

// Every field of `s` between separators, empty ones included ("a  b" has three; "" has one).
std::vector<std::string_view> split_fields(std::string_view s, char sep);

// min..max lowercase hex digits.
bool is_lower_hex(std::string_view s, size_t min, size_t max);

// Only printable ASCII (0x20 .. 0x7e).
bool is_printable_ascii(std::string_view s);

}  // namespace troupe
