#include "actors/optimizer_actor.hpp"

#include <memory>

#include "kernels/check.hpp"
#include "kernels/thread_pool.hpp"

namespace troupe {

namespace {

struct OptimizerState {
  std::unique_ptr<ThreadPool> pool;
  Context ctx;
  std::vector<AdamSegment> segments;
  std::vector<Tensor> exp_avg, exp_avg_sq;  // one per segment, zero at the start
};

optimizer_actor::behavior_type optimizer_behavior(optimizer_actor::stateful_pointer<OptimizerState> self,
                                                  std::vector<AdamSegment> segments, int num_threads) {
  configure_blas_threads();
  auto& st = self->state;
  st.pool = std::make_unique<ThreadPool>(num_threads);
  st.ctx.device = Device::cpu;
  st.ctx.pool = st.pool.get();
  st.segments = std::move(segments);
  for (const AdamSegment& s : st.segments) {
    st.exp_avg.push_back(Tensor::zeros(s.param.shape(), s.param.dtype()));
    st.exp_avg_sq.push_back(Tensor::zeros(s.param.shape(), s.param.dtype()));
  }
  return {
      [self](step_atom, const StepRequest& req) -> ok_atom {
        auto& s = self->state;
        adamw_step(s.ctx, s.segments, s.exp_avg, s.exp_avg_sq, req);
        return ok_atom::value;
      },
      [self](save_atom) -> OptimizerMoments {
        OptimizerMoments m;
        for (const Tensor& t : self->state.exp_avg) m.exp_avg.push_back(t.clone());
        for (const Tensor& t : self->state.exp_avg_sq) m.exp_avg_sq.push_back(t.clone());
        return m;
      },
      [self](load_atom, const OptimizerMoments& m) -> ok_atom {
        auto& s = self->state;
        TROUPE_CHECK(m.exp_avg.size() == s.exp_avg.size() && m.exp_avg_sq.size() == s.exp_avg_sq.size(),
                     "optimizer moments for other segments");
        for (size_t i = 0; i < s.exp_avg.size(); ++i) {
          s.exp_avg[i].copy_from(m.exp_avg[i]);
          s.exp_avg_sq[i].copy_from(m.exp_avg_sq[i]);
        }
        return ok_atom::value;
      },
  };
}

}  // namespace

optimizer_actor spawn_optimizer(caf::actor_system& system, std::vector<AdamSegment> segments, int num_threads) {
  return system.spawn<caf::detached>(optimizer_behavior, std::move(segments), num_threads);
}

}  // namespace troupe
