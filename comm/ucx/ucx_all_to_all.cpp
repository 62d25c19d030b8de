// all_to_all_v of the ucx backend: pairwise exchange over tagged messages.
//
// Step k = 1 .. p-1: rank r receives from (r - k) mod p and sends to (r + k) mod p, so in every
// step each rank sends to exactly one peer and receives from exactly one (the steps are
// permutations): no rank is flooded by all the others at once, and each pair's transfer is one
// message (eager or a zero-copy rendezvous, whichever UCX picks for its size). Up to
// chunks_in_flight steps run at once, started in step order as earlier ones finish; step k of a
// rank needs only step k of its two partners, so the window never deadlocks. This rank's own block
// is copied locally while the first steps are in flight.
//
// Every pair exchanges a message, empty blocks too: a rank cannot tell from its own counts that its
// partner has nothing for it, and the receive's expected size is what detects a mismatch (the
// receiver's recv_counts[j] against the sender's send_counts[r]: shorter arrives short, longer is
// truncated by UCX; either fails the receiver's operation naming both counts, and nothing is
// written past its block). Tags carry the sender's group rank (the step and chunk fields), as in
// the other direct algorithms: a group has at most 2^24 ranks.
#include <algorithm>
#include <cstring>

#include "comm/ucx/ucx_collectives.hpp"
#include "troupe/check.hpp"

namespace troupe::comm::ucx {

namespace {

// offsets[j] = counts[0] + ... + counts[j-1].
std::vector<size_t> offsets_of(const std::vector<size_t>& counts) {
  std::vector<size_t> offsets(counts.size(), 0);
  for (size_t j = 1; j < counts.size(); ++j) offsets[j] = offsets[j - 1] + counts[j - 1];
  return offsets;
}

class PairwiseAllToAllOp final : public Op {
 public:
  PairwiseAllToAllOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                     const void* send, std::vector<size_t> send_counts, void* recv,
                     std::vector<size_t> recv_counts, size_t esz)
      : Op(engine, std::move(group), seq, std::move(name)),
        send_(static_cast<const char*>(send)),
        recv_(static_cast<char*>(recv)),
        send_counts_(std::move(send_counts)),
        recv_counts_(std::move(recv_counts)),
        send_offsets_(offsets_of(send_counts_)),
        recv_offsets_(offsets_of(recv_counts_)),
        esz_(esz),
        p_(group_->size()),
        r_(group_->rank),
        left_(static_cast<size_t>(p_), 2) {}

 private:
  void start() override {
    const int window = std::min(engine_.options().chunks_in_flight, p_ - 1);
    for (int i = 0; i < window; ++i) launch();
    const size_t own = send_counts_[static_cast<size_t>(r_)] * esz_;
    if (own != 0) {
      std::memcpy(recv_ + recv_offsets_[static_cast<size_t>(r_)] * esz_,
                  send_ + send_offsets_[static_cast<size_t>(r_)] * esz_, own);
    }
  }

  // The next step: its receive first, so the partner's message finds it posted.
  void launch() {
    const int k = next_step_++;
    const auto from = static_cast<size_t>((r_ + p_ - k) % p_);
    const auto to = static_cast<size_t>((r_ + k) % p_);
    recv_from(static_cast<int>(from), recv_ + recv_offsets_[from] * esz_, recv_counts_[from] * esz_,
              sender_step(static_cast<int>(from)), sender_chunk(static_cast<int>(from)), k,
              static_cast<int>(from));
    send_to(static_cast<int>(to), send_ + send_offsets_[to] * esz_, send_counts_[to] * esz_,
            sender_step(r_), sender_chunk(r_), k, static_cast<int>(to));
  }

  void on_complete(Msg& m) override {
    if (--left_[static_cast<size_t>(m.a)] != 0) return;
    if (++steps_done_ == p_ - 1) {
      succeed();
    } else if (next_step_ < p_) {
      launch();
    }
  }

  // In the caller's terms: elements and counts (m.b is the partner's group rank).
  std::string size_mismatch(const Msg& m) const override {
    const auto q = static_cast<size_t>(m.b);
    const std::string partner =
        "rank " + std::to_string(m.peer) + " (group rank " + std::to_string(m.b) + ")";
    const std::string rule =
        "; recv_counts[p] must equal what group rank p passes as send_counts[rank()]";
    if (m.is_send) {
      return partner + " did not take the " + std::to_string(send_counts_[q]) +
             " elements this rank's send_counts[" + std::to_string(m.b) +
             "] gives it (its recv_counts for this rank differs)" + rule;
    }
    const bool unknown = m.status == UCS_ERR_MESSAGE_TRUNCATED && m.length <= m.expected;
    const std::string sent =
        unknown ? "more than " + std::to_string(recv_counts_[q]) : std::to_string(m.length / esz_);
    return partner + " sends " + sent + " elements to this rank (group rank " + std::to_string(r_) +
           "), whose recv_counts[" + std::to_string(m.b) + "] is " +
           std::to_string(recv_counts_[q]) + rule;
  }

  const char* send_;
  char* recv_;
  std::vector<size_t> send_counts_, recv_counts_;
  std::vector<size_t> send_offsets_, recv_offsets_;
  size_t esz_;
  int p_, r_;
  int next_step_ = 1;
  int steps_done_ = 0;
  std::vector<int> left_;  // per step: requests outstanding
};

}  // namespace

std::unique_ptr<Op> make_all_to_all(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                    const void* send, std::vector<size_t> send_counts, void* recv,
                                    std::vector<size_t> recv_counts, size_t esz) {
  if (group->channel != nullptr && group->size() >= 2 &&
      send_counts.size() == static_cast<size_t>(group->size()) && recv_counts.size() == send_counts.size())
    return make_shm_all_to_all(engine, std::move(group), seq, std::move(name), send, std::move(send_counts), recv,
                               std::move(recv_counts), esz);
  return make_pairwise_all_to_all(engine, std::move(group), seq, std::move(name), send, std::move(send_counts),
                                  recv, std::move(recv_counts), esz);
}

std::unique_ptr<Op> make_pairwise_all_to_all(Engine& engine, GroupPtr group, uint64_t seq, std::string name,
                                             const void* send, std::vector<size_t> send_counts, void* recv,
                                             std::vector<size_t> recv_counts, size_t esz) {
  TROUPE_CHECK(group->size() >= 2 && group->size() <= (1 << (kTagStepBits + kTagChunkBits)) &&
                   send_counts.size() == static_cast<size_t>(group->size()) &&
                   recv_counts.size() == send_counts.size(),
               "make_all_to_all needs a group of 2..2^24 ranks and one count per rank each way");
  return std::make_unique<PairwiseAllToAllOp>(engine, std::move(group), seq, std::move(name), send,
                                              std::move(send_counts), recv, std::move(recv_counts),
                                              esz);
}

}  // namespace troupe::comm::ucx
