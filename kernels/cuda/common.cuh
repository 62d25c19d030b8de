// Shared pieces of the CUDA op files: error checks, the stream, element access in f32 registers
// whatever the storage type, and the dtype dispatch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/context.hpp"
#include "kernels/device_memory.hpp"
#include "kernels/dropout.hpp"
#include "troupe/check.hpp"

namespace troupe::cuda {

// A failed CUDA call throws DeviceError (the rank engine returns it as the step's error).
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw DeviceError(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

// An op's scratch tensor on its stream; out of device memory throws DeviceError with the
// allocator's message (what was asked, what is held, which flags lower it).
inline Tensor scratch(const Context& ctx, const Shape& shape, DType dtype, const char* what) {
  auto t = device_empty(shape, dtype, ctx.cuda_device, reinterpret_cast<uint64_t>(ctx.stream));
  if (!t.is_ok()) throw DeviceError(std::string(what) + ": " + t.status().message());
  return t.value();
}
// After a launch: a bad configuration shows here; a fault in the kernel shows at the next sync.
#define TROUPE_CUDA_LAUNCHED(what) ::troupe::cuda::check_cuda(cudaGetLastError(), what)

inline cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

inline void check_device(const Context& ctx, std::initializer_list<const Tensor*> ts, const char* op) {
  TROUPE_CHECK(ctx.device == Device::cuda, op);
  for (const Tensor* t : ts) TROUPE_CHECK(!t->defined() || t->device() == Device::cuda, op);
}

// Loads and stores in f32 (16-bit storage widened exactly, rounded to nearest even once).
__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float ld(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

// Calls fn(T{}) with T the storage type of dtype: float, __nv_bfloat16 or __half.
template <class Fn>
void with_type(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: fn(float{}); return;
    case DType::bf16: fn(__nv_bfloat16{}); return;
    case DType::f16: fn(__half{}); return;
    default: break;
  }
  const std::string m = std::string(op) + ": the CUDA backend computes f32, bf16 or f16 tensors";
  TROUPE_CHECK(false, m.c_str());
}

template <class T> T* dptr(const Tensor& t) { return t.defined() ? static_cast<T*>(t.raw()) : nullptr; }

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int per_block = kThreads) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

// Sum over a block of blockDim.x threads (a multiple of 32, <= 1024) in a fixed order; every thread
// gets the total. `shared` holds 32 values.
template <class A>
__device__ A block_sum(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  A total = 0;
  const int warps = (blockDim.x + 31) >> 5;
  for (int w = 0; w < warps; ++w) total += shared[w];
  return total;
}

template <class T> constexpr DType storage_dtype();
template <> constexpr DType storage_dtype<float>() { return DType::f32; }
template <> constexpr DType storage_dtype<__nv_bfloat16>() { return DType::bf16; }
template <> constexpr DType storage_dtype<__half>() { return DType::f16; }

// Calls fn(T{}) or fn(float{}) as t is stored in T or in f32 (an undefined t: f32, and dptr gives
// null). For T = float both are the same instantiation, so a kernel has 1 + 2 * 2^k versions for k
// such arguments rather than 3^(k+1).
template <class T, class Fn>
void with_same_or_f32(const Tensor& t, const char* op, Fn&& fn) {
  if (!t.defined() || t.dtype() == DType::f32) return fn(float{});
  TROUPE_CHECK(t.dtype() == storage_dtype<T>(), op);
  fn(T{});
}

__device__ __forceinline__ float max_of(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_of(double a, double b) { return fmax(a, b); }

// The maximum over a block of blockDim.x threads (a multiple of 32); every thread gets it. As
// block_sum, `shared` holds 32 values. A maximum does not depend on the order.
template <class A>
__device__ A block_max(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v = max_of(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  A m = -INFINITY;
  const int warps = (blockDim.x + 31) >> 5;
  for (int w = 0; w < warps; ++w) m = max_of(m, shared[w]);
  return m;
}

// Threads per row of the cross-entropy kernels, fused (softmax_xent.cu) and in pieces
// (xent_parallel.cu): the same in both, so that with one shard the pieces' strided sums equal the
// fused kernel's bitwise (kernels/ops.hpp).
constexpr int kXentRowThreads = 256;

// kernels/dropout.hpp's rule on the device: Philox-4x32-10 of (element / 4, sample, iteration,
// stream) keyed by the seed; element e is kept when word e % 4 >> 8 >= threshold (ceil(p 2^24)).
struct DeviceDropout {
  bool active = false;
  uint32_t threshold = 0, seed0 = 0, seed1 = 0, stream = 0, iteration = 0;
  float keep_scale = 1;  // 1 / (1 - p)
  int64_t first_sample = 0;
};

inline DeviceDropout device_dropout(const DropoutMask& m) {
  DeviceDropout d;
  d.active = m.active();
  d.threshold = m.threshold();
  d.seed0 = static_cast<uint32_t>(m.seed);
  d.seed1 = static_cast<uint32_t>(m.seed >> 32);
  d.stream = m.stream;
  d.iteration = m.iteration;
  d.keep_scale = m.active() ? static_cast<float>(1.0 / (1.0 - m.p)) : 1.0f;
  d.first_sample = m.first_sample;
  return d;
}

__device__ __forceinline__ void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// The factor (0 or keep_scale; 1 without dropout) of element e of sample `local_sample` of the
// micro-batch (global sample first_sample + local_sample).
__device__ __forceinline__ float dropout_factor(const DeviceDropout& d, int64_t local_sample, int64_t e) {
  if (!d.active) return 1.0f;
  uint32_t c[4] = {uint32_t(e / 4), uint32_t(d.first_sample + local_sample), d.iteration, d.stream};
  philox4x32_10(c, d.seed0, d.seed1);
  return (c[e % 4] >> 8) >= d.threshold ? d.keep_scale : 0.0f;
}

}  // namespace troupe::cuda
