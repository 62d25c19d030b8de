// The CUDA side of the caching allocator (host code on the CUDA runtime API, compiled as C++20 with
// troupe_kernels): cudaMalloc / cudaFree / CUDA events under the device-
// independent logic of kernels/caching_allocator.cpp, one allocator per GPU, and device tensors
// whose storage returns its block to that allocator (kernels/device_memory.hpp).
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/device_memory.hpp"

namespace troupe {

namespace {

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int device) : device_(device) {
    size_t free_bytes = 0;
    if (cudaSetDevice(device_) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total_) != cudaSuccess) total_ = 0;
    (void)cudaGetLastError();
  }
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    cudaSetDevice(device_);
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // out of memory is not sticky: clear it and let the caller retry
      return nullptr;
    }
    return p;
  }
  void release(void* p) override {
    cudaSetDevice(device_);
    (void)cudaFree(p);
  }
  uint64_t record_event(uint64_t stream) override {
    cudaSetDevice(device_);
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      // No event: wait for the stream instead, so the block is safe to reuse at once.
      (void)cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
      return 0;
    }
    (void)cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream));
    return reinterpret_cast<uint64_t>(e);
  }
  bool event_done(uint64_t event) override {
    if (event == 0) return true;
    const cudaError_t r = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
    if (r == cudaErrorNotReady) return false;
    (void)cudaGetLastError();
    return true;  // done, or failed (a failed stream's work is over either way)
  }
  void destroy_event(uint64_t event) override {
    if (event != 0) (void)cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event));
  }
  size_t capacity() const override { return total_; }

 private:
  int device_;
  size_t total_ = 0;
};

// One allocator per device, made on first use and kept for the process's lifetime (device tensors
// may outlive any owner we could name).
Result<CachingAllocator*> allocator_for(int device) {
  static std::mutex mutex;
  static std::vector<CachingAllocator*> allocators;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::error(cuda_error("no usable CUDA device", e));
  }
  if (device < 0 || device >= count)
    return Status::bad_input("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                             " visible)");
  std::lock_guard<std::mutex> lock(mutex);
  if (allocators.size() < static_cast<size_t>(count)) allocators.resize(static_cast<size_t>(count), nullptr);
  if (allocators[device] == nullptr)
    allocators[device] = new CachingAllocator(std::make_unique<CudaDeviceMemory>(device));
  return allocators[device];
}

}  // namespace

void make_device_current(int device) {
  if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();  // the next call on it reports why
}

Result<Tensor> device_empty(const Shape& shape, DType dtype, int device, uint64_t stream) {
  auto alloc = allocator_for(device);
  if (!alloc.is_ok()) return alloc.status();
  CachingAllocator* a = alloc.value();
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto p = a->allocate(bytes, stream);
  if (!p.is_ok()) return p.status();
  void* data = p.value();
  return Tensor::wrap(data, shape, dtype, std::shared_ptr<void>(data, [a](void* q) { a->free(q); }), Device::cuda);
}

Status copy_tensor(const Tensor& dst, const Tensor& src, uint64_t stream) {
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel())
    return Status::bad_input("copy_tensor: " + dst.shape().str() + " " + dtype_name(dst.dtype()) + " from " +
                             src.shape().str() + " " + dtype_name(src.dtype()));
  try {
    device_copy(dst, src, stream);
  } catch (const DeviceError& e) {
    return Status::error(std::string("copy_tensor: ") + e.what());
  }
  // device_copy waits only when host memory is on one side; this call waits for every copy.
  const cudaError_t e = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::error(cuda_error("copy_tensor", e));
  }
  return Status::ok();
}

void device_zero(const Tensor& t, uint64_t stream) {
  if (t.nbytes() == 0) return;
  const cudaError_t e = cudaMemsetAsync(t.raw(), 0, t.nbytes(), reinterpret_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw DeviceError(cuda_error("zeroing a device tensor", e));
  }
}

void device_copy(const Tensor& dst, const Tensor& src, uint64_t stream) {
  if (dst.nbytes() != src.nbytes())
    throw DeviceError("device_copy: " + std::to_string(dst.nbytes()) + " bytes from " + std::to_string(src.nbytes()));
  if (src.nbytes() == 0) return;
  auto s = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault, s);
  // Host memory on either side may be read, reused or freed as soon as we return.
  if (e == cudaSuccess && (dst.device() == Device::cpu || src.device() == Device::cpu)) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw DeviceError(cuda_error(dst.device() == Device::cpu   ? "copying a device tensor to the host"
                                 : src.device() == Device::cpu ? "copying a host tensor to the device"
                                                               : "copying a device tensor",
                                 e));
  }
}

Status record_stream(const Tensor& t, uint64_t stream) {
  if (t.device() != Device::cuda) return Status::bad_input("record_stream: not a device tensor");
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, t.raw()) != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::error("record_stream: not a CUDA pointer");
  }
  auto alloc = allocator_for(attr.device);
  if (!alloc.is_ok()) return alloc.status();
  alloc.value()->record_stream(t.storage_data(), stream);
  return Status::ok();
}

Result<CachingAllocatorStats> device_allocator_stats(int device) {
  auto alloc = allocator_for(device);
  if (!alloc.is_ok()) return alloc.status();
  return alloc.value()->stats();
}

Status device_empty_cache(int device) {
  auto alloc = allocator_for(device);
  if (!alloc.is_ok()) return alloc.status();
  alloc.value()->empty_cache();
  return Status::ok();
}

}  // namespace troupe
