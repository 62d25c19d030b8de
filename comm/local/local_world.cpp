// The local backend (see comm/local/local_world.hpp for the algorithms and the failure contract).
//
// Synchronisation. A group's members meet at a reusable generation barrier (arrive_and_wait). Each
// collective publishes its arguments in a slot array that alternates with the collective's parity:
// a member can be at most one collective ahead of the slowest (the next barrier needs everyone), so
// the slots of collective k stay untouched until every member has finished reading them.
//
// Buffer safety on failure. Between the barriers of a collective, members read and write each
// other's buffers ("data phases"). A barrier that opens a data phase adds the group size to
// `accessing_` as it completes; each member subtracts one when its phase ends. A member that fails
// out of a barrier waits for `accessing_` to reach 0 before it reports the failure, so once a
// failed wait() returns, no other thread touches that member's buffers. Data phases never block, so
// this wait is short.
#include "comm/local/local_world.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "comm/local/local_kernels.hpp"

namespace troupe::comm {
namespace detail {

namespace {

constexpr int kSpins = 32;  // yields before a waiter blocks (short: 2 cores serve many threads)
constexpr uint64_t kFirstReservedTag = uint64_t{1} << 56;

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

bool reducible(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::i32 || t == DType::i64 ||
         t == DType::bf16 || t == DType::f16;
}

// Block b of `count` elements cut into n blocks as evenly as possible (the first count % n get
// one more).
struct Block {
  size_t offset, length;
};
Block even_block(size_t count, int n, int b) {
  const size_t base = count / n, rem = count % n, ub = static_cast<size_t>(b);
  return {ub * base + std::min(ub, rem), base + (ub < rem ? 1 : 0)};
}

char* at(void* p, size_t elements, size_t esz) {
  return static_cast<char*>(p) + elements * esz;
}
const char* at(const void* p, size_t elements, size_t esz) {
  return static_cast<const char*>(p) + elements * esz;
}

// offsets[j] = counts[0] + ... + counts[j-1], for j = 0..n.
std::vector<size_t> prefix_sums(const std::vector<size_t>& counts) {
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t j = 0; j < counts.size(); ++j) offsets[j + 1] = offsets[j] + counts[j];
  return offsets;
}

// Calls f(j, a, b) for each non-empty block j = [offsets[j], offsets[j+1]) that meets `range`,
// with [a, b) the overlap.
template <class F>
void for_each_piece(const std::vector<size_t>& offsets, Block range, F f) {
  const size_t lo = range.offset, hi = range.offset + range.length;
  for (size_t j = 0; j + 1 < offsets.size(); ++j) {
    const size_t a = std::max(lo, offsets[j]), b = std::min(hi, offsets[j + 1]);
    if (a < b) f(static_cast<int>(j), a, b);
  }
}

// The largest cache of CPU 0 as Linux reports it (sysconf's figure is wrong in some VMs: 320 MiB
// for a 32 MiB L3), or 32 MiB where that cannot be read.
size_t last_level_cache_bytes() {
  size_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    size_t value = 0;
    char unit = 0;
    if (!(in >> value)) break;
    in >> unit;
    largest = std::max(largest, value << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0));
  }
  return largest > 0 ? largest : size_t{32} << 20;
}

// Whether a collective that reads `read` and writes `written` bytes in all (over every member)
// should write with streaming stores. The benchmarks call a collective on the same buffers again
// and again, and so does training, so the question is what stays in the last-level cache (C bytes)
// between calls. With ordinary stores, all F = read + written bytes compete for it, and roughly a
// fraction 1 - C/F of the accesses miss, each missed written line costing a read and a write. With
// streaming stores every written byte goes to DRAM, but the cache keeps the reads. So stream when
//   written < (1 - C/F) (read + 2 written).
// (Measured on a 32 MiB L3, 2 to 8 ranks: reduce_scatter gains up to 2x from streaming once F
// passes C; all_gather, whose writes dominate, only once F passes about 2C.)
bool streams(size_t read, size_t written) {
  static const double cache = static_cast<double>(last_level_cache_bytes());
  const double r = static_cast<double>(read), w = static_cast<double>(written), f = r + w;
  return f > cache && w < (1 - cache / f) * (r + 2 * w);
}

}  // namespace

class LocalGroup;

// An operation's completion. Completed exactly once, by whichever thread finishes the operation.
class LocalWork final : public Work {
 public:
  // timed_by_waiter: wait() applies the fabric's timeout. Only for send/recv: a collective's
  // barriers time out on the progress thread, and naming the missing ranks there is more useful.
  // owner: the world rank whose thread waits for it (counted in LocalFabricState::in_wait).
  LocalWork(std::weak_ptr<LocalFabricState> fabric, std::string what, bool timed_by_waiter, int owner)
      : fabric_(std::move(fabric)), what_(std::move(what)), timed_by_waiter_(timed_by_waiter), owner_(owner) {}
  const std::string& what() const { return what_; }

