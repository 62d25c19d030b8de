// kernels/device_memory.hpp: the thread's current placement, and, in a build without the CUDA
// backend, every device call saying so (the CUDA ops themselves are only reached through a
// DeviceContext's Context). The CUDA build compiles kernels/cuda/device_allocator.cpp instead.
#include "kernels/device_memory.hpp"

namespace troupe {
namespace {
thread_local DevicePlacement current;
}  // namespace
DevicePlacement current_placement() { return current; }
// A placement on a stream makes its GPU the thread's current CUDA device too (kernels launch on the
// current device, and a stream belongs to one); the host-only placement {0, 0} touches no CUDA
// state, so CPU ranks never initialise the CUDA runtime.
DeviceScope::DeviceScope(DevicePlacement at) : saved_(current) {
  current = at;
  if (at.stream != 0) make_device_current(at.device);
}
DeviceScope::~DeviceScope() {
  current = saved_;
  if (saved_.stream != 0) make_device_current(saved_.device);
}
}  // namespace troupe

#ifndef TROUPE_WITH_CUDA
#include "kernels/cuda/cuda_ops.hpp"

namespace troupe {

namespace {
Status no_cuda() {
  return Status::error("this troupe was built without the CUDA backend (TROUPE_CUDA=off, or nvcc / cuBLAS / NCCL "
                       "not found under /usr/local/cuda): rebuild with scripts/build.sh -DTROUPE_CUDA=on");
}
}  // namespace

Result<Tensor> device_empty(const Shape&, DType, int, uint64_t) { return no_cuda(); }
Status copy_tensor(const Tensor&, const Tensor&, uint64_t) { return no_cuda(); }
Status record_stream(const Tensor&, uint64_t) { return no_cuda(); }
Result<CachingAllocatorStats> device_allocator_stats(int) { return no_cuda(); }
Status device_empty_cache(int) { return no_cuda(); }
void make_device_current(int) {}
void device_zero(const Tensor&, uint64_t) { throw DeviceError(no_cuda().message()); }
void device_copy(const Tensor&, const Tensor&, uint64_t) { throw DeviceError(no_cuda().message()); }

namespace cuda {
Result<std::unique_ptr<DeviceContext>> DeviceContext::create(int) { return no_cuda(); }
DeviceContext::~DeviceContext() = default;
Status DeviceContext::synchronize() { return no_cuda(); }
}  // namespace cuda

}  // namespace troupe
#endif
