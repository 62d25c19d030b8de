#include "comm/flight_recorder.hpp"

#include <chrono>
#include <nlohmann/json.hpp>
#include <numeric>

#include "troupe/check.hpp"

namespace troupe::comm {

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Records every operation of `inner`, then hands it on. The counters are the owner thread's (a
// Communicator is used by one thread at a time); the recorder takes its own lock.
class FlightCommunicator final : public Communicator {
 public:
  FlightCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<FlightRecorder> recorder,
                     int group, std::vector<int> members)
      : inner_(std::move(inner)),
        recorder_(std::move(recorder)),
        group_(group),
        members_(std::move(members)),
        sent_(members_.size(), 0),
        received_(members_.size(), 0) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }

  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    const uint64_t id = collective(FlightKind::all_reduce, dtype, op, count * dtype_size(dtype));
    return attach(inner_->all_reduce(buf, count, dtype, op), id);
  }
  WorkPtr reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts,
                           DType dtype, ReduceOp op) override {
    const uint64_t id =
        collective(FlightKind::reduce_scatter, dtype, op, total(counts) * dtype_size(dtype));
    return attach(inner_->reduce_scatter_v(send, recv, counts, dtype, op), id);
  }
  WorkPtr all_gather_v(const void* send, void* recv, std::span<const size_t> counts,
                       DType dtype) override {
    const uint64_t id =
        collective(FlightKind::all_gather, dtype, ReduceOp::sum, total(counts) * dtype_size(dtype));
    return attach(inner_->all_gather_v(send, recv, counts, dtype), id);
  }
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    const uint64_t id = collective(FlightKind::broadcast, dtype, ReduceOp::sum,
                                   count * dtype_size(dtype), world(root));
    return attach(inner_->broadcast(buf, count, dtype, root), id);
  }
  WorkPtr barrier() override {
    const uint64_t id = collective(FlightKind::barrier, DType::u8, ReduceOp::sum, 0);
    return attach(inner_->barrier(), id);
  }
  WorkPtr send(const void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    const uint64_t id = p2p(FlightKind::send, sent_, count, dtype, peer, tag);
    return attach(inner_->send(buf, count, dtype, peer, tag), id);
  }
  WorkPtr recv(void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    const uint64_t id = p2p(FlightKind::recv, received_, count, dtype, peer, tag);
    return attach(inner_->recv(buf, count, dtype, peer, tag), id);
  }

 private:
  static size_t total(std::span<const size_t> counts) {
    return std::accumulate(counts.begin(), counts.end(), size_t{0});
  }
  // A group rank out of range is the backend's to refuse: it is recorded as -1.
  int world(int group_rank) const {
    return group_rank >= 0 && static_cast<size_t>(group_rank) < members_.size()
               ? members_[static_cast<size_t>(group_rank)]
               : -1;
  }
  uint64_t collective(FlightKind kind, DType dtype, ReduceOp op, size_t bytes, int root = -1) {
    FlightOp f;
    f.seq = ++collectives_;
    f.kind = kind;
    f.dtype = dtype;
    f.op = op;
    f.group = group_;
    f.peer = root;
    f.bytes = bytes;
    return recorder_->issue(f);
  }
  uint64_t p2p(FlightKind kind, std::vector<uint64_t>& counters, size_t count, DType dtype,
               int peer, uint64_t tag) {
    FlightOp f;
    const bool known = peer >= 0 && static_cast<size_t>(peer) < counters.size();
    f.seq = known ? ++counters[static_cast<size_t>(peer)] : 0;
    f.kind = kind;
    f.dtype = dtype;
    f.group = group_;
    f.peer = world(peer);
    f.tag = tag;
    f.bytes = count * dtype_size(dtype);
    return recorder_->issue(f);
  }
  WorkPtr attach(WorkPtr work, uint64_t id) {
    if (work) work->attach_flight(recorder_, id);
    return work;
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  const int group_;
  const std::vector<int> members_;
  uint64_t collectives_ = 0;
  std::vector<uint64_t> sent_, received_;  // per group rank of the peer
};

}  // namespace

const char* flight_kind_name(FlightKind kind) {
  switch (kind) {
    case FlightKind::all_reduce:
      return "all_reduce";
    case FlightKind::reduce_scatter:
      return "reduce_scatter";
    case FlightKind::all_gather:
      return "all_gather";
    case FlightKind::broadcast:
      return "broadcast";
    case FlightKind::barrier:
      return "barrier";
    case FlightKind::send:
      return "send";
    case FlightKind::recv:
      return "recv";
    case FlightKind::all_to_all:
      return "all_to_all";
  }
  return "?";
}

bool is_collective(FlightKind kind) {
  return kind != FlightKind::send && kind != FlightKind::recv;
}

