// A control command rank 0's inspector hands the other processes ("control SEQ VERB ARGS...":
// parse_control, inspect/control_command.hpp). Property: an accepted command's text parses again
// to the same command.
#include <sstream>

#include "inspect/control_command.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "troupe/check.hpp"

namespace troupe::fuzz {

Status inspect_control(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  if (words.empty()) return Status::bad_input("no command");
  auto c = parse_control(words[0], {words.begin() + 1, words.end()}, size % 2 == 0);
  if (!c) return c.status();
  std::istringstream again_in(c->text());
  std::vector<std::string> again_words;
  for (std::string w; again_in >> w;) again_words.push_back(w);
  auto again = parse_control(again_words.at(0), {again_words.begin() + 1, again_words.end()}, size % 2 == 0);
  TROUPE_CHECK(again.is_ok() && again->text() == c->text(), "an accepted command does not parse back to itself");
  return Status::ok();
}

}  // namespace troupe::fuzz