  void complete(Status status) {
    completed(status.is_ok());
    {
      std::lock_guard lk(mu_);
      TROUPE_CHECK(!done_, "a local Work completed twice");
      status_ = std::move(status);
      done_ = true;
      done_flag_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
  // Completes with "local comm: <what> failed: <cause>" (or ok).
  void finish(const Status& cause) {
    complete(cause.is_ok() ? Status::ok()
                           : Status::error("local comm: " + what_ + " failed: " + cause.message()));
  }

  Status do_wait() override;
  bool do_test() override { return done_flag_.load(std::memory_order_acquire); }

 private:
  std::weak_ptr<LocalFabricState> fabric_;
  std::string what_;
  bool timed_by_waiter_;
  int owner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> done_flag_{false};
  Status status_;
};

// One group's shared state: its barrier, collective slots and point-to-point mailboxes.
enum class OpKind : uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  all_to_all,
  broadcast,
  barrier
};

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::all_reduce:
      return "all_reduce";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::all_gather:
      return "all_gather";
    case OpKind::all_to_all:
      return "all_to_all";
    case OpKind::broadcast:
      return "broadcast";
    case OpKind::barrier:
      return "barrier";
  }
  return "?";
}

struct Slot {
  OpKind kind = OpKind::barrier;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  size_t count = 0;                             // all_reduce, broadcast
  const std::vector<size_t>* counts = nullptr;  // reduce_scatter, all_gather; all_to_all: sends
  const std::vector<size_t>* recv_counts = nullptr;  // all_to_all
  const void* send = nullptr;
  void* recv = nullptr;  // all_reduce and broadcast: the buffer
};

struct P2pEntry {
  const void* src = nullptr;  // sends
  void* dst = nullptr;        // recvs
  size_t bytes = 0;
  uint64_t tag = 0;
  std::shared_ptr<LocalWork> work;
};

struct LocalFabricState {
  int size = 0;
  std::chrono::milliseconds timeout{0};
  // Per world rank: threads of that rank now blocked in a Work::wait. A timeout names the ranks at
  // zero: not waiting for any peer, so computing -- or stuck, which is what a timeout is hunting.
  std::vector<std::atomic<int>> in_wait;
  std::string ranks_not_waiting() const {
    std::vector<int> idle;
    for (int r = 0; r < size; ++r)
      if (in_wait[static_cast<size_t>(r)].load() == 0) idle.push_back(r);
    return "; rank(s) not waiting for any peer at that moment (computing, or stuck): " + rank_list(idle);
  }
  std::atomic<bool> failed{false};
  std::string failure;  // written once, before `failed` turns true; read only after seeing it true

  std::mutex mu;  // guards everything below
  std::condition_variable boot_cv;
  std::vector<std::weak_ptr<LocalGroup>> groups;  // live groups, woken by fail()
  struct Pending {
    std::shared_ptr<LocalGroup> group;
    int attached = 0;
  };
  struct Directory {
    std::vector<int> next;           // per member position: how many groups of this list it made
    std::map<int, Pending> pending;  // instance index -> group not yet joined by every member
  };
  std::map<std::vector<int>, Directory> directory;
  struct BootRound {
    std::vector<std::string> blobs;
    std::vector<char> given;
    int given_count = 0, taken = 0;
  };
  std::map<std::string, BootRound> rounds;
  std::set<std::string> finished_keys;

  Status failure_status() const { return Status::error(failure); }
  void fail(const std::string& cause);
  Result<std::shared_ptr<LocalGroup>> attach(const std::vector<int>& members, int position);
  Result<std::vector<std::string>> boot_gather(int rank, const std::string& key,
                                               const std::string& mine);
};

class LocalGroup {
 public:
  LocalGroup(LocalFabricState* fabric, std::vector<int> members)
      : fabric_(fabric),
        members_(std::move(members)),
        n_(static_cast<int>(members_.size())),
        name_(rank_list(members_)),
        here_(members_.size(), 0),
        sends_(members_.size() * members_.size()),
        recvs_(members_.size() * members_.size()) {
    for (auto& s : slots_) s.resize(members_.size());
  }

  int size() const { return n_; }
  int world_rank(int member) const { return members_[member]; }
  const std::string& name() const { return name_; }
  Slot* slots(uint64_t seq) { return slots_[seq & 1].data(); }

