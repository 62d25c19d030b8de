// The "ucx" backend: ranks in different processes or nodes exchange host memory over UCX (UCP tag
// API for collectives, active messages for tagged send/recv). Shared memory (sysv/posix/cma), TCP
// and InfiniBand/RoCE are whatever UCX selects; UCX_TLS / UCX_NET_DEVICES steer it as usual.
//
//   auto boot = FileBootstrap::create(dir, rank, world_size).value();   // or a CafBootstrap
//   std::unique_ptr<CommWorld> world = create_ucx_world(*boot).value();
//   auto dp = world->group({0, 2, 4, 6}).value();
//   dp->all_reduce(grads, n, DType::f32, ReduceOp::sum)->wait();
//
// Structure: one UCP context and worker per world, an endpoint to every other rank, and a progress
// thread. Calls enqueue an operation (a state machine driven by request completions) and return; it
// is started at once when no other thread is driving UCX. Whoever holds the engine's drive token
// calls UCX and runs the state machines, reductions included: the progress thread while callers
// compute, a caller blocked in Work::wait while it waits (the progress thread steps aside; this
// saves two thread hand-offs per operation and keeps one busy thread per rank, which matters when
// ranks outnumber cores). With nothing to do, a waiter polls for spin_us (yielding its core), then
// everyone sleeps on the worker's event fd (UCP_FEATURE_WAKEUP): an idle rank burns no core.
//
// Algorithms (p = group size, N = message bytes, T = ring threshold):
//   all_reduce   N < T: recursive doubling; with p not a power of two, ranks 2i and 2i+1
//                (i < p - 2^k) first fold into 2i+1 and get the result back at the end. Partners
//                combine as op(lower rank's value, higher rank's value): both hold the same bits.
//                N >= T: ring reduce-scatter then ring all-gather, each block cut into chunks of at
//                most chunk_bytes that move independently (chunks_in_flight at a time), so copies
//                and reductions of different chunks overlap. Block b is summed along the ring
//                starting at rank b+1: ((x[b+1] + x[b+2]) + ...) + x[b]; the owner's result is then
//                copied to everyone, so every rank holds the same bits. bf16/f16 travel in 16 bits:
//                each combine is done in fp32 and rounded (ring: once per hop; recursive doubling:
//                once per combine). Groups with the shared-memory path fold all p inputs of an
//                element in fp32 in rank order and round once (comm/ucx/ucx_shm_ops.cpp).
//   reduce_scatter_v  N = sum of all blocks. N < T: every rank sends block j to rank j, which
//                reduces the p contributions in rank order 0..p-1 (bf16/f16: in fp32, rounded
//                once). N >= T: the ring's reduce-scatter half with per-rank block sizes (bf16/f16
//                rounded per hop), or the shared-memory path (rounded once).
//   all_gather_v N < T: every rank sends its block to every other rank. N >= T: the same in chunks
//                when the group is on one host with at most direct_max_ranks ranks (shared-memory
//                transfers are single copies whatever the pair, so the ring's p-1 dependent steps
//                buy nothing), else the ring's all-gather half with per-rank block sizes.
//   all_to_all_v whatever N: a group with a shared-memory channel stages every pair's block in its
//                writer's lanes, chunk by chunk behind a length header, and each reader copies its
//                pieces (comm/ucx/ucx_shm_ops.cpp, ShmAllToAllOp: a count mismatch is seen in the
//                header, consumed, and fails the reader naming both counts). Other groups: pairwise
//                exchange, in step k = 1..p-1 rank r sends its block for r+k and receives r-k's
//                block for it, one message per pair (empty blocks too, so the receiver sees a count
//                mismatch), chunks_in_flight steps at once; the own block is a local copy. On one
//                host the message path's per-collective cost dominated blocks below ~1 MiB
//                (docs/PERFORMANCE.md: 0.3-0.7x Open MPI), which the extra copy of the staging
//                area does not.
//   broadcast    N < T: binomial tree rooted at root. N >= T: pipelined chain root -> root+1 -> ...
//                in chunks.
//   barrier      dissemination (ceil(log2 p) rounds of empty messages).
//   send/recv    one active message each: eager data is copied once; large data moves by
//                rendezvous straight into the posted buffer. Matching by (group, peer, tag), in
//                send order.
// Which algorithm runs depends only on (p, N, T, whether the group is on one host), and T,
// chunk_bytes and direct_max_ranks must be equal on all ranks (checked when the world is created),
// so every rank runs the same one. Results are deterministic.
//
// Tags (64 bits, collectives only): bits 63..62 = 0b11, 61..40 group id (22 bits of a hash of the
// member list and how many groups with that list this world made before), 39..24 the group's
// operation sequence number (mod 2^16), 23..12 step, 11..0 chunk (both mod 2^12; the direct
// algorithms put the sender's group rank in step/chunk instead). Messages from one sender with
// equal tags match in send order, so the wrap-arounds are safe while fewer than 2^16 operations of
// a group and 2^11 chunks of an operation are in flight. User send/recv tags (< 2^56) travel in
// active-message headers with the full 64-bit group id, so they never meet collective traffic.
// group() fails if two live groups of this rank would share a 22-bit id (odds ~1e-6).
//
// Endpoints and failure. Ranks on other hosts: UCP_ERR_HANDLING_MODE_PEER with an error callback
// and UCX keepalive (interval keepalive_ms unless UCX_KEEPALIVE_INTERVAL is set). Ranks on this
// host (same hostname and pid namespace): UCX 1.13 offers MODE_PEER there only over TCP loopback
// (its shared memory transports lack peer-failure support, and UCX_TLS=sm,self refuses MODE_PEER
// outright), which is several times slower, so by default these endpoints use shared memory with
// MODE_NONE and this rank watches the peer's process itself (pidfd; /proc on old kernels).
// same_host_shm = false (TROUPE_UCX_SAME_HOST=ucx) keeps MODE_PEER for them. MODE_NONE endpoints
// get the error callback too: a transport failure UCX cannot recover from (a cma rendezvous read
// from a peer that died during it) then fails the endpoint instead of aborting the process. Either
// way, when a peer fails this rank fails every pending and later operation of groups containing it
// (send/recv: with it) with "rank R (host H, pid P) failed (...)", force-closes its endpoint, and
// tells every other rank, which does the same; nothing hangs. Requests of a failed operation are
// cancelled before its wait() returns, so its buffers are free again -- except requests to the dead
// peer that UCX never returns, which are dropped with the worker. A rank whose world is destroyed
// says goodbye first, so its departure is not taken for a failure; a receive that still needs a
// departed rank fails naming it. A fatal error inside UCX ends the process with exit code 1 and a
// line naming the rank (unless UCX_HANDLE_ERRORS is set). Nothing of a world has a name in
// /dev/shm: troupe's segments are anonymous (comm/ucx/ucx_shm.hpp), and with UCX_TLS unset UCX runs
// without its posix transport (docs/COMM.md).
//
// Thread safety: as comm/world.hpp: a world or communicator is used by one thread at a time;
// different communicators of one world may be used by different threads concurrently. Destroy
// communicators (after waiting for their work) before the world; the world's destructor then stops
// the progress thread, closes the endpoints and releases UCX (nothing is ucp_mem_map'ed: UCX's
// registration cache serves transports that need registration).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/bootstrap.hpp"
#include "comm/world.hpp"
#include "troupe/status.hpp"

