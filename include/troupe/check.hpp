// Invariant checks. A failed TROUPE_CHECK is a bug (a broken invariant), not bad input: it prints the
// condition, file:line and a hint, then aborts. Bad input is reported through troupe::Status instead.
#pragma once
#include <string_view>

namespace troupe {
[[noreturn]] void check_failed(const char* condition, const char* file, int line, std::string_view hint);
}  // namespace troupe

#define TROUPE_CHECK(cond, hint)                                       \
  do {                                                                 \
    if (!(cond)) ::troupe::check_failed(#cond, __FILE__, __LINE__, hint); \
  } while (0)
