// The communicator interface: collectives and tagged point-to-point messages among the ranks of one
// group, with asynchronous handles so compute can overlap communication. Three backends implement it:
//   local  ranks are threads of one process; shared-memory algorithms, no serialisation (comm/local/local_*)
//   ucx    ranks in other processes or nodes, host memory, UCP tag API (comm/ucx/ucx_*)
//   nccl   GPU ranks (comm/nccl/; built with the CUDA backend)
//
// Semantics (all backends):
//   * Every member calls every collective, in the same order, with the same count, dtype and op.
//     Calls return at once with a Work handle; the operation completes in the background (backends
//     make progress without the caller), and Work::wait() returns when this rank's part is done and its
//     buffers may be reused. Buffers must stay alive and untouched until then.
//   * all_to_all_v (mixture-of-experts token exchange) takes counts per peer on both sides: rank r
//     sends send_counts[p] elements to p, and its recv_counts[p] must equal what p passes as
//     send_counts[r] (counts may differ between pairs, may be zero, all of them too). A mismatch is
//     an error naming both counts where the backend can see it (local: always, every member; ucx:
//     the receiving rank of that pair; nccl: cannot, see comm/nccl/nccl_world.hpp), never memory
//     written past recv. It moves bytes (any dtype, no reduction); send and recv must not overlap.
//   * Counts are in elements. Any count works for all_reduce and broadcast (including counts
//     smaller than the group or not divisible by it). reduce_scatter / all_gather / all_to_all take
//     one count per rank (counts may differ; the equal-count forms are shorthand), so a buffer whose
//     size the group does not divide is split without padding. The counts spans need only live for
//     the call (backends copy them; the equal-count forms pass a temporary).
//   * Reductions are deterministic for a given group size and count: the same inputs give bitwise the
//     same outputs on every rank and every run. (Sums of integer-valued floats are exact.)
//   * Reducible dtypes: f32, f64, i32, i64, bf16, f16 (sum and max; u8 too on nccl). bf16/f16 are
//     widened to fp32 exactly, combined in fp32 and rounded back to nearest, ties to even (a finite
//     sum past the format's largest value becomes Inf -- fp16: from 65520 up -- so an overflow stays
//     visible to a loss scaler; Inf + -Inf and any NaN input give NaN). Where the rounding happens
//     is part of the result, so each backend states it:
//       local  every output element is one fp32 fold over the ranks in order 0..n-1, rounded once
//              (members read every source directly: no partial result travels).
//       ucx    reduce_scatter below the ring threshold and both collectives through the
//              shared-memory path: as local, rounded once. The ring (large messages without the
//              shared-memory path) sends partial results to the next rank in 16 bits, so block b is
//              rounded at every hop: r(...r(r(x[b+1] + x[b+2]) + x[b+3])... + x[b]), p-1 roundings.
//              Small all_reduce (recursive doubling) rounds every pairwise combine: floor(log2 p)
//              rounds, plus the first fold of pairs (2i, 2i+1), i < p - 2^floor(log2 p). (Sending
//              fp32 partials instead would double the bytes on the wire.)
//       nccl   NCCL's own (its ring and tree round partial results per step).
//     max is exact everywhere: its result is one of the inputs.
//   * send/recv match by (peer, tag); messages with the same (peer, tag) arrive in send order. Tags
//     below 2^56 are the caller's; the rest is reserved for the backends' collectives.
//   * A peer that dies makes pending and later operations fail with an error naming the peer; nothing
//     hangs (UCX: endpoint error handling; local: a rank that aborts the group).
// Thread safety: one Communicator is used by one thread at a time (its owner: a shard or stage actor).
// Different communicators (e.g. the TP and DP groups of one rank) may be used concurrently.
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/status.hpp"
#include "kernels/tensor.hpp"

namespace troupe::comm {

enum class ReduceOp : uint8_t { sum, max };

const char* reduce_op_name(ReduceOp op);

class FlightRecorder;

// An operation in flight. Backends implement do_wait() and do_test(); wait() and test() also tell
// the flight recorder (comm/flight_recorder.hpp) about an operation it records.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done; an error names the failed peer or the cause.
  Status wait();
  // Non-blocking: true once done (successfully or not; wait() then returns at once).
  bool test();

  // The recorder's entry for this operation (called once, by record_flight's communicator, on the
  // caller's thread before the Work reaches the caller): wait() marks it started, and it is
  // completed or failed when the backend says so (completed()) or else when a wait returns or a
  // test finds it done.
  void attach_flight(std::shared_ptr<FlightRecorder> recorder, uint64_t id);

 protected:
  virtual Status do_wait() = 0;
  virtual bool do_test() = 0;
  // Backends that finish operations on threads of their own (local, ucx) call this once, from any
  // thread, when the operation is done, before waiters are woken: the record then has the true
  // completion time even when nobody waits yet.
  void completed(bool ok);

