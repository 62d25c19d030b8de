// The inspect file `troupe inspect` reads (config/inspect_file.hpp). Property: a file it accepts,
// written back, reads back to the same target.
#include "config/inspect_file.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "troupe/check.hpp"

namespace troupe::fuzz {

Status inspect_file(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto target = parse_inspect_file(text);
  if (!target) return target.status();
  const InspectTarget& t = target.value();
  auto again = parse_inspect_file(inspect_file_text(t.host, t.port, t.token, t.pid, t.dashboard));
  TROUPE_CHECK(again.is_ok(), "an inspect file parse_inspect_file accepted does not read back after writing");
  TROUPE_CHECK(again->host == t.host && again->port == t.port && again->token == t.token && again->pid == t.pid &&
                   again->dashboard == t.dashboard,
               "an inspect file does not read back to the same target");
  return Status::ok();
}

}  // namespace troupe::fuzz
