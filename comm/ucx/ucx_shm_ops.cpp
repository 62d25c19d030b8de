// all_reduce, reduce_scatter_v and all_gather_v through shared memory, for groups whose members
// all live on this host (comm/ucx/ucx_shm.hpp has the memory layout, comm/ucx/ucx_world.hpp the design).
//
// Every block (rank j's part: the block it owns in all_reduce / reduce_scatter, its contribution in
// all_gather) is cut into the same number of chunks, as in the ring; chunk c of every block moves
// through lane L = c mod kShmLanes of each member's area. For
// chunk c, rank r
//   stages      reductions: copies chunk c of every block j != r of its input into piece j of its
//               lane and publishes in_tok; all_gather: copies chunk c of its own block into the
//               lane (and from there, still in cache, into its own place in recv), publishes out_tok;
//   reduces     (reductions) once every peer q published in_tok: folds chunk c of block r over the
//               ranks in order 0..p-1 (q's input from piece r of q's lane, its own from its buffer),
//               into piece r of its lane (all_reduce: publishes out_tok, copies it into its buffer)
//               or straight into recv (reduce_scatter), and acknowledges the input pieces (ack_in);
//   gathers     (all_reduce, all_gather) each peer's published result piece into its place in the
//               output and acknowledges it (ack_out).
// Up to kShmLanes chunks are in flight; a lane is written again only after every reader
// acknowledged its previous chunk (ShmChannel::lane_free), also across operations of the group.
// The operation is done once this rank holds its results: its buffers are no longer read by
// anybody (peers read the staged copies), so it does not wait for the last acknowledgements.
//
// Deadlock freedom: the lowest chunk not yet done everywhere needs only stages of itself (its lane
// is free: earlier chunks in that lane are done everywhere), so it always completes.
// Determinism: each block's chunk is reduced once, by its owner, in rank order, and copied bitwise
// to everyone.
#include <algorithm>
#include <cstring>

#include "comm/ucx/ucx_collectives.hpp"
#include "comm/ucx/ucx_detail.hpp"
#include "comm/ucx/ucx_reduce.hpp"
#include "comm/ucx/ucx_shm.hpp"
#include "troupe/check.hpp"

namespace troupe::comm::ucx {

namespace {

using detail::mix;

// Publishes this rank's area of the channel's group (at its first collective) and finds every
// member's. False while some member has not published yet, or with *error set (the directory is
// full); true once the channel's state is ready or fallback (some member has no room: all fall back
// alike).
bool resolve_channel(Engine& engine, ShmChannel& ch, const std::vector<int>& members, Status* error) {
  if (!ch.own_published) {
    auto area = engine.shm_own_area(ch.group_id, ch.layout.area_bytes());
    if (!area.is_ok()) {
      *error = area.status();
      return false;
    }
    ch.own_published = true;
    ch.areas[static_cast<size_t>(ch.rank)] = area.value();
    if (area.value() == nullptr) {
      ch.state = ShmChannel::State::fallback;
      return true;
    }
  }
  bool missing = false;
  for (size_t q = 0; q < members.size(); ++q) {
    if (ch.areas[q] != nullptr) continue;
    const int found = engine.shm_find_area(members[q], ch.group_id, &ch.areas[q]);
    if (found < 0) {
      ch.state = ShmChannel::State::fallback;
      return true;
    }
    missing = missing || found == 0;
  }
  if (missing) return false;  // that member has not reached its first collective of the group
  ch.state = ShmChannel::State::ready;
  return true;
}

// What the shared-memory collectives share: their place in the channel's queue (one runs at a time,
// in call order, the front one polled), resolving the channel at a group's first call, the fallback to
// the UCX algorithm of the same call (on every member alike), the chunk sequence numbers a call takes,
// and its window of chunks [lo, hi) staged and not yet done here.
class ShmQueuedOp : public Op {
 public:
  bool poll() final;

