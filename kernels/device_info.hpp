// What compute this binary can use: the CPU always; CUDA GPUs when built with the CUDA backend and a
// driver is present. Never fails: a missing driver is reported, not fatal.
#pragma once
#include <string>

namespace troupe {

struct DeviceInfo {
  bool cuda_built = false;   // compiled with TROUPE_WITH_CUDA
  int cuda_devices = 0;      // GPUs visible at run time (0 without a driver)
  std::string cuda_detail;   // versions or the reason no GPU is usable
};

DeviceInfo query_devices();

}  // namespace troupe