  // Waits until every member has arrived. enter_access: the barrier opens a data phase (see the
  // file comment); the caller then calls end_access() once its phase is done. Fails when the fabric
  // failed before the barrier completed, or this wait passed the fabric's timeout (which fails the
  // fabric).
  Status arrive_and_wait(int me, const std::string& what, bool enter_access);
  void end_access() {
    if (accessing_.fetch_sub(1) == 1 && fabric_->failed.load()) {
      std::lock_guard lk(mu_);
      cv_.notify_all();
    }
  }

  // Posts one side of a message from member `src` to member `dst`; the side posted second copies.
  void post(int src, int dst, bool is_send, P2pEntry entry);

  // Called by LocalFabricState::fail: wakes every waiter and fails every unmatched send/recv.
  void on_failure();

 private:
  Status quiesce_and_fail(std::unique_lock<std::mutex>& lk) {
    cv_.wait(lk, [&] { return accessing_.load() == 0; });
    return fabric_->failure_status();
  }

  LocalFabricState* fabric_;  // outlives the group: every owner of a group also owns the fabric
  const std::vector<int> members_;
  const int n_;
  const std::string name_;
  std::array<std::vector<Slot>, 2> slots_;

  std::mutex mu_;  // guards the barrier's arrival state and the mailboxes
  std::condition_variable cv_;
  int arrived_ = 0;
  std::vector<char> here_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> accessing_{0};
  std::vector<std::deque<P2pEntry>> sends_, recvs_;  // index src * n + dst, in post order
};

Status LocalGroup::arrive_and_wait(int me, const std::string& what, bool enter_access) {
  std::unique_lock lk(mu_);
  if (fabric_->failed.load()) return quiesce_and_fail(lk);
  const uint64_t gen = generation_.load(std::memory_order_relaxed);
  here_[me] = 1;
  if (++arrived_ == n_) {
    arrived_ = 0;
    std::fill(here_.begin(), here_.end(), 0);
    if (enter_access) accessing_.fetch_add(n_);
    generation_.store(gen + 1, std::memory_order_release);
    lk.unlock();
    cv_.notify_all();
    return Status::ok();
  }
  lk.unlock();
  for (int i = 0; i < kSpins; ++i) {
    if (generation_.load(std::memory_order_acquire) != gen) return Status::ok();
    if (fabric_->failed.load()) break;
    std::this_thread::yield();
  }
  lk.lock();
  auto done = [&] {
    return generation_.load(std::memory_order_acquire) != gen || fabric_->failed.load();
  };
  if (fabric_->timeout.count() > 0) {
    if (!cv_.wait_for(lk, fabric_->timeout, done)) {
      std::vector<int> missing;
      for (int j = 0; j < n_; ++j) {
        if (!here_[j]) missing.push_back(members_[j]);
      }
      lk.unlock();
      fabric_->fail("timeout: " + what + " waited " + std::to_string(fabric_->timeout.count()) +
                    " ms for rank(s) " + rank_list(missing) + fabric_->ranks_not_waiting() +
                    " (LocalFabricOptions::timeout); find why they stopped, or raise the timeout");
      lk.lock();
    }
  } else {
    cv_.wait(lk, done);
  }
  // A completed barrier stays complete: its data phase runs, the next barrier reports the failure.
  if (generation_.load(std::memory_order_acquire) != gen) return Status::ok();
  return quiesce_and_fail(lk);
}

void LocalGroup::post(int src, int dst, bool is_send, P2pEntry entry) {
  const size_t pair = static_cast<size_t>(src) * n_ + dst;
  std::unique_lock lk(mu_);
  if (fabric_->failed.load()) {
    lk.unlock();
    entry.work->finish(fabric_->failure_status());
    return;
  }
  std::deque<P2pEntry>& others = is_send ? recvs_[pair] : sends_[pair];
  auto it = std::find_if(others.begin(), others.end(),
                         [&](const P2pEntry& e) { return e.tag == entry.tag; });
  if (it == others.end()) {
    (is_send ? sends_[pair] : recvs_[pair]).push_back(std::move(entry));
    return;
  }
  P2pEntry match = std::move(*it);
  others.erase(it);
  lk.unlock();
  // Both entries are ours alone now; neither work is complete, so both buffers stay valid.
  const P2pEntry& s = is_send ? entry : match;
  const P2pEntry& r = is_send ? match : entry;
  if (s.bytes != r.bytes) {
    const Status st =
        Status::error("a send of " + std::to_string(s.bytes) + " bytes from rank " +
                      std::to_string(members_[src]) + " to rank " + std::to_string(members_[dst]) +
                      " with tag " + std::to_string(s.tag) + " met a recv of " +
                      std::to_string(r.bytes) + " bytes; recv the count and dtype that were sent");
    s.work->finish(st);
    r.work->finish(st);
    return;
  }
  if (s.bytes > 0) std::memcpy(r.dst, s.src, s.bytes);
  r.work->finish(Status::ok());
  s.work->finish(Status::ok());
}

