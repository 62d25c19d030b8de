// Private to the ucx backend (see comm/ucx/ucx_world.hpp for the design): the Engine owns the UCP
// context, worker, endpoints and progress thread of one world; an Op is one collective or
// point-to-point operation, a state machine driven by request completions; a Msg is one UCX request
// of an Op.
//
// Threads: Engine::submit(), make_group() and drive_until() may be called from any thread.
// Everything else (Op methods, Engine::post_*, the p2p matching, every UCX call after creation)
// runs only in the thread that holds the engine's drive token: the progress thread, or a thread
// waiting in WorkState::wait that drives progress itself. Ops therefore need no locks of their own.
#pragma once
#include <poll.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/communicator.hpp"
#include "comm/ucx/ucx_shm.hpp"
#include "comm/ucx/ucx_world.hpp"
#include "troupe/status.hpp"

namespace troupe::comm::ucx {

// ---- Tags (layout in comm/ucx/ucx_world.hpp) ----
constexpr int kTagChunkBits = 12;
constexpr int kTagStepBits = 12;
constexpr int kTagSeqBits = 16;
constexpr int kTagGroupBits = 22;
uint64_t make_tag(uint32_t group_tag_id, uint64_t seq, uint32_t step, uint32_t chunk);

// A group as the ops see it; immutable once built, shared by the communicator and its ops.
struct GroupInfo {
  uint64_t id = 0;           // 64-bit hash of (members, creation index): p2p headers
  uint32_t tag_id = 0;       // its low kTagGroupBits (folded): collective tags
  std::vector<int> members;  // world ranks in group-rank order
  int rank = 0;              // this rank's group rank
  bool one_host = false;     // all members share this host (same hostname and pid namespace)
  // Set when every member mapped every other member's shared-memory segment: the group's large
  // collectives then move through shared memory (ucx_shm_ops.cpp). Driver-thread state.
  std::shared_ptr<ShmChannel> channel;
  int size() const { return static_cast<int>(members.size()); }
  bool contains(int world_rank) const;
};

class Engine;
class Op;

// The Work handle of an Op: completed once by whichever thread drives progress, waited on by the
// caller. wait() drives the engine itself while it waits (see Engine::drive_until).
class WorkState final : public Work {
 public:
  explicit WorkState(std::weak_ptr<Engine> engine) : engine_(std::move(engine)) {}
  bool done() const { return done_.load(std::memory_order_acquire); }
  void complete(Status status);
  void wait_for(std::chrono::microseconds timeout);  // returns early when completed

 private:
  Status do_wait() override;
  bool do_test() override { return done(); }
  std::weak_ptr<Engine> engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  Status status_;
};

// One UCX request of an Op. Lives in its Op's pool; `req` is non-null while UCX holds it.
struct Msg {
  Op* op = nullptr;
  void* req = nullptr;
  ucs_status_t status = UCS_OK;
  size_t expected = 0;  // bytes a receive must get (a shorter message means the ranks disagree)
  size_t length = 0;    // bytes received
  int peer = -1;        // world rank at the other end
  int a = 0, b = 0;     // op-defined (chunk slot, step, ...)
  bool is_send = false;
  bool pending = false;  // posted and not yet delivered back to the op
  bool called = false;   // completion recorded (maybe before the posting call returned)
};

// One operation. Subclasses implement start() and on_complete(); the base class counts outstanding
// requests, turns a failed request into a failed operation (cancelling the rest first, so the
// caller's buffers are free when wait() returns) and completes the Work.
class Op {
 public:
  Op(Engine& engine, std::shared_ptr<const GroupInfo> group, uint64_t seq, std::string name);
  virtual ~Op() = default;
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  WorkPtr work() const { return work_; }
  const std::string& name() const { return name_; }

  // ---- drive-token holder only ----
  void begin();          // fails at once if a member already failed, else start()
  void deliver(Msg* m);  // a request completed (m->status)
  void fail(const Status& status);
  virtual bool involves(int world_rank) const { return group_->contains(world_rank); }
  virtual bool waits_on(int world_rank) const;  // has a receive from world_rank outstanding
  // Ops that move data without UCX requests (shared memory) are polled while registered with
  // Engine::add_poller; true if anything happened.
  virtual bool poll() { return false; }
  bool finished() const { return completed_ && outstanding_ == 0; }
  // A failing op whose remaining requests all involve failed peers (UCX may never return those), or
  // that has been failing for longer than `grace`, reports its failure anyway; the leftover
  // requests are dropped with the worker. Returns true if it did.
  bool abandon_if_stale(std::chrono::steady_clock::time_point now, std::chrono::milliseconds grace);
  std::list<std::unique_ptr<Op>>::iterator self;  // the engine's handle on this op

