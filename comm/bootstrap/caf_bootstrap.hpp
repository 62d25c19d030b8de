// CafBootstrap: the Bootstrap of multi-process jobs, over CAF's io middleman (TCP).
//
// Rank 0 spawns a rendezvous actor and publishes it on master_port. Every rank (rank 0 included,
// over a local handle) owns an agent actor that joins the rendezvous with (rank, world size, job
// token) and carries its all_gather / barrier requests. Control traffic only: blobs are small (UCX
// worker addresses, NCCL unique ids); tensors never go through CAF.
//
// Protocol (rendezvous side; the typed interfaces are in caf_bootstrap.cpp):
//   join(rank, world, host, pid, rdzv id) -> world size. A rank outside [0, world), a world size
//     or rendezvous id (--rdzv-id) other than rank 0's, or a rank that already joined is refused
//     with an error naming both values, and the refusal is
//     logged with the peer's address (the error reply waits for the address lookup). A joined
//     agent is bound to its rank by its actor address and monitored. (The token is not part of
//     the join: the connection has proven it before any message is read, see Security.)
//   gather(key, blob) -> every rank's blob in rank order, answered when all ranks contributed.
//     Only joined agents may ask; anything else is refused and logged. A key is used once.
//     Barriers are gathers of empty blobs under "barrier/<key>".
//   leave -> ack. A rank that leaves is done with the bootstrap: requests needing it fail at once.
//   Attempts: a join carries which start of the job it belongs to (CafBootstrapOptions::attempt);
//     a rank 0 of an earlier one whose job failed (or, under in-job recovery, any older one, and
//     for a replacement any failed one or one whose place for it is still held) answers "try
//     again", and the joiner reaches the port again until its own rank 0 answers (also when the
//     rendezvous is lost while its join is under way, for any start but the first).
//
//   Standby (in-job recovery): once every rank has joined, the rendezvous names a standby --
//     where the next generation's rendezvous goes should this one be lost -- and tells each member
//     and waiting spare (rendezvous_place.hpp); a join carries the address the joiner reaches the
//     rendezvous from. Whoever hosts the rendezvous (rank 0 at the first generation, the standby's
//     process after a loss) is CafBootstrapOptions::rendezvous_at's rank.
//
// Failures: when a joined rank disconnects without leaving (process died, connection lost,
// heartbeat timeout), the rendezvous broadcasts "job failed" to the other agents and fails every
// pending and later request with an error naming that rank; job_failure() then returns the reason
// and options.on_job_failed is called. When the rendezvous is lost (rank 0 died) every agent fails
// the same way. A gather that does not complete within collective_timeout fails naming the missing
// ranks. No call waits forever.
//
// Security (docs/COMM.md, "Security model"): every connection is TLS 1.3 keyed by the job token
// (comm/bootstrap/secure_transport.hpp, comm/bootstrap/psk_tls.hpp): a peer that cannot prove the token is refused
// before CAF reads a byte of it, the token never crosses the wire, handshakes are bounded in
// number and time, and messages above max_message_bytes close the connection before anything is
// allocated for them. Where rank 0 listens and where the others connect follows the network
// plan (comm/bootstrap/net_plan.hpp): 127.0.0.1 for a one-host job, the address MASTER_ADDR names on rank
// 0's host otherwise. CAF lets any connected node address any actor of the system by id, so the
// bootstrap is best run in its own actor system (the first create_caf_bootstrap form); its
// actors check who sends what.
//
// Threads: a CafBootstrap is used by one thread at a time (its calls block that thread).
// job_failure() may be called from any thread.
#pragma once
#include <caf/fwd.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/bootstrap.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "comm/bootstrap/net_plan.hpp"
#include "comm/bootstrap/rendezvous_place.hpp"
#include "comm/bootstrap/secure_transport.hpp"

