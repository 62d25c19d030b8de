// The train-config JSON stored in every checkpoint (TrainConfig::from_json). Property: a config it
// accepts writes back (to_json) to a text that reads back to the same config.
#include "troupe/train_config.hpp"
#include "fuzz/fuzz_targets.hpp"

namespace troupe::fuzz {

Status train_config_json(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = TrainConfig::from_json(text);
  if (!config) return config.status();
  const std::string written = config->to_json();
  auto again = TrainConfig::from_json(written);
  TROUPE_CHECK(again.is_ok(), "a config from_json accepted does not read back after to_json");
  TROUPE_CHECK(again->to_json() == written,
               "to_json(from_json(to_json(c))) differs from to_json(c)");
  return Status::ok();
}

}  // namespace troupe::fuzz