 protected:
  virtual void start() = 0;
  virtual void on_complete(Msg& m) = 0;  // a request of this op succeeded
  virtual void on_fail() {}              // hook: undo registrations (p2p matching)
  void succeed();                        // all requests done; completes the Work with ok
  // Why request m moved another size than it expected (m.length: what arrived; on truncation
  // what the sender sent when UCX says, else 0): the ranks disagree. Ops that take counts from
  // the caller say it in the caller's terms.
  virtual std::string size_mismatch(const Msg& m) const;

  // Collective messages to/from group rank `peer`, tagged (group, seq, step, chunk).
  Msg* send_to(int peer, const void* buf, size_t bytes, uint32_t step, uint32_t chunk, int a = 0,
               int b = 0);
  Msg* recv_from(int peer, void* buf, size_t bytes, uint32_t step, uint32_t chunk, int a = 0,
                 int b = 0);
  Msg* new_msg(int world_peer, bool is_send);
  void mark_posted(Msg* m);  // m is handed to the engine: counted until delivered back
  int world_of(int group_rank) const { return group_->members[static_cast<size_t>(group_rank)]; }
  bool failing() const { return failed_; }

  Engine& engine_;
  std::shared_ptr<const GroupInfo> group_;
  uint64_t seq_;

 private:
  friend class Engine;
  Status failure_for(const Msg& m) const;