 protected:
  ShmQueuedOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name)
      : Op(engine, std::move(group), seq, std::move(name)), channel_(group_->channel) {}
  void enqueue();  // joins the channel's queue (from start())
  void leave_queue();
  void finish(const Status& status);
  void on_fail() override;
  // Member q runs another collective at this point: the channel is unusable from now on.
  void disagree(int q, const char* differences);
  virtual std::unique_ptr<Op> fallback() = 0;  // the UCX algorithm of this call
  virtual uint64_t sequence_span() const = 0;  // chunk sequence numbers the call takes (equal on all)
  virtual bool run() = 0;                       // stages, copies and finishes; true if it did something
  int lane_of(size_t c) const { return static_cast<int>(c % kShmLanes); }
  uint64_t token_of(size_t c) const { return channel_->token(seq0_ + c); }

  std::shared_ptr<ShmChannel> channel_;
  size_t nchunks_ = 1;
  bool queued_ = false;     // in the channel's queue
  bool begun_ = false;      // took its chunk sequence numbers
  uint64_t seq0_ = 0;
  size_t lo_ = 0, hi_ = 0;  // chunks [lo, hi) are staged and not yet done here
  WorkPtr child_;           // the UCX algorithm, when the group falls back
};

void ShmQueuedOp::enqueue() {
  ShmChannel& ch = *channel_;
  ch.queue.push_back(this);
  queued_ = true;
  if (ch.queue.front() == this) engine_.add_poller(this);
}

void ShmQueuedOp::leave_queue() {
  if (!queued_) return;
  queued_ = false;
  engine_.remove_poller(this);
  auto& q = channel_->queue;
  const bool was_front = !q.empty() && q.front() == this;
  q.erase(std::find(q.begin(), q.end(), this));
  if (was_front && !q.empty()) engine_.add_poller(q.front());
}

void ShmQueuedOp::on_fail() {
  // Stopped in the middle: the lanes are in an unknown state on some members.
  if (begun_ && child_ == nullptr && lo_ < nchunks_ && channel_->state == ShmChannel::State::ready) {
    channel_->state = ShmChannel::State::broken;
    channel_->broken_reason = "an earlier shared-memory collective of this group failed";
  }
  leave_queue();
}

void ShmQueuedOp::finish(const Status& status) {
  leave_queue();
  if (status.is_ok()) {
    succeed();
  } else {
    fail(status);
  }
}

void ShmQueuedOp::disagree(int q, const char* differences) {
  channel_->state = ShmChannel::State::broken;
  channel_->broken_reason = "the members disagreed on an earlier collective";
  finish(Status::error(name() + ": rank " + std::to_string(world_of(q)) + " runs another collective here (" +
                       differences + "): every member must make the same calls in the same order"));
}

bool ShmQueuedOp::poll() {
  if (failing() || !queued_) return false;
  if (child_ != nullptr) {
    if (!child_->test()) return false;
    finish(child_->wait());
    return true;
  }
  ShmChannel& ch = *channel_;
  bool did = false;
  if (ch.state == ShmChannel::State::unresolved) {
    Status error;
    const bool resolved = resolve_channel(engine_, ch, group_->members, &error);
    if (!error.is_ok()) finish(Status::error(name() + ": " + error.message()));
    if (!resolved || !error.is_ok()) return !queued_;
    did = true;
  }
  switch (ch.state) {
    case ShmChannel::State::fallback: {
      std::unique_ptr<Op> child = fallback();
      child_ = child->work();
      engine_.adopt(std::move(child));
      return true;
    }
    case ShmChannel::State::broken:
      finish(Status::error(name() + ": " + ch.broken_reason +
                           ", so its shared-memory channel is unusable; create the group again"));
      return true;
    default:
      break;
  }
  if (!begun_) {
    begun_ = true;
    seq0_ = ch.next_seq;
    ch.next_seq += sequence_span();
  }
  return run() || did;
}

class ShmCollectiveOp final : public ShmQueuedOp {
 public:
  ShmCollectiveOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name, RingMode mode,
                  const void* src, void* dst, std::vector<size_t> counts, DType dtype, ReduceOp op)
      : ShmQueuedOp(engine, std::move(group), seq, std::move(name)),
        mode_(mode),
        src_(static_cast<const char*>(src)),
        dst_(static_cast<char*>(dst)),
        counts_(std::move(counts)),
        dtype_(dtype),
        op_(op),
        esz_(dtype_size(dtype)) {
    p_ = group_->size();
    r_ = group_->rank;
    offsets_.resize(counts_.size());
    size_t off = 0, largest = 0;
    uint64_t sig = mix(static_cast<uint64_t>(mode_) + 1, static_cast<uint64_t>(dtype_));
    sig = mix(sig, static_cast<uint64_t>(op_));
    for (size_t i = 0; i < counts_.size(); ++i) {
      offsets_[i] = off;
      off += counts_[i];
      largest = std::max(largest, counts_[i]);
      sig = mix(sig, counts_[i]);
    }
    sig_ = sig | 1;
    // A reduction's chunk fills one piece; an all_gather chunk the whole lane.
    const AreaLayout& layout = channel_->layout;
    const size_t cap_bytes = mode_ == RingMode::all_gather ? layout.data_bytes() : layout.slot_bytes;
    const size_t cap = std::max<size_t>(1, cap_bytes / esz_);
    nchunks_ = std::max<size_t>(1, (largest + cap - 1) / cap);
    reduces_ = mode_ != RingMode::all_gather;
    gathers_ = mode_ != RingMode::reduce_scatter;
    // Streaming stores for outputs that will not stay in cache anyway. Not for all_reduce: its
    // output overwrites lines this rank just read (staging), where they cost more than they save.
    const size_t out_bytes =
        (mode_ == RingMode::reduce_scatter ? counts_[static_cast<size_t>(r_)] : off) * esz_;
    stream_ = mode_ != RingMode::all_reduce && engine_.stream_stores(out_bytes);
    in_place_ = mode_ == RingMode::all_gather && src_ == dst_at(r_, 0);
    copied_.assign(static_cast<size_t>(kShmLanes) * static_cast<size_t>(p_), 0);
  }

