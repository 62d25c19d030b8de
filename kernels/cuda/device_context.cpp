// cuda::DeviceContext (kernels/cuda/cuda_ops.hpp): a rank's stream, cuBLASLt handle and workspace.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_ops.hpp"

namespace troupe::cuda {

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's recommendation for Hopper
}

Result<std::unique_ptr<DeviceContext>> DeviceContext::create(int device) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::error(std::string("no usable CUDA device: ") + cudaGetErrorString(e));
  }
  if (device < 0 || device >= count)
    return Status::bad_input("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                             " visible)");
  std::unique_ptr<DeviceContext> dc(new DeviceContext);
  Context& c = dc->ctx_;
  c.device = Device::cuda;
  c.cuda_device = device;
  auto fail = [](const char* what, const char* why) { return Status::error(std::string(what) + ": " + why); };
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return fail("cudaSetDevice", cudaGetErrorString(e));
  cudaStream_t s = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
    return fail("cudaStreamCreate", cudaGetErrorString(e));
  c.stream = s;
  cublasLtHandle_t h = nullptr;
  if (cublasStatus_t e = cublasLtCreate(&h); e != CUBLAS_STATUS_SUCCESS)
    return fail("cublasLtCreate", cublasGetStatusString(e));
  c.blas_handle = h;
  void* ws = nullptr;
  if (cudaError_t e = cudaMalloc(&ws, kWorkspaceBytes); e != cudaSuccess)
    return fail("the cuBLASLt workspace", cudaGetErrorString(e));
  c.blas_workspace = ws;
  c.blas_workspace_bytes = kWorkspaceBytes;
  return dc;
}

DeviceContext::~DeviceContext() {
  (void)cudaSetDevice(ctx_.cuda_device);
  if (ctx_.stream != nullptr) (void)cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream));
  if (ctx_.blas_workspace != nullptr) (void)cudaFree(ctx_.blas_workspace);
  if (ctx_.blas_handle != nullptr) (void)cublasLtDestroy(static_cast<cublasLtHandle_t>(ctx_.blas_handle));
  if (ctx_.stream != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(ctx_.stream));
}

Status DeviceContext::synchronize() {
  if (cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream)); e != cudaSuccess)
    return Status::error(std::string("a CUDA kernel failed: ") + cudaGetErrorString(e));
  return Status::ok();
}

}  // namespace troupe::cuda
