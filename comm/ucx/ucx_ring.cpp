// Bandwidth-optimal algorithms of the ucx backend: the chunked ring (all_reduce, reduce_scatter_v,
// all_gather_v) and the chunked chain broadcast.
//
// Ring, with p ranks, left = r-1, right = r+1 (mod p). Steps k = 0 .. S-1 where S = (p-1) for the
// reduce-scatter half plus (p-1) for the all-gather half:
//   reduce-scatter step k: send block r-k-1 (own data at k = 0, else what step k-1 reduced);
//     receive block r-k-2 into a scratch slot and reduce it with this rank's own data as
//     op(incoming, own). The last step leaves block r complete.
//   all-gather step t: send block r-t (own final block at t = 0), receive block r-t-1 in place.
//     (all_gather alone: step 0 sends the own block from `send`; start() copies it into place.)
// Every block is cut into the same number of chunks (largest block / chunk size, rounded up), and
// each chunk walks the S steps on its own "lane"; up to chunks_in_flight lanes run at once, so the
// copy of one chunk overlaps the reduction of another. Within a lane at most two receives are
// posted (steps k and k+1), so the next message is already matched while the current one is
// reduced. Scratch slots (3 per lane) come from the engine's pool; in reduce_scatter mode a slot
// that was reduced into is also the source of the next send, so it is reused only after that send
// completed.
//
// Deadlock freedom: all ranks start chunks in the same order, and a lane finishes only when its
// chunk finished here; so the lowest unfinished chunk is active on every rank that has not finished
// it.
#include <algorithm>
#include <cstring>

#include "comm/ucx/ucx_collectives.hpp"
#include "comm/ucx/ucx_reduce.hpp"
#include "troupe/check.hpp"

namespace troupe::comm::ucx {

namespace {

constexpr int kSlots = 3;

class RingOp final : public Op {
 public:
  RingOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name, RingMode mode,
         const void* src, void* dst, std::vector<size_t> counts, DType dtype, ReduceOp op)
      : Op(engine, std::move(group), seq, std::move(name)),
        mode_(mode),
        src_(static_cast<const char*>(src)),
        dst_(static_cast<char*>(dst)),
        counts_(std::move(counts)),
        dtype_(dtype),
        op_(op),
        esz_(dtype_size(dtype)) {
    p_ = group_->size();
    r_ = group_->rank;
    left_ = (r_ + p_ - 1) % p_;
    right_ = (r_ + 1) % p_;
    offsets_.resize(counts_.size());
    size_t off = 0, largest = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      offsets_[i] = off;
      off += counts_[i];
      largest = std::max(largest, counts_[i]);
    }
    // Chunks of at most chunk_bytes (4x that without reductions: nothing has to stay in cache).
    // Splitting blocks further for mid-sized messages measured slower: more messages, each a
    // rendezvous round trip, cost more than the extra overlap gains when ranks share cores.
    const size_t chunk_bytes =
        engine_.options().chunk_bytes * (mode_ == RingMode::all_gather ? 4 : 1);
    const size_t chunk_elems = std::max<size_t>(1, chunk_bytes / esz_);
    nchunks_ = std::max<size_t>(1, (largest + chunk_elems - 1) / chunk_elems);
    s_rs_ = mode_ == RingMode::all_gather ? 0 : p_ - 1;
    s_ = s_rs_ + (mode_ == RingMode::reduce_scatter ? 0 : p_ - 1);
  }

  ~RingOp() override {
    for (Lane& lane : lanes_) release_slots(lane);
  }

 private:
  struct Lane {
    size_t chunk = 0;
    bool active = false;
    int next_post = 0;                  // next step whose receive to post
    int processed = 0;                  // receives processed so far (steps 0 .. processed-1)
    int sends = 0;                      // sends outstanding
    bool received[2] = {false, false};  // receive of step k (slot k % 2) completed, not processed
    void* slot[kSlots] = {};
    int slot_busy[kSlots] = {};
  };

  int mod(int x) const { return ((x % p_) + p_) % p_; }
  int send_block(int k) const { return k < s_rs_ ? mod(r_ - k - 1) : mod(r_ - (k - s_rs_)); }
  int recv_block(int k) const { return k < s_rs_ ? mod(r_ - k - 2) : mod(r_ - (k - s_rs_) - 1); }

  // Chunk c of block b: elements [begin, begin + count) of the whole buffer's layout.
  size_t chunk_begin(int b, size_t c) const {
    const size_t n = counts_[static_cast<size_t>(b)];
    return offsets_[static_cast<size_t>(b)] + c * (n / nchunks_) + std::min(c, n % nchunks_);
  }
  size_t chunk_count(int b, size_t c) const {
    const size_t n = counts_[static_cast<size_t>(b)];
    return n / nchunks_ + (c < n % nchunks_ ? 1 : 0);
  }
  const char* src_at(int b, size_t c) const {
    if (mode_ == RingMode::all_gather)
      return src_ + (chunk_begin(b, c) - offsets_[static_cast<size_t>(b)]) * esz_;
    return src_ + chunk_begin(b, c) * esz_;
  }
  char* dst_at(int b, size_t c) const {
    if (mode_ == RingMode::reduce_scatter)
      return dst_ + (chunk_begin(b, c) - offsets_[static_cast<size_t>(b)]) * esz_;
    return dst_ + chunk_begin(b, c) * esz_;
  }

