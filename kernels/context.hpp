// Where an op runs. Every op takes a Context first; the backend is chosen by ctx.device and every
// tensor argument must live on that device. The CPU backend parallelises over ctx.pool (the rank's
// own compute threads); the CUDA backend (built when TROUPE_WITH_CUDA) will carry its stream and
// cuBLAS handle here, so callers never change when a shard moves to a GPU.
#pragma once
#include "kernels/tensor.hpp"
#include "kernels/thread_pool.hpp"

namespace troupe {

struct Context {
  Device device = Device::cpu;
  ThreadPool* pool = nullptr;   // CPU backend: must be set
  void* stream = nullptr;       // CUDA backend: cudaStream_t
  void* blas_handle = nullptr;  // CUDA backend: cublasLtHandle_t
  void* blas_workspace = nullptr;  // CUDA backend: cuBLASLt's workspace on the device
  size_t blas_workspace_bytes = 0;
  int cuda_device = 0;          // CUDA backend: the GPU of stream and tensors
};

// Makes OpenBLAS single-threaded: troupe splits every GEMM over the rank's own pool instead, which
// is as fast (measured in bench/) and keeps two thread pools from spinning against each other.
void configure_blas_threads();

}  // namespace troupe
