// Every message troupe's actors exchange, and the typed interfaces they form (docs/ARCHITECTURE.md).
// Messages that carry tensors are local-only: tensors never travel through CAF's serialisation (the
// comm layer moves them); those types are whitelisted as unsafe. Control-only types have inspect().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "engine/types.hpp"
#include "troupe/actors.hpp"
#include "kernels/tensor.hpp"
#include "troupe/data_source.hpp"

namespace troupe {

using init_atom = caf::atom_constant<caf::atom("init")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using save_atom = caf::atom_constant<caf::atom("save")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
using batch_atom = caf::atom_constant<caf::atom("batch")>;
using run_atom = caf::atom_constant<caf::atom("run")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using progress_atom = caf::atom_constant<caf::atom("progress")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using ok_atom = caf::atom_constant<caf::atom("ok")>;
using control_atom = caf::atom_constant<caf::atom("control")>;

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepRequest& x) {
  return f(caf::meta::type_name("StepRequest"), x.step, x.adam_step_offset, x.lr, x.weight_decay, x.beta1, x.beta2,
           x.eps, x.clip_grad, x.loss_scale, x.skip_on_overflow, x.stop, x.regroup, x.control, x.capture_grad,
           x.capture_activation, x.capture_rank, x.capture_micro, x.params_norm, x.zeros_in_grad);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SaveRequest& x) {
  return f(caf::meta::type_name("SaveRequest"), x.dir, x.iteration, x.consumed_samples, x.optimizer_step,
           x.config_json, x.rng_json, x.memory);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadRequest& x) {
  return f(caf::meta::type_name("LoadRequest"), x.dir, x.iteration, x.load_optimizer);
}

// Serves (count, seq_length+1) token windows of a split, starting at a sample index.
using data_loader_actor =
    caf::typed_actor<caf::replies_to<batch_atom, DataSplit, int64_t, int32_t>::with<Tensor>>;

}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::Tensor)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::DataSplit)

namespace troupe {

// The trainer: drives iterations once told to run; stops after the current iteration on stop; on
// control, applies the inspector's commands that arrived (inspect/job_control.hpp) when it is paused.
using trainer_actor =
    caf::typed_actor<caf::reacts_to<run_atom>, caf::reacts_to<stop_atom>, caf::reacts_to<control_atom>>;

}  // namespace troupe
