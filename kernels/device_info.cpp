#include "kernels/device_info.hpp"

namespace troupe {

#ifdef TROUPE_WITH_CUDA
DeviceInfo cuda_query_devices();  // kernels/cuda/device_query.cu
bool cuda_pin_host_memory(void* p, size_t bytes);  // kernels/cuda/host_memory.cu
void cuda_unpin_host_memory(void* p);
DeviceInfo query_devices() { return cuda_query_devices(); }
bool pin_host_memory(void* p, size_t bytes) { return cuda_pin_host_memory(p, bytes); }
void unpin_host_memory(void* p) { cuda_unpin_host_memory(p); }
#else
bool pin_host_memory(void*, size_t) { return false; }
void unpin_host_memory(void*) {}
DeviceInfo query_devices() {
  DeviceInfo info;
  info.cuda_detail = "built without CUDA (TROUPE_CUDA=off or toolkit not found)";
  return info;
}
#endif

}  // namespace troupe