  void start() override {
    const size_t lanes =
        std::min<size_t>(static_cast<size_t>(engine_.options().chunks_in_flight), nchunks_);
    lanes_.resize(lanes);
    for (size_t i = 0; i < lanes; ++i) activate(static_cast<int>(i));
    if (mode_ == RingMode::all_gather) {  // this rank's own place, while the first steps run
      char* own = dst_ + offsets_[static_cast<size_t>(r_)] * esz_;
      const size_t own_bytes = counts_[static_cast<size_t>(r_)] * esz_;
      if (own != src_ && own_bytes != 0) std::memmove(own, src_, own_bytes);
    }
  }

  void activate(int li) {
    Lane& lane = lanes_[static_cast<size_t>(li)];
    void* slots[kSlots];
    std::copy(std::begin(lane.slot), std::end(lane.slot), slots);  // keep the lane's slots
    lane = Lane{};
    std::copy(std::begin(slots), std::end(slots), lane.slot);
    lane.chunk = next_chunk_++;
    lane.active = true;
    if (s_rs_ > 0) {
      for (void*& s : lane.slot) {
        if (s == nullptr) s = engine_.acquire_slot();
      }
    }
    advance(li);  // posts the first receives before the first send goes out
    post_send(li, 0);
  }

  void release_slots(Lane& lane) {
    for (void*& s : lane.slot) {
      if (s != nullptr) engine_.release_slot(s);
      s = nullptr;
    }
  }

  void post_recv(int li, int k) {
    Lane& lane = lanes_[static_cast<size_t>(li)];
    const int b = recv_block(k);
    const size_t bytes = chunk_count(b, lane.chunk) * esz_;
    void* target;
    if (k < s_rs_) {
      target = lane.slot[k % kSlots];
      ++lane.slot_busy[k % kSlots];
    } else {
      target = dst_at(b, lane.chunk);
    }
    recv_from(left_, target, bytes, static_cast<uint32_t>(k), static_cast<uint32_t>(lane.chunk), li,
              k);
  }

  void post_send(int li, int k) {
    Lane& lane = lanes_[static_cast<size_t>(li)];
    const int b = send_block(k);
    const size_t c = lane.chunk;
    const void* from;
    if (k < s_rs_) {
      if (k == 0) {
        from = src_at(b, c);
      } else if (mode_ == RingMode::all_reduce) {
        from = dst_at(b, c);  // reduced in place by step k-1
      } else {
        from = lane.slot[(k - 1) % kSlots];  // reduced into its slot by step k-1; busy until sent
      }
    } else if (k == s_rs_ && mode_ == RingMode::all_gather) {
      from = src_at(b, c);  // own block, straight from the caller's send buffer
    } else {
      from = dst_at(b, c);  // own final block (all_reduce, t = 0) or what step k-1 received
    }
    ++lane.sends;
    send_to(right_, from, chunk_count(b, c) * esz_, static_cast<uint32_t>(k),
            static_cast<uint32_t>(c), li, k);
  }

  // Step k's receive has landed: fold it in (reduce-scatter half).
  void process(Lane& lane, int k) {
    if (k >= s_rs_) return;
    const int b = recv_block(k);
    const size_t c = lane.chunk;
    const size_t n = chunk_count(b, c);
    void* in = lane.slot[k % kSlots];
    const char* own = src_at(b, c);
    if (k == s_rs_ - 1 || mode_ == RingMode::all_reduce) {
      // Final step (b == r) into the output, or all_reduce's in-place accumulation (own == dst_at).
      reduce(dst_at(b, c), in, own, n, dtype_, op_);
      --lane.slot_busy[k % kSlots];
    } else {
      reduce(in, in, own, n, dtype_,
             op_);  // the slot is sent next, and freed when that send is done
    }
  }

  void advance(int li) {
    Lane& lane = lanes_[static_cast<size_t>(li)];
    for (;;) {
      bool moved = false;
      while (lane.next_post < s_ && lane.next_post <= lane.processed + 1 &&
             (lane.next_post >= s_rs_ || lane.slot_busy[lane.next_post % kSlots] == 0)) {
        post_recv(li, lane.next_post++);
        moved = true;
      }
      if (lane.processed < lane.next_post && lane.received[lane.processed % 2]) {
        lane.received[lane.processed % 2] = false;
        process(lane, lane.processed);
        ++lane.processed;
        if (lane.processed < s_) post_send(li, lane.processed);
        moved = true;
      }
      if (!moved) break;
    }
  }

