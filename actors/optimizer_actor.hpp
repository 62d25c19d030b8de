// The optimizer partition actor (ZeRO's unit): one per rank, spawned detached by the rank actor and
// linked to it. It owns the Adam moments (fp32 exp_avg, exp_avg_sq) of the parameter ranges this
// rank's ZeRO stores give it (every unit's own partition; stage 0: all of it), and under ZeRO-3 the
// master weights themselves are the store's partition buffers it updates. On (step, StepRequest) it
// runs AdamW over its segments on its own threads and replies ok; the rank has already reduced and
// clipped the gradients, and all-gathers the updated partitions afterwards (stages 1, 2).
// Segments are views into the rank's buffers: rank and optimizer share memory (one process), and the
// rank does not touch them while a step is in flight.
// The moments live where --offload-optimizer says (engine/moment_store.hpp): with the actor, in the
// process's host memory pool (cpu), or in a swap file read ahead and written back piece by piece
// around the step (nvme); the numbers are bitwise the same in all three.
#pragma once
#include <vector>

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "engine/moment_store.hpp"
#include "engine/zero_store.hpp"

namespace troupe {

// Copies of the moments, one tensor per segment (checkpoints).
struct OptimizerMoments {
  std::vector<Tensor> exp_avg, exp_avg_sq;
};

using optimizer_actor = caf::typed_actor<caf::replies_to<step_atom, StepRequest>::with<ok_atom>,
                                         caf::replies_to<save_atom>::with<OptimizerMoments>,  // copies out
                                         caf::replies_to<load_atom, OptimizerMoments>::with<ok_atom>>;  // copies in

// Creates the moments first (an nvme swap file may fail: no space, no permission) and returns that
// error without spawning anything.
// cuda_device >= 0: the segments are on that GPU; the moments go there too and AdamW runs on a
// stream of the actor's own.
Result<optimizer_actor> spawn_optimizer(caf::actor_system& system, std::vector<AdamSegment> segments, int num_threads,
                                        const OptimizerOffload& offload = {}, int cuda_device = -1);

}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::AdamSegment>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::OptimizerMoments)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::MomentStore>)