void LocalGroup::on_failure() {
  std::vector<P2pEntry> dropped;
  {
    std::lock_guard lk(mu_);
    for (auto* boxes : {&sends_, &recvs_}) {
      for (auto& box : *boxes) {
        for (auto& e : box) dropped.push_back(std::move(e));
        box.clear();
      }
    }
    cv_.notify_all();
  }
  for (auto& e : dropped) e.work->finish(fabric_->failure_status());
}

Status LocalWork::do_wait() {
  std::unique_lock lk(mu_);
  if (!done_) {
    const auto fabric = fabric_.lock();
    if (fabric) fabric->in_wait[static_cast<size_t>(owner_)].fetch_add(1);
    if (fabric && timed_by_waiter_ && fabric->timeout.count() > 0) {
      if (!cv_.wait_for(lk, fabric->timeout, [&] { return done_; })) {
        lk.unlock();
        fabric->fail("timeout: " + what_ + " did not complete within " + std::to_string(fabric->timeout.count()) +
                     " ms" + fabric->ranks_not_waiting() +
                     " (LocalFabricOptions::timeout); a peer never took part -- find why, or raise the timeout");
        lk.lock();
      }
    }
    // After a fabric failure every operation completes promptly (see the file comment).
    cv_.wait(lk, [&] { return done_; });
    if (fabric) fabric->in_wait[static_cast<size_t>(owner_)].fetch_sub(1);
  }
  return status_;
}

void LocalFabricState::fail(const std::string& cause) {
  std::vector<std::shared_ptr<LocalGroup>> live;
  {
    std::lock_guard lk(mu);
    if (failed.load()) return;
    failure = cause;
    failed.store(true);
    for (auto& w : groups) {
      if (auto g = w.lock()) live.push_back(std::move(g));
    }
  }
  boot_cv.notify_all();
  for (auto& g : live) g->on_failure();
}

Result<std::shared_ptr<LocalGroup>> LocalFabricState::attach(const std::vector<int>& members,
                                                             int position) {
  std::lock_guard lk(mu);
  if (failed.load()) return failure_status();
  Directory& d = directory[members];
  if (d.next.empty()) d.next.assign(members.size(), 0);
  const int index = d.next[position]++;
  Pending& p = d.pending[index];
  if (!p.group) {
    p.group = std::make_shared<LocalGroup>(this, members);
    std::erase_if(groups, [](const std::weak_ptr<LocalGroup>& w) { return w.expired(); });
    groups.push_back(p.group);
  }
  std::shared_ptr<LocalGroup> g = p.group;
  if (++p.attached == static_cast<int>(members.size())) d.pending.erase(index);
  return g;
}

Result<std::vector<std::string>> LocalFabricState::boot_gather(int rank, const std::string& key,
                                                               const std::string& mine) {
  const std::string what = "local bootstrap: key '" + key + "' on rank " + std::to_string(rank);
  std::unique_lock lk(mu);
  if (failed.load()) return Status::error(what + " failed: " + failure);
  BootRound& round = rounds[key];
  if (round.given.empty()) {
    round.given.assign(size, 0);
    round.blobs.resize(size);
  }
  if (round.given[rank] || finished_keys.count(key)) {
    return Status::error(what + ": the key was used before; use each bootstrap key once");
  }
  round.given[rank] = 1;
  round.blobs[rank] = mine;
  if (++round.given_count == size) boot_cv.notify_all();
  auto ready = [&] { return round.given_count == size || failed.load(); };
  if (timeout.count() > 0) {
    if (!boot_cv.wait_for(lk, timeout, ready)) {
      std::vector<int> missing;
      for (int r = 0; r < size; ++r) {
        if (!round.given[r]) missing.push_back(r);
      }
      lk.unlock();
      fail("timeout: " + what + " waited " + std::to_string(timeout.count()) + " ms for rank(s) " +
           rank_list(missing) +
           " (LocalFabricOptions::timeout); find why they stopped, or raise the timeout");
      lk.lock();
    }
  } else {
    boot_cv.wait(lk, ready);
  }
  if (round.given_count != size) return Status::error(what + " failed: " + failure);
  std::vector<std::string> out = round.blobs;
  if (++round.taken == size) {
    rounds.erase(key);
    finished_keys.insert(key);
  }
  return out;
}

