// Tags, groups, Work handles and the Op base class of the ucx backend (see comm/ucx/ucx_engine.hpp).
#include <algorithm>
#include <string>

#include "comm/ucx/ucx_engine.hpp"
#include "troupe/check.hpp"

namespace troupe::comm::ucx {

// ------------------------------------------------------------------------------------------------
// Tags, groups, work

uint64_t make_tag(uint32_t group_tag_id, uint64_t seq, uint32_t step, uint32_t chunk) {
  constexpr uint64_t chunk_mask = (1ull << kTagChunkBits) - 1;
  constexpr uint64_t step_mask = (1ull << kTagStepBits) - 1;
  constexpr uint64_t seq_mask = (1ull << kTagSeqBits) - 1;
  constexpr uint64_t group_mask = (1ull << kTagGroupBits) - 1;
  static_assert(kTagChunkBits + kTagStepBits + kTagSeqBits + kTagGroupBits == 62);
  return (3ull << 62) |
         ((group_tag_id & group_mask) << (kTagSeqBits + kTagStepBits + kTagChunkBits)) |
         ((seq & seq_mask) << (kTagStepBits + kTagChunkBits)) |
         ((step & step_mask) << kTagChunkBits) | (chunk & chunk_mask);
}

bool GroupInfo::contains(int world_rank) const {
  return std::find(members.begin(), members.end(), world_rank) != members.end();
}

Status WorkState::do_wait() {
  if (!done()) {
    if (std::shared_ptr<Engine> engine = engine_.lock()) engine->drive_until(*this);
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_.load(std::memory_order_relaxed); });
  return status_;
}

void WorkState::wait_for(std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return done_.load(std::memory_order_relaxed); });
}

void WorkState::complete(Status status) {
  completed(status.is_ok());
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

// ------------------------------------------------------------------------------------------------
// Op

Op::Op(Engine& engine, std::shared_ptr<const GroupInfo> group, uint64_t seq, std::string name)
    : engine_(engine),
      group_(std::move(group)),
      seq_(seq),
      name_(std::move(name)),
      work_(std::make_shared<WorkState>(engine.weak_from_this())) {}

void Op::begin() {
  for (int w : group_->members) {
    if (engine_.peer_failed(w) && involves(w)) {
      fail(Status::error(name_ + ": " + engine_.peer_status(w).message()));
      return;
    }
  }
  start();
}

Msg* Op::new_msg(int world_peer, bool is_send) {
  Msg* m;
  if (!free_msgs_.empty()) {
    m = free_msgs_.back();
    free_msgs_.pop_back();
  } else {
    m = &msgs_.emplace_back();
  }
  *m = Msg{};
  m->op = this;
  m->peer = world_peer;
  m->is_send = is_send;
  return m;
}

void Op::mark_posted(Msg* m) {
  m->pending = true;
  ++outstanding_;
}

Msg* Op::send_to(int peer, const void* buf, size_t bytes, uint32_t step, uint32_t chunk, int a,
                 int b) {
  Msg* m = new_msg(world_of(peer), true);
  m->expected = bytes;
  m->a = a;
  m->b = b;
  mark_posted(m);
  engine_.post_tag_send(m, buf, bytes, make_tag(group_->tag_id, seq_, step, chunk));
  return m;
}

Msg* Op::recv_from(int peer, void* buf, size_t bytes, uint32_t step, uint32_t chunk, int a, int b) {
  Msg* m = new_msg(world_of(peer), false);
  m->expected = bytes;
  m->a = a;
  m->b = b;
  mark_posted(m);
  engine_.post_tag_recv(m, buf, bytes, make_tag(group_->tag_id, seq_, step, chunk));
  return m;
}

Status Op::failure_for(const Msg& m) const {
  Status peer = engine_.peer_status(m.peer);
  if (!peer.is_ok()) return Status::error(name_ + ": " + peer.message());
  if (m.status == UCS_ERR_MESSAGE_TRUNCATED || (m.status == UCS_OK && m.length != m.expected))
    return Status::error(name_ + ": " + size_mismatch(m));
  return Status::error(name_ + ": communication with " + engine_.who(m.peer) + " failed (" +
                       ucs_status_string(m.status) +
                       "); the process may have died or the network failed");
}

std::string Op::size_mismatch(const Msg& m) const {
  const bool unknown = m.status == UCS_ERR_MESSAGE_TRUNCATED && m.length <= m.expected;
  return "rank " + std::to_string(m.peer) + " sent " +
         (unknown ? std::string("more than") : std::to_string(m.length)) + " bytes where " +
         std::to_string(m.expected) +
         " were expected: the ranks called this operation with different counts, dtypes or "
         "roots, or in a different order; every member must make the same calls";
}

void Op::deliver(Msg* m) {
  m->pending = false;
  --outstanding_;
  auto release = [&] { free_msgs_.push_back(m); };
  if (completed_ || failed_) {
    release();
    if (failed_ && !completed_ && outstanding_ == 0) {
      completed_ = true;
      work_->complete(failure_);
    }
    return;
  }
  if (m->status != UCS_OK || (!m->is_send && m->length != m->expected)) {
    Status s = failure_for(*m);
    release();
    fail(s);
    return;
  }
  on_complete(*m);
  release();
}

void Op::fail(const Status& status) {
  if (completed_ || failed_) return;
  failed_ = true;
  failure_ = status;
  fail_time_ = std::chrono::steady_clock::now();
  on_fail();
  for (Msg& m : msgs_) {
    if (m.pending && m.req != nullptr) engine_.cancel(&m);
  }
  if (outstanding_ == 0) {
    completed_ = true;
    work_->complete(failure_);
  }
}

bool Op::abandon_if_stale(std::chrono::steady_clock::time_point now,
                          std::chrono::milliseconds grace) {
  if (!failed_ || completed_) return false;
  bool only_failed_peers = true;  // their requests may never come back, even after a FORCE close
  for (const Msg& m : msgs_) {
    if (m.pending && !engine_.peer_failed(m.peer)) only_failed_peers = false;
  }
  if (only_failed_peers || now - fail_time_ > grace) {
    completed_ = true;
    work_->complete(failure_);
    return true;
  }
  return false;
}

void Op::succeed() {
  TROUPE_CHECK(outstanding_ == 0, "a ucx operation finished with requests still outstanding");
  if (completed_ || failed_) return;
  completed_ = true;
  work_->complete(Status::ok());
}

bool Op::waits_on(int world_rank) const {
  for (const Msg& m : msgs_) {
    if (m.pending && !m.is_send && m.peer == world_rank) return true;
  }
  return false;
}

}  // namespace troupe::comm::ucx
