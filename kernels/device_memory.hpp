// Tensors in GPU memory, from one caching allocator per device (kernels/caching_allocator.hpp over
// cudaMalloc / cudaFree / CUDA events: kernels/cuda/device_allocator.cu). Without the CUDA backend,
// or without a usable GPU, every call returns an error saying which; nothing aborts.
//
// A device tensor's storage belongs to the stream it was allocated for (0: the default stream);
// work on another stream that reads or writes it calls record_stream first, so its memory is reused
// only after that work (the rank actors' one stream each, issue 15).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/caching_allocator.hpp"
#include "kernels/tensor.hpp"
#include "troupe/status.hpp"

namespace troupe {

// A device operation failed where there is no Status to return (Tensor's own methods, the ops): the
// message says what and what to change. Rank engines return it as their step's error.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The GPU and stream that Tensor::empty(..., Device::cuda), zero_, clone and copy_from use on this
// thread (stream 0: the device's default stream). A rank engine sets its own for each of its calls.
struct DevicePlacement {
  int device = 0;
  uint64_t stream = 0;  // a cudaStream_t
};
DevicePlacement current_placement();
class DeviceScope {
 public:
  explicit DeviceScope(DevicePlacement at);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  DevicePlacement saved_;
};
// cudaSetDevice(device) on this thread (DeviceScope calls it for placements on a stream); nothing
// without the CUDA backend.
void make_device_current(int device);

// Tensor's methods on device tensors (throw DeviceError): zeroes t on `stream` (no wait); copies src
// into dst (equal bytes; either may be on the host) on `stream`, waiting for it when either side is
// host memory.
void device_zero(const Tensor& t, uint64_t stream);
void device_copy(const Tensor& dst, const Tensor& src, uint64_t stream);

// An uninitialised tensor on GPU `device`.
Result<Tensor> device_empty(const Shape& shape, DType dtype, int device = 0, uint64_t stream = 0);
// Copies src into dst (same dtype and element count; host to device, device to host or device to
// device) on `stream` and waits for the copy.
Status copy_tensor(const Tensor& dst, const Tensor& src, uint64_t stream = 0);
// The storage of device tensor t is used by work on `stream` too.
Status record_stream(const Tensor& t, uint64_t stream);
// Device `device`'s allocator: its counters, and giving its wholly free segments back.
Result<CachingAllocatorStats> device_allocator_stats(int device = 0);
Status device_empty_cache(int device = 0);

}  // namespace troupe