// A member's communicator: submits operations to its own progress thread, which runs them in order.
class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalFabricState> fabric, std::shared_ptr<LocalGroup> group, int me)
      : fabric_(std::move(fabric)),
        group_(std::move(group)),
        me_(me),
        thread_([this] { progress_loop(); }) {}

  ~LocalComm() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  int rank() const override { return me_; }
  int size() const override { return group_->size(); }
  std::string backend() const override { return "local"; }

  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    Slot s;
    s.kind = OpKind::all_reduce;
    s.dtype = dtype;
    s.op = op;
    s.count = count;
    s.recv = buf;
    return collective(s, {}, count == 0);
  }

  WorkPtr reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts,
                           DType dtype, ReduceOp op) override {
    Slot s;
    s.kind = OpKind::reduce_scatter;
    s.dtype = dtype;
    s.op = op;
    s.send = send;
    s.recv = recv;
    return collective(s, std::vector<size_t>(counts.begin(), counts.end()), false);
  }

  WorkPtr all_gather_v(const void* send, void* recv, std::span<const size_t> counts,
                       DType dtype) override {
    Slot s;
    s.kind = OpKind::all_gather;
    s.dtype = dtype;
    s.send = send;
    s.recv = recv;
    return collective(s, std::vector<size_t>(counts.begin(), counts.end()), false);
  }

  WorkPtr all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                       std::span<const size_t> recv_counts, DType dtype) override {
    Slot s;
    s.kind = OpKind::all_to_all;
    s.dtype = dtype;
    s.send = send;
    s.recv = recv;
    return collective(s, std::vector<size_t>(send_counts.begin(), send_counts.end()), false,
                      std::vector<size_t>(recv_counts.begin(), recv_counts.end()));
  }

  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    if (root < 0 || root >= size()) {
      return bad_call("broadcast", "root " + std::to_string(root) +
                                       " is not a rank of this group of " + std::to_string(size()) +
                                       "; pass a group rank");
    }
    Slot s;
    s.kind = OpKind::broadcast;
    s.dtype = dtype;
    s.root = root;
    s.count = count;
    s.recv = buf;
    return collective(s, {}, count == 0);
  }

  WorkPtr barrier() override { return collective(Slot{}, {}, false); }

  WorkPtr send(const void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    return point_to_point(const_cast<void*>(buf), count, dtype, peer, tag, /*is_send=*/true);
  }
  WorkPtr recv(void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    return point_to_point(buf, count, dtype, peer, tag, /*is_send=*/false);
  }

 private:
  using Task = std::function<void()>;

  std::string describe(const std::string& op) const {
    return op + " on rank " + std::to_string(group_->world_rank(me_)) + " in group " +
           group_->name();
  }
  WorkPtr bad_call(const char* op, const std::string& problem) const {
    return completed_work(Status::error("local comm: " + describe(op) + ": " + problem));
  }

  WorkPtr submit(std::shared_ptr<LocalWork> work, Task task) {
    if (fabric_->failed.load()) {
      work->finish(fabric_->failure_status());
      return work;
    }
    {
      std::lock_guard lk(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return work;
  }

  // recv_counts: all_to_all only.
  WorkPtr collective(Slot slot, std::vector<size_t> counts, bool no_op,
                     std::vector<size_t> recv_counts = {});
  Status run_collective(Slot& slot, const std::string& what);
  Status check_agreement(const Slot* slots) const;
  Status check_all_to_all(const Slot* slots) const;
  void run_all_to_all(const Slot* slots) const;
  WorkPtr point_to_point(void* buf, size_t count, DType dtype, int peer, uint64_t tag,
                         bool is_send);

  void progress_loop() {
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything issued has run
      Task task = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      task();
      lk.lock();
    }
  }

  std::shared_ptr<LocalFabricState> fabric_;
  std::shared_ptr<LocalGroup> group_;
  const int me_;
  uint64_t seq_ = 0;  // collectives run so far (progress thread only)

  std::mutex mu_;  // guards the queue
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

WorkPtr LocalComm::collective(Slot slot, std::vector<size_t> counts, bool no_op,
                              std::vector<size_t> recv_counts) {
  const char* name = op_kind_name(slot.kind);
  const bool reduces = slot.kind == OpKind::all_reduce || slot.kind == OpKind::reduce_scatter;
  if (reduces && !reducible(slot.dtype)) {
    return bad_call(name, std::string("cannot reduce ") + dtype_name(slot.dtype) +
                              "; reduce f32, f64, bf16, f16, i32 or i64 (convert first)");
  }
  if (slot.kind == OpKind::reduce_scatter || slot.kind == OpKind::all_gather) {
    if (counts.size() != static_cast<size_t>(size())) {
      return bad_call(name, "got " + std::to_string(counts.size()) + " counts for a group of " +
                                std::to_string(size()) + "; pass one count per rank");
    }
    no_op = std::all_of(counts.begin(), counts.end(), [](size_t c) { return c == 0; });
  }
  // all_to_all never skips: this member's counts being zero says nothing about the others', and a
  // mismatch must be seen by everyone (check_all_to_all).
  if (slot.kind == OpKind::all_to_all && (counts.size() != static_cast<size_t>(size()) ||
                                          recv_counts.size() != static_cast<size_t>(size()))) {
    return bad_call(name, "got " + std::to_string(counts.size()) + " send counts and " +
                              std::to_string(recv_counts.size()) + " recv counts for a group of " +
                              std::to_string(size()) + "; pass one count per rank in each");
  }
  auto work = std::make_shared<LocalWork>(fabric_, describe(name), false, group_->world_rank(me_));
  if (no_op) {  // every member sees the same counts, so every member skips alike
    return submit(work, [this, work] {
      work->finish(fabric_->failed.load() ? fabric_->failure_status() : Status::ok());
    });
  }
  return submit(work, [this, work, slot, counts = std::move(counts),
                       recv_counts = std::move(recv_counts)]() mutable {
    slot.counts = &counts;
    if (slot.kind == OpKind::all_to_all) slot.recv_counts = &recv_counts;
    work->finish(run_collective(slot, work->what()));
  });
}

Status LocalComm::check_agreement(const Slot* slots) const {
  const Slot& a = slots[0];
  for (int j = 1; j < size(); ++j) {
    const Slot& b = slots[j];
    std::string diff;
    if (a.kind != b.kind) {
      diff = std::string("called ") + op_kind_name(a.kind) + " vs " + op_kind_name(b.kind);
    } else if (a.dtype != b.dtype) {
      diff = std::string("dtype ") + dtype_name(a.dtype) + " vs " + dtype_name(b.dtype);
    } else if (a.op != b.op && (a.kind == OpKind::all_reduce || a.kind == OpKind::reduce_scatter)) {
      diff = std::string("op ") + reduce_op_name(a.op) + " vs " + reduce_op_name(b.op);
    } else if (a.count != b.count) {
      diff = "count " + std::to_string(a.count) + " vs " + std::to_string(b.count);
    } else if (a.root != b.root) {
      diff = "root " + std::to_string(a.root) + " vs " + std::to_string(b.root);
    } else if (a.kind != OpKind::all_to_all && a.counts && b.counts && *a.counts != *b.counts) {
      diff = "different per-rank counts";
    }
    if (!diff.empty()) {
      return Status::error(
          "ranks " + std::to_string(group_->world_rank(0)) + " and " +
          std::to_string(group_->world_rank(j)) + " disagree (" + diff +
          "); every member must issue the same collectives in the same order with the "
          "same arguments");
    }
  }
  return a.kind == OpKind::all_to_all ? check_all_to_all(slots) : Status::ok();
}

// Every member sees every member's counts, so each finds the same first mismatch (pairs in order).
Status LocalComm::check_all_to_all(const Slot* slots) const {
  const int n = size();
  const size_t esz = dtype_size(slots[0].dtype);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const size_t sent = (*slots[i].counts)[j], expected = (*slots[j].recv_counts)[i];
      if (sent != expected) {
        return Status::error(
            "rank " + std::to_string(group_->world_rank(i)) + " sends " + std::to_string(sent) +
            " elements to rank " + std::to_string(group_->world_rank(j)) + ", whose recv_counts[" +
            std::to_string(i) + "] is " + std::to_string(expected) +
            "; recv_counts[p] must equal what group rank p passes as send_counts[rank()]");
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    const Slot& m = slots[i];
    const auto* s = static_cast<const char*>(m.send);
    const auto* r = static_cast<const char*>(m.recv);
    const size_t sb = std::accumulate(m.counts->begin(), m.counts->end(), size_t{0}) * esz;
    const size_t rb =
        std::accumulate(m.recv_counts->begin(), m.recv_counts->end(), size_t{0}) * esz;
    if (sb > 0 && rb > 0 && s < r + rb && r < s + sb) {
      return Status::error("rank " + std::to_string(group_->world_rank(i)) +
                           " passed overlapping send and recv buffers; all_to_all needs two "
                           "separate buffers");
    }
  }
  return Status::ok();
}

// Member i pulls its recv from the senders' buffers (block i of each send, in place), starting
// with rank i+1 so the members do not all read rank 0 first. Each byte is read and written once.
void LocalComm::run_all_to_all(const Slot* slots) const {
  const int n = size();
  const size_t esz = dtype_size(slots[0].dtype);
  const Slot& mine = slots[me_];
  const std::vector<size_t> recv_offsets = prefix_sums(*mine.recv_counts);
  size_t total = 0;  // bytes every member receives, together: read once and written once
  for (int j = 0; j < n; ++j)
    total += std::accumulate(slots[j].counts->begin(), slots[j].counts->end(), size_t{0}) * esz;
  const bool streaming = streams(total, total);
  for (int k = 1; k <= n; ++k) {
    const int j = (me_ + k) % n;
    const size_t count = (*mine.recv_counts)[j];
    if (count == 0) continue;
    const std::vector<size_t>& sent = *slots[j].counts;
    const size_t offset = std::accumulate(sent.begin(), sent.begin() + me_, size_t{0});
    void* dst = at(mine.recv, recv_offsets[j], esz);
    copy_to({&dst, 1}, at(slots[j].send, offset, esz), count * esz, streaming);
  }
}

Status LocalComm::run_collective(Slot& slot, const std::string& what) {
  const int n = size();
  Slot* slots = group_->slots(seq_++);
  slots[me_] = slot;
  const bool has_data = slot.kind != OpKind::barrier;
  TROUPE_RETURN_IF_ERROR(group_->arrive_and_wait(me_, what, has_data));
  if (!has_data) return Status::ok();
  Status agreed = check_agreement(slots);
  if (!agreed.is_ok()) {
    // Every member reaches the same verdict. Meet once more before the slots' counts (owned by
    // each member's task) go away.
    group_->end_access();
    TROUPE_RETURN_IF_ERROR(group_->arrive_and_wait(me_, what, false));
    return agreed;
  }
  const size_t esz = dtype_size(slot.dtype);
  std::vector<void*> dsts(n);
  std::vector<const void*> srcs(n);
  switch (slot.kind) {
    case OpKind::all_reduce: {
      // My share of the count, reduced once and written into every member's buffer (nobody else
      // touches this range, so in place is safe). The destination lines were just read as sources
      // and are still in cache, so ordinary stores cost no DRAM read; streaming stores measured
      // 15-25% slower here.
      const Block part = even_block(slot.count, n, me_);
      if (n > 1 && part.length > 0) {
        for (int j = 0; j < n; ++j) {
          dsts[j] = at(slots[j].recv, part.offset, esz);
          srcs[j] = dsts[j];
        }
        reduce_to(dsts, srcs, part.length, slot.dtype, slot.op, /*streaming=*/false);
      }
      break;
    }
    case OpKind::reduce_scatter: {
      // My share of the concatenated send layout (the owners' blocks when counts are equal),
      // reduced into the recv of each block's owner.
      const std::vector<size_t> offsets = prefix_sums(*slot.counts);
      const bool streaming = streams(n * offsets[n] * esz, offsets[n] * esz);
      for_each_piece(offsets, even_block(offsets[n], n, me_), [&](int j, size_t a, size_t b) {
        for (int r = 0; r < n; ++r) srcs[r] = at(slots[r].send, a, esz);
        void* dst = at(slots[j].recv, a - offsets[j], esz);
        reduce_to({&dst, 1}, srcs, b - a, slot.dtype, slot.op, streaming);
      });
      break;
    }
    case OpKind::all_gather: {
      // My share of the concatenated recv layout: each piece is read once from its sender and
      // pushed into every member's recv (copy_to skips a send that is its own block of recv).
      const std::vector<size_t> offsets = prefix_sums(*slot.counts);
      const bool streaming = streams(offsets[n] * esz, n * offsets[n] * esz);
      for_each_piece(offsets, even_block(offsets[n], n, me_), [&](int j, size_t a, size_t b) {
        for (int r = 0; r < n; ++r) dsts[r] = at(slots[r].recv, a, esz);
        copy_to(dsts, at(slots[j].send, a - offsets[j], esz), (b - a) * esz, streaming);
      });
      break;
    }
    case OpKind::broadcast: {
      // My share of root's buffer, pushed into every other member's (copy_to skips root's own).
      const Block part = even_block(slot.count, n, me_);
      if (part.length > 0) {
        for (int r = 0; r < n; ++r) dsts[r] = at(slots[r].recv, part.offset, esz);
        copy_to(dsts, at(slots[slot.root].recv, part.offset, esz), part.length * esz,
                streams(slot.count * esz, (n - 1) * slot.count * esz));
      }
      break;
    }
    case OpKind::all_to_all:
      run_all_to_all(slots);
      break;
    case OpKind::barrier:
      break;
  }
  group_->end_access();
  return group_->arrive_and_wait(me_, what, false);
}

WorkPtr LocalComm::point_to_point(void* buf, size_t count, DType dtype, int peer, uint64_t tag,
                                  bool is_send) {
  const char* name = is_send ? "send" : "recv";
  if (peer < 0 || peer >= size()) {
    return bad_call(name, "peer " + std::to_string(peer) + " is not a rank of this group of " +
                              std::to_string(size()) + "; pass a group rank");
  }
  if (tag >= kFirstReservedTag) {
    return bad_call(
        name, "tag " + std::to_string(tag) + " is reserved for the backends; use tags below 2^56");
  }
  const std::string op = std::string(name) + (is_send ? " to rank " : " from rank ") +
                         std::to_string(group_->world_rank(peer)) + " (tag " + std::to_string(tag) +
                         ")";
  auto work = std::make_shared<LocalWork>(fabric_, describe(op), true, group_->world_rank(me_));
  P2pEntry entry;
  if (is_send) {
    entry.src = buf;
  } else {
    entry.dst = buf;
  }
  entry.bytes = count * dtype_size(dtype);
  entry.tag = tag;
  entry.work = work;
  const int src = is_send ? me_ : peer, dst = is_send ? peer : me_;
  return submit(work, [this, src, dst, is_send, entry = std::move(entry)]() mutable {
    group_->post(src, dst, is_send, std::move(entry));
  });
}

class LocalWorldImpl final : public CommWorld {
 public:
  LocalWorldImpl(std::shared_ptr<LocalFabricState> fabric, int rank)
      : fabric_(std::move(fabric)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return fabric_->size; }
  std::string backend() const override { return "local"; }

  Result<std::unique_ptr<Communicator>> group(const std::vector<int>& members) override {
    const std::string what =
        "local comm: group " + rank_list(members) + " on rank " + std::to_string(rank_);
    if (members.empty())
      return Status::error(what + ": no members; pass the world ranks of the group");
    int position = -1;
    std::vector<int> sorted = members;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.front() < 0 || sorted.back() >= size()) {
      return Status::error(what + ": members must be world ranks 0.." + std::to_string(size() - 1));
    }
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return Status::error(what + ": a rank is listed twice; list each member once");
    }
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] == rank_) position = static_cast<int>(i);
    }
    if (position < 0)
      return Status::error(what + ": this rank is not a member; only members call group()");
    auto g = fabric_->attach(members, position);
    if (!g.is_ok()) return Status::error(what + " failed: " + g.status().message());
    return std::unique_ptr<Communicator>(
        std::make_unique<LocalComm>(fabric_, std::move(g.value()), position));
  }

 private:
  std::shared_ptr<LocalFabricState> fabric_;
  int rank_;
};

