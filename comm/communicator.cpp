// The backend-independent parts of comm/communicator.hpp and comm/world.hpp.
#include "comm/communicator.hpp"

#include <numeric>

#include "comm/world.hpp"

namespace troupe::comm {

namespace {

class CompletedWork final : public Work {
 public:
  explicit CompletedWork(Status status) : status_(std::move(status)) {}
  Status wait() override { return status_; }
  bool test() override { return true; }

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

Result<std::unique_ptr<Communicator>> CommWorld::everyone() {
  std::vector<int> members(static_cast<size_t>(size()));
  std::iota(members.begin(), members.end(), 0);
  return group(members);
}

}  // namespace troupe::comm
