// Linear layers whose weights are packed once, for decoding: C (M,N) = A (M,K) W^T [+ bias], fp32,
// W (N,K) row-major as a Linear's weight.
//
// Why: a decoder's weights do not change between feeds, but OpenBLAS packs them again on every call
// (the whole model per decode step) and re-packs the activations once per tile of gemm() (gemm.hpp):
// at a 16-prompt prefill of GPT-2 that is ~15% of the GEMMs' time. Here the weights are packed once
// (PackedWeight: panels of 64 of W's rows, K contiguous, zero-padded), the activations are read in
// place (one element broadcast per row and k), and the pool's threads compute blocks of up to
// 96 x 256 of C, K in passes of 96 so a panel's slice stays in L1.
//
// Numerics. Every element of C is s (+ bias[n], one rounding), where s = fma(a_{K-1}, w_{K-1}, ...
// fma(a_1, w_1, fma(a_0, w_0, 0))): one fused multiply-add per k, in k order, each rounded to nearest
// even. That holds on both kernels, for every pool size, block cut and CPU, so the result is bitwise
// the same everywhere, and bitwise a plain loop of std::fma in k order (the tests' reference). It is
// not bitwise OpenBLAS's gemm() (which sums in blocks of its own); both are within the fp32 bound of
// K sequential roundings. IEEE denormals (the kernels never set FTZ/DAZ; the process's MXCSR applies).
//
// Kernels, one chosen per process (packed_gemm_kernel()): avx512 (AVX-512F: 6 x 64 blocks in 24 zmm
// accumulators), avx2 (AVX2 + FMA: 6 x 16 in 12 ymm), or none, where the CPU has neither or
// TROUPE_CPU_FEATURES=generic: then nothing is packed and callers keep OpenBLAS's path;
// TROUPE_CPU_FEATURES=avx2 caps the choice at avx2 (so an AVX-512 machine can run the AVX2 kernel).
//
// Memory: a PackedWeight holds ceil(N/64) 64 K floats (the weight again, plus its row padding); a
// call needs 96 KiB of accumulators per pool thread, kept between calls. Not re-entrant on one pool
// (ThreadPool runs one loop at a time).
#pragma once
#include <cstdint>
#include <memory>

#include "kernels/thread_pool.hpp"

namespace troupe::cpu {

enum class PackedKernel { none, avx2, avx512 };

// Whether this CPU (and its OS: the AVX registers saved) runs `kernel`; none is always supported.
bool packed_kernel_supported(PackedKernel kernel);
// The kernel for a process whose TROUPE_CPU_FEATURES is `cpu_features` (nullptr: unset): "generic"
// gives none, "avx2" at most avx2; else the best supported.
PackedKernel choose_packed_kernel(const char* cpu_features);
// choose_packed_kernel(getenv("TROUPE_CPU_FEATURES")), decided at the first call.
PackedKernel packed_gemm_kernel();
const char* packed_kernel_name(PackedKernel kernel);

// A weight W (N, K) packed for the kernels: panel p holds rows 64p .. 64p+63 as (K, 64), zero past N.
// Independent of the kernel: both read the same layout. Immutable once packed; copies share it.
class PackedWeight {
 public:
  PackedWeight() = default;
  // W (N, K) row-major, ldw >= K. Packed on the pool's threads.
  static PackedWeight pack(ThreadPool& pool, const float* w, int64_t N, int64_t K, int64_t ldw);

  bool empty() const { return data_ == nullptr; }
  int64_t rows() const { return n_; }   // N
  int64_t depth() const { return k_; }  // K
  const float* data() const { return data_.get(); }
  size_t bytes() const;

 private:
  std::shared_ptr<float[]> data_;  // (ceil(N/64), K, 64), 64-byte aligned
  int64_t n_ = 0, k_ = 0;
};

// C (M, N) = A (M, K) W^T (+ bias (N), when not null), ldc >= N, lda >= K; `kernel` not none and
// supported. M == 0 does nothing; K == 0 gives C = bias (or 0).
void linear_packed(PackedKernel kernel, ThreadPool& pool, int64_t M, const float* A, int64_t lda,
                   const PackedWeight& w, const float* bias, float* C, int64_t ldc);
// The same on packed_gemm_kernel() (which must not be none).
void linear_packed(ThreadPool& pool, int64_t M, const float* A, int64_t lda, const PackedWeight& w,
                   const float* bias, float* C, int64_t ldc);

}  // namespace troupe::cpu