  bool waits_on(int world_rank) const override;

 private:
  struct Slot {
    bool reduced = false;
    int left = 0;  // result pieces still to gather
  };

  void start() override { enqueue(); }
  void on_complete(Msg&) override {}  // no UCX requests of its own

  size_t chunk_begin(int b, size_t c) const {  // within block b
    const size_t n = counts_[static_cast<size_t>(b)];
    return c * (n / nchunks_) + std::min(c, n % nchunks_);
  }
  size_t chunk_bytes(int b, size_t c) const {
    const size_t n = counts_[static_cast<size_t>(b)];
    return (n / nchunks_ + (c < n % nchunks_ ? 1 : 0)) * esz_;
  }
  // Chunk c of block b in the input (all_gather: src is this rank's block alone) and the output
  // (reduce_scatter: dst is this rank's block alone).
  const char* src_at(int b, size_t c) const {
    if (mode_ == RingMode::all_gather) return src_ + chunk_begin(b, c) * esz_;
    return src_ + (offsets_[static_cast<size_t>(b)] + chunk_begin(b, c)) * esz_;
  }
  char* dst_at(int b, size_t c) const {
    if (mode_ == RingMode::reduce_scatter) return dst_ + chunk_begin(b, c) * esz_;
    return dst_ + (offsets_[static_cast<size_t>(b)] + chunk_begin(b, c)) * esz_;
  }
  // Chunk c always uses lane c mod kShmLanes (lane_of), so back-to-back calls of a few chunks keep
  // reusing the same (cached) lanes instead of cycling through all of them.
  Slot& slot(size_t c) { return slots_[c % kShmLanes]; }
  uint8_t& copied(size_t c, int q) {
    return copied_[(c % kShmLanes) * static_cast<size_t>(p_) + static_cast<size_t>(q)];
  }

  std::unique_ptr<Op> fallback() override;
  uint64_t sequence_span() const override { return nchunks_; }
  bool run() override;
  void stage(size_t c, int lane);
  bool advance(size_t c);
  bool chunk_done(size_t c) { return (!reduces_ || slot(c).reduced) && (!gathers_ || slot(c).left == 0); }
  void mismatch(int q) { disagree(q, "different operation, counts, dtype or reduction"); }

