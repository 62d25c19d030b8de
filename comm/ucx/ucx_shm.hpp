// Private to the ucx backend: the shared-memory data path of groups whose members all live on this
// host (the design is in comm/ucx/ucx_world.hpp, "Same-host groups").
//
// Segments. Each rank with shared memory enabled creates one segment at world creation: an
// anonymous file (memfd_create), which has no name in /dev/shm or anywhere else, so nothing
// outlives the processes that map it, however they end (SIGKILL at any moment included). Its
// same-host peers open it through /proc/<owner pid>/fd/<fd> (the descriptor in the owner's address
// blob) and map it read-write; the kernel allows that to processes of the same user and group while
// the owner is dumpable (a ptrace "read" check, which Yama's ptrace_scope does not restrict). Its
// size is sealed (nobody can shrink it under a mapping). Layout:
//   Header     magic, version, owner rank and pid, a random nonce (so a peer knows it mapped the
//              right segment), and `asleep`: set while no thread of the owner drives progress
//              although it has shared-memory work in flight; a peer that publishes something then
//              clears it and wakes the owner with a UCX active message (the owner's event fd).
//   Directory  kDirEntries entries {group id, area offset, area bytes}: where the owner keeps each
//              group's staging area. bytes == 0 publishes "no area" (the segment is full): every
//              member then runs that group's large collectives with the UCX algorithms instead.
//   Areas      allocated lazily, at a group's first shared-memory collective, and fallocate'd first
//              so a lack of memory means a clean fallback rather than SIGBUS.
//
// Area of a group of p ranks, owned by member w: kShmLanes lanes, each
//   LaneHead   in_tok, out_tok (the token of the chunk whose pieces are published), sig (the
//              operation's signature, to catch ranks that disagree on the call)
//   ack_in[q], ack_out[q] (one cache line each): the token of the last chunk of w's lane that
//              member q finished reading (in: an input piece for q's reduction; out: a result or
//              gathered piece)
//   p pieces of slot_bytes (the whole run for all_gather)
// Only w writes its pieces and heads; only q writes ack_*[q]. Tokens are hashes of (group id, the
// group's chunk sequence number), never 0, so stale values from an earlier use of the memory never
// match. A writer reuses a lane only after every reader acknowledged the lane's previous chunk.
//
// Threads: ShmWorld's creation and attach run during world creation; allocate/release and
// the directory are locked and may be called from any thread; everything else (ShmChannel, the
// flags) belongs to the engine's drive-token holder.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::comm::ucx {

class Op;

constexpr int kShmLanes = 4;
constexpr int kDirEntries = 1024;
constexpr size_t kShmMaxRanks = 64;  // larger groups keep the UCX algorithms

