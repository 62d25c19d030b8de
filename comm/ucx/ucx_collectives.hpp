// Private to the ucx backend: the collective algorithms (described in comm/ucx/ucx_world.hpp) as Ops.
// Each factory picks the algorithm from the message size and the engine's ring threshold, which all
// ranks share, so every member builds the same state machine. Preconditions (checked by the caller,
// UcxCommunicator): group size >= 2, a reducible dtype for reductions, counts.size() == group size,
// at least one element in all. Buffers are the caller's and must outlive the Work.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/ucx/ucx_engine.hpp"

namespace troupe::comm::ucx {

using GroupPtr = std::shared_ptr<const GroupInfo>;

std::unique_ptr<Op> make_all_reduce(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                    void* buf, size_t count, DType dtype, ReduceOp op);
std::unique_ptr<Op> make_reduce_scatter(Engine& engine, GroupPtr group, uint64_t seq,
                                        std::string name, const void* send, void* recv,
                                        std::vector<size_t> counts, DType dtype, ReduceOp op);
// all_gather: also copies `send` into this rank's place in `recv` (unless they are the same).
std::unique_ptr<Op> make_all_gather(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                    const void* send, void* recv, std::vector<size_t> counts,
                                    DType dtype);
std::unique_ptr<Op> make_broadcast(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                   void* buf, size_t bytes, int root);
std::unique_ptr<Op> make_barrier(Engine& engine, GroupPtr group, uint64_t seq, std::string name);

// The large-message algorithms (ucx_ring.cpp), used by the factories above.
enum class RingMode { all_reduce, reduce_scatter, all_gather };
// all_reduce: src == dst == the whole buffer. reduce_scatter: src = the whole send buffer, dst =
// this rank's block. all_gather: src = this rank's block, dst = the whole buffer (this rank's place
// in dst is copied from src at the start).
std::unique_ptr<Op> make_ring(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                              RingMode mode, const void* src, void* dst, std::vector<size_t> counts,
                              DType dtype, ReduceOp op);
// all_gather by direct exchange in chunks, for groups on one host (ucx_direct.cpp); contract of
// make_all_gather.
std::unique_ptr<Op> make_direct_all_gather(Engine& engine, GroupPtr group, uint64_t seq,
                                           std::string name, const void* send, void* recv,
                                           std::vector<size_t> counts, size_t esz);
// The three collectives through shared memory, for groups with a channel (ucx_shm_ops.cpp); modes
// and buffers as make_ring. Falls back to the UCX algorithms (on every member alike) when some
// member has no room for the group's staging area.
std::unique_ptr<Op> make_shm_collective(Engine& engine, GroupPtr group, uint64_t seq,
                                        std::string name, RingMode mode, const void* src,
                                        void* dst, std::vector<size_t> counts, DType dtype,
                                        ReduceOp op);
std::unique_ptr<Op> make_chain_broadcast(Engine& engine, GroupPtr group, uint64_t seq,
                                         std::string name, void* buf, size_t bytes, int root);

}  // namespace troupe::comm::ucx
