#include "storage/json_input.hpp"

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <vector>

namespace troupe {
namespace {

using nlohmann::json;

// The deepest nesting of objects and arrays in `text`, and the byte where it first exceeds
// `limit` (or npos). A lexical scan: brackets inside strings do not count.
size_t first_byte_deeper_than(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return i;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

// Follows the parser's events to know the key path of the value being read, so that a failure in
// the middle of the text (a number out of range, a duplicated key) can say where it is.
class PathTracker {
 public:
  explicit PathTracker(bool check_duplicates) : check_duplicates_(check_duplicates) {}

  bool on_event(json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        frames_.push_back({false, 0, {}, {}});
        break;
      case json::parse_event_t::array_start:
        frames_.push_back({true, 0, {}, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames_.empty()) frames_.pop_back();
        next_element();
        break;
      case json::parse_event_t::key:
        if (!frames_.empty() && parsed.is_string()) {
          Frame& f = frames_.back();
          f.key = parsed.get_ref<const std::string&>();
          if (check_duplicates_ && !f.keys.insert(f.key).second && duplicate_.empty())
            duplicate_ = path();
        }
        break;
      case json::parse_event_t::value:
        next_element();
        break;
    }
    return true;
  }

  // "a.b[2].c"; "" at the top level.
  std::string path() const {
    std::string out;
    for (const Frame& f : frames_) {
      if (f.array) {
        out += "[" + std::to_string(f.index) + "]";
      } else {
        if (!out.empty()) out += ".";
        out += f.key;
      }
    }
    return out;
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  struct Frame {
    bool array;
    int64_t index;               // arrays: the element being read
    std::string key;             // objects: the key being read
    std::set<std::string> keys;  // objects: keys seen (duplicate check)
  };
  void next_element() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }
  bool check_duplicates_;
  std::vector<Frame> frames_;
  std::string duplicate_;
};

// "[json.exception.parse_error.101] parse error at ..." -> "parse error at ...".
std::string without_prefix(const char* what) {
  std::string s = what;
  if (!s.empty() && s[0] == '[') {
    const size_t end = s.find("] ");
    if (end != std::string::npos) s.erase(0, end + 2);
  }
  return s;
}

// The offending text of "number overflow parsing '1e400'".
std::string quoted_token(const std::string& what) {
  const size_t open = what.find('\''), close = what.rfind('\'');
  if (open == std::string::npos || close <= open) return "";
  return what.substr(open + 1, close - open - 1);
}

// "what: ", or nothing when the caller names the input itself.
std::string lead(const std::string& what) {
  return what.empty() ? std::string() : what + ": ";
}

std::string key_text(const std::string& path) {
  return path.empty() ? std::string("the top-level value") : "key \"" + path + "\"";
}

}  // namespace

Result<json> parse_json(std::string_view text, const std::string& what,
                        const JsonParseOptions& options) {
  if (const size_t at = first_byte_deeper_than(text, options.max_depth);
      at != std::string_view::npos) {
    return Status::bad_input(lead(what) + "objects and arrays are nested deeper than " +
                             std::to_string(options.max_depth) + " levels (at byte " +
                             std::to_string(at) + ")");
  }
  // Fast path without a callback (JSONL inputs are large); the tracking parse runs only to explain
  // a failure, or when duplicate keys must be found.
  if (!options.reject_duplicate_keys) {
    json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) return parsed;
  }
  PathTracker tracker(options.reject_duplicate_keys);
  json::parser_callback_t callback = [&tracker](int, json::parse_event_t event, json& parsed) {
    return tracker.on_event(event, parsed);
  };
  try {
    json parsed = json::parse(text, callback);
    if (!tracker.duplicate().empty())
      return Status::bad_input(lead(what) + "key \"" + tracker.duplicate() +
                               "\" appears twice in one object");
    return parsed;
  } catch (const json::parse_error& e) {
    return Status::bad_input((what.empty() ? "not valid JSON" : what + " is not valid JSON") +
                             " (byte " + std::to_string(e.byte) + "): " + without_prefix(e.what()));
  } catch (const json::out_of_range& e) {
    const std::string token = quoted_token(e.what());
    return Status::bad_input(lead(what) + key_text(tracker.path()) + " holds the number " +
                             (token.empty() ? std::string("given") : token) +
                             ", outside the range of a double (magnitude up to 1.8e308)");
  } catch (const json::exception& e) {
    return Status::bad_input(lead(what) + "cannot be read as JSON: " + without_prefix(e.what()));
  }
}

std::string json_excerpt(const json& value, size_t max_chars) {
  std::string s = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > max_chars) {
    s.resize(max_chars > 3 ? max_chars - 3 : 0);
    s += "...";
  }
  return s;
}

std::string range_text(int64_t min, int64_t max) {
  return "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

Status json_to_integer(const json& value, int64_t min, int64_t max, int64_t* out,
                       bool allow_exponent) {
  const auto fail = [&] {
    return Status::bad_input("must be an integer in " + range_text(min, max) + ", got " +
                             json_excerpt(value));
  };
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    if (max < 0 || u > static_cast<uint64_t>(max)) return fail();
    const auto i = static_cast<int64_t>(u);
    if (i < min) return fail();
    *out = i;
    return Status::ok();
  }
  if (value.is_number_integer()) {
    const auto i = value.get<int64_t>();
    if (i < min || i > max) return fail();
    *out = i;
    return Status::ok();
  }
  if (allow_exponent && value.is_number_float()) {
    const double d = value.get<double>();
    // 2^63 itself does not fit an int64_t; the comparison is exact in double.
    if (!(std::floor(d) == d && d >= -9223372036854775808.0 && d < 9223372036854775808.0))
      return fail();
    const auto i = static_cast<int64_t>(d);
    if (i < min || i > max) return fail();
    *out = i;
    return Status::ok();
  }
  return fail();
}

Status json_to_unsigned(const json& value, uint64_t max, uint64_t* out) {
  if (value.is_number_unsigned() && value.get<uint64_t>() <= max) {
    *out = value.get<uint64_t>();
    return Status::ok();
  }
  // nlohmann stores non-negative integers as unsigned, so a signed one here is negative.
  return Status::bad_input("must be an integer in [0, " + std::to_string(max) + "], got " +
                           json_excerpt(value));
}

Status json_to_number(const json& value, double min, double max, double* out) {
  if (value.is_number()) {
    const double d = value.get<double>();
    if (d >= min && d <= max) {
      *out = d;
      return Status::ok();
    }
  }
  return Status::bad_input(
      fmt::format("must be a number in [{}, {}], got {}", min, max, json_excerpt(value)));
}

}  // namespace troupe