  void on_complete(Msg& m) override {
    const int li = m.a;
    const int k = m.b;
    Lane& lane = lanes_[static_cast<size_t>(li)];
    if (m.is_send) {
      --lane.sends;
      if (mode_ == RingMode::reduce_scatter && k >= 1 && k < s_rs_)
        --lane.slot_busy[(k - 1) % kSlots];
    } else {
      lane.received[k % 2] = true;
    }
    advance(li);
    if (lane.processed == s_ && lane.sends == 0) {
      lane.active = false;
      ++chunks_done_;
      if (next_chunk_ < nchunks_) {
        activate(li);
      } else if (chunks_done_ == nchunks_) {
        succeed();
      }
    }
  }

  RingMode mode_;
  const char* src_;
  char* dst_;
  std::vector<size_t> counts_;
  std::vector<size_t> offsets_;
  DType dtype_;
  ReduceOp op_;
  size_t esz_;
  int p_ = 0, r_ = 0, left_ = 0, right_ = 0;
  int s_rs_ = 0, s_ = 0;
  size_t nchunks_ = 1;
  size_t next_chunk_ = 0;
  size_t chunks_done_ = 0;
  std::vector<Lane> lanes_;
};

// Chain broadcast: root -> root+1 -> ... -> root-1, in chunks; each rank forwards a chunk as soon
// as it has it, up to chunks_in_flight chunks at a time. Every link carries the message once.
class ChainBroadcastOp final : public Op {
 public:
  ChainBroadcastOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name, void* buf,
                   size_t bytes, int root)
      : Op(engine, std::move(group), seq, std::move(name)),
        buf_(static_cast<char*>(buf)),
        bytes_(bytes) {
    const int p = group_->size();
    const int r = group_->rank;
    const int v = (r - root + p) % p;
    prev_rank_ = v == 0 ? -1 : (r + p - 1) % p;
    next_rank_ = v == p - 1 ? -1 : (r + 1) % p;
    // Chunks small enough that the pipeline fills (about 2p of them), but not below 64 KiB.
    size_t chunk = (bytes_ + 2 * static_cast<size_t>(p) - 1) / (2 * static_cast<size_t>(p));
    chunk = std::clamp<size_t>(chunk, 64 << 10,
                               std::max<size_t>(engine_.options().chunk_bytes, 64 << 10));
    chunk_ = chunk;
    nchunks_ = std::max<size_t>(1, (bytes_ + chunk_ - 1) / chunk_);
  }

 private:
  size_t chunk_bytes(size_t c) const { return std::min(chunk_, bytes_ - c * chunk_); }

  void start() override {
    const size_t window =
        std::min<size_t>(static_cast<size_t>(engine_.options().chunks_in_flight) * 2, nchunks_);
    for (size_t i = 0; i < window; ++i) launch();
  }

  void launch() {
    const size_t c = next_chunk_++;
    if (prev_rank_ < 0) {
      send_to(next_rank_, buf_ + c * chunk_, chunk_bytes(c), 0, static_cast<uint32_t>(c), 0,
              static_cast<int>(c));
    } else {
      recv_from(prev_rank_, buf_ + c * chunk_, chunk_bytes(c), 0, static_cast<uint32_t>(c), 0,
                static_cast<int>(c));
    }
  }

  void on_complete(Msg& m) override {
    const size_t c = static_cast<size_t>(m.b);
    bool chunk_done = m.is_send;
    if (!m.is_send) {
      if (next_rank_ >= 0) {
        send_to(next_rank_, buf_ + c * chunk_, chunk_bytes(c), 0, static_cast<uint32_t>(c), 0,
                static_cast<int>(c));
      } else {
        chunk_done = true;
      }
    }
    if (!chunk_done) return;
    if (++done_ == nchunks_) {
      succeed();
    } else if (next_chunk_ < nchunks_) {
      launch();
    }
  }

  char* buf_;
  size_t bytes_;
  int prev_rank_ = -1, next_rank_ = -1;  // group ranks; -1 at the chain's ends
  size_t chunk_ = 0;
  size_t nchunks_ = 1;
  size_t next_chunk_ = 0;  // next chunk to launch
  size_t done_ = 0;
};

}  // namespace

std::unique_ptr<Op> make_ring(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                              RingMode mode, const void* src, void* dst, std::vector<size_t> counts,
                              DType dtype, ReduceOp op) {
  TROUPE_CHECK(group->size() >= 2 && counts.size() == static_cast<size_t>(group->size()),
               "make_ring needs a group of at least 2 and one count per rank");
  return std::make_unique<RingOp>(engine, std::move(group), seq, std::move(name), mode, src, dst,
                                  std::move(counts), dtype, op);
}

std::unique_ptr<Op> make_chain_broadcast(Engine& engine, GroupPtr group, uint64_t seq,
                                         std::string name, void* buf, size_t bytes, int root) {
  return std::make_unique<ChainBroadcastOp>(engine, std::move(group), seq, std::move(name), buf,
                                            bytes, root);
}

}  // namespace troupe::comm::ucx