  RingMode mode_;
  const char* src_;
  char* dst_;
  std::vector<size_t> counts_;
  std::vector<size_t> offsets_;
  DType dtype_;
  ReduceOp op_;
  size_t esz_;
  int p_ = 0, r_ = 0;
  uint64_t sig_ = 0;
  bool reduces_ = false, gathers_ = false, stream_ = false, in_place_ = false;
  Slot slots_[kShmLanes];
  std::vector<uint8_t> copied_;  // (lane, peer): its result piece is gathered
  std::vector<const void*> inputs_;
};

std::unique_ptr<Op> ShmCollectiveOp::fallback() {
  if (mode_ == RingMode::all_gather && group_->size() <= engine_.options().direct_max_ranks)
    return make_direct_all_gather(engine_, group_, seq_, name(), src_, dst_, counts_, esz_);
  return make_ring(engine_, group_, seq_, name(), mode_, src_, dst_, counts_, dtype_, op_);
}

bool ShmCollectiveOp::run() {
  ShmChannel& ch = *channel_;
  bool did = false;
  while (hi_ < nchunks_ && hi_ - lo_ < static_cast<size_t>(kShmLanes)) {
    const int lane = lane_of(hi_);
    if (!ch.lane_free(lane)) break;
    stage(hi_, lane);
    ++hi_;
    did = true;
  }
  for (size_t c = lo_; c < hi_ && queued_; ++c) did = advance(c) || did;
  if (!queued_) return true;  // failed (mismatch)
  while (lo_ < hi_ && chunk_done(lo_)) ++lo_;
  if (did) engine_.shm_notify(group_->members);
  if (lo_ == nchunks_) {
    finish(Status::ok());
    return true;
  }
  return did;
}

void ShmCollectiveOp::stage(size_t c, int lane) {
  ShmChannel& ch = *channel_;
  const uint64_t tok = token_of(c);
  LaneHead* h = ch.head(r_, lane);
  Slot& s = slot(c);
  s = Slot{};
  s.left = gathers_ ? p_ - 1 : 0;
  std::fill_n(copied_.begin() + static_cast<std::ptrdiff_t>(lane) * p_, p_, uint8_t{0});
  if (mode_ == RingMode::all_gather) {
    const size_t n = chunk_bytes(r_, c);
    char* piece = ch.piece(r_, lane, 0);
    copy_bytes(piece, src_at(r_, c), n, false);
    h->sig.store(sig_, std::memory_order_relaxed);
    h->out_tok.store(tok, std::memory_order_release);
    ch.lanes[lane] = ShmChannel::LaneUse{tok, false, true};
    if (!in_place_) copy_bytes(dst_at(r_, c), piece, n, stream_);  // own place, from cache
    return;
  }
  for (int j = 0; j < p_; ++j) {
    if (j != r_) copy_bytes(ch.piece(r_, lane, j), src_at(j, c), chunk_bytes(j, c), false);
  }
  h->sig.store(sig_, std::memory_order_relaxed);
  h->in_tok.store(tok, std::memory_order_release);
  ch.lanes[lane] = ShmChannel::LaneUse{tok, true, mode_ == RingMode::all_reduce};
}

