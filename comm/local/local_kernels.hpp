// Data-movement kernels of the local backend (comm/local/local_world.cpp); private to comm/.
//
// They exist to move as few bytes through DRAM as the collectives allow: a source chunk of a few
// KiB is read once into a cache-resident buffer and then written to every destination, and with
// `streaming` the destination writes are non-temporal (they skip the cache, so a destination line
// is not first read from DRAM). Streaming pays only when the data will not be re-read from cache
// soon: the caller enables it for collectives too large for the last-level cache.
//
// Both kernels are fenced: when they return, every store (streaming or not) is ordered before the
// caller's next store, so publishing completion through a mutex or an atomic is enough.
#pragma once
#include <cstddef>
#include <span>

#include "comm/communicator.hpp"

namespace troupe::comm::detail {

// For k < count: dsts[d][k] = op(...op(op(srcs[0][k], srcs[1][k]), srcs[2][k])..., srcs[n-1][k])
// for every d, always in source order, so each destination gets bitwise the serial reduction.
// A destination may be one of the sources (the same pointer, not a partial overlap): each chunk is
// reduced into a local accumulator before it is written. dtype: f32, f64, i32, i64, bf16 or f16
// (a broken invariant otherwise). bf16/f16 accumulate in fp32 (the op applied to the widened
// values, in the same order) and round to the 16-bit type once per element, round to nearest even
// (kernels/half.hpp). srcs non-empty; with one source this is a copy.
void reduce_to(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count,
               DType dtype, ReduceOp op, bool streaming);

// dsts[d][0..bytes) = src[0..bytes) for every d; a destination equal to src is skipped. Buffers
// must not otherwise overlap.
void copy_to(std::span<void* const> dsts, const void* src, size_t bytes, bool streaming);

}  // namespace troupe::comm::detail