namespace troupe::comm {

// The join attempt of a process that replaces a failed one under in-job recovery: it joins whichever
// generation is forming.
constexpr int32_t kAnyGeneration = -1;

// Warm spares (troupe launch --in-job-recovery --spares K; docs/RESILIENCE.md): a process started
// without a rank (LaunchEnv::spare) joins the rendezvous as a spare and waits there, its data open,
// until rank 0 has a place for it -- a rank lost (disconnected) in the generation before -- and
// then joins as that rank. The texts below end a join, so a caller can tell what happened.
// A spare's join while the job ended (rank 0 announced it with CafBootstrap::end_job): the outcome follows.
inline constexpr const char* kJobEndedText = "the job has ended without needing this spare: ";
// A survivor (cut off, then back) whose rank a spare took in the meantime: it may stay as a spare.
inline constexpr const char* kPlaceTakenText = "'s place was taken by a spare while this process was away";
bool job_ended_for_spare(const Status& st);
bool place_taken_by_spare(const Status& st);

struct CafBootstrapOptions {
  // Ranks > 0 retry reaching the rendezvous this long (rank 0 may start later).
  std::chrono::milliseconds connect_timeout{60'000};
  // The longest an all_gather or barrier waits for missing ranks, from the first contribution.
  std::chrono::milliseconds collective_timeout{600'000};
  // Rank 0: every wait_report_interval until all ranks joined it logs who is missing (by rank and,
  // under troupe launch or torchrun, by node); ranks still missing after join_timeout fail the job
  // naming them. TROUPE_RDZV_TIMEOUT (seconds; troupe launch --rdzv-conf join_timeout) sets
  // join_timeout and connect_timeout both. torchrun's join_timeout default is 600 s too.
  std::chrono::milliseconds join_timeout{600'000};
  std::chrono::milliseconds wait_report_interval{10'000};
  // On destruction, rank 0 waits up to this long for the other ranks to leave before closing.
  std::chrono::milliseconds shutdown_grace{10'000};
  // CAF middleman heartbeats between the processes; a peer silent for connection_timeout (hung or
  // cut off without closing its socket) counts as disconnected. Zero disables both.
  std::chrono::milliseconds heartbeat_interval{1'000};
  std::chrono::milliseconds connection_timeout{15'000};
  // Rank 0's listening address: empty = the network plan's (comm/bootstrap/net_plan.hpp).
  std::string bind_addr;
  // The largest message a connection may announce (BASP payload); a gather's blobs must fit one
  // (all ranks' together, minus framing). Blobs are UCX addresses and NCCL ids: kilobytes.
  size_t max_message_bytes = size_t{16} << 20;
  // Incoming connections that have not proven the token: how long they may take (environment
  // TROUPE_HANDSHAKE_TIMEOUT, seconds, wins), how many at once.
  std::chrono::milliseconds handshake_timeout{10'000};
  int max_pending_handshakes = 64;
  // Which start of the job this process's join belongs to: unset = TROUPE_RESTART_COUNT (or
  // TORCHELASTIC_RESTART_COUNT). A joiner of a later start than a failed rank 0's is told to try
  // again (the failed start's rank 0 may still hold the port) until its own rank 0 answers.
  std::optional<int32_t> attempt;
  // In-job recovery (troupe launch --in-job-recovery): the processes that survive a failure keep
  // running and rejoin with their generation + 1, a replacement process with kAnyGeneration; rank 0
  // tells a joiner to try again while its own generation is older (it has not noticed the failure
  // yet), and a replacement while the rendezvous has failed or its rank's place is still held (its
  // predecessor's loss not yet noticed). Every process of a job sets it alike.
  bool in_job_recovery = false;
  // The rendezvous's host under in-job recovery: the ranks a spare may take at this generation's rendezvous (those
  // the previous one lost: CafBootstrap::lost_ranks). A spare that asks gets the lowest one still
  // free; a rank's own process that comes back first keeps it.
  std::vector<int> open_places;
  // ... and, at a later generation than the first, any place no process has taken this long after the
  // rendezvous started (a rank lost with rank 0, whose replacement knows of no loss; a survivor
  // that is slow to come back takes a spare's role if one takes its place).
  std::chrono::milliseconds spare_grace{5'000};
  // ... shorter where the rendezvous moved (its host lost: the other ranks of that host likely with
  // it; a survivor rejoins within a second, the heartbeat having told every process at once).
  std::chrono::milliseconds moved_spare_grace{2'000};
  // The rendezvous moves (warm spares; comm/bootstrap/rendezvous_place.hpp): where this generation's
  // rendezvous is. Unset: rank 0 hosts it at MASTER_ADDR:MASTER_PORT (the first generation's). Set:
  // the process of rendezvous_at->rank hosts it there (a spare never does), the others look for it
  // there, then at `places`, then at MASTER_ADDR:MASTER_PORT, in turn.
  std::optional<RendezvousPlace> rendezvous_at;
  std::vector<RendezvousPlace> places;
  // rendezvous_at is the last generation's standby place (that rendezvous was lost): a standby that
  // hosts it gives it up when no other process joins within failover_after.
  bool rendezvous_moved = false;
  // This process is the last generation's standby, and that generation failed without it losing
  // the rendezvous: it looks for the next one like the others, and hosts it at `standby_here`
  // when no place answered within failover_after (the rendezvous's host went silent after it
  // announced the failure).
  std::optional<RendezvousPlace> standby_here;
  // How long a standby looks before it hosts (above), and how long a standby that hosts waits for
  // another process to join before it gives the rendezvous up (its own host was the one cut off:
  // the job goes on where the others are). The heartbeat's connection timeout is a good value.
  std::chrono::milliseconds failover_after{15'000};
  // Called from an actor thread each time the rendezvous names its standby (in-job recovery, once
  // every rank has joined): where the rendezvous is and where it goes when lost.
  std::function<void(const RendezvousPlace& at, const RendezvousPlace& standby)> on_standby;
  // Called once, from an actor thread, when the job is known to have failed (a lost rank or
  // rendezvous).
  std::function<void(const std::string& why)> on_job_failed;
  // Where refusals and failures are logged; default: one "troupe bootstrap: ..." line on stderr.
  std::function<void(const std::string& line)> log;
};

// Registers the bootstrap's message types and loads the io middleman with the heartbeat settings of
// `options`. Call it on the config of any actor system passed to create_caf_bootstrap, on every
// rank, before the system is created (CAF needs remote message types registered on both ends).
// It loads the middleman itself: do not load it a second time.
void configure_for_bootstrap(caf::actor_system_config& cfg,
                             const CafBootstrapOptions& options = {});

class CafBootstrap final : public Bootstrap {
 public:
  struct Impl;
  explicit CafBootstrap(std::unique_ptr<Impl> impl);
  // Leaves the job. Rank 0 then waits up to shutdown_grace for the other ranks to leave (so their
  // last replies are delivered) and closes the rendezvous.
  ~CafBootstrap() override;
  CafBootstrap(const CafBootstrap&) = delete;
  CafBootstrap& operator=(const CafBootstrap&) = delete;

  int rank() const override;
  int world_size() const override;
  Result<std::vector<std::string>> all_gather(const std::string& key,
                                              const std::string& mine) override;
  Status barrier(const std::string& key) override;

  // The port the rendezvous listens on (rank 0: the bound port, useful with master_port 0).
  int port() const;
  // Empty while the job is healthy; otherwise why it failed. Thread-safe.
  std::string job_failure() const;
  // The plan's UCX_NET_DEVICES (Bootstrap::ucx_net_devices), and the plan itself.
  std::string ucx_net_devices() const override;
  const NetworkPlan& network_plan() const;
  // Counters of the secure transport (refusals, timeouts, ...); zeros for a world of one.
  SecureTransportStats transport_stats() const;
  // The rendezvous's host: the ranks that disconnected from it without leaving (died, cut off), and
  // the open places no process took, in rank order; a spare may take their places at the next
  // generation's (open_places). Complete once the bootstrap is closed (close()). Thread-safe.
  std::vector<int> lost_ranks() const;
  // Whether this process hosts the rendezvous, and where it met it (its own place when it hosts).
  bool hosts_rendezvous() const;
  RendezvousPlace place() const;
  // The standby the rendezvous named once every rank had joined (in-job recovery), if any yet.
  // Thread-safe; stays readable after close().
  std::optional<RendezvousPlace> standby() const;
  // The job failed because this process lost the rendezvous (its host died, hung or was cut off
  // from here), not because the rendezvous announced a lost rank. Thread-safe.
  bool rendezvous_lost() const;
  // Leaves the job now (what the destructor does); lost_ranks() stays readable.
  void close();
  // The rendezvous's host: the job has ended (`outcome`: "finished", "given up: ...", ...); the
  // spares waiting for a place, and any that asks later, are told so (kJobEndedText + outcome) and
  // end. Before the bootstrap is destroyed; does nothing on other processes.
  void end_job(const std::string& outcome);

 private:
  std::unique_ptr<Impl> impl_;
};

// Joins the job described by `env` (rank 0 first starts and publishes the rendezvous). Returns once
// this rank has joined; it does not wait for the others. A spare (env.spare) returns once it holds
// a rank (rank() says which), waiting as long as the job runs without a place for it. Errors name the address, the port and the
// fix (port in use: --master-port; unreachable: MASTER_ADDR and the firewall; refused: the token;
// a MASTER_ADDR the network plan cannot use: bad input). A world of more than one may raise the
// soft limit on open files (RLIMIT_NOFILE) up to the hard limit, for one socket per rank.
// This form runs its own small actor system.
Result<std::unique_ptr<CafBootstrap>> create_caf_bootstrap(const LaunchEnv& env,
                                                           const CafBootstrapOptions& options = {});
// Uses `sys` (configured with configure_for_bootstrap), which must outlive the bootstrap.
Result<std::unique_ptr<CafBootstrap>> create_caf_bootstrap(const LaunchEnv& env,
                                                           caf::actor_system& sys,
                                                           const CafBootstrapOptions& options = {});

}  // namespace troupe::comm