bool ShmCollectiveOp::advance(size_t c) {
  ShmChannel& ch = *channel_;
  const int lane = lane_of(c);
  const uint64_t tok = token_of(c);
  Slot& s = slot(c);
  bool did = false;
  if (reduces_ && !s.reduced) {
    bool ready = true;
    for (int q = 0; q < p_ && ready; ++q) {
      if (q == r_) continue;
      const LaneHead* h = ch.head(q, lane);
      if (h->in_tok.load(std::memory_order_acquire) != tok) {
        ready = false;
      } else if (h->sig.load(std::memory_order_relaxed) != sig_) {
        mismatch(q);
        return true;
      }
    }
    if (ready) {
      inputs_.resize(static_cast<size_t>(p_));
      for (int q = 0; q < p_; ++q)
        inputs_[static_cast<size_t>(q)] = q == r_ ? src_at(r_, c) : ch.piece(q, lane, r_);
      const size_t n = chunk_bytes(r_, c) / esz_;
      if (mode_ == RingMode::all_reduce) {
        char* out = ch.piece(r_, lane, r_);
        reduce_many(out, inputs_.data(), p_, n, dtype_, op_, false);
        ch.head(r_, lane)->out_tok.store(tok, std::memory_order_release);
        for (int q = 0; q < p_; ++q) {
          if (q != r_) ch.ack_in(q, lane, r_)->v.store(tok, std::memory_order_release);
        }
        copy_bytes(dst_at(r_, c), out, n * esz_, stream_);
      } else {
        reduce_many(dst_at(r_, c), inputs_.data(), p_, n, dtype_, op_, stream_);
        for (int q = 0; q < p_; ++q) {
          if (q != r_) ch.ack_in(q, lane, r_)->v.store(tok, std::memory_order_release);
        }
      }
      s.reduced = true;
      did = true;
    }
  }
  if (gathers_ && s.left > 0) {
    for (int i = 1; i < p_; ++i) {
      const int q = (r_ + i) % p_;
      uint8_t& got = copied(c, q);
      if (got) continue;
      const LaneHead* h = ch.head(q, lane);
      if (h->out_tok.load(std::memory_order_acquire) != tok) continue;
      if (h->sig.load(std::memory_order_relaxed) != sig_) {
        mismatch(q);
        return true;
      }
      const char* from = ch.piece(q, lane, mode_ == RingMode::all_gather ? 0 : q);
      copy_bytes(dst_at(q, c), from, chunk_bytes(q, c), stream_);
      ch.ack_out(q, lane, r_)->v.store(tok, std::memory_order_release);
      got = 1;
      --s.left;
      did = true;
    }
  }
  return did;
}

bool ShmCollectiveOp::waits_on(int world_rank) const {
  // Called when world_rank departed (destroyed its world): what it published stays readable in
  // its segment, so this operation is stuck only if it needs something it never published.
  if (!queued_ || child_ != nullptr) return Op::waits_on(world_rank);
  int q = -1;
  for (int i = 0; i < p_; ++i) {
    if (world_of(i) == world_rank) q = i;
  }
  if (q < 0 || q == r_) return false;
  const ShmChannel& ch = *channel_;
  if (!begun_ || ch.areas[static_cast<size_t>(q)] == nullptr) return true;
  if (nchunks_ > lo_ + kShmLanes) return true;  // q cannot have staged those yet
  for (size_t c = lo_; c < nchunks_; ++c) {
    const int lane = lane_of(c);
    const uint64_t tok = token_of(c);
    const LaneHead* h = ch.head(q, lane);
    const Slot& s = slots_[c % kShmLanes];
    const bool staged = c < hi_;
    if (reduces_ && (!staged || !s.reduced) && h->in_tok.load(std::memory_order_acquire) != tok)
      return true;
    if (gathers_ && h->out_tok.load(std::memory_order_acquire) != tok &&
        (!staged || !copied_[(c % kShmLanes) * static_cast<size_t>(p_) + static_cast<size_t>(q)]))
      return true;
  }
  return false;
}

// all_to_all_v through shared memory. Rank r cuts its block for each peer j (send_counts[j]
// elements) into chunks of cap = slot_bytes - kA2aHeader bytes; chunk c of every block goes into
// piece j of r's lane c mod kShmLanes behind a header holding the block's whole byte length (read
// from chunk 0, the one chunk every pair moves), and
// peer j copies piece r of r's lane into its recv block and acknowledges it (ack_in). A pair moves
// max(1, ceil(bytes / cap)) chunks: an empty block still moves its header, so every reader learns
// what every writer sends. Before reusing a lane the writer waits only for the readers its chunk held
// something for (LaneUse::readers). Ranks cut different numbers of chunks, so each call takes a fixed
// stride of the channel's chunk sequence (kA2aStride), the same on every member.
// A reader whose recv_counts[q] disagree with q's send_counts[r] learns it from the header: it still
// consumes and acknowledges every chunk q sends, copies no more than its block holds, and fails the
// call naming both counts, so nobody hangs and the channel stays usable.
// The call is done here once this rank holds its results and staged all its chunks: what peers still
// read stays in its lanes (a later call reuses a lane only after its readers acknowledged it).
constexpr size_t kA2aHeader = 64;  // a piece's first bytes: the block's byte length (u64), then padding
constexpr uint64_t kA2aStride = uint64_t{1} << 32;

