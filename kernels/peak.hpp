// Measures this machine's sgemm peak the way troupe computes: square f32 GEMMs split over `pool`.
// Used as the denominator of "% of peak" (model FLOP/s over measured sgemm FLOP/s).
#pragma once
#include "kernels/thread_pool.hpp"

namespace troupe {

// Best GFLOP/s of repeated n x n x n sgemm calls over about `seconds` of work.
double measure_sgemm_peak_gflops(ThreadPool& pool, double seconds = 0.5, int n = 1536);

// Best GFLOP/s of repeated (m x k) x (k x n) sgemm calls (at least 3) over about `seconds` of work:
// what a GEMM of that shape reaches on `pool` (troupe plan's CPU efficiency by shape).
double measure_sgemm_gflops(ThreadPool& pool, int m, int n, int k, double seconds = 0.02);

}  // namespace troupe
