// The offload actor (one per process; docs/ARCHITECTURE.md): background checkpoint I/O. Ranks hand it host
// snapshots of their shards and go back to training; it writes them on its own thread, in arrival
// order, then completes each save (waits for the job's other processes, writes the metadata and the
// latest pointer) once this process's shards of that save are on disk. It owns the process's host
// memory pool (storage/host_pool.hpp), from which the optimizer partitions take their offloaded
// moments (--offload-optimizer cpu) or their swap buffers (nvme; engine/moment_store.hpp).
//
// Failures: the first failed write or commit is sent to the listener as (failed_atom, message), so
// the job stops, and every later flush replies it. flush replies once all queued work is done: the
// job flushes before it exits, so no save is lost.
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "engine/buffer_recycler.hpp"
#include "storage/checkpoint.hpp"
#include "storage/host_pool.hpp"
#include "storage/shard_file.hpp"

namespace troupe {

using write_atom = caf::atom_constant<caf::atom("write")>;
using commit_atom = caf::atom_constant<caf::atom("commit")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;

struct ShardWrite {
  std::string path;
  int rank = 0;
  int64_t iteration = 0;
  ShardContents contents;  // host copies: the rank's tensors may change right after
  // An in-memory snapshot's: the rank's recycler, whose kept files the pieces may lie in and which
  // keeps this shard's file for a later snapshot (engine/buffer_recycler.hpp). Null for saves.
  std::shared_ptr<BufferRecycler> recycler;
};

using offload_actor = caf::typed_actor<caf::reacts_to<write_atom, ShardWrite>,
                                       caf::reacts_to<commit_atom, SaveRequest>,
                                       caf::replies_to<flush_atom>::with<ok_atom>>;

// commit: completes a save after this process's shards are written (barrier, metadata, latest); an
// in-memory snapshot's commit (with its copies to the buddy host) runs at the lowest priority while
// the ranks train, as the writes do. A committed save's report carries the background CPU time its
// writes and commit took (SavedCheckpoint::writer_cpu_seconds).
// saves_in_flight: whoever sends a commit increments it first, the actor decrements it once that
// commit is done; while more than one save is in flight the writer does not pace itself (it is behind:
// catching up beats holding several snapshots in memory).
// mailbox: the messages (shards, commits) waiting behind the one the actor takes up, for the inspector.
// draining: set by the job once training is over and it waits for the queue (flush): from then on the
// writer does not pace itself (no step is left to protect; paced on a machine busy with other work,
// a job's last save took minutes).
offload_actor spawn_offload(caf::actor_system& system, std::function<Status(const SaveRequest&)> commit,
                            caf::actor listener, std::shared_ptr<HostPool> pool = std::make_shared<HostPool>(),
                            std::shared_ptr<std::atomic<int>> saves_in_flight = std::make_shared<std::atomic<int>>(0),
                            std::shared_ptr<std::atomic<int64_t>> mailbox = std::make_shared<std::atomic<int64_t>>(0),
                            std::shared_ptr<std::atomic<bool>> draining = std::make_shared<std::atomic<bool>>(false));

}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::ShardWrite)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::HostPool>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<std::atomic<int>>)
