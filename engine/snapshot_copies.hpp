// In-memory snapshots of a job that spans hosts (--save-memory-interval under troupe launch
// --nnodes N > 1; docs/RESILIENCE.md, "Memory snapshots"). Each host keeps its snapshots in a tmpfs
// folder of its own (its launcher's), and each process's shard has a second copy in the folder of
// its buddy: the process of the next host (hosts in a ring by node rank) with the same local rank
// (modulo that host's count), so with two hosts or more no shard has both copies on one host. Each
// host's folder holds its own shards and its predecessor host's, with the whole snapshot's
// metadata.json (every shard's digest). At a start the processes agree on the newest snapshot of
// the run whose every shard is on some host; each host fetches the shards its folder lacks from the
// hosts that hold them, then every process loads the snapshot from its own host's folder.
//
// Everything here is collective over the job's processes (one rank each) and runs on one thread at
// a time: the recovery in resolve_run, the exchange on the offload actor's thread after the
// snapshot's shards are written. The shards travel over a communicator of the job's world of their
// own; the bootstrap carries only the small reports. Each copy is checked against its checksum
// before it is written.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/world.hpp"
#include "storage/shard_coverage.hpp"
#include "storage/sharded_checkpoint.hpp"
#include "troupe/status.hpp"

namespace troupe {

// Where a process runs: its node (launch env's node_rank) and its rank on it.
struct SnapshotPeer {
  int node = 0;
  int local_rank = 0;
};
// buddies[p]: the process on the next node (nodes ordered by index, the last followed by the first)
// whose place among that node's processes (by world rank) is p's local rank modulo their count; -1
// for every process when all are on one node.
std::vector<int> snapshot_buddies(const std::vector<SnapshotPeer>& peers);

// What a process reports at a start: whether it was restarted, the run id it would resume, the
// newest checkpoint of that run in --save (-1: none), and what its host's folder holds.
struct SnapshotReport {
  bool restarted = false;
  std::string expected_run;  // "" when none (hex otherwise)
  int64_t disk_latest = -1;
  std::vector<HeldIteration> held;
};
// One line per field and held iteration; the parser is strict and bounded (at most kMaxHeldReported
// iterations, shard indices ascending and below the iteration's count, ids hex): the fuzz target
// snapshot_report's entry.
inline constexpr size_t kMaxHeldReported = 64;
inline constexpr int kMaxSnapshotShards = 1 << 20;
std::string encode_snapshot_report(const SnapshotReport& report);
Result<SnapshotReport> parse_snapshot_report(std::string_view text);  // engine/snapshot_report.cpp

// Who sends which shard to whom at a start.
struct ShardFetch {
  int shard = 0;
  int from = 0;  // a process whose host's folder holds it
  int to = 0;    // a process of the host that lacks it
};
struct RecoveryPlan {
  int64_t iteration = -1;  // -1: nothing to resume from memory
  std::vector<ShardFetch> fetches;
  int metadata_from = -1;  // the first process whose host's folder has the iteration's metadata.json
  bool by_reads = false;   // each host fetches the shards its ranks read (else all it lacks)
};
// Decided by rank 0's report (restarted, run id, --save's newest): the newest iteration of that run,
// newer than --save's, whose shards (as many as the processes of the job that wrote it: an elastic
// round may have more or fewer) are together on the hosts; each shard a host needs and lacks is
// fetched by one process of that host (its shards spread over the host's processes) from one that
// holds it (spread over the holders). A host needs the shards its processes' ranks read -- `reads`,
// the snapshot's metadata.json's, when it has one list per process (the layout that wrote it) --
// else every shard.
RecoveryPlan plan_snapshot_recovery(const std::vector<SnapshotReport>& reports, const std::vector<SnapshotPeer>& peers,
                                    const std::vector<std::vector<int>>& reads = {});

class SnapshotCopies {
 public:
  // Collective: gathers where every process runs, makes the copies' communicator.
  static Result<std::unique_ptr<SnapshotCopies>> open(comm::Bootstrap& bootstrap, comm::CommWorld& world, int node,
                                                      int local_rank);
  ~SnapshotCopies();  // lets the kept copies' files go
  SnapshotCopies(const SnapshotCopies&) = delete;
  SnapshotCopies& operator=(const SnapshotCopies&) = delete;
  int buddy() const { return buddies_[static_cast<size_t>(rank_)]; }
  // This process has the lowest rank of its host: it writes the host folder's metadata.json.
  bool first_of_host() const { return first_of_host_; }
  int hosts() const { return hosts_; }

  // After every process's shard of `iteration` is in its host's folder `dir`: sends this process's
  // to its buddy and writes the copies it receives into `dir`, then gathers every shard's digest
  // and the shards each rank reads (for metadata.json, in shard order). Which shards a rank reads
  // is worked out at the first exchange from every process's coverage (its rank's, built once:
  // what its shard holds, what it reads), sent once to all; `reads` comes back empty when a process
  // had none.
  // A copy is received into the file of the same process's copy two snapshots before, once that
  // snapshot was dropped (kept as SNAPSHOT_DIR/.recycle/copy.<shard file>.<pid>.<n>): its pages are
  // in place, so receiving neither faults nor clears a page per 4 KiB (copies_in_place counts them).
  struct Exchanged {
    std::vector<ShardDigest> digests;
    std::vector<std::vector<int>> reads;
    int copies_in_place = 0;
  };
  Result<Exchanged> exchange(const std::string& dir, int64_t iteration,
                             std::shared_ptr<const RankCoverage> coverage);

  // At a start, before loading: reports what `dir` holds, agrees on the snapshot to resume
  // (plan_snapshot_recovery), fetches what this host lacks and makes it `dir`'s latest. Returns the
  // iteration (-1: none) and a note for the log.
  struct Recovered {
    int64_t iteration = -1;
    std::string note;
  };
  Result<Recovered> recover(const std::string& dir, const SnapshotReport& mine);

 private:
  SnapshotCopies(comm::Bootstrap& bootstrap, std::unique_ptr<comm::Communicator> comm, std::vector<SnapshotPeer> peers,
                 int rank);
  comm::Bootstrap& bootstrap_;
  std::unique_ptr<comm::Communicator> comm_;
  std::vector<SnapshotPeer> peers_;
  std::vector<int> buddies_;
  // The shards this process's rank reads ("1,4"; "." none; "-" unknown), once worked out.
  Result<std::string> my_reads(std::shared_ptr<const RankCoverage> coverage);
  std::optional<std::string> my_reads_;
  // The received copies' files kept for later snapshots, oldest first (at most two per sender).
  struct KeptCopy {
    int peer = 0;
    std::string link;
  };
  std::vector<KeptCopy> kept_;
  bool swept_ = false;
  std::string take_kept_copy(int peer);  // a kept file of `peer`'s no snapshot holds, or ""
  void keep_copy(const std::string& path, int peer);
  int rank_ = 0;
  int hosts_ = 1;
  bool first_of_host_ = true;
};

}  // namespace troupe
