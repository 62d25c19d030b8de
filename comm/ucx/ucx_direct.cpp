// Large all_gather_v for groups that live on one host: every rank sends its block to every other
// rank directly, in chunks.
//
// Why not the ring there: on shared memory each transfer is one copy (cma) whatever the pair, so
// the ring's neighbour-only traffic buys nothing, while its p-1 dependent steps cost a scheduling
// round trip each (ranks often outnumber cores). Direct moves the same bytes per rank in one step.
// (For the reductions the ring stayed as fast or faster in measurements, so they keep it.)
//
// Per chunk c (every block cut into the same number of chunks, as in the ring): rank r sends chunk
// c of its block to every other rank and receives chunk c of every other block in place. Chunks
// move independently, chunks_in_flight at a time. Tags carry the sender (step field = sender's
// group rank, so groups are limited to 4096 ranks; the factory uses this only for small groups).
#include <algorithm>
#include <cstring>

#include "comm/ucx/ucx_collectives.hpp"
#include "troupe/check.hpp"

namespace troupe::comm::ucx {

namespace {

class DirectAllGatherOp final : public Op {
 public:
  DirectAllGatherOp(Engine& engine, GroupPtr group, uint64_t seq, std::string name, const void* src,
                    void* dst, std::vector<size_t> counts, size_t esz)
      : Op(engine, std::move(group), seq, std::move(name)),
        src_(static_cast<const char*>(src)),
        dst_(static_cast<char*>(dst)),
        counts_(std::move(counts)),
        esz_(esz) {
    p_ = group_->size();
    r_ = group_->rank;
    offsets_.resize(counts_.size());
    size_t off = 0, largest = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      offsets_[i] = off;
      off += counts_[i];
      largest = std::max(largest, counts_[i]);
    }
    // No reduction, so nothing has to stay in cache and nothing to overlap with: as few messages as
    // possible, chunks only bound the size of one transfer (4 chunk_bytes).
    const size_t chunk_bytes = engine_.options().chunk_bytes * 4;
    const size_t chunk_elems = std::max<size_t>(1, chunk_bytes / esz_);
    nchunks_ = std::max<size_t>(1, (largest + chunk_elems - 1) / chunk_elems);
  }

 private:
  size_t chunk_begin(int b, size_t c) const {
    const size_t n = counts_[static_cast<size_t>(b)];
    return c * (n / nchunks_) + std::min(c, n % nchunks_);  // within block b
  }
  size_t chunk_count(int b, size_t c) const {
    const size_t n = counts_[static_cast<size_t>(b)];
    return n / nchunks_ + (c < n % nchunks_ ? 1 : 0);
  }

  void start() override {
    const size_t lanes =
        std::min<size_t>(static_cast<size_t>(engine_.options().chunks_in_flight), nchunks_);
    for (size_t i = 0; i < lanes; ++i) launch();
    // This rank's own place, while the peers copy.
    char* own = dst_ + offsets_[static_cast<size_t>(r_)] * esz_;
    const size_t own_bytes = counts_[static_cast<size_t>(r_)] * esz_;
    if (own != src_ && own_bytes != 0) std::memmove(own, src_, own_bytes);
  }

  // Receives first, so the peers' messages find them posted; the own chunk goes from `src`.
  void launch() {
    const size_t c = next_chunk_++;
    const auto cu = static_cast<uint32_t>(c);
    for (int i = 1; i < p_; ++i) {
      const int j = (r_ + p_ - i) % p_;
      recv_from(j, dst_ + (offsets_[static_cast<size_t>(j)] + chunk_begin(j, c)) * esz_,
                chunk_count(j, c) * esz_, static_cast<uint32_t>(j), cu, static_cast<int>(c));
    }
    for (int i = 1; i < p_; ++i) {
      send_to((r_ + i) % p_, src_ + chunk_begin(r_, c) * esz_, chunk_count(r_, c) * esz_,
              static_cast<uint32_t>(r_), cu, static_cast<int>(c));
    }
    left_.push_back(2 * (p_ - 1));
  }

  void on_complete(Msg& m) override {
    if (--left_[static_cast<size_t>(m.a)] != 0) return;
    if (++chunks_done_ == nchunks_) {
      succeed();
    } else if (next_chunk_ < nchunks_) {
      launch();
    }
  }

  const char* src_;
  char* dst_;
  std::vector<size_t> counts_;
  std::vector<size_t> offsets_;
  size_t esz_;
  int p_ = 0, r_ = 0;
  size_t nchunks_ = 1;
  size_t next_chunk_ = 0;
  size_t chunks_done_ = 0;
  std::vector<int> left_;  // per chunk: requests outstanding
};

}  // namespace

std::unique_ptr<Op> make_direct_all_gather(Engine& engine, GroupPtr group, uint64_t seq,
                                           std::string name, const void* send, void* recv,
                                           std::vector<size_t> counts, size_t esz) {
  TROUPE_CHECK(group->size() >= 2 && group->size() <= 4096 &&
                   counts.size() == static_cast<size_t>(group->size()),
               "make_direct_all_gather needs a group of 2..4096 and one count per rank");
  return std::make_unique<DirectAllGatherOp>(engine, std::move(group), seq, std::move(name), send,
                                             recv, std::move(counts), esz);
}

}  // namespace troupe::comm::ucx