class LocalBootstrapImpl final : public Bootstrap {
 public:
  LocalBootstrapImpl(std::shared_ptr<LocalFabricState> fabric, int rank)
      : fabric_(std::move(fabric)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return fabric_->size; }
  Result<std::vector<std::string>> all_gather(const std::string& key,
                                              const std::string& mine) override {
    return fabric_->boot_gather(rank_, "gather/" + key, mine);
  }
  Status barrier(const std::string& key) override {
    auto r = fabric_->boot_gather(rank_, "barrier/" + key, "");
    return r.is_ok() ? Status::ok() : r.status();
  }

 private:
  std::shared_ptr<LocalFabricState> fabric_;
  int rank_;
};

}  // namespace detail

Result<LocalFabric> LocalFabric::create(int size, LocalFabricOptions options) {
  if (size < 1) {
    return Status::error("local fabric: size " + std::to_string(size) +
                         " is invalid; a fabric needs at least 1 rank");
  }
  if (options.timeout.count() < 0) {
    return Status::error("local fabric: timeout " + std::to_string(options.timeout.count()) +
                         " ms is negative; pass 0 (no timeout) or a positive duration");
  }
  auto state = std::make_shared<detail::LocalFabricState>();
  state->size = size;
  state->timeout = options.timeout;
  state->in_wait = std::vector<std::atomic<int>>(static_cast<size_t>(size));
  return LocalFabric(std::move(state));
}

int LocalFabric::size() const {
  return state_->size;
}

std::unique_ptr<CommWorld> LocalFabric::world(int rank) const {
  TROUPE_CHECK(rank >= 0 && rank < state_->size,
               "LocalFabric::world: rank out of range; pass 0 <= rank < size()");
  return std::make_unique<detail::LocalWorldImpl>(state_, rank);
}

std::unique_ptr<Bootstrap> LocalFabric::bootstrap(int rank) const {
  TROUPE_CHECK(rank >= 0 && rank < state_->size,
               "LocalFabric::bootstrap: rank out of range; pass 0 <= rank < size()");
  return std::make_unique<detail::LocalBootstrapImpl>(state_, rank);
}

void LocalFabric::abort(int rank, const std::string& reason) const {
  state_->fail("rank " + std::to_string(rank) + " aborted: " + reason);
}

Status LocalFabric::status() const {
  return state_->failed.load() ? state_->failure_status() : Status::ok();
}

}  // namespace troupe::comm