class ShmAllToAllOp final : public ShmQueuedOp {
 public:
  ShmAllToAllOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name, const void* send,
                std::vector<size_t> send_counts, void* recv, std::vector<size_t> recv_counts, size_t esz)
      : ShmQueuedOp(engine, std::move(group), seq, std::move(name)),
        send_(static_cast<const char*>(send)),
        recv_(static_cast<char*>(recv)),
        send_counts_(std::move(send_counts)),
        recv_counts_(std::move(recv_counts)),
        esz_(esz) {
    p_ = group_->size();
    r_ = group_->rank;
    cap_ = channel_->layout.slot_bytes - kA2aHeader;
    send_off_.assign(static_cast<size_t>(p_), 0);
    recv_off_.assign(static_cast<size_t>(p_), 0);
    for (int j = 1; j < p_; ++j) {
      send_off_[j] = send_off_[j - 1] + send_counts_[j - 1] * esz_;
      recv_off_[j] = recv_off_[j - 1] + recv_counts_[j - 1] * esz_;
    }
    need_.assign(static_cast<size_t>(p_), 0);
    sent_.assign(static_cast<size_t>(p_), 0);
    known_.assign(static_cast<size_t>(p_), 0);
    for (int j = 0; j < p_; ++j) {
      if (j == r_) continue;
      send_chunks_ = std::max(send_chunks_, pair_chunks(send_counts_[j] * esz_));
      need_[j] = pair_chunks(recv_counts_[j] * esz_);
      nchunks_ = std::max(nchunks_, need_[j]);
    }
    nchunks_ = std::max(nchunks_, send_chunks_);
    sig_ = mix(0xa11702a11ull, esz_) | 1;  // the counts differ between ranks by design
    // Streaming stores into recv when it will not stay in cache anyway (as the other collectives).
    stream_ = engine_.stream_stores(recv_off_.back() + recv_counts_.back() * esz_);
    copied_.assign(static_cast<size_t>(kShmLanes) * static_cast<size_t>(p_), 0);
  }

  bool waits_on(int world_rank) const override;

 private:
  void start() override;
  void on_complete(Msg&) override {}

  size_t pair_chunks(size_t bytes) const { return std::max<size_t>(1, (bytes + cap_ - 1) / cap_); }
  uint8_t& copied(size_t c, int q) {
    return copied_[(c % kShmLanes) * static_cast<size_t>(p_) + static_cast<size_t>(q)];
  }
  uint8_t copied(size_t c, int q) const {
    return copied_[(c % kShmLanes) * static_cast<size_t>(p_) + static_cast<size_t>(q)];
  }
  std::unique_ptr<Op> fallback() override {
    return make_pairwise_all_to_all(engine_, group_, seq_, name(), send_, send_counts_, recv_, recv_counts_, esz_);
  }
  uint64_t sequence_span() const override { return kA2aStride; }
  bool run() override;
  void stage(size_t c, int lane);
  bool advance(size_t c);
  bool chunk_done(size_t c) const {
    for (int q = 0; q < p_; ++q)
      if (q != r_ && (!known_[q] || (c < need_[q] && !copied(c, q)))) return false;
    return true;
  }
  std::string count_mismatch(int q) const;

  const char* send_;
  char* recv_;
  std::vector<size_t> send_counts_, recv_counts_;
  std::vector<size_t> send_off_, recv_off_;  // bytes
  size_t esz_;
  size_t cap_ = 0;
  int p_ = 0, r_ = 0;
  uint64_t sig_ = 0;
  bool stream_ = false;
  size_t send_chunks_ = 0;  // chunks this rank stages (its longest block's); nchunks_: the chunks this
                            // call goes through (grows if a writer sends more than expected)
  std::vector<size_t> need_;    // per peer: chunks to read from it (from its header once known)
  std::vector<size_t> sent_;    // per peer: the bytes its header says it sends
  std::vector<uint8_t> known_;  // per peer: its header was read
  std::vector<int> mismatched_;  // peers whose block is not the size recv_counts say
  bool own_mismatch_ = false;
  std::vector<uint8_t> copied_;
};

