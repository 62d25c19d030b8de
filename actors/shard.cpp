#include "actors/shard.hpp"

#include <cmath>
#include <memory>

#include "actors/adamw.hpp"
#include "actors/errors.hpp"
#include "actors/fault_injection.hpp"
#include "kernels/context.hpp"
#include "model/gpt.hpp"
#include "storage/checkpoint.hpp"

namespace troupe {

namespace {

struct ShardState {
  std::unique_ptr<ThreadPool> pool;
  Context ctx;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<AdamW> optimizer;

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

shard_actor::behavior_type shard_behavior(shard_actor::stateful_pointer<ShardState> self, ShardSpec spec) {
  configure_blas_threads();
  name_exceptions(self, "the shard");
  auto& st = self->state;
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
      [self](save_atom, const SaveRequest& req) -> caf::result<ok_atom> {
        CheckpointMeta meta;
        meta.iteration = req.iteration;
        meta.consumed_samples = req.consumed_samples;
        meta.optimizer_step = req.optimizer_step;
        meta.config_json = req.config_json;
        meta.rng_json = req.rng_json;
        Status st = save_checkpoint(req.dir, meta, self->state.contents());
        if (!st) return to_caf_error(st);
        return ok_atom::value;
      },
      [self](load_atom, const LoadRequest& req) -> caf::result<ok_atom> {
        Status st = load_checkpoint(req.dir, req.iteration, self->state.contents(), req.load_optimizer);
        if (!st) return to_caf_error(st);
        self->state.model->zero_grad();
        return ok_atom::value;
      },
  };
}

}  // namespace

shard_actor spawn_shard(caf::actor_system& system, const ShardSpec& spec) {
  return system.spawn<caf::detached>(shard_behavior, spec);
}

}  // namespace troupe
