// Latency-friendly algorithms of the ucx backend (recursive doubling, direct exchanges, binomial
// tree, dissemination barrier) and the factories that choose between them and the ring / chain.
#include "comm/ucx/ucx_collectives.hpp"

#include <cstring>

#include "comm/ucx/ucx_reduce.hpp"
#include "troupe/check.hpp"

namespace troupe::comm::ucx {

namespace {

// Recursive doubling all_reduce. With p = 2^k + rem, ranks 2i and 2i+1 (i < rem) fold first: 2i
// sends its buffer to 2i+1 (step 0) and waits for the result (step k+1); the remaining 2^k ranks
// exchange full buffers with partner newrank ^ 2^j at step j+1 and combine op(lower rank's, higher
// rank's).
class RecursiveDoublingOp final : public Op {
 public:
  RecursiveDoublingOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name, void* buf,
                      size_t count, DType dtype, ReduceOp op)
      : Op(engine, std::move(group), seq, std::move(name)),
        buf_(buf),
        count_(count),
        bytes_(count * dtype_size(dtype)),
        dtype_(dtype),
        op_(op) {
    const int p = group_->size();
    p2_ = 1;
    while (p2_ * 2 <= p) p2_ *= 2;
    rem_ = p - p2_;
    rounds_ = 0;
    while ((1 << rounds_) < p2_) ++rounds_;
  }

 private:
  enum class Phase { folded, fold_in, round, unfold };

  void start() override {
    const int r = group_->rank;
    tmp_.resize(bytes_);
    if (r < 2 * rem_) {
      if (r % 2 == 0) {
        phase_ = Phase::folded;
        pending_ = 2;
        recv_from(r + 1, buf_, bytes_, static_cast<uint32_t>(rounds_ + 1), 0);
        send_to(r + 1, buf_, bytes_, 0, 0);
        return;
      }
      newrank_ = r / 2;
      phase_ = Phase::fold_in;
      pending_ = 1;
      recv_from(r - 1, tmp_.data(), bytes_, 0, 0);
      return;
    }
    newrank_ = r - rem_;
    start_round();
  }

  int real_rank(int newrank) const { return newrank < rem_ ? newrank * 2 + 1 : newrank + rem_; }

  void start_round() {
    if (round_ == rounds_) {
      if (group_->rank < 2 * rem_) {
        phase_ = Phase::unfold;
        pending_ = 1;
        send_to(group_->rank - 1, buf_, bytes_, static_cast<uint32_t>(rounds_ + 1), 0);
      } else {
        succeed();
      }
      return;
    }
    phase_ = Phase::round;
    partner_ = real_rank(newrank_ ^ (1 << round_));
    pending_ = 2;
    recv_from(partner_, tmp_.data(), bytes_, static_cast<uint32_t>(round_ + 1), 0);
    send_to(partner_, buf_, bytes_, static_cast<uint32_t>(round_ + 1), 0);
  }

  void on_complete(Msg&) override {
    if (--pending_ > 0) return;
    switch (phase_) {
      case Phase::folded:
      case Phase::unfold:
        succeed();
        return;
      case Phase::fold_in:
        reduce(buf_, tmp_.data(), buf_, count_, dtype_,
               op_);  // the partner (r-1) is the lower rank
        start_round();
        return;
      case Phase::round:
        // Both partners evaluate the same expression: op(lower rank's value, higher rank's value).
        if (partner_ < group_->rank) {
          reduce(buf_, tmp_.data(), buf_, count_, dtype_, op_);
        } else {
          reduce(buf_, buf_, tmp_.data(), count_, dtype_, op_);
        }
        ++round_;
        start_round();
        return;
    }
  }

  void* buf_;
  size_t count_;
  size_t bytes_;
  DType dtype_;
  ReduceOp op_;
  std::vector<char> tmp_;
  int p2_ = 1, rem_ = 0, rounds_ = 0;
  int newrank_ = 0, round_ = 0, partner_ = 0, pending_ = 0;
  Phase phase_ = Phase::round;
};

// Small reduce_scatter_v: rank j gets every rank's block j at once and reduces them in rank order.
class DirectReduceScatterOp final : public Op {
 public:
  DirectReduceScatterOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                        const void* send, void* recv, std::vector<size_t> counts, DType dtype,
                        ReduceOp op)
      : Op(engine, std::move(group), seq, std::move(name)),
        send_(static_cast<const char*>(send)),
        recv_(recv),
        counts_(std::move(counts)),
        dtype_(dtype),
        op_(op),
        esz_(dtype_size(dtype)) {}

