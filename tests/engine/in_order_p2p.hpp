// NCCL's point-to-point semantics, at their strictest, for the engine's pipeline messages on the CPU
// (comm/nccl/nccl_world.hpp): a communicator's operations run one after another on its one stream
// (here: one queue per rank, only its head can run); a send and a recv match when both are at the
// heads of their ranks' queues (a send completes only once the peer's recv runs: no buffering); and
// messages between two ranks match in issue order whatever their tags. A matched pair whose tags or
// sizes differ is an ordering bug and fails both; queues that stop moving for `stall` are a deadlock
// and fail every queued operation, naming the heads. The GPU's NCCL buffers small messages, so what
// completes here completes there. Collectives are not part of it (the pipeline group carries none).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"

namespace troupe::test {

class InOrderP2P {
 public:
  explicit InOrderP2P(int size, std::chrono::milliseconds stall = std::chrono::milliseconds(3000))
      : queues_(static_cast<size_t>(size)), stall_(stall) {
    matcher_ = std::thread([this] { match(); });
  }
  ~InOrderP2P() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    matcher_.join();
  }
  InOrderP2P(const InOrderP2P&) = delete;
  InOrderP2P& operator=(const InOrderP2P&) = delete;

  // The first failure (an ordering bug or a deadlock); empty while there is none.
  std::string failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  // Rank `rank`'s communicator of this group.
  std::unique_ptr<comm::Communicator> member(int rank);

 private:
  struct Done : comm::Work {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
    void finish(Status st) {
      {
        std::lock_guard<std::mutex> lock(mu);
        status = std::move(st);
        done = true;
      }
      completed(status.is_ok());
      cv.notify_all();
    }
    Status do_wait() override {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done; });
      return status;
    }
    bool do_test() override {
      std::lock_guard<std::mutex> lock(mu);
      return done;
    }
  };
  struct Op {
    bool send = false;
    int peer = 0;
    const void* from = nullptr;
    void* into = nullptr;
    size_t bytes = 0;
    uint64_t tag = 0;
    std::shared_ptr<Done> work;
  };
  class Member;

  comm::WorkPtr post(int rank, Op op) {
    auto work = std::make_shared<Done>();
    op.work = work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.empty()) {
        work->finish(Status::error(failure_));
        return work;
      }
      queues_[static_cast<size_t>(rank)].push_back(std::move(op));
      ++posted_;
    }
    cv_.notify_all();
    return work;
  }

  static std::string describe(int rank, const Op& op) {
    return "rank " + std::to_string(rank) + (op.send ? " sends to " : " receives from ") + std::to_string(op.peer) +
           " (tag " + std::to_string(op.tag) + ", " + std::to_string(op.bytes) + " bytes)";
  }

  void fail_all_locked(const std::string& why) {
    if (failure_.empty()) failure_ = why;
    for (auto& q : queues_) {
      for (Op& op : q) op.work->finish(Status::error(failure_));
      q.clear();
    }
  }

  void match() {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t seen = posted_;
    auto quiet_since = std::chrono::steady_clock::now();
    while (!stop_) {
      bool moved = false;
      for (size_t a = 0; a < queues_.size(); ++a) {
        if (queues_[a].empty()) continue;
        Op& head = queues_[a].front();
        auto& other = queues_[static_cast<size_t>(head.peer)];
        if (!head.send || other.empty()) continue;
        Op& peer = other.front();
        if (peer.send || peer.peer != static_cast<int>(a)) continue;  // the peer's stream is busy elsewhere
        if (peer.tag != head.tag || peer.bytes != head.bytes) {
          fail_all_locked("out of order: " + describe(static_cast<int>(a), head) + " met " +
                          describe(head.peer, peer) + " -- NCCL would deliver the wrong message");
          break;
        }
        std::memcpy(peer.into, head.from, head.bytes);
        head.work->finish(Status::ok());
        peer.work->finish(Status::ok());
        queues_[a].pop_front();
        other.pop_front();
        moved = true;
      }
      if (moved || posted_ != seen) {
        seen = posted_;
        quiet_since = std::chrono::steady_clock::now();
        continue;
      }
      bool pending = false;
      for (const auto& q : queues_) pending = pending || !q.empty();
      if (pending && std::chrono::steady_clock::now() - quiet_since > stall_) {
        std::string heads;
        for (size_t r = 0; r < queues_.size(); ++r)
          if (!queues_[r].empty()) heads += "; " + describe(static_cast<int>(r), queues_[r].front());
        fail_all_locked("deadlock: no message could move for " + std::to_string(stall_.count()) + " ms" + heads);
        continue;
      }
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Op>> queues_;
  uint64_t posted_ = 0;
  bool stop_ = false;
  std::string failure_;
  std::chrono::milliseconds stall_;
  std::thread matcher_;
};

class InOrderP2P::Member final : public comm::Communicator {
 public:
  Member(InOrderP2P* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->queues_.size()); }
  std::string backend() const override { return "in-order p2p (NCCL's semantics)"; }
  comm::WorkPtr send(const void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    Op op;
    op.send = true;
    op.peer = peer;
    op.from = buf;
    op.bytes = count * element_size(dtype);
    op.tag = tag;
    return group_->post(rank_, std::move(op));
  }
  comm::WorkPtr recv(void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    Op op;
    op.peer = peer;
    op.into = buf;
    op.bytes = count * element_size(dtype);
    op.tag = tag;
    return group_->post(rank_, std::move(op));
  }
  comm::WorkPtr all_reduce(void*, size_t, DType, comm::ReduceOp) override { return unsupported(); }
  comm::WorkPtr reduce_scatter_v(const void*, void*, std::span<const size_t>, DType, comm::ReduceOp) override {
    return unsupported();
  }
  comm::WorkPtr all_gather_v(const void*, void*, std::span<const size_t>, DType) override { return unsupported(); }
  comm::WorkPtr all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>, DType) override {
    return unsupported();
  }
  comm::WorkPtr broadcast(void*, size_t, DType, int) override { return unsupported(); }
  comm::WorkPtr barrier() override { return unsupported(); }

 private:
  static comm::WorkPtr unsupported() {
    return comm::completed_work(Status::error("the in-order p2p group carries point-to-point messages only"));
  }
  InOrderP2P* group_;
  int rank_;
};

inline std::unique_ptr<comm::Communicator> InOrderP2P::member(int rank) {
  return std::make_unique<Member>(this, rank);
}

}  // namespace troupe::test