const char* flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::scheduled:
      return "scheduled";
    case FlightState::started:
      return "started";
    case FlightState::completed:
      return "completed";
    case FlightState::failed:
      return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(int rank, size_t capacity) : rank_(rank), ring_(capacity) {
  TROUPE_CHECK(capacity >= 1, "a flight recorder holds at least one operation");
}

int FlightRecorder::add_group(std::string name, std::vector<int> members) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back(FlightGroup{std::move(name), std::move(members)});
  return static_cast<int>(groups_.size()) - 1;
}

uint64_t FlightRecorder::issue(FlightOp op) {
  op.state = FlightState::scheduled;
  op.enqueued_ns = steady_ns();
  op.started_ns = op.finished_ns = 0;
  std::lock_guard<std::mutex> lock(mu_);
  op.id = next_++;
  ring_[op.id % ring_.size()] = op;
  return op.id;
}

FlightOp* FlightRecorder::find_locked(uint64_t id) {
  FlightOp& slot = ring_[id % ring_.size()];
  return id < next_ && slot.id == id ? &slot : nullptr;  // else overwritten since
}

void FlightRecorder::started(uint64_t id) {
  const int64_t now = steady_ns();
  std::lock_guard<std::mutex> lock(mu_);
  FlightOp* op = find_locked(id);
  if (op == nullptr || op->state != FlightState::scheduled) return;
  op->state = FlightState::started;
  op->started_ns = now;
}

void FlightRecorder::finished(uint64_t id, bool ok) {
  const int64_t now = steady_ns();
  std::lock_guard<std::mutex> lock(mu_);
  FlightOp* op = find_locked(id);
  if (op == nullptr || op->finished_ns != 0) return;
  op->state = ok ? FlightState::completed : FlightState::failed;
  op->finished_ns = now;
}

FlightRecord FlightRecorder::snapshot(size_t last) const {
  FlightRecord out;
  out.rank = rank_;
  out.capacity = ring_.size();
  std::lock_guard<std::mutex> lock(mu_);
  out.steady_ns = steady_ns();
  out.unix_us = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  out.recorded = next_;
  out.groups = groups_;
  size_t held = static_cast<size_t>(std::min<uint64_t>(next_, ring_.size()));
  if (last > 0 && last < held) held = last;
  out.ops.reserve(held);
  for (uint64_t id = next_ - held; id < next_; ++id) out.ops.push_back(ring_[id % ring_.size()]);
  return out;
}

std::unique_ptr<Communicator> record_flight(std::unique_ptr<Communicator> inner,
                                            std::shared_ptr<FlightRecorder> recorder,
                                            std::string name, std::vector<int> members) {
  TROUPE_CHECK(inner && recorder, "record_flight needs a communicator and a recorder");
  TROUPE_CHECK(members.size() == static_cast<size_t>(inner->size()),
               "record_flight: the member list must have one world rank per group rank");
  const int group = recorder->add_group(std::move(name), members);
  return std::make_unique<FlightCommunicator>(std::move(inner), std::move(recorder), group,
                                              std::move(members));
}

std::string flight_record_json(const FlightRecord& record) {
  using nlohmann::json;
  auto us = [](int64_t ns) { return static_cast<double>(ns) / 1000.0; };
  json ops = json::array();
  for (const FlightOp& op : record.ops) {
    const bool known = op.group >= 0 && static_cast<size_t>(op.group) < record.groups.size();
    const int64_t end = op.finished_ns != 0 ? op.finished_ns : record.steady_ns;
    const bool reduces = op.kind == FlightKind::all_reduce || op.kind == FlightKind::reduce_scatter;
    const bool p2p = !is_collective(op.kind);
    ops.push_back({
        {"id", op.id},
        {"group", known ? record.groups[static_cast<size_t>(op.group)].name : std::string("?")},
        {"members",
         known ? record.groups[static_cast<size_t>(op.group)].members : std::vector<int>{}},
        {"seq", op.seq},
        {"kind", flight_kind_name(op.kind)},
        {"state", flight_state_name(op.state)},
        {"dtype", dtype_name(op.dtype)},
        {"op", reduces ? json(reduce_op_name(op.op)) : json(nullptr)},
        {"peer", p2p ? json(op.peer) : json(nullptr)},
        {"root", op.kind == FlightKind::broadcast ? json(op.peer) : json(nullptr)},
        {"tag", p2p ? json(op.tag) : json(nullptr)},
        {"bytes", op.bytes},
        {"enqueued_unix_us", record.unix_us - (record.steady_ns - op.enqueued_ns) / 1000},
        {"duration_us", us(end - op.enqueued_ns)},
        {"wait_us", op.started_ns != 0 ? json(us(end - op.started_ns)) : json(nullptr)},
    });
  }
  return json{{"rank", record.rank},
              {"capacity", record.capacity},
              {"recorded", record.recorded},
              {"ops", ops}}
      .dump();
}

}  // namespace troupe::comm
