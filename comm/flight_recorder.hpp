// The flight recorder (docs/INSPECT.md, "flight"): per rank, a ring of its last N communication
// operations over every group and every backend, which any thread may copy while the rank computes
// (the inspector's `flight`, the stall file). Like PyTorch's Flight Recorder: when a job stalls,
// the members of a group that reached collective k and the one that did not are told apart by the
// sequence numbers.
//
//   auto recorder = std::make_shared<FlightRecorder>(rank);
//   auto tp = record_flight(world->group(members).value(), recorder, "tp", members);
//   tp->all_reduce(...)->wait();           // recorded: scheduled, started, completed
//   FlightRecord now = recorder->snapshot();  // from any thread
//
// What is recorded, by record_flight's communicator (once, for every backend): each call of the
// Communicator interface is an operation, numbered
//   * collectives (all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, barrier): seq 1,
//     2, ... per group, so the k-th collective of a group is seq k on every member (they call the
//     group's collectives in the same order: comm/communicator.hpp);
//   * send and recv: seq 1, 2, ... per (group, peer, direction): the k-th send of rank a to b in a
//     group; it is b's k-th recv from a when b posts its receives from a in a's send order (the tag
//     is recorded to match them otherwise).
// bytes: all_reduce and broadcast the buffer, reduce_scatter the whole input (every member's
// blocks), all_gather the whole output, send/recv the message: the same on every member of a
// collective; except all_to_all: what this rank sends (its whole send buffer), which differs
// between members when their counts do.
// States: scheduled when issued; started when the rank's thread begins to wait for it
// (Work::wait) before it is done; completed or failed when it is done: the local and ucx backends
// say so from the thread that finishes it (Work::completed), the nccl backend's operations are
// seen done when a wait returns or a test finds the CUDA event passed (until then an nccl
// operation nobody waits for stays scheduled or started). An operation the ring overwrote before
// it finished is not updated any more. Times are the steady clock's.
//
// Cost: recording an operation takes one mutex and writes one fixed-size entry (no allocation);
// its wait and its completion take the mutex twice more. Measured in
// tests/comm/test_flight_recorder.cpp (docs/INSPECT.md gives the figure).
//
// Thread safety: a FlightRecorder may be used from any thread (a rank's groups run on several);
// the communicator record_flight returns is used as any Communicator (by one thread at a time).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace troupe::comm {

enum class FlightKind : uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  barrier,
  send,
  recv,
  all_to_all
};
const char* flight_kind_name(FlightKind kind);  // "all_reduce", ..., "recv", "all_to_all"
bool is_collective(FlightKind kind);

enum class FlightState : uint8_t { scheduled, started, completed, failed };
const char* flight_state_name(FlightState state);  // "scheduled", "started", "completed", "failed"

// One operation (plain data: the ring holds capacity of them).
struct FlightOp {
  uint64_t id = 0;   // this rank's operations over all its groups, 0, 1, ... in issue order
  uint64_t seq = 0;  // see the header comment; from 1
  FlightKind kind = FlightKind::barrier;
  FlightState state = FlightState::scheduled;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;  // all_reduce, reduce_scatter
  int group = -1;               // index into FlightRecord::groups
  int peer = -1;                // send/recv: the other end; broadcast: the root (world ranks)
  uint64_t tag = 0;             // send/recv
  uint64_t bytes = 0;
  int64_t enqueued_ns = 0;  // steady clock
  int64_t started_ns = 0;   // 0: no wait yet
  int64_t finished_ns = 0;  // 0: not done (as far as the rank knows)
};

struct FlightGroup {
  std::string name;          // "tp", "pp", "dp", "embedding", "world", or the caller's
  std::vector<int> members;  // world ranks in group-rank order
};

// A copy of a rank's record.
struct FlightRecord {
  int rank = 0;
  size_t capacity = 0;
  uint64_t recorded = 0;  // operations ever recorded; ops holds the last min(recorded, capacity)
  std::vector<FlightGroup> groups;
  std::vector<FlightOp> ops;  // oldest first
  int64_t steady_ns = 0;      // when copied, on the steady clock
  int64_t unix_us = 0;        // the same instant, microseconds since the Unix epoch
};

class FlightRecorder {
 public:
  static constexpr size_t kDefaultCapacity = 256;
  // capacity >= 1 (0 is a bug).
  explicit FlightRecorder(int rank, size_t capacity = kDefaultCapacity);
  int rank() const { return rank_; }
  size_t capacity() const { return ring_.size(); }

  // A group of this rank; returns its index for FlightOp::group.
  int add_group(std::string name, std::vector<int> members);
  // Records a new operation (op's id, state and times are set here); returns its id.
  uint64_t issue(FlightOp op);
  // The rank begins to wait for operation `id` (no effect unless it is scheduled).
  void started(uint64_t id);
  void finished(uint64_t id, bool ok);

  // The last `last` operations (0: all the ring holds).
  FlightRecord snapshot(size_t last = 0) const;

 private:
  FlightOp* find_locked(uint64_t id);
  const int rank_;
  mutable std::mutex mu_;
  std::vector<FlightOp> ring_;  // op id at ring_[id % capacity]
  uint64_t next_ = 0;
  std::vector<FlightGroup> groups_;
};

// `inner` (any backend) with every operation recorded in `recorder`, as group `name` whose members
// are `members` (world ranks in group-rank order: members.size() == inner->size()).
std::unique_ptr<Communicator> record_flight(std::unique_ptr<Communicator> inner,
                                            std::shared_ptr<FlightRecorder> recorder,
                                            std::string name, std::vector<int> members);

// The JSON of a record (docs/INSPECT.md): {"rank", "capacity", "recorded", "ops": [{"id",
// "group", "members", "seq", "kind", "state", "dtype", "op", "peer", "tag", "bytes",
// "enqueued_unix_us", "duration_us", "wait_us"}]}, one line.
std::string flight_record_json(const FlightRecord& record);

}  // namespace troupe::comm
