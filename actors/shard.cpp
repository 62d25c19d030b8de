#include "actors/shard.hpp"

#include <cmath>
#include <memory>

#include "actors/adamw.hpp"
#include "actors/errors.hpp"
#include "actors/fault_injection.hpp"
#include "kernels/context.hpp"
#include "model/gpt.hpp"
#include "storage/checkpoint.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe {

namespace {

struct ShardState {
  std::unique_ptr<ThreadPool> pool;
  Context ctx;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<AdamW> optimizer;
  offload_actor offload;  // the process's background writer (null: write before replying)

  CheckpointContents contents() const {
    CheckpointContents c;
    const auto& specs = model->specs();
    for (size_t i = 0; i < specs.size(); ++i) {
      c.params.push_back({specs[i].name, specs[i].global_shape, model->params()[i]});
      c.exp_avg.push_back({specs[i].name, specs[i].global_shape, optimizer->exp_avg()[i]});
      c.exp_avg_sq.push_back({specs[i].name, specs[i].global_shape, optimizer->exp_avg_sq()[i]});
    }
    return c;
  }
};

shard_actor::behavior_type shard_behavior(shard_actor::stateful_pointer<ShardState> self, ShardSpec spec,
                                          offload_actor offload) {
  configure_blas_threads();
  name_exceptions(self, "the shard");
  auto& st = self->state;
  st.offload = std::move(offload);
  st.pool = std::make_unique<ThreadPool>(spec.num_threads);
  st.ctx.device = Device::cpu;
  st.ctx.pool = st.pool.get();
  st.model = std::make_unique<GptModel>(spec.model, spec.max_micro_batch);
  st.optimizer = std::make_unique<AdamW>(st.model->specs(), st.model->params());
  return {
      [self](init_atom, uint64_t seed) -> ok_atom {
        self->state.model->init(seed);
        self->state.model->zero_grad();
        return ok_atom::value;
      },
      [self](fwd_bwd_atom, const MicroBatch& mb) -> caf::result<MicroBatchResult> {
        auto& s = self->state;
        if (mb.tokens.dim(0) > s.model->max_micro_batch())
          return make_actor_error(ActorErrc::failed, "micro-batch larger than the shard was built for");
        MicroBatchResult r;
        r.index = mb.index;
        r.loss_sum = s.model->forward_backward(s.ctx, mb.tokens, mb.grad_scale);
        r.tokens = mb.tokens.dim(0) * (mb.tokens.dim(1) - 1);
        return r;
      },
      [self](step_atom, const StepRequest& req) -> caf::result<StepResult> {
        auto& s = self->state;
        throw_if_asked("shard", -1, req.step);
        hang_if_asked("shard", -1, req.step);
        StepResult r;
        r.grad_norm = s.optimizer->step(s.ctx, s.model->params(), s.model->grads(), s.model->flat_grads(), req);
        s.model->zero_grad();
        if (!std::isfinite(r.grad_norm))
          return make_actor_error(ActorErrc::diverged,
                                  "the gradient norm is not finite at optimizer step " + std::to_string(req.step) +
                                      " -- the run diverged: lower --lr, raise --lr-warmup-iters or set --clip-grad");
        return r;
      },
      [self](eval_atom, const Tensor& tokens) -> double {
        auto& s = self->state;
        return s.model->forward_loss(s.ctx, tokens);
      },
      // This job's one shard (format version 2): snapshot, then written by the offload actor in the
      // background, which completes the save when the trainer commits it.
      [self](save_atom, const SaveRequest& req) -> caf::result<ok_atom> {
        if (Status st = prepare_iteration_dir(req.dir, req.iteration); !st) return to_caf_error(st);
        ShardWrite w;
        w.path = shard_file_path(req.dir, req.iteration, 0);
        w.iteration = req.iteration;
        w.contents = whole_tensor_shard(self->state.contents());
        if (self->state.offload) {
          caf::anon_send(self->state.offload, write_atom::value, std::move(w));
          return ok_atom::value;
        }
        if (Status st = write_shard_file(w.path, 0, w.contents); !st) return to_caf_error(st);
        crash_if_asked(req.iteration);
        return ok_atom::value;
      },
      // Any version's checkpoint from any layout: the reader assembles the whole tensors.
      [self](load_atom, const LoadRequest& req) -> caf::result<ok_atom> {
        auto files = checkpoint_files(req.dir, req.iteration);
        if (!files) return to_caf_error(files.status());
        auto reader = ShardSetReader::open(files.value());
        if (!reader) return to_caf_error(reader.status());
        Status st = read_whole_tensors(**reader, self->state.contents(), req.load_optimizer);
        if (!st) return to_caf_error(st);
        self->state.model->zero_grad();
        return ok_atom::value;
      },
  };
}

}  // namespace

shard_actor spawn_shard(caf::actor_system& system, const ShardSpec& spec, offload_actor offload) {
  return system.spawn<caf::detached>(shard_behavior, spec, std::move(offload));
}

}  // namespace troupe
