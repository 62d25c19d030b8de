// GEMM on bf16 operands with fp32 accumulation, row-major as gemm() (gemm.hpp):
//   C (M,N) = alpha op(A) op(B) + beta C,  op(A) (M,K), op(B) (K,N), A, B bf16 (uint16_t bit patterns).
// Mixed precision keeps weights and activations in bf16; this multiplies them without widening the
// operands to fp32 first. The transposes linear uses: forward x W^T (false, true), dx = dout W
// (false, false), dW += dout^T x (true, false); all four combinations are supported.
//
// Two kernels, one chosen per process (bf16_gemm_kernel()):
// - avx512_bf16: op(A) and op(B) are packed once into panels of K pairs (each 32-bit word holds
//   elements 2p and 2p+1 of one row of op(A) or one column of op(B); an odd K's last pair is padded
//   with a zero), then 6 x 64 blocks of C are computed by VDPBF16PS in registers, K cut into
//   cache-sized chunks, the blocks split over the pool in tasks cut from (M, N, K) alone.
// - widen_sgemm: op(A) and op(B) widened to fp32 (exact), then gemm<float>(), on CPUs without
//   AVX512-BF16 or where TROUPE_CPU_FEATURES=generic.
//
// Numerics. Every element of C is alpha * s + beta * c (one fused multiply-add of beta * c onto the
// rounded alpha * s; beta == 0 reads no C, as BLAS), where s sums the K products in order:
// - avx512_bf16, per Intel's description of VDPBF16PS: a bf16 x bf16 product is exact in fp32, and
//   each pair is two fp32 accumulations, element 2p+1's product first, then element 2p's, each
//   rounded to nearest even whatever MXCSR says. Denormal inputs are read as zero and denormal
//   results flushed to zero; no exception flags are raised. So s is the fp32 sum of the products in
//   the order k = 1, 0, 3, 2, 5, 4, ..., whatever the thread count or tiling: the result is bitwise the
//   same for every pool size and every cut (tests/kernels/test_gemm_bf16.cpp).
// - widen_sgemm: OpenBLAS's order and its own treatment of alpha and beta (gemm.hpp), IEEE denormals.
// Both satisfy, for C's element (i, j) against the exact result on the same bf16 inputs,
//   |error| <= (K + 2) 2^-24 (|alpha| sum_k |a_ik| |b_kj| + |beta| |c_ij|)   (+ what flushing drops),
// the fp32 bound for K sequential roundings plus those of alpha and beta. The two kernels agree
// within twice that, not bitwise.
//
// The bf16-output variant computes the same fp32 value, with beta applied to C's bf16 values
// widened, and rounds it to bf16 to nearest even (VCVTNEPS2BF16 on the fast kernel: NaN stays NaN,
// denormals flush; the generic one rounds in software and keeps denormals).
//
// Scratch: the packed operands, about 2 (M + 6) (K + 1) + 2 (K + 1) (N + 64) bytes, held by the calling
// thread between calls; and 96 KiB of accumulators per pool thread. Not re-entrant on one pool
// (ThreadPool runs one loop at a time).
#pragma once
#include <cstdint>

#include "kernels/thread_pool.hpp"

namespace troupe::cpu {

enum class Bf16Kernel { widen_sgemm, avx512_bf16 };

// Whether this CPU (and its OS, which must save the AVX-512 registers) runs the kernel.
bool bf16_kernel_supported(Bf16Kernel kernel);

// The kernel for a process whose TROUPE_CPU_FEATURES is `cpu_features` (nullptr: unset): "generic"
// forces widen_sgemm; otherwise avx512_bf16 where supported.
Bf16Kernel choose_bf16_kernel(const char* cpu_features);

// choose_bf16_kernel(getenv("TROUPE_CPU_FEATURES")), decided at the first call.
Bf16Kernel bf16_gemm_kernel();
const char* bf16_kernel_name(Bf16Kernel kernel);

// C (M,N) fp32, ldc >= N. lda >= K (trans_a: lda >= M), ldb >= N (trans_b: ldb >= K), as BLAS.
void gemm_bf16(ThreadPool& pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
               float beta, float* C, int64_t ldc);

// The same product with C (M,N) in bf16, read (beta != 0) and written rounded to nearest even.
void gemm_bf16_out(ThreadPool& pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                   float beta, uint16_t* C, int64_t ldc);

// The same on a named kernel (tests and bench/bf16_gemm compare them); the kernel must be supported.
void gemm_bf16(Bf16Kernel kernel, ThreadPool& pool, bool trans_a, bool trans_b, int64_t M, int64_t N,
               int64_t K, float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
               int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bf16_out(Bf16Kernel kernel, ThreadPool& pool, bool trans_a, bool trans_b, int64_t M,
                   int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float beta, uint16_t* C, int64_t ldc);

// bf16 <-> fp32 as the generic kernel converts: widening is exact; narrowing rounds to nearest
// even, a NaN stays a (quiet) NaN.
inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace troupe::cpu
