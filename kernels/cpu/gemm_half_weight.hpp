// The linear forward with a 16-bit weight on any CPU, row-major:
//   C (M,N) f32 = A (M,K) f32 @ B^T + beta C,   B (N,K) stored as bf16 or fp16 (ldb >= K).
//
// What the 16-bit layer does otherwise (widen the whole weight to an f32 temporary, then gemm()) moves
// six bytes per weight element through memory before the GEMM reads four more; with few rows (decoding:
// one to a few dozen tokens per step) that traffic, not the arithmetic, is the call's time, so fp16
// decoding ran 2.5-4x slower than f32. Here B is cut into blocks of rows chosen from the shape alone; a task
// widens its block (exact: half::convert_array) into scratch that stays in cache and multiplies it by all
// of A in one OpenBLAS call. Each weight element is read once, as two bytes, and widened once.
//
// Numerics: the widened B is exact, so C is an f32 GEMM of the same values; each block is the same
// OpenBLAS call whatever the pool, so the result is bitwise the same for every pool size. It is not
// bitwise gemm() (which cuts elsewhere; gemm.hpp says why that matters).
#pragma once
#include <cstdint>

#include "kernels/tensor.hpp"
#include "kernels/thread_pool.hpp"

namespace troupe::cpu {

// Rows of B per block for depth K and M rows of A: about 256 KiB of widened rows, or up to M / 2 rows
// within 1 MiB (many rows of A: each block's call packs all of A again); a multiple of 16, at least 16.
int64_t half_weight_block_rows(int64_t K, int64_t M);

// b_type is DType::bf16 or DType::f16; B points at its bit patterns. beta == 0 reads no C.
void gemm_f32_half_bt(ThreadPool& pool, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      DType b_type, const void* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace troupe::cpu