struct alignas(64) ShmWord {
  std::atomic<uint64_t> v{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory flags need lock-free atomics");

struct alignas(64) LaneHead {
  std::atomic<uint64_t> in_tok{0};
  std::atomic<uint64_t> out_tok{0};
  std::atomic<uint64_t> sig{0};
};

// Byte offsets inside one group area (identical on every member: p and slot_bytes are shared).
struct AreaLayout {
  int p = 0;
  size_t slot_bytes = 0;  // one piece; a multiple of 4096
  size_t ctl_bytes = 0;   // LaneHead + 2p ack words, rounded up to 4096
  size_t lane_bytes = 0;  // ctl_bytes + p * slot_bytes
  AreaLayout(int p, size_t slot_bytes);
  size_t area_bytes() const { return lane_bytes * kShmLanes; }
  size_t data_bytes() const { return static_cast<size_t>(p) * slot_bytes; }  // of one lane
};

// One group's staging areas as this rank sees them, and the order its shared-memory collectives
// run in (one at a time, in call order, which every member shares).
struct ShmChannel {
  enum class State { unresolved, ready, fallback, broken };
  State state = State::unresolved;
  std::string broken_reason;
  uint64_t group_id = 0;
  std::vector<int> members;  // world ranks
  int rank = 0;              // group rank
  AreaLayout layout;
  bool own_published = false;
  std::vector<char*> areas;  // per group rank, once found (own included)
  uint64_t next_seq = 0;     // chunks this group moved so far (equal on all members)
  struct LaneUse {           // what the last chunk written into own lane L still waits for
    uint64_t token = 0;
    bool need_in = false, need_out = false;
    uint64_t readers = ~uint64_t{0};  // the group ranks whose acknowledgements it waits for
  };
  LaneUse lanes[kShmLanes];
  std::deque<Op*> queue;  // its shared-memory collectives; the front one runs

  ShmChannel(uint64_t id, std::vector<int> m, int r, size_t slot_bytes)
      : group_id(id),
        members(std::move(m)),
        rank(r),
        layout(static_cast<int>(members.size()), slot_bytes),
        areas(members.size(), nullptr) {}
  int size() const { return static_cast<int>(members.size()); }
  // Pointers into member q's area (group rank), lane L.
  LaneHead* head(int q, int lane) const {
    return reinterpret_cast<LaneHead*>(areas[static_cast<size_t>(q)] + lane * layout.lane_bytes);
  }
  ShmWord* ack_in(int q, int lane, int reader) const {
    return reinterpret_cast<ShmWord*>(areas[static_cast<size_t>(q)] + lane * layout.lane_bytes) +
           1 + reader;
  }
  ShmWord* ack_out(int q, int lane, int reader) const { return ack_in(q, lane, layout.p + reader); }
  char* piece(int q, int lane, int j) const {
    return areas[static_cast<size_t>(q)] + lane * layout.lane_bytes + layout.ctl_bytes +
           static_cast<size_t>(j) * layout.slot_bytes;
  }
  uint64_t token(uint64_t seq) const;
  // True once every reader acknowledged what own lane L last held (then it may be overwritten).
  bool lane_free(int lane);
};

// This rank's segment and its view of the peers' segments.
class ShmWorld {
 public:
  // Creates this rank's segment of `bytes` (header and directory included).
  static Result<std::unique_ptr<ShmWorld>> create(int rank, int world_size, size_t bytes);
  ~ShmWorld();
  ShmWorld(const ShmWorld&) = delete;
  ShmWorld& operator=(const ShmWorld&) = delete;

  // "fd<fd>:<nonce>", for the peers' attach().
  std::string descriptor() const;
  // Maps peer r's segment (process `pid` on this host) from its descriptor and checks its header.
  Status attach(int r, const std::string& descriptor, long pid);
  bool attached(int r) const { return bases_[static_cast<size_t>(r)] != nullptr; }

  // Own area for `group_id` (allocated and published on the first call); nullptr when the segment
  // has no room (then "no area" is published); an error when the directory is full. Any thread.
  Result<char*> own_area(uint64_t group_id, size_t bytes);
  // The group is gone: its area returns to the free list once every reader acknowledged what it
  // last read (`pending`: the lanes' last tokens and which acks they need). Any thread.
  void release(uint64_t group_id, const ShmChannel& channel);
  // Peer r's area for `group_id`: 1 found (*area set), 0 not published yet, -1 published as none.
  int find_area(int r, uint64_t group_id, char** area) const;

  // The owner's sleep flag, and the peers' (exchange to 0: true if it was set).
  void set_asleep(bool asleep);
  bool take_asleep(int r);

 private:
  struct Header;
  struct DirEntry;
  struct Quarantined {
    size_t offset, bytes;
    std::vector<std::pair<const ShmWord*, uint64_t>> acks;  // word, token it must reach
  };
  ShmWorld(int rank, int world_size);
  Header* header(int r) const { return reinterpret_cast<Header*>(bases_[static_cast<size_t>(r)]); }
  DirEntry* directory(int r) const;
  void reclaim();  // mu_ held: quarantined areas whose readers are done go back to free_

  int rank_;
  uint64_t nonce_ = 0;
  int fd_ = -1;  // the memfd; kept for fallocate of new areas
  size_t bytes_ = 0;
  std::vector<char*> bases_;  // per world rank: mapped segment or nullptr
  std::vector<size_t> sizes_;
  std::mutex mu_;
  std::map<size_t, size_t> free_;                        // offset -> bytes
  std::map<uint64_t, std::pair<size_t, size_t>> owned_;  // group id -> (offset, bytes)
  std::vector<Quarantined> quarantine_;
};

}  // namespace troupe::comm::ucx
