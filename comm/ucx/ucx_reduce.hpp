// Private to the ucx backend: the elementwise reductions and bulk copies its collectives apply.
#pragma once
#include <cstddef>

#include "comm/communicator.hpp"

namespace troupe::comm::ucx {

// True for the dtypes collectives can reduce: f32, f64, bf16, f16, i32, i64 (sum and max).
bool reducible(DType dtype);

// out[i] = a[i] op b[i] for i < n, with a as the left operand (the order is part of the result for
// floats, so callers fix it). out may alias a or b exactly; no other overlap. Integer sums wrap.
// bf16/f16: computed in fp32 and rounded to the 16-bit type (nearest even): one rounding per call.
// Vectorised loops; thread-compatible (no shared state). The dtype must be reducible (checked).
void reduce(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op);

// out[i] = (((in[0][i] op in[1][i]) op in[2][i]) ... op in[k-1][i]) for i < n, k >= 1: the same bits
// as folding reduce() over the inputs left to right -- except bf16/f16, which fold all k inputs in
// fp32 and round once (not once per fold step). Works through an L1-sized tile, so each input
// is read once and out written once; out may alias any input exactly. nontemporal: out is written
// with streaming stores (for outputs far larger than the caches).
void reduce_many(void* out, const void* const* in, int k, size_t n, DType dtype, ReduceOp op,
                 bool nontemporal = false);

// memcpy, or with streaming stores that bypass the caches when `nontemporal` (faster for
// destinations much larger than the last-level cache, whose lines would only be evicted again).
// No overlap. Streaming stores are fenced before returning, so a release store that follows
// publishes the bytes.
void copy_bytes(void* dst, const void* src, size_t bytes, bool nontemporal);

}  // namespace troupe::comm::ucx
