// The layout rank 0 sends the other ranks under --auto-layout over several hosts
// (config/layout_text.hpp). Property: a text it accepts writes back (layout_text) to one that reads
// back to the same layout.
#include "config/layout_text.hpp"
#include "fuzz/fuzz_targets.hpp"

namespace troupe::fuzz {

Status layout_text(const uint8_t* data, size_t size) {
  TrainConfig c;
  if (Status st = apply_layout_text(std::string(reinterpret_cast<const char*>(data), size), c); !st) return st;
  const std::string written = troupe::layout_text(c);
  TrainConfig again;
  TROUPE_CHECK(apply_layout_text(written, again).is_ok(), "a layout apply_layout_text accepted does not read back");
  TROUPE_CHECK(troupe::layout_text(again) == written, "layout_text(apply(layout_text(c))) differs from layout_text(c)");
  return Status::ok();
}

}  // namespace troupe::fuzz
