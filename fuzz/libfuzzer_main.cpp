// libFuzzer's entry point for one target (TROUPE_FUZZ_ENTRY, set by troupe_add_fuzzer).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)TROUPE_FUZZ_ENTRY(data, size);
  return 0;
}
