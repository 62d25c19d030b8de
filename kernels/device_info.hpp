// What compute this binary can use: the CPU always; CUDA GPUs when built with the CUDA backend and a
// driver is present. Never fails: a missing driver is reported, not fatal.
#pragma once
#include <cstddef>
#include <string>

namespace troupe {

struct DeviceInfo {
  bool cuda_built = false;   // compiled with TROUPE_WITH_CUDA
  int cuda_devices = 0;      // GPUs visible at run time (0 without a driver)
  std::string cuda_detail;   // versions or the reason no GPU is usable
};

DeviceInfo query_devices();

// Page-locks [p, p + bytes) for fast and asynchronous device copies (cudaHostRegister) when this
// binary has the CUDA backend and a GPU is visible; returns whether it did. Without a GPU the memory
// stays pageable and nothing else changes. unpin_host_memory undoes a successful pin.
bool pin_host_memory(void* p, size_t bytes);
void unpin_host_memory(void* p);

}  // namespace troupe
