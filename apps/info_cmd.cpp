// troupe info: what this build and machine offer.
#include <cstdio>
#include <thread>

#include <caf/config.hpp>

#include "apps/commands.hpp"
#include "kernels/device_info.hpp"

namespace troupe::apps {

void add_info_command(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("info", "Build and machine information");
  cmd->callback([exit_code] {
    const DeviceInfo d = query_devices();
    std::printf("troupe %s\n", TROUPE_VERSION);
    std::printf("  CPU threads: %u\n", std::thread::hardware_concurrency());
    std::printf("  CAF: %d.%d.%d\n", CAF_VERSION / 10000, (CAF_VERSION / 100) % 100, CAF_VERSION % 100);
    std::printf("  CUDA backend: %s; %s\n", d.cuda_built ? "built" : "not built", d.cuda_detail.c_str());
    *exit_code = kExitOk;
  });
}

}  // namespace troupe::apps