  std::string name_;
  std::shared_ptr<WorkState> work_;
  std::deque<Msg> msgs_;
  std::vector<Msg*> free_msgs_;
  int outstanding_ = 0;
  bool completed_ = false;  // the Work is completed
  bool failed_ = false;     // failing: waiting for cancelled requests
  Status failure_;
  std::chrono::steady_clock::time_point fail_time_{};
};

// ---- point-to-point (ucx_p2p.cpp) ----
struct P2PHeader {
  uint64_t group_id;
  uint64_t tag;
  uint64_t seq;  // per (group, sender, receiver), from 0
  uint64_t bytes;
  int32_t src;  // world rank
  uint32_t magic;
};

// A message that arrived by active message. `data` is UCX's (eager data kept with UCS_INPROGRESS,
// or a rendezvous descriptor) unless `copy` holds it.
struct Arrival {
  P2PHeader hdr{};
  void* data = nullptr;
  bool rndv = false;
  bool ucx_owned = false;
  std::vector<char> copy;
};

class P2PRecvOp;

// The messages of one (group, source) pair at this rank.
struct P2PChannel {
  uint64_t next_seq = 0;
  std::map<uint64_t, Arrival> early;  // arrived ahead of next_seq
  std::deque<Arrival> unexpected;     // in send order, no receive posted yet
  std::deque<P2PRecvOp*> posted;      // in post order, no message yet
};

std::unique_ptr<Op> make_p2p_send(Engine& engine, std::shared_ptr<const GroupInfo> group,
                                  uint64_t seq, const void* buf, size_t bytes, int peer,
                                  uint64_t tag);
std::unique_ptr<Op> make_p2p_recv(Engine& engine, std::shared_ptr<const GroupInfo> group,
                                  uint64_t seq, void* buf, size_t bytes, int peer, uint64_t tag);

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // Collective over the bootstrap's ranks (see create_ucx_world). `options` already has the
  // environment applied.
  static Result<std::shared_ptr<Engine>> create(Bootstrap& bootstrap, const UcxOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const UcxOptions& options() const { return options_; }

  // ---- any thread ----
  // Queues `op` and returns its Work; starts it right away when no other thread drives.
  WorkPtr submit(std::unique_ptr<Op> op);
  // Called by WorkState::wait: the waiting thread drives progress itself until `work` completes
  // (the progress thread steps aside meanwhile), which saves two thread hand-offs per operation and
  // keeps one thread per rank busy instead of two.
  void drive_until(WorkState& work);
  // Validates `members`, derives the group's ids and registers its tag id (see ucx_world.hpp).
  Result<std::shared_ptr<const GroupInfo>> make_group(const std::vector<int>& members);
  void release_group(const GroupInfo& group);

  // ---- drive-token holder only (the progress thread or a driving waiter) ----
  void post_tag_send(Msg* m, const void* buf, size_t bytes, uint64_t tag);
  void post_tag_recv(Msg* m, void* buf, size_t bytes, uint64_t tag);
  void post_am_send(Msg* m, const P2PHeader& header, const void* buf, size_t bytes);
  void post_am_recv_data(Msg* m, void* desc, void* buf, size_t bytes);
  void cancel(Msg* m);
  // Ok while world rank `r` is alive; else why not (failed, or departed after destroying its
  // world).
  Status peer_status(int r) const;
  bool peer_failed(int r) const { return peer_state_[static_cast<size_t>(r)] == PeerState::failed; }
  // CommWorld::abort: every peer counts as failed with `why` from the progress thread's next check
  // (at most ~20 ms of progress later): pending and later operations fail. Any thread.
  void request_abort(const std::string& why);
  // "rank R (host H, pid P)": how failure messages name world rank r.
  const std::string& who(int r) const { return peer_names_[static_cast<size_t>(r)]; }
  // Scratch buffers of options().chunk_bytes for the ring, recycled (freed with the engine).
  void* acquire_slot();
  void release_slot(void* slot);
  // Runs `op` (an operation's helper, e.g. a fallback algorithm) like a submitted one.
  void adopt(std::unique_ptr<Op> op);
  // Shared memory (ucx_shm.hpp): pollers, areas, waking peers that sleep.
  void add_poller(Op* op);
  void remove_poller(Op* op);
  Result<char*> shm_own_area(uint64_t group_id, size_t bytes);  // nullptr: no room (fall back)
  int shm_find_area(int world_rank, uint64_t group_id, char** area) const;
  void shm_notify(const std::vector<int>& members);  // wakes members asleep with work in flight
  // Whether copies of `bytes` into a user buffer should bypass the caches: the ranks on this host
  // together write at least half the last-level cache, and this rank an eighth of it. (Measured
  // on a 32 MiB cache, all_gather: 2 ranks gain at 8 MiB and lose at 4 MiB, 4 ranks gain at 4 MiB,
  // 8 ranks gain at 4 MiB and lose at 2 MiB.)
  bool stream_stores(size_t bytes) const {
    return 8 * bytes >= stream_bytes_ && 2 * bytes * local_ranks_ >= stream_bytes_;
  }

  // p2p matching (ucx_p2p.cpp)
  uint64_t next_send_seq(uint64_t group_id, int dst);
  void p2p_post(P2PRecvOp* op, uint64_t group_id, int src);
  void p2p_unpost(P2PRecvOp* op, uint64_t group_id, int src);
  void release_arrival(Arrival& a);
  void add_arrival(Arrival a) { arrivals_.push_back(std::move(a)); }

 private:
  enum class PeerState : uint8_t { alive, departed, failed };
  struct EpContext {
    Engine* engine;
    int rank;
  };
  struct ControlEvent {
    uint32_t type;
    int rank;  // the rank the event is about
    int from;  // who said so
  };

  Engine(int rank, int size, const UcxOptions& options);
  Status init_ucx();
  // identities[r] = "host=<hostname> pidns=<pid namespace> pid=<pid>" of rank r.
  Status connect(const std::vector<std::string>& addresses,
                 const std::vector<std::string>& identities);
  void watch_process(int r, const std::string& identity);  // own liveness check (MODE_NONE peers)
  std::vector<pollfd> wait_fds() const;  // the event fd and the pidfds of live watched peers
  void handle_watch(const std::vector<pollfd>& fds);  // marks peers whose pidfd fired as failed
  void periodic_checks();  // /proc checks, an abort asked for, and stale failures, at most every 20 ms
  void abandon_stale_failures();
  void run();   // the progress thread
  bool pump();  // one round of everything; true if anything happened (token held)
  // Pumps (token `lk` held) until done(); sleeps on the event fd when idle, releasing the token.
  // A driver spins (yielding) for `spin` after its last event before it sleeps.
  void drive(std::unique_lock<std::timed_mutex>& lk, const std::function<bool()>& done,
             int sleep_ms, std::chrono::microseconds spin);
  void reap(Op* op);
  void complete_msg(Msg* m, ucs_status_t status, size_t length);
  void handle_peer_error(int r, ucs_status_t status);
  void handle_control(const ControlEvent& e);
  void mark_failed(int r, const std::string& reason, bool tell_others);
  void send_control(int to, uint32_t type, int about);
  bool wait_request(void* req, double seconds);  // progress until req completes; false on timeout
  void shutdown_network();
  void process_arrivals();  // ucx_p2p.cpp
  bool poll_shm();          // polls the registered ops once; true if anything happened
  // Before the token holder lets go without sleeping: with shared-memory work in flight, tell the
  // peers to wake this rank (its flag), then look once more (what arrived before the flag).
  void going_idle();
  Status setup_shm(Bootstrap& bootstrap, int index, const std::vector<std::string>& identities);

  static void send_cb(void* req, ucs_status_t status, void* user_data);
  static void recv_cb(void* req, ucs_status_t status, const ucp_tag_recv_info_t* info,
                      void* user_data);
  static void am_data_cb(void* req, ucs_status_t status, size_t length, void* user_data);
  static void ep_error_cb(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t am_p2p_cb(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t am_control_cb(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param);

  const int rank_;
  const int size_;
  const UcxOptions options_;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  // Peers whose endpoint has no UCX error handling (shared-memory transports in UCX 1.13 do not
  // support UCP_ERR_HANDLING_MODE_PEER): this rank watches their process itself.
  std::vector<int> pidfds_;  // per rank: pidfd, or -1
  std::vector<long>
      proc_pids_;  // per rank: pid checked through /proc when there is no pidfd, or -1
  std::chrono::steady_clock::time_point next_check_{};

  // The drive token: whoever holds it may call UCX and touch the progress-thread state below.
  std::timed_mutex drive_mu_;
  std::atomic<int> drivers_waiting_{0};  // user threads in drive_until
  std::atomic<int> live_ops_{0};         // submitted and not yet reaped
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;  // wakes the progress thread when the last driver leaves
  std::vector<ucp_ep_h> eps_;
  std::vector<EpContext> ep_contexts_;
  std::vector<PeerState> peer_state_;
  std::vector<std::string> peer_reason_;
  std::vector<std::string> host_keys_;  // per rank "hostname/pid namespace"; immutable after create
  std::vector<std::string> peer_names_;  // per rank, see who(); immutable after create

  // Submissions and groups (any thread).
  std::mutex mu_;
  std::vector<std::unique_ptr<Op>> submitted_;
  std::map<std::vector<int>, uint64_t> group_counts_;
  std::multiset<uint32_t> live_tag_ids_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // request_abort (any thread): every peer is failed with the reason at the next periodic check.
  std::atomic<bool> abort_requested_{false};
  bool aborted_ = false;  // drive-token holder's
  std::mutex abort_mu_;
  std::string abort_reason_;

  // Drive-token holder's state.
  std::list<std::unique_ptr<Op>> ops_;
  std::vector<Msg*> completions_;
  std::vector<std::pair<int, ucs_status_t>> ep_errors_;
  std::vector<ControlEvent> controls_;
  std::vector<Arrival> arrivals_;
  std::map<std::pair<uint64_t, int>, P2PChannel> channels_;
  std::map<std::pair<uint64_t, int>, uint64_t> send_seqs_;
  std::vector<void*> closing_;  // endpoint-close requests in flight
  std::vector<void*> free_slots_;
  std::vector<void*> all_slots_;
  bool stopping_ = false;
  bool abandoned_ = false;  // some operation was reported failed with requests left in UCX
  std::vector<Op*> pollers_;

  // Shared memory: this rank's segment (null when unused) and which ranks mapped all their
  // same-host peers' segments (immutable after create).
  std::unique_ptr<ShmWorld> shm_;
  std::vector<char> shm_ok_;
  size_t local_ranks_ = 1;
  size_t stream_bytes_ = size_t{32} << 20;
};

}  // namespace troupe::comm::ucx
