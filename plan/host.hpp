// This host's figures for `troupe plan --gpu cpu` and `troupe train --auto-layout`, measured once per
// process on first use (about a second): the sgemm peak of all cores with troupe's own kernels, the
// memory bandwidth of a 64 MiB copy (one thread: a lower bound of what all cores reach), and the
// memory available to this process (config/memory_estimate.hpp's available_memory_bytes).
// Thread-safe (a function-local static).
#pragma once

#include "plan/cluster.hpp"

namespace troupe::plan {

struct HostFigures {
  int cores = 1;
  double sgemm_peak_gflops = 0;
  double memory_bandwidth = 0;  // bytes/s
  double available_bytes = 0;
};
const HostFigures& this_host();

// This host as a cluster of `ranks` ranks sharing its cores and memory (measured_cpu_cluster).
Cluster this_host_cluster(int ranks);

// The fraction of the all-core sgemm peak's share of `threads` cores that an (m x k) x (k x n) sgemm
// reaches on `threads` threads here: measured (about 20 ms) the first time a shape's bucket is asked
// for and kept. Buckets: each size rounded to a power of two (from 1 up to 4096; larger sizes count as
// 4096, where OpenBLAS's efficiency has levelled off). At most 1.
double measured_gemm_efficiency(int threads, double m, double n, double k);

}  // namespace troupe::plan
