// CUDA backend entry point: reports the toolkit, cuBLAS and NCCL versions and the visible GPUs.
// The CUDA op implementations join this folder in a later issue.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "kernels/device_info.hpp"

namespace troupe {

DeviceInfo cuda_query_devices() {
  DeviceInfo info;
  info.cuda_built = true;
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  int nccl = 0;
  ncclGetVersion(&nccl);
  std::string versions = "CUDA runtime " + std::to_string(runtime / 1000) + "." +
                         std::to_string((runtime % 1000) / 10) + ", NCCL " + std::to_string(nccl);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.cuda_detail = versions + "; no usable GPU: " + cudaGetErrorString(err);
    return info;
  }
  info.cuda_devices = count;
  std::string names;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) names += std::string(d ? ", " : "") + prop.name;
  }
  info.cuda_detail = versions + "; " + std::to_string(count) + " GPU(s): " + names;
  return info;
}

}  // namespace troupe