 private:
  enum : uint8_t { kAttached = 1, kDone = 2, kOk = 4 };
  void flight_finished(bool ok);
  std::shared_ptr<FlightRecorder> flight_;  // written once, before kAttached is set
  uint64_t flight_id_ = 0;
  std::atomic<uint8_t> flight_bits_{0};
  bool flight_done_ = false;  // the owner's thread told the recorder
};
using WorkPtr = std::shared_ptr<Work>;

// A Work that is already complete with `status` (for trivial cases such as a group of one).
WorkPtr completed_work(Status status = Status::ok());

// Code with no error channel of its own (a model chunk's layers, ZeRO's hooks inside them) waits with
// wait_or_throw: a failed collective (a peer died, the job is being aborted) throws CollectiveFailed
// naming the collective and the peer, which the caller that has an error channel (the rank engine's
// entry points) turns back into a Status, instead of aborting the process.
class CollectiveFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Which of its rank's groups a wait is on, for whoever watches the thread's waits.
enum class WaitGroup : uint8_t { other, tp, dp };
void wait_or_throw(const WorkPtr& work, const std::string& what, WaitGroup group = WaitGroup::other);

// Told about this thread's blocking waits in wait_or_throw (the rank engine's activity board,
// engine/activity.hpp): begin() before a wait that has not completed yet, end(ok) after it.
class WaitListener {
 public:
  virtual ~WaitListener() = default;
  virtual void begin(const std::string& what, WaitGroup group) = 0;
  virtual void end(bool ok) = 0;
  // A collective inside a layer that the timeline shows as a span of its own (the MoE layers' token
  // all-to-alls), told when it has completed: its name and when it was issued; it ended now.
  virtual void collective_span(const std::string& what, std::chrono::steady_clock::time_point issued) {
    (void)what;
    (void)issued;
  }
};
// Tells this thread's listener, if any, of a completed collective issued at `issued`.
void report_collective_span(const std::string& what, std::chrono::steady_clock::time_point issued);
// Sets this thread's listener (null: none); returns the previous one.
WaitListener* set_thread_wait_listener(WaitListener* listener);

// Waits for all, returns the first error.
Status wait_all(const std::vector<WorkPtr>& works);

// While one lives, this thread's waits are background ones (the offload writer's snapshot copies,
// at the lowest priority while the ranks train): with nothing to do, a wait sleeps until the
// transport has an event instead of polling first (UCX's spin_us), which would only take cycles
// from the cores the training uses. Per thread; nests.
class BackgroundWaits {
 public:
  BackgroundWaits();
  ~BackgroundWaits();
  BackgroundWaits(const BackgroundWaits&) = delete;
  BackgroundWaits& operator=(const BackgroundWaits&) = delete;
  static bool active();  // on this thread

 private:
  bool was_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // rank in this group, 0 .. size()-1
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "ucx", "nccl"

  // In place: afterwards buf holds op over all ranks' buf, elementwise. buf: count elements.
  virtual WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;

  // send: sum(counts) elements, rank r's block at offset sum(counts[:r]); recv: counts[rank()] elements
  // = op over all ranks of their block `rank()`. counts.size() == size().
  virtual WorkPtr reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype,
                                   ReduceOp op) = 0;
  // send: counts[rank()] elements; recv: sum(counts) elements, rank r's contribution at offset
  // sum(counts[:r]). send may alias its own block of recv.
  virtual WorkPtr all_gather_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype) = 0;

  // send: sum(send_counts) elements, the block for peer p at offset sum(send_counts[:p]); recv:
  // sum(recv_counts) elements, peer p's block at offset sum(recv_counts[:p]). Both spans have
  // size() entries; recv_counts[p] == peer p's send_counts[rank()]. The block for this rank itself
  // is a local copy. send and recv must not overlap.
  virtual WorkPtr all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                               std::span<const size_t> recv_counts, DType dtype) = 0;

  // Equal blocks: recv_count / send_count / count_per_peer elements per rank.
  WorkPtr reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op);
  WorkPtr all_gather(const void* send, void* recv, size_t send_count, DType dtype);
  WorkPtr all_to_all(const void* send, void* recv, size_t count_per_peer, DType dtype);

  // In place: every rank's buf becomes root's.
  virtual WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) = 0;

  // Tagged point-to-point (pipeline activations and gradients). recv's count must equal the sent count.
  virtual WorkPtr send(const void* buf, size_t count, DType dtype, int peer, uint64_t tag) = 0;
  virtual WorkPtr recv(void* buf, size_t count, DType dtype, int peer, uint64_t tag) = 0;

  virtual WorkPtr barrier() = 0;

  // Bytes of one element of `dtype`. Every dtype moves (broadcast, all_gather, all_to_all,
  // send/recv); the reducible ones are listed in the file comment (f32, f64, i32, i64, bf16, f16).
  static size_t element_size(DType dtype) { return dtype_size(dtype); }
};

}  // namespace troupe::comm
