// The rank actor: one per (tp, pp, dp) rank, spawned detached; owns the rank's communicators and its
// RankEngine (model chunks, ZeRO stores, the pipeline schedule) and runs them on its own thread.
// Its mailbox is the rank's command queue: every rank of a job receives the same commands in the same
// order, so their collectives match. A failure replies an error naming the rank; a peer that dies
// fails the others' pending collectives (comm/), so nothing waits for ever.
//
// The replica group (group_actor) is what the trainer talks to: it splits each global batch over the
// data-parallel replicas (dp rank d gets windows [d*G/dp, (d+1)*G/dp), in order), sends every rank
// of this process its replica's windows, and replies once all of them have (they agree on the loss and
// the gradient norm: both come out of one all-reduce over the world). Under `troupe launch` each
// process holds one rank and its own group; in one process the group holds every rank.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "engine/moment_store.hpp"
#include "actors/offload_actor.hpp"
#include "engine/rank_engine.hpp"
#include "comm/flight_recorder.hpp"
#include "comm/local/local_world.hpp"
#include "comm/world.hpp"

namespace troupe {

using train_step_atom = caf::atom_constant<caf::atom("trainstep")>;
using spans_atom = caf::atom_constant<caf::atom("spans")>;
using memory_atom = caf::atom_constant<caf::atom("memory")>;
using pending_atom = caf::atom_constant<caf::atom("pending")>;
using tensor_atom = caf::atom_constant<caf::atom("tensor")>;
using names_atom = caf::atom_constant<caf::atom("names")>;


struct RankStepRequest {
  Tensor tokens;  // this replica's windows
  double grad_scale = 0;
  StepRequest step;
};

// What the trainer gets back from a step of the whole job.
struct GroupStepResult {
  double loss_sum = 0;
  double grad_norm = 0;
  double max_busy_us = 0;  // the busiest rank of this process
  double step_us = 0;
  double busy_fraction_min = 0, busy_fraction_max = 0;  // busy / step time over this process's ranks
  bool stop = false;  // the job's processes agreed to stop after this step (StepOutcome::stop)
  bool regroup = false;  // ... for a node that asks to join (StepOutcome::regroup)
  bool skipped = false;  // the loss scaler's overflow: no optimizer step (StepOutcome::skipped)
  std::vector<RankPieces> captured;  // StepRequest::capture_grad's pieces, every local rank's
  int64_t control = 0;  // the inspector commands every process applies after this step (StepOutcome::control)
  std::vector<std::vector<TimerReading>> rank_timers;  // each local rank's StepOutcome::timers, in rank order
  int64_t zeros_in_grad = -1;                          // StepOutcome::zeros_in_grad (every rank has the same)
  double params_norm = -1;                             // StepOutcome::params_norm (every rank has the same)
  std::vector<MoeLayerLoad> moe;                       // StepOutcome::moe: job-wide, every rank has the same
  std::vector<double> world_sections;                  // StepOutcome::world_sections (every rank has the same)
};

using rank_actor = caf::typed_actor<
    caf::replies_to<init_atom, uint64_t>::with<ok_atom>,
    caf::replies_to<train_step_atom, RankStepRequest>::with<StepOutcome>,
    caf::replies_to<eval_atom, Tensor>::with<double>,
    caf::replies_to<spans_atom>::with<RankTimeline>,
    caf::replies_to<memory_atom>::with<RankMemory>,
    caf::replies_to<save_atom, SaveRequest>::with<ok_atom>,   // this rank's shard file
    caf::replies_to<load_atom, LoadRequest>::with<ok_atom>,   // from any layout's checkpoint
    // A parameter's values or Adam moments (TensorKind as int32; not grad: see StepRequest).
    caf::replies_to<tensor_atom, std::string, int32_t>::with<RankPieces>,
    caf::replies_to<names_atom>::with<std::vector<std::string>>>;  // its parameters' global names

using group_actor = caf::typed_actor<
    caf::replies_to<init_atom, uint64_t>::with<ok_atom>,
    caf::replies_to<train_step_atom, Tensor, double, StepRequest>::with<GroupStepResult>,  // global batch
    caf::replies_to<eval_atom, Tensor>::with<double>,  // windows of the whole job; sum of token losses
    caf::replies_to<spans_atom>::with<std::vector<RankTimeline>>,
    caf::replies_to<memory_atom>::with<std::vector<RankMemory>>,
    caf::replies_to<pending_atom>::with<std::vector<int>>,  // ranks that have not answered the current step
    caf::replies_to<save_atom, SaveRequest>::with<ok_atom>,   // every local rank's shard file
    caf::replies_to<load_atom, LoadRequest>::with<ok_atom>,
    caf::replies_to<tensor_atom, std::string, int32_t>::with<std::vector<RankPieces>>,  // every local rank's
    caf::replies_to<names_atom>::with<std::vector<std::string>>>;  // every local rank's parameters, sorted

// world: this rank's view of the backend (local fabric or UCX), kept by the actor, which creates
// its groups from `topology` on its own thread before taking commands.
// offload: the process's offload actor, which writes the rank's checkpoint shards in the background
// (default: the rank writes them itself before replying). optimizer_offload: where the rank's
// optimizer partition keeps its Adam moments (its rank field is set here). board: where the rank's
// engine records what it is doing (null: its own). flight: where its communicators record their
// operations (comm/flight_recorder.hpp; null: not recorded).
rank_actor spawn_rank(caf::actor_system& system, const RankSpec& spec, const comm::Topology& topology, int rank,
                      std::shared_ptr<comm::CommWorld> world, offload_actor offload = {},
                      OptimizerOffload optimizer_offload = {}, std::shared_ptr<ActivityBoard> board = nullptr,
                      std::shared_ptr<comm::FlightRecorder> flight = nullptr);

// ranks: the rank actors of this process with their global ranks. micro_batch: the ranks' micro-batch
// size (batches are split over replicas in whole micro-batches: replica_windows).
group_actor spawn_group(caf::actor_system& system, const comm::Topology& topology, std::vector<rank_actor> ranks,
                        std::vector<int> global_ranks, int micro_batch);

// The ranks of a layout that this process runs, and their group.
struct RankSet {
  std::optional<comm::Topology> topology;  // spec.par's layout (Topology has no empty state)
  std::optional<comm::LocalFabric> fabric; // the in-process backend; none under a launcher
  std::vector<rank_actor> ranks;
  group_actor group;
  // What each of this process's ranks is doing now (engine/activity.hpp), readable from any thread
  // while the rank actors compute (they answer no message then): in ranks' order.
  std::vector<std::shared_ptr<const ActivityBoard>> boards;
  // Their flight records (comm/flight_recorder.hpp), in ranks' order, readable from any thread.
  std::vector<std::shared_ptr<const comm::FlightRecorder>> flights;
  // Tells the group and every rank to exit.
  void exit(caf::local_actor* self) const;
};
// world null: every rank of spec.par's layout, in this process on the in-process backend (whose
// waits for a peer fail after fabric_options.timeout); else this process's one rank of `world`
// (troupe launch). offload and optimizer_offload: as spawn_rank's.
Result<RankSet> spawn_ranks(caf::actor_system& system, const RankSpec& spec, std::shared_ptr<comm::CommWorld> world,
                            offload_actor offload = {}, const OptimizerOffload& optimizer_offload = {},
                            comm::LocalFabricOptions fabric_options = {});

}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::RankStepRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::StepOutcome)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::GroupStepResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::RankTimeline)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::RankMemory)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::RankTimeline>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::RankMemory>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::RankPieces)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::RankPieces>)
