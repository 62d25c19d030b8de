#include "kernels/device_info.hpp"

namespace troupe {

#ifdef TROUPE_WITH_CUDA
DeviceInfo cuda_query_devices();  // kernels/cuda/device_query.cu
DeviceInfo query_devices() { return cuda_query_devices(); }
#else
DeviceInfo query_devices() {
  DeviceInfo info;
  info.cuda_detail = "built without CUDA (TROUPE_CUDA=off or toolkit not found)";
  return info;
}
#endif

}  // namespace troupe
