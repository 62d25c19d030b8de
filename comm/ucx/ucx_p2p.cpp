// Tagged send/recv of the ucx backend: one active message per send, with a header naming the group,
// the sender, the user's tag and a per-(group, sender, receiver) sequence number. The receiver puts
// arrivals back in send order and matches them against posted receives by tag, first come first
// served, like MPI. Eager data waits in UCX's buffer (UCP_AM_FLAG_PERSISTENT_DATA) until a receive
// copies it out; rendezvous data stays with the sender until a receive pulls it into the user's
// buffer.
#include <cstring>

#include "comm/ucx/ucx_engine.hpp"

namespace troupe::comm::ucx {

namespace {

constexpr uint32_t kP2PMagic = 0x74703270;  // "tp2p"

class P2PSendOp final : public Op {
 public:
  P2PSendOp(Engine& engine, std::shared_ptr<const GroupInfo> group, uint64_t seq, std::string name,
            const void* buf, size_t bytes, int peer_world, uint64_t tag)
      : Op(engine, std::move(group), seq, std::move(name)),
        buf_(buf),
        bytes_(bytes),
        peer_(peer_world),
        tag_(tag) {}

  bool involves(int world_rank) const override { return world_rank == peer_; }

 private:
  void start() override {
    header_ = P2PHeader{group_->id, tag_,           engine_.next_send_seq(group_->id, peer_),
                        bytes_,     engine_.rank(), kP2PMagic};
    if (peer_ == engine_.rank()) {
      // To self: the message is copied into an arrival at once, so the send completes now.
      Arrival a;
      a.hdr = header_;
      a.copy.assign(static_cast<const char*>(buf_), static_cast<const char*>(buf_) + bytes_);
      engine_.add_arrival(std::move(a));
      succeed();
      return;
    }
    Msg* m = new_msg(peer_, true);
    m->expected = bytes_;
    mark_posted(m);
    engine_.post_am_send(m, header_, buf_, bytes_);
  }
  void on_complete(Msg&) override { succeed(); }

  const void* buf_;
  size_t bytes_;
  int peer_;
  uint64_t tag_;
  P2PHeader header_{};  // UCX reads it until the send completes
};

}  // namespace

class P2PRecvOp final : public Op {
 public:
  P2PRecvOp(Engine& engine, std::shared_ptr<const GroupInfo> group, uint64_t seq, std::string name,
            void* buf, size_t bytes, int peer_world, uint64_t tag)
      : Op(engine, std::move(group), seq, std::move(name)),
        buf_(buf),
        bytes_(bytes),
        peer_(peer_world),
        tag_(tag) {}

  uint64_t tag() const { return tag_; }
  bool involves(int world_rank) const override { return world_rank == peer_; }
  bool waits_on(int world_rank) const override {
    return world_rank == peer_ && (!matched_ || Op::waits_on(world_rank));
  }

  // The engine found this receive's message; `a` is consumed.
  void matched(Arrival& a) {
    matched_ = true;
    if (a.hdr.bytes != bytes_) {
      engine_.release_arrival(a);
      fail(Status::error(name() + ": rank " + std::to_string(peer_) + " sent " +
                         std::to_string(a.hdr.bytes) +
                         " bytes with this tag but the receive expects " + std::to_string(bytes_) +
                         "; send and recv must use the same count and dtype"));
      return;
    }
    if (a.rndv) {
      Msg* m = new_msg(peer_, false);
      m->expected = bytes_;
      mark_posted(m);
      void* desc = a.data;
      a.data = nullptr;  // ucp_am_recv_data_nbx owns it now
      engine_.post_am_recv_data(m, desc, buf_, bytes_);
      return;
    }
    if (bytes_ != 0) std::memcpy(buf_, a.ucx_owned ? a.data : a.copy.data(), bytes_);
    engine_.release_arrival(a);
    succeed();
  }

 private:
  void start() override { engine_.p2p_post(this, group_->id, peer_); }
  void on_complete(Msg&) override { succeed(); }
  void on_fail() override {
    if (!matched_) engine_.p2p_unpost(this, group_->id, peer_);
  }

