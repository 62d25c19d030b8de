// Measures this machine's sgemm peak the way troupe computes: square f32 GEMMs split over `pool`.
// Used as the denominator of "% of peak" (model FLOP/s over measured sgemm FLOP/s).
#pragma once
#include "kernels/thread_pool.hpp"

namespace troupe {

// Best GFLOP/s of repeated n x n x n sgemm calls over about `seconds` of work.
double measure_sgemm_peak_gflops(ThreadPool& pool, double seconds = 0.5, int n = 1536);

}  // namespace troupe