namespace troupe::comm {

// Shared-memory data path for same-host groups: off, on where every member can map every other
// member's segment (else UCX), or required (world creation fails if some rank cannot).
enum class UcxShm : uint8_t { off, on, require };

struct UcxOptions {
  // Messages of at least this many bytes use the large-message algorithms (ring, chunked direct
  // all_gather, chain broadcast) (env TROUPE_UCX_RING_THRESHOLD). Must be equal on all ranks, as
  // must chunk_bytes and direct_max_ranks.
  size_t ring_threshold = 64 << 10;
  // Largest piece the ring and chain algorithms move at once (env TROUPE_UCX_CHUNK_BYTES, 4 KiB..1
  // GiB).
  size_t chunk_bytes = 512 << 10;
  // Chunks of one operation in flight at once (env TROUPE_UCX_CHUNKS_IN_FLIGHT), 1..1024. Local:
  // ranks may differ.
  int chunks_in_flight = 4;
  // Groups of at most this many ranks, all on one host, use the direct all_gather instead of the
  // ring for large messages (env TROUPE_UCX_DIRECT_MAX_RANKS; 0: always the ring).
  int direct_max_ranks = 16;
  // How long a thread waiting in Work::wait keeps polling (yielding its core) after the last event
  // before it sleeps on the worker's event fd (env TROUPE_UCX_SPIN_US; 0: sleep at once). 2 ms:
  // a shared-memory collective hands chunks back and forth between ranks, and a rank that sleeps
  // between two chunks costs a wake-up (~0.4 ms measured) per chunk; with 50 us, 2-rank 64 MiB
  // all_reduce fell to 1.9 GB/s busbw in 3 runs of 4, against 8.8 GB/s with 2 ms every time.
  int spin_us = 2000;
  // Endpoints to ranks on this host use shared memory without UCX error handling (see above); false
  // keeps UCP_ERR_HANDLING_MODE_PEER for them, which UCX 1.13 serves over TCP loopback only
  // (env TROUPE_UCX_SAME_HOST=shm|ucx).
  bool same_host_shm = true;
  // UCX keepalive interval: how soon a silently dead peer is noticed (env UCX_KEEPALIVE_INTERVAL
  // wins).
  int keepalive_ms = 1000;
  // Large collectives of groups on this host through shared memory (env TROUPE_UCX_SHM=on|off|
  // require). Needs same_host_shm and a shared-memory transport in UCX_TLS. Equal on all ranks.
  UcxShm shm = UcxShm::on;
  // One staging piece of the shared-memory path (env TROUPE_UCX_SHM_SLOT_BYTES, a multiple of 4096
  // in [4096, 64 MiB]); a group of p ranks stages up to 4 * p pieces per rank. Equal on all ranks.
  size_t shm_slot_bytes = 128 << 10;
  // Size of this rank's segment (env TROUPE_UCX_SHM_BYTES, at least 2 MiB): sparse, its group
  // areas are backed as they are allocated; a group that finds no room uses UCX.
  size_t shm_bytes = size_t{256} << 20;
  // UCX_NET_DEVICES for the world's context: "" takes bootstrap.ucx_net_devices() (the launch's
  // network plan: loopback only for a one-host job, the interface toward rank 0 otherwise). A
  // UCX_NET_DEVICES in the environment that troupe did not set wins over both.
  std::string net_devices;
};

// Collective over the bootstrap's ranks: creates this rank's UCP context, worker and endpoints,
// exchanging worker addresses through bootstrap.all_gather (the key is "ucx/world<n>/address" for
// the n-th world created over this bootstrap object). Environment variables (TROUPE_UCX_*) override
// `options`. Fails with a message on UCX errors, malformed or out-of-range settings, settings that
// differ between ranks, and when the bootstrap fails. Any thread; the bootstrap is used during the
// call only. The network devices are applied through the process environment (UCX reads
// UCX_NET_DEVICES when the context is created), so create worlds before starting threads that
// modify the environment.
Result<std::unique_ptr<CommWorld>> create_ucx_world(Bootstrap& bootstrap,
                                                    const UcxOptions& options = {});

}  // namespace troupe::comm
