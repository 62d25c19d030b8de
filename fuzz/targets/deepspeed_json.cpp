// A --deepspeed-config file merged into the defaults (merge_deepspeed_config), then validated as
// `troupe train` validates it (validate_train_config). The data-parallel size of DeepSpeed's batch
// rule is 1 to 4, taken from the input's length so that the corpus covers each.
#include "config/deepspeed_config.hpp"
#include "apps/cli/train_options.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"

namespace troupe::fuzz {

Status deepspeed_json(const uint8_t* data, size_t size) {
  const std::string path =
      write_scratch("ds_config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  TrainConfig config;
  config.train_iters = 100;  // required by validation; the file cannot set it
  FlagOrigins origins;
  bool set_global_batch = false;
  const int dp = 1 + static_cast<int>(size % 4);
  const FlagGivenFn none_given = [](const char*) { return false; };
  TROUPE_RETURN_IF_ERROR(
      merge_deepspeed_config(path, dp, none_given, &config, &origins, &set_global_batch));
  config.mock_data = true;  // validation then reads no dataset
  return validate_train_config(config);
}

}  // namespace troupe::fuzz
