#include "troupe/check.hpp"

#include <cstdio>
#include <cstdlib>

namespace troupe {
void check_failed(const char* condition, const char* file, int line, std::string_view hint) {
  std::fprintf(stderr, "troupe: internal check failed: %s\n  at %s:%d\n  HINT: %.*s\n", condition, file,
               line, static_cast<int>(hint.size()), hint.data());
  std::fflush(stderr);
  std::abort();
}
}  // namespace troupe
