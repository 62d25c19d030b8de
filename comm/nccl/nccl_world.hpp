// The "nccl" backend: communicators for GPU ranks, one CUDA device per rank (built with the CUDA
// backend only; host C++, links CUDA::cudart and nccl::nccl).
//
// World. create_nccl_world() makes this rank's device current, rank 0 makes an ncclUniqueId, every
// rank takes it from the bootstrap (all_gather under options.key) and joins a world NCCL
// communicator (non-blocking init polled against options.init_timeout, so a rank that never comes
// fails the others instead of hanging them). The world communicator is private: it only carries
// group set-up.
//
// Groups. CommWorld::group(members) is collective among the members only, as the interface asks.
// ncclCommSplit would need every world rank (non-members passing NCCL_SPLIT_NOCOLOR), so it is not
// used. Instead the first member makes a fresh ncclUniqueId and sends it, with a hash of the member
// list, to the other members with ncclSend/ncclRecv on the world communicator (point-to-point: only
// members take part); then the members run ncclCommInitRankConfig (non-blocking, timed). Each group
// is an independent NCCL communicator with its own CUDA stream; it may outlive the world. As with
// any collective, every rank must create its groups in one global order (e.g. the topology's: all
// TP groups, then all DP groups, ...), skipping the groups it is not in; two ranks that create
// groups they share in opposite orders block each other until init_timeout. A member list that
// differs between members is reported as an error (the hash). group() calls on one world are
// serialised.
//
// Buffers are device pointers on the communicator's device. Ordering with compute: the
// communicator's stream (stream()) is a non-blocking stream; each operation first waits (on the
// device, cudaStreamWaitEvent) for the work the calling thread queued on its current stream
// (DeviceScope, kernels/device_memory.hpp) when that stream is on the communicator's device.
// Otherwise buffers must be ready when an operation is called (synchronise the producing stream, or
// make stream() wait on an event of it). Work::wait() returns once the operation's event has completed on the device and
// NCCL reports no error; the buffers may then be read by the host or any stream.
//
// Operations (all on stream(), in call order):
//   all_reduce      ncclAllReduce, in place. Reductions (sum, max) take f32, f64, i32, i64, bf16,
//                   f16 and u8; u16 fails with an error.
//   reduce_scatter  equal counts: ncclReduceScatter. Uneven counts (_v): one ncclReduce per block
//                   (root = the block's owner) inside one ncclGroupStart/End; NCCL runs it as one
//                   fused launch. (ncclSend/Recv would need a reduction kernel of our own; grouped
//                   reduces keep NCCL's reduction order, so results stay deterministic.)
//   all_gather      equal counts: ncclAllGather (in place when send is recv's own block). Uneven
//                   counts (_v): one ncclBroadcast per block (root = the owner) in one group.
//   all_to_all      ncclSend / ncclRecv of every non-empty block, this rank's own included (NCCL
//                   copies a send to self locally), in one ncclGroupStart/End: one fused launch,
//                   NCCL orders the pairs. Neither this backend nor NCCL checks the counts (that
//                   would take an exchange of them first): a recv_counts[p] that differs from p's
//                   send_counts[rank] is undefined in NCCL; expect the pair to stall until
//                   op_timeout aborts the communicator (an error naming the operation, not the
//                   counts). A rank whose counts are all zero completes at once.
//   broadcast       ncclBroadcast, in place.
//   send / recv     ncclSend / ncclRecv. NCCL has no tags: messages between two ranks match in the
//                   order they are issued, whatever the tag, so a rank must post its recvs from a
//                   peer in the order that peer sent them (tags are not checked; keep them as the
//                   other backends would match them). recv's count must equal the sent count.
//                   A send completes only once the peer's recv runs, and a communicator's
//                   operations run one after another on its stream: two ranks that each send to the
//                   other before receiving deadlock (beyond NCCL's buffering) until op_timeout.
//                   Order exchanges (the lower rank sends first) or use batch_p2p(). No self-send.
//   barrier         a one-element ncclAllReduce; wait() returns once every member has reached it.
//   Movement (broadcast, all_gather, all_to_all, send/recv) is done in bytes, so any dtype works.
// Counts of zero complete at once. Determinism: NCCL gives every rank the same bits, and the same
// bits run to run while it picks the same algorithm (same NCCL version, topology and
// NCCL_ALGO/NCCL_PROTO).
//
// Failures. An NCCL error, an asynchronous error (a peer exited, a network error) or an operation
// not complete within options.op_timeout of its call aborts the communicator (ncclCommAbort, which
// stops its kernels): the Work fails with a message naming the operation, the rank and NCCL's
// description, and every later call on that communicator fails with the same cause. NCCL does not
// say which peer failed; its last-error text (NCCL_DEBUG=WARN prints more) often does.
//
// Thread safety: as Communicator (one thread at a time per communicator; different communicators
// may be used concurrently from different threads). NCCL advises that concurrent communicators on
// one device issue operations in the same order on every rank; otherwise their kernels can wait on
// each other.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "comm/bootstrap.hpp"
#include "comm/communicator.hpp"
#include "comm/world.hpp"
#include "troupe/status.hpp"

namespace troupe::comm {

struct NcclOptions {
  // Creating the world or one group: how long to wait for every rank to join.
  std::chrono::milliseconds init_timeout = std::chrono::minutes(5);
  // One operation, from its call to its completion on the device.
  std::chrono::milliseconds op_timeout = std::chrono::minutes(30);
  // Destroying a communicator: how long ncclCommFinalize may flush pending work before it is
  // aborted.
  std::chrono::milliseconds destroy_timeout = std::chrono::minutes(1);
  // Bootstrap key for the unique id; create each world on one bootstrap under a different key.
  std::string key = "nccl/world";
};

// A point-to-point operation of batch_p2p().
struct P2POp {
  bool is_send = true;
  void* buf = nullptr;  // const for a send
  size_t count = 0;
  DType dtype = DType::f32;
  int peer = 0;
};

// The communicators of the nccl backend (dynamic_cast a Communicator to reach these).
class NcclCommunicator : public Communicator {
 public:
  virtual int device() const = 0;
  // The stream every operation of this communicator runs on (owned by the communicator).
  virtual cudaStream_t stream() const = 0;
  // Sends and recvs launched together as one NCCL group, so their order among themselves does not
  // matter (no deadlock when two ranks exchange); one Work for all of them. Like NCCL's grouped
  // send/recv (PyTorch's batch_isend_irecv).
  virtual WorkPtr batch_p2p(std::span<const P2POp> ops) = 0;
};

// The world of GPU ranks: this rank (bootstrap.rank() of bootstrap.world_size()) uses CUDA device
// `device` (an index among the devices visible to this process). Fails when the device is missing,
// NCCL fails, or a rank does not join within options.init_timeout. Collective over all ranks.
Result<std::unique_ptr<CommWorld>> create_nccl_world(Bootstrap& bootstrap, int device,
                                                     const NcclOptions& options = {});

}  // namespace troupe::comm
