// troupe::parse_train_flags (include/troupe/flags.hpp): the flags of `troupe train`, parsed by the
// same CLI11 app the command registers.
#include "troupe/flags.hpp"

#include <CLI/CLI.hpp>

#include "apps/cli/megatron_compat.hpp"
#include "apps/cli/train_options.hpp"

namespace troupe {

Result<TrainConfig> parse_train_flags(const std::vector<std::string>& args, int world_size,
                                      std::vector<std::string>* notes) {
  auto screened = screen_train_args(args, world_size);
  if (!screened) return screened.status();
  if (notes != nullptr) *notes = screened.value().notes;
  TrainConfig cfg;
  CLI::App app{"troupe train"};
  add_train_options(&app, &cfg);
  const std::vector<std::string>& kept = screened.value().args;
  std::vector<std::string> reversed(kept.rbegin(), kept.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return Status::bad_input(app.help());
  } catch (const CLI::ParseError& e) {
    return Status::bad_input(std::string(e.what()) + " -- troupe train --help lists the accepted flags");
  }
  if (Status st = finalize_train_config(app, &cfg, world_size, notes); !st) return st.as_bad_input();
  return cfg;
}

}  // namespace troupe
