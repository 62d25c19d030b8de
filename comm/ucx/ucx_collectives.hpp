// Private to the ucx backend: the collective algorithms (described in comm/ucx/ucx_world.hpp) as
// Ops. Each factory picks the algorithm from the message size and the engine's ring threshold,
// which all ranks share, so every member builds the same state machine. Preconditions (checked by
// the caller, UcxCommunicator): group size >= 2, a reducible dtype for reductions, counts.size() ==
// group size, at least one element in all (all_to_all: any counts). Buffers are the caller's and
// must outlive the Work.
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
// all_to_all_v (ucx_all_to_all.cpp): through shared memory for groups with a channel
// (make_shm_all_to_all), else by pairwise exchange; esz: bytes per element. Counts need not be
// checked against the peers': a mismatch fails the receiving rank's operation.
std::unique_ptr<Op> make_all_to_all(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                    const void* send, std::vector<size_t> send_counts, void* recv,
                                    std::vector<size_t> recv_counts, size_t esz);
// The pairwise exchange over UCX messages alone (the shared-memory path's fallback).
std::unique_ptr<Op> make_pairwise_all_to_all(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                             const void* send, std::vector<size_t> send_counts, void* recv,
                                             std::vector<size_t> recv_counts, size_t esz);
// all_to_all_v through shared memory (ucx_shm_ops.cpp), for groups with a channel; falls back to
// the pairwise exchange on every member alike when some member has no room for the staging area.
std::unique_ptr<Op> make_shm_all_to_all(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                        const void* send, std::vector<size_t> send_counts, void* recv,
                                        std::vector<size_t> recv_counts, size_t esz);

// The direct algorithms receive one message from every rank in the same step, so the tag must tell
// the senders apart: the sender's group rank goes into the step and chunk fields (24 bits).
inline uint32_t sender_step(int sender) {
  return static_cast<uint32_t>(sender) >> kTagChunkBits;
}
inline uint32_t sender_chunk(int sender) {
  return static_cast<uint32_t>(sender) & ((1u << kTagChunkBits) - 1);
}

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