void ShmAllToAllOp::start() {
  // This rank's own block, while the peers copy.
  const size_t own = send_counts_[static_cast<size_t>(r_)] * esz_;
  const size_t room = recv_counts_[static_cast<size_t>(r_)] * esz_;
  own_mismatch_ = own != room;
  if (std::min(own, room) != 0)
    std::memcpy(recv_ + recv_off_[static_cast<size_t>(r_)], send_ + send_off_[static_cast<size_t>(r_)],
                std::min(own, room));
  enqueue();
}

std::string ShmAllToAllOp::count_mismatch(int q) const {
  const std::string rule = "; recv_counts[p] must equal what group rank p passes as send_counts[rank()]";
  if (q == r_) {
    return "this rank's send_counts[" + std::to_string(r_) + "] is " + std::to_string(send_counts_[q]) +
           " but its recv_counts[" + std::to_string(r_) + "] is " + std::to_string(recv_counts_[q]) + rule;
  }
  const size_t sent = sent_[static_cast<size_t>(q)];
  const std::string elements = sent % esz_ == 0 ? std::to_string(sent / esz_) : std::to_string(sent) + " bytes' worth of";
  return "rank " + std::to_string(world_of(q)) + " (group rank " + std::to_string(q) + ") sends " + elements +
         " elements to this rank (group rank " + std::to_string(r_) + "), whose recv_counts[" + std::to_string(q) +
         "] is " + std::to_string(recv_counts_[static_cast<size_t>(q)]) + rule;
}

bool ShmAllToAllOp::run() {
  ShmChannel& ch = *channel_;
  bool did = false;
  while (hi_ < nchunks_ && hi_ - lo_ < static_cast<size_t>(kShmLanes)) {
    const int lane = lane_of(hi_);
    if (hi_ < send_chunks_ && !ch.lane_free(lane)) break;
    std::fill_n(copied_.begin() + static_cast<std::ptrdiff_t>(lane) * p_, p_, uint8_t{0});
    if (hi_ < send_chunks_) stage(hi_, lane);
    ++hi_;
    did = true;
  }
  for (size_t c = lo_; c < hi_ && queued_; ++c) did = advance(c) || did;
  if (!queued_) return true;  // failed (another collective on the channel)
  while (lo_ < hi_ && chunk_done(lo_)) ++lo_;
  if (did) engine_.shm_notify(group_->members);
  if (lo_ == nchunks_ && hi_ >= send_chunks_) {
    if (own_mismatch_) {
      finish(Status::error(name() + ": " + count_mismatch(r_)));
    } else if (!mismatched_.empty()) {
      finish(Status::error(name() + ": " + count_mismatch(mismatched_.front())));
    } else {
      finish(Status::ok());
    }
    return true;
  }
  return did;
}

void ShmAllToAllOp::stage(size_t c, int lane) {
  ShmChannel& ch = *channel_;
  uint64_t readers = 0;
  for (int j = 0; j < p_; ++j) {
    const size_t total = send_counts_[static_cast<size_t>(j)] * esz_;
    if (j == r_ || c >= pair_chunks(total)) continue;
    char* piece = ch.piece(r_, lane, j);
    const uint64_t header = total;
    std::memcpy(piece, &header, sizeof header);
    const size_t begin = c * cap_;
    if (begin < total)
      copy_bytes(piece + kA2aHeader, send_ + send_off_[static_cast<size_t>(j)] + begin,
                 std::min(cap_, total - begin), false);
    readers |= uint64_t{1} << j;
  }
  const uint64_t tok = token_of(c);
  LaneHead* h = ch.head(r_, lane);
  h->sig.store(sig_, std::memory_order_relaxed);
  h->in_tok.store(tok, std::memory_order_release);
  ch.lanes[lane] = ShmChannel::LaneUse{tok, true, false, readers};
}