  void* buf_;
  size_t bytes_;
  int peer_;
  uint64_t tag_;
  bool matched_ = false;
};

std::unique_ptr<Op> make_p2p_send(Engine& engine, std::shared_ptr<const GroupInfo> group,
                                  uint64_t seq, const void* buf, size_t bytes, int peer,
                                  uint64_t tag) {
  const int w = group->members[static_cast<size_t>(peer)];
  std::string name = "ucx send to rank " + std::to_string(w) + " (tag " + std::to_string(tag) + ")";
  return std::make_unique<P2PSendOp>(engine, std::move(group), seq, std::move(name), buf, bytes, w,
                                     tag);
}

std::unique_ptr<Op> make_p2p_recv(Engine& engine, std::shared_ptr<const GroupInfo> group,
                                  uint64_t seq, void* buf, size_t bytes, int peer, uint64_t tag) {
  const int w = group->members[static_cast<size_t>(peer)];
  std::string name =
      "ucx recv from rank " + std::to_string(w) + " (tag " + std::to_string(tag) + ")";
  return std::make_unique<P2PRecvOp>(engine, std::move(group), seq, std::move(name), buf, bytes, w,
                                     tag);
}

uint64_t Engine::next_send_seq(uint64_t group_id, int dst) {
  return send_seqs_[{group_id, dst}]++;
}

void Engine::release_arrival(Arrival& a) {
  if (a.ucx_owned && a.data != nullptr) ucp_am_data_release(worker_, a.data);
  a.data = nullptr;
  a.ucx_owned = false;
  a.copy.clear();
}

void Engine::p2p_post(P2PRecvOp* op, uint64_t group_id, int src) {
  P2PChannel& ch = channels_[{group_id, src}];
  for (auto it = ch.unexpected.begin(); it != ch.unexpected.end(); ++it) {
    if (it->hdr.tag == op->tag()) {
      Arrival a = std::move(*it);
      ch.unexpected.erase(it);
      op->matched(a);
      return;
    }
  }
  if (src != rank_ && peer_state_[static_cast<size_t>(src)] != PeerState::alive) {
    op->fail(Status::error(op->name() + ": " + peer_status(src).message()));
    return;
  }
  ch.posted.push_back(op);
}

void Engine::p2p_unpost(P2PRecvOp* op, uint64_t group_id, int src) {
  auto it = channels_.find({group_id, src});
  if (it == channels_.end()) return;
  auto& posted = it->second.posted;
  for (auto p = posted.begin(); p != posted.end(); ++p) {
    if (*p == op) {
      posted.erase(p);
      return;
    }
  }
}

ucs_status_t Engine::am_p2p_cb(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
  auto* e = static_cast<Engine*>(arg);
  Arrival a;
  if (header_length != sizeof(P2PHeader)) return UCS_OK;  // not ours; drop
  std::memcpy(&a.hdr, header, sizeof a.hdr);
  if (a.hdr.magic != kP2PMagic || a.hdr.src < 0 || a.hdr.src >= e->size_) return UCS_OK;
  ucs_status_t keep = UCS_OK;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    a.rndv = true;
    a.ucx_owned = true;
    a.data = data;
    keep = UCS_INPROGRESS;
  } else if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) && data != nullptr) {
    a.ucx_owned = true;
    a.data = data;
    keep = UCS_INPROGRESS;
  } else if (length != 0) {
    a.copy.assign(static_cast<const char*>(data), static_cast<const char*>(data) + length);
  }
  // Matching happens after ucp_worker_progress returns (process_arrivals), never inside UCX.
  e->arrivals_.push_back(std::move(a));
  return keep;
}

void Engine::process_arrivals() {
  auto deliver = [&](P2PChannel& ch, Arrival&& a) {
    ++ch.next_seq;
    for (auto it = ch.posted.begin(); it != ch.posted.end(); ++it) {
      if ((*it)->tag() == a.hdr.tag) {
        P2PRecvOp* op = *it;
        ch.posted.erase(it);
        op->matched(a);
        reap(op);
        return;
      }
    }
    ch.unexpected.push_back(std::move(a));
  };
  std::vector<Arrival> batch;
  batch.swap(arrivals_);
  for (Arrival& a : batch) {
    P2PChannel& ch = channels_[{a.hdr.group_id, a.hdr.src}];
    if (a.hdr.seq != ch.next_seq) {
      const uint64_t seq = a.hdr.seq;
      ch.early.emplace(seq, std::move(a));
      continue;
    }
    deliver(ch, std::move(a));
    while (!ch.early.empty() && ch.early.begin()->first == ch.next_seq) {
      auto node = ch.early.extract(ch.early.begin());
      deliver(ch, std::move(node.mapped()));
    }
  }
}

}  // namespace troupe::comm::ucx
