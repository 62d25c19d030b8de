// Page-locked host memory for the offload actor's pool (kernels/device_info.hpp).
#include <cuda_runtime.h>

#include <cstddef>

namespace troupe {

bool cuda_pin_host_memory(void* p, size_t bytes) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

void cuda_unpin_host_memory(void* p) {
  (void)cudaHostUnregister(p);
}

}  // namespace troupe
