// The "local" backend: ranks that are threads (actors) of one process communicate through shared
// memory, with no serialisation and no copies beyond what each algorithm needs.
//
//   auto fabric = LocalFabric::create(4).value();         // once, for 4 ranks
//   // on rank r's thread:
//   std::unique_ptr<CommWorld> world = fabric.world(r);
//   auto tp = world->group(topology.tp_group(r)).value();
//   tp->all_reduce(buf, n, DType::f32, ReduceOp::sum)->wait();
//
// Algorithms (members' progress threads read and write each other's buffers in place). Each
// collective cuts its elements into size() shares as evenly as possible (shares may be empty), and
// member i moves share i, so the work is balanced even when _v counts are not. Data is moved in
// chunks of a few KiB that stay in L1/L2: a chunk is read once and written to every destination,
// which is the fewest bytes through DRAM each collective allows (S = one member's buffer):
//   all_reduce      member i reduces share i over all members' buffers in rank order 0..n-1 (so
//                   every rank gets bitwise the same result) and writes the result into share i of
//                   every member's buffer. Reads nS, writes nS in all. bf16/f16: the fold is in
//                   fp32 and rounded once (comm/local/local_kernels.hpp), here and in
//                   reduce_scatter.
//   reduce_scatter  member i reduces share i of the concatenated send layout (its own block when
//                   counts are equal), in rank order, into the recv of the block's owner. recv may
//                   be exactly its own block of send (in place). Reads nS (S: a send), writes S.
//   all_gather      member i reads share i of the concatenated layout from the senders and writes
//                   it into every member's recv (a send that is its own block of recv is left in
//                   place). Reads S, writes nS (S: a recv).
//   all_to_all      member i copies block i of every sender's send straight into its own recv
//                   (pull; senders in the order i+1, i+2, ..., i, the own block included), so each
//                   byte is read once and written once. Members that received more do more of the
//                   work: the counts decide the balance, not the shares. Reads S, writes S (S: all
//                   members' sends together).
//   broadcast       member i reads share i of root's buffer and writes it into every other
//                   member's. Reads S, writes (n-1)S.
//   send / recv     a mailbox per (sender, receiver) pair of the group: whichever side is posted
//                   second copies once, from the sender's buffer straight into the receiver's
//                   (rendezvous, nothing is buffered), so send completes when the receiver has
//                   copied. Posting never blocks the communicator: both sides may send first.
//   barrier         1 barrier.
// The other collectives meet at 2 barriers: one publishes the buffers, one ends the data phase.
// Writes are streaming (non-temporal) stores when a collective's buffers together exceed the
// last-level cache (the data would not stay cached anyway), except all_reduce's: its destination
// lines were just read, so they are in cache.
// A count of 0 (or _v counts that are all 0) is a no-op that involves no other rank, except in
// all_to_all: one member's zero counts say nothing about the others', so it always meets them.
//
// Progress: each Communicator owns one progress thread that runs its operations in issue order;
// calls return at once. Communicators of one rank (tp and dp, say) run concurrently. Waiting (for
// peers in a barrier, in Work::wait) spins with yields a few times and then blocks on a condition
// variable, so an idle rank burns no core.
//
// Failure: abort(rank, reason) (a rank's actor died) fails the whole fabric: every pending and
// later operation of every rank -- collectives, send/recv, bootstrap, group creation -- completes
// with an error naming the rank and reason, and nothing hangs. A failed wait() returns only when no
// other rank still touches that rank's buffers. With LocalFabricOptions::timeout set, a wait for a
// peer (a barrier, an unmatched send/recv in Work::wait, a bootstrap round) that lasts longer fails
// the fabric the same way, naming the ranks that did not arrive and the ranks that were not blocked
// in any Work::wait at that moment (computing, or stuck: usually the culprit). A fabric does not recover: build a
// new one to restart. Misuse that every rank sees alike (a dtype that cannot be reduced, members
// that disagree on a collective's count, dtype, op or root, a send/recv size mismatch, an
// all_to_all whose recv_counts[p] differs from p's send_counts[rank], naming both counts, or
// whose send and recv overlap on some member) fails the operation with a message on every member.
//
// Thread safety: LocalFabric is a handle; copies share one fabric, and any thread may use it. A
// CommWorld or Communicator from it is used by one thread at a time (its owner), as in
// comm/world.hpp. Communicators must be destroyed only after their operations completed (the
// destructor waits for them; a fabric failure bounds that wait).
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "comm/bootstrap.hpp"
#include "comm/world.hpp"
#include "troupe/status.hpp"

namespace troupe::comm {

struct LocalFabricOptions {
  // Longest wait for a peer before the fabric is failed; 0 waits for ever (the default).
  std::chrono::milliseconds timeout{0};
};

namespace detail {
struct LocalFabricState;
}

class LocalFabric {
 public:
  // size: the number of ranks (>= 1).
  static Result<LocalFabric> create(int size, LocalFabricOptions options = {});

  int size() const;

  // Rank `rank`'s view of the fabric (0 <= rank < size; out of range is a bug). May be called more
  // than once per rank; group() calls with the same member list pair up by their order on each
  // rank.
  std::unique_ptr<CommWorld> world(int rank) const;
  // An in-process bootstrap for rank `rank` over the same fabric (keys are shared by all its
  // ranks).
  std::unique_ptr<Bootstrap> bootstrap(int rank) const;

  // Fails every pending and later operation with "rank <rank> aborted: <reason>". The first failure
  // wins; later calls do nothing.
  void abort(int rank, const std::string& reason) const;
  // Ok, or the failure every operation now reports.
  Status status() const;

 private:
  explicit LocalFabric(std::shared_ptr<detail::LocalFabricState> state)
      : state_(std::move(state)) {}
  std::shared_ptr<detail::LocalFabricState> state_;
};

}  // namespace troupe::comm