 private:
  void start() override {
    const int p = group_->size();
    const int r = group_->rank;
    std::vector<size_t> offsets(counts_.size());
    for (size_t i = 1; i < counts_.size(); ++i) offsets[i] = offsets[i - 1] + counts_[i - 1];
    own_ = send_ + offsets[static_cast<size_t>(r)] * esz_;
    block_ = counts_[static_cast<size_t>(r)] * esz_;
    tmp_.resize(block_ * static_cast<size_t>(
                             p));  // contribution of rank j at j * block_ (own: the accumulator)
    pending_ = 2 * (p - 1);
    for (int i = 1; i < p; ++i) {
      const int j = (r + p - i) % p;
      recv_from(j, tmp_.data() + static_cast<size_t>(j) * block_, block_, sender_step(j),
                sender_chunk(j));
    }
    for (int i = 1; i < p; ++i) {
      const int j = (r + i) % p;
      send_to(j, send_ + offsets[static_cast<size_t>(j)] * esz_,
              counts_[static_cast<size_t>(j)] * esz_, sender_step(r), sender_chunk(r));
    }
  }

  void on_complete(Msg&) override {
    if (--pending_ > 0) return;
    const int p = group_->size();
    const int r = group_->rank;
    const size_t n = counts_[static_cast<size_t>(r)];
    auto contribution = [&](int j) -> const void* {
      return j == r ? static_cast<const void*>(own_)
                    : tmp_.data() + static_cast<size_t>(j) * block_;
    };
    // Accumulate in rank r's (unused) place, so recv may alias own block of send. One
    // reduce_many: bf16/f16 are summed in fp32 over all p contributions and rounded once.
    char* acc = tmp_.data() + static_cast<size_t>(r) * block_;
    std::vector<const void*> in(static_cast<size_t>(p));
    for (int j = 0; j < p; ++j) in[static_cast<size_t>(j)] = contribution(j);
    reduce_many(acc, in.data(), p, n, dtype_, op_);
    if (block_ != 0) std::memcpy(recv_, acc, block_);
    succeed();
  }

  const char* send_;
  void* recv_;
  std::vector<size_t> counts_;
  DType dtype_;
  ReduceOp op_;
  size_t esz_;
  const char* own_ = nullptr;
  size_t block_ = 0;
  std::vector<char> tmp_;
  int pending_ = 0;
};

// Small all_gather_v: every rank sends its block to every other rank (the caller copies its own).
class DirectAllGatherOp final : public Op {
 public:
  DirectAllGatherOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                    const void* send, void* recv, std::vector<size_t> counts, size_t esz)
      : Op(engine, std::move(group), seq, std::move(name)),
        send_(send),
        recv_(static_cast<char*>(recv)),
        counts_(std::move(counts)),
        esz_(esz) {}

 private:
  void start() override {
    const int p = group_->size();
    const int r = group_->rank;
    std::vector<size_t> offsets(counts_.size());
    for (size_t i = 1; i < counts_.size(); ++i) offsets[i] = offsets[i - 1] + counts_[i - 1];
    const size_t own_bytes = counts_[static_cast<size_t>(r)] * esz_;
    pending_ = 2 * (p - 1);
    for (int i = 1; i < p; ++i) {
      const int j = (r + p - i) % p;
      recv_from(j, recv_ + offsets[static_cast<size_t>(j)] * esz_,
                counts_[static_cast<size_t>(j)] * esz_, sender_step(j), sender_chunk(j));
    }
    for (int i = 1; i < p; ++i)
      send_to((r + i) % p, send_, own_bytes, sender_step(r), sender_chunk(r));
    char* own = recv_ + offsets[static_cast<size_t>(r)] * esz_;
    if (own != send_ && own_bytes != 0) std::memmove(own, send_, own_bytes);  // while peers copy
  }

  void on_complete(Msg&) override {
    if (--pending_ == 0) succeed();
  }

  const void* send_;
  char* recv_;
  std::vector<size_t> counts_;
  size_t esz_;
  int pending_ = 0;
};

// Binomial-tree broadcast over virtual ranks v = (r - root) mod p: v receives from v - lowbit(v)
// and sends to v + 2^j for every 2^j below lowbit(v) (all of them at the root).
class TreeBroadcastOp final : public Op {
 public:
  TreeBroadcastOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name, void* buf,
                  size_t bytes, int root)
      : Op(engine, std::move(group), seq, std::move(name)), buf_(buf), bytes_(bytes), root_(root) {}

 private:
  void start() override {
    const int p = group_->size();
    v_ = (group_->rank - root_ + p) % p;
    mask_ = 1;
    while (mask_ < p) {
      if (v_ & mask_) {
        recv_from((v_ - mask_ + root_) % p, buf_, bytes_, 0, 0);
        return;
      }
      mask_ <<= 1;
    }
    send_children();  // the root
  }

  void send_children() {
    const int p = group_->size();
    for (int m = mask_ >> 1; m > 0; m >>= 1) {
      if (v_ + m < p) {
        ++pending_;
        send_to((v_ + m + root_) % p, buf_, bytes_, 0, 0);
      }
    }
    if (pending_ == 0) succeed();
  }

  void on_complete(Msg& m) override {
    if (!m.is_send) {
      send_children();
    } else if (--pending_ == 0) {
      succeed();
    }
  }

  void* buf_;
  size_t bytes_;
  int root_;
  int v_ = 0, mask_ = 1, pending_ = 0;
};

