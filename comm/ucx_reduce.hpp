// Private to the ucx backend: the elementwise reductions its collectives apply.
#pragma once
#include <cstddef>

#include "comm/communicator.hpp"

namespace troupe::comm::ucx {

// True for the dtypes collectives can reduce: f32, f64, i32, i64 (sum and max).
bool reducible(DType dtype);

// out[i] = a[i] op b[i] for i < n, with a as the left operand (the order is part of the result for
// floats, so callers fix it). out may alias a or b exactly; no other overlap. Integer sums wrap.
// Vectorised loops; thread-compatible (no shared state). The dtype must be reducible (checked).
void reduce(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op);

}  // namespace troupe::comm::ucx
