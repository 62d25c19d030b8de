// JSON that comes from outside (config files, checkpoint metadata, dataset records) parsed into
// nlohmann::json without an exception ever escaping, and numbers read from it with their ranges
// checked.
//
// Why: nlohmann::json throws on a syntax error and, even when told not to throw on syntax errors,
// on a number outside a double's range (`1e400`, out_of_range 406), which an uncaught exception
// turns into std::terminate. And get<int>() / get<int64_t>() narrow silently: 1e19 read as int64,
// 3000000000 read as int, -1 read as a size all come out as other numbers. The readers here make
// every such case a Status naming the key (as a path: "optimizer.params.lr", "betas[1]") and the
// range allowed.
//
// Limits: nesting deeper than JsonParseOptions::max_depth is refused before parsing (a deeply
// nested value would otherwise overflow the stack when printed or compared). Memory is
// proportional to the text. Thread-safe (no shared state).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "troupe/status.hpp"

namespace troupe {

struct JsonParseOptions {
  int max_depth = 64;  // objects and arrays nested deeper are refused
  bool reject_duplicate_keys =
      false;  // a key repeated in one object is an error (DeepSpeed's rule)
};

// Parses `text`. `what` starts every error message (e.g. "--deepspeed-config ds.json"; "" when the
// caller puts its own prefix before the message); the message
// then says what is wrong and where: the byte of a syntax error, the key path of a number out of a
// double's range, of a duplicated key, or of too deep a nesting. No fix is appended: the caller
// knows it (append " -- ..." to the message).
Result<nlohmann::json> parse_json(std::string_view text, const std::string& what,
                                  const JsonParseOptions& options = {});

// A value for an error message: its dump() cut to at most `max_chars` characters ("..." marks the
// cut). Never throws (invalid UTF-8 in strings is replaced).
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 60);

// Reads an integer in [min, max]. A non-integer (a string, 1.5, true) or one out of the range
// fails with "must be an integer in [min, max], got <value>" (the caller adds the key and file).
// Whole floats written with an exponent (5e8) count as integers only with `allow_exponent`.
Status json_to_integer(const nlohmann::json& value, int64_t min, int64_t max, int64_t* out,
                       bool allow_exponent = false);
// The same for a uint64_t field (e.g. a seed): [0, max].
Status json_to_unsigned(const nlohmann::json& value, uint64_t max, uint64_t* out);
// Reads a number in [min, max] (a double; JSON numbers are always finite once parsed).
Status json_to_number(const nlohmann::json& value, double min, double max, double* out);

// "[min, max]" for messages, with INT32/INT64 limits spelt as numbers.
std::string range_text(int64_t min, int64_t max);

}  // namespace troupe