// Dissemination barrier: in round k, send to r + 2^k and receive from r - 2^k; the next round
// starts once this round's message arrived.
class BarrierOp final : public Op {
 public:
  using Op::Op;

 private:
  void start() override { next_round(); }

  void next_round() {
    const int p = group_->size();
    const int r = group_->rank;
    const int dist = 1 << round_;
    if (dist >= p) {
      if (sends_ == 0) succeed();
      return;
    }
    ++sends_;
    recv_from((r - dist % p + p) % p, nullptr, 0, static_cast<uint32_t>(round_), 0);
    send_to((r + dist) % p, nullptr, 0, static_cast<uint32_t>(round_), 0);
  }

  void on_complete(Msg& m) override {
    if (m.is_send) {
      --sends_;
      if ((1 << round_) >= group_->size() && sends_ == 0) succeed();
    } else {
      ++round_;
      next_round();
    }
  }

  int round_ = 0;
  int sends_ = 0;
};

}  // namespace

std::unique_ptr<Op> make_all_reduce(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                    void* buf, size_t count, DType dtype, ReduceOp op) {
  if (count * dtype_size(dtype) < engine.options().ring_threshold) {
    return std::make_unique<RecursiveDoublingOp>(engine, std::move(group), seq, std::move(name),
                                                 buf, count, dtype, op);
  }
  const size_t p = static_cast<size_t>(group->size());
  std::vector<size_t> counts(p);
  for (size_t i = 0; i < p; ++i) counts[i] = count / p + (i < count % p ? 1 : 0);
  if (group->channel != nullptr) {
    return make_shm_collective(engine, std::move(group), seq, std::move(name), RingMode::all_reduce,
                               buf, buf, std::move(counts), dtype, op);
  }
  return make_ring(engine, std::move(group), seq, std::move(name), RingMode::all_reduce, buf, buf,
                   std::move(counts), dtype, op);
}

std::unique_ptr<Op> make_reduce_scatter(Engine& engine, GroupPtr group, uint64_t seq,
                                        std::string name, const void* send, void* recv,
                                        std::vector<size_t> counts, DType dtype, ReduceOp op) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (total * dtype_size(dtype) < engine.options().ring_threshold) {
    return std::make_unique<DirectReduceScatterOp>(engine, std::move(group), seq, std::move(name),
                                                   send, recv, std::move(counts), dtype, op);
  }
  if (group->channel != nullptr) {
    return make_shm_collective(engine, std::move(group), seq, std::move(name),
                               RingMode::reduce_scatter, send, recv, std::move(counts), dtype, op);
  }
  return make_ring(engine, std::move(group), seq, std::move(name), RingMode::reduce_scatter, send,
                   recv, std::move(counts), dtype, op);
}

std::unique_ptr<Op> make_all_gather(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                    const void* send, void* recv, std::vector<size_t> counts,
                                    DType dtype) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (total * dtype_size(dtype) < engine.options().ring_threshold) {
    return std::make_unique<DirectAllGatherOp>(engine, std::move(group), seq, std::move(name), send,
                                               recv, std::move(counts), dtype_size(dtype));
  }
  if (group->channel != nullptr) {
    return make_shm_collective(engine, std::move(group), seq, std::move(name), RingMode::all_gather,
                               send, recv, std::move(counts), dtype, ReduceOp::sum);
  }
  if (group->one_host && group->size() <= engine.options().direct_max_ranks) {
    return make_direct_all_gather(engine, std::move(group), seq, std::move(name), send, recv,
                                  std::move(counts), dtype_size(dtype));
  }
  return make_ring(engine, std::move(group), seq, std::move(name), RingMode::all_gather, send, recv,
                   std::move(counts), dtype, ReduceOp::sum);
}

std::unique_ptr<Op> make_broadcast(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                   void* buf, size_t bytes, int root) {
  if (bytes < engine.options().ring_threshold) {
    return std::make_unique<TreeBroadcastOp>(engine, std::move(group), seq, std::move(name), buf,
                                             bytes, root);
  }
  return make_chain_broadcast(engine, std::move(group), seq, std::move(name), buf, bytes, root);
}

std::unique_ptr<Op> make_barrier(Engine& engine, GroupPtr group, uint64_t seq, std::string name) {
  return std::make_unique<BarrierOp>(engine, std::move(group), seq, std::move(name));
}

}  // namespace troupe::comm::ucx