bool ShmAllToAllOp::advance(size_t c) {
  ShmChannel& ch = *channel_;
  const int lane = lane_of(c);
  const uint64_t tok = token_of(c);
  bool did = false;
  for (int i = 1; i < p_; ++i) {
    const int q = (r_ + i) % p_;
    const auto qs = static_cast<size_t>(q);
    // Only chunk 0 is written for every reader: a later chunk's piece for this rank may be another
    // call's, so nothing is read from it before chunk 0 told this pair's length.
    if (known_[qs] ? c >= need_[qs] : c != 0) continue;
    if (copied(c, q)) continue;
    const LaneHead* h = ch.head(q, lane);
    if (h->in_tok.load(std::memory_order_acquire) != tok) continue;
    if (h->sig.load(std::memory_order_relaxed) != sig_) {
      disagree(q, "different operation or dtype");
      return true;
    }
    const char* piece = ch.piece(q, lane, r_);
    uint64_t total = 0;
    std::memcpy(&total, piece, sizeof total);
    if (!known_[qs]) {  // chunk 0's header settles the pair
      if (total / cap_ >= kA2aStride - 1) {  // more chunks than a call's sequence span holds: not a length
        channel_->state = ShmChannel::State::broken;
        channel_->broken_reason = "a member published a block length no call can have";
        finish(Status::error(name() + ": rank " + std::to_string(world_of(q)) + " published a block of " +
                             std::to_string(total) + " bytes for this rank, more than a call can move"));
        return true;
      }
      known_[qs] = 1;
      sent_[qs] = total;
      need_[qs] = pair_chunks(total);
      nchunks_ = std::max(nchunks_, need_[qs]);
      if (total != recv_counts_[qs] * esz_) mismatched_.push_back(q);
    }
    const size_t room = recv_counts_[qs] * esz_, begin = c * cap_;
    if (begin < total && begin < room)
      copy_bytes(recv_ + recv_off_[qs] + begin, piece + kA2aHeader, std::min({cap_, total - begin, room - begin}),
                 stream_);
    ch.ack_in(q, lane, r_)->v.store(tok, std::memory_order_release);
    copied(c, q) = 1;
    did = true;
  }
  return did;
}

bool ShmAllToAllOp::waits_on(int world_rank) const {
  // world_rank departed: what it published stays readable in its segment, so this call is stuck
  // only if it needs a chunk that rank never staged.
  if (!queued_ || child_ != nullptr) return Op::waits_on(world_rank);
  int q = -1;
  for (int i = 0; i < p_; ++i)
    if (world_of(i) == world_rank) q = i;
  if (q < 0 || q == r_) return false;
  const ShmChannel& ch = *channel_;
  if (!begun_ || ch.areas[static_cast<size_t>(q)] == nullptr) return true;
  const auto qs = static_cast<size_t>(q);
  for (size_t c = lo_; c < nchunks_; ++c) {
    if (known_[qs] && c >= need_[qs]) continue;
    if (c < hi_ && copied(c, q)) continue;
    if (c >= lo_ + kShmLanes) return true;  // q cannot have staged it yet
    if (ch.head(q, lane_of(c))->in_tok.load(std::memory_order_acquire) != token_of(c)) return true;
  }
  return false;
}

}  // namespace

std::unique_ptr<Op> make_shm_collective(Engine& engine, GroupPtr group, uint64_t seq,
                                        std::string name, RingMode mode, const void* src,
                                        void* dst, std::vector<size_t> counts, DType dtype,
                                        ReduceOp op) {
  TROUPE_CHECK(group->channel != nullptr && counts.size() == static_cast<size_t>(group->size()),
               "make_shm_collective needs a group with a shared-memory channel and one count per "
               "rank");
  return std::make_unique<ShmCollectiveOp>(engine, std::move(group), seq, std::move(name), mode,
                                           src, dst, std::move(counts), dtype, op);
}

std::unique_ptr<Op> make_shm_all_to_all(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                        const void* send, std::vector<size_t> send_counts, void* recv,
                                        std::vector<size_t> recv_counts, size_t esz) {
  TROUPE_CHECK(group->channel != nullptr && send_counts.size() == static_cast<size_t>(group->size()) &&
                   recv_counts.size() == send_counts.size() && group->size() <= 64,
               "make_shm_all_to_all needs a group of at most 64 ranks with a shared-memory channel and one "
               "count per rank each way");
  return std::make_unique<ShmAllToAllOp>(engine, std::move(group), seq, std::move(name), send,
                                         std::move(send_counts), recv, std::move(recv_counts), esz);
}

}  // namespace troupe::comm::ucx
