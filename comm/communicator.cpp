// The backend-independent parts of comm/communicator.hpp and comm/world.hpp.
#include "comm/communicator.hpp"

#include <numeric>
#include <utility>

#include "comm/flight_recorder.hpp"
#include "comm/world.hpp"

namespace troupe::comm {

namespace {

class CompletedWork final : public Work {
 public:
  explicit CompletedWork(Status status) : status_(std::move(status)) {}
  Status do_wait() override { return status_; }
  bool do_test() override { return true; }

 private:
  Status status_;
};

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

Status Work::wait() {
  if (!flight_ || flight_done_) return do_wait();
  flight_->started(flight_id_);  // no effect once the backend reported it done
  Status st = do_wait();
  flight_finished(st.is_ok());
  return st;
}

bool Work::test() {
  const bool done = do_test();
  // Done: do_wait() returns at once with the outcome.
  if (done && flight_ && !flight_done_) flight_finished(do_wait().is_ok());
  return done;
}

// attach_flight and completed race when the backend finishes before the caller got its Work:
// whichever of them comes second tells the recorder (the recorder keeps the first outcome of an
// operation, so the owner's wait or test telling it again changes nothing).
void Work::attach_flight(std::shared_ptr<FlightRecorder> recorder, uint64_t id) {
  flight_ = std::move(recorder);
  flight_id_ = id;
  const uint8_t before = flight_bits_.fetch_or(kAttached, std::memory_order_acq_rel);
  if (before & kDone) flight_->finished(flight_id_, (before & kOk) != 0);
}

void Work::completed(bool ok) {
  const uint8_t before =
      flight_bits_.fetch_or(static_cast<uint8_t>(kDone | (ok ? kOk : 0)), std::memory_order_acq_rel);
  if (before & kAttached) flight_->finished(flight_id_, ok);
}

void Work::flight_finished(bool ok) {
  flight_done_ = true;
  flight_->finished(flight_id_, ok);
}

WorkPtr completed_work(Status status) {
  return std::make_shared<CompletedWork>(std::move(status));
}

namespace {
thread_local WaitListener* thread_listener = nullptr;
}  // namespace

WaitListener* set_thread_wait_listener(WaitListener* listener) {
  WaitListener* before = thread_listener;
  thread_listener = listener;
  return before;
}

void wait_or_throw(const WorkPtr& work, const std::string& what, WaitGroup group) {
  WaitListener* told = thread_listener != nullptr && !work->test() ? thread_listener : nullptr;
  if (told) told->begin(what, group);
  const Status st = work->wait();
  if (told) told->end(st.is_ok());
  if (!st.is_ok()) throw CollectiveFailed(what + " failed: " + st.message());
}

void report_collective_span(const std::string& what, std::chrono::steady_clock::time_point issued) {
  if (thread_listener != nullptr) thread_listener->collective_span(what, issued);
}

Status wait_all(const std::vector<WorkPtr>& works) {
  // Waits for every one even after a failure, so no buffer is still in use when this returns.
  Status first;
  for (const WorkPtr& w : works) {
    if (!w) continue;
    Status s = w->wait();
    if (first.is_ok() && !s.is_ok()) first = s;
  }
  return first;
}

WorkPtr Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                     ReduceOp op) {
  const std::vector<size_t> counts(static_cast<size_t>(size()), recv_count);
  return reduce_scatter_v(send, recv, counts, dtype, op);
}

WorkPtr Communicator::all_gather(const void* send, void* recv, size_t send_count, DType dtype) {
  const std::vector<size_t> counts(static_cast<size_t>(size()), send_count);
  return all_gather_v(send, recv, counts, dtype);
}

WorkPtr Communicator::all_to_all(const void* send, void* recv, size_t count_per_peer, DType dtype) {
  const std::vector<size_t> counts(static_cast<size_t>(size()), count_per_peer);
  return all_to_all_v(send, counts, recv, counts, dtype);
}

Result<std::unique_ptr<Communicator>> CommWorld::everyone() {
  std::vector<int> members(static_cast<size_t>(size()));
  std::iota(members.begin(), members.end(), 0);
  return group(members);
}

namespace {
thread_local bool background_waits = false;
}  // namespace

BackgroundWaits::BackgroundWaits() : was_(std::exchange(background_waits, true)) {}
BackgroundWaits::~BackgroundWaits() { background_waits = was_; }
bool BackgroundWaits::active() { return background_waits; }

}  // namespace troupe::comm
