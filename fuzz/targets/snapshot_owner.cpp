// The owner file of an in-memory snapshot folder (storage/sharded_checkpoint.hpp), which the sweep of
// abandoned folders reads from a tmpfs anyone can write. Property: what it accepts is a pid in range
// and a start time, and writing them back the way write_snapshot_owner does reads back the same.
#include <string>

#include "fuzz/fuzz_targets.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe::fuzz {

Status snapshot_owner(const uint8_t* data, size_t size) {
  const auto owner = parse_snapshot_owner(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!owner) return Status::bad_input("not an owner file");
  TROUPE_CHECK(owner->pid >= 1 && owner->pid <= (1 << 22) && owner->start >= -1, "owner out of range");
  const std::string again = std::to_string(owner->pid) + " " + std::to_string(owner->start) + "\n";
  const auto back = parse_snapshot_owner(again);
  TROUPE_CHECK(back && back->pid == owner->pid && back->start == owner->start, "an owner does not read back");
  TROUPE_CHECK(again == std::string(reinterpret_cast<const char*>(data), size), "an owner file has one spelling");
  return Status::ok();
}

}  // namespace troupe::fuzz
