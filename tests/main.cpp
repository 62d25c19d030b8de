// Catch2's main for every test executable, after filling in the environment the tests read
// (TROUPE_BIN, TROUPE_SOURCE_DIR, TROUPE_<WORKER>_BIN) from the build's defaults.
#define CATCH_CONFIG_RUNNER
#include <cstdlib>

#include <catch2/catch.hpp>

#include "test_env_defaults.hpp"

int main(int argc, char** argv) {
  for (const auto& kv : kTroupeTestEnv) setenv(kv[0], kv[1], /*overwrite=*/0);
  return Catch::Session().run(argc, argv);
}
