#include "actors/optimizer_actor.hpp"

#include <memory>

#include "actors/errors.hpp"
#include "engine/fault_injection.hpp"
#include "troupe/check.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device_memory.hpp"
#include "kernels/thread_pool.hpp"

namespace troupe {

namespace {

struct OptimizerState {
  std::unique_ptr<ThreadPool> pool;
  Context ctx;
  std::vector<AdamSegment> segments;
  std::shared_ptr<MomentStore> moments;  // zero at the start
  int rank = 0;
  // A GPU rank's optimizer: its own stream on the rank's GPU (the rank drained its stream before
  // asking for the step; the step drains this one before replying).
  std::shared_ptr<cuda::DeviceContext> device;
  DevicePlacement placement;
  // A GPU rank with --offload-optimizer (ZeRO-Offload): the moments stay in host memory and AdamW
  // runs on the CPU (cpu_ctx): each piece's parameters and gradients are copied to the host, stepped
  // and the parameters copied back.
  bool host_step = false;
  Context cpu_ctx;
  std::shared_ptr<BufferRecycler> snapshot_buffers;  // the moments' snapshot copies (null: fresh)
};

caf::error optimizer_error(const Status& st) {
  return to_caf_error(st);
}

optimizer_actor::behavior_type optimizer_behavior(
    optimizer_actor::stateful_pointer<OptimizerState> self, std::vector<AdamSegment> segments,
    int num_threads, std::shared_ptr<MomentStore> moments, int rank, std::shared_ptr<cuda::DeviceContext> device,
    bool host_step, std::shared_ptr<BufferRecycler> snapshot_buffers) {
  configure_blas_threads();
  name_exceptions(self, "the optimizer partition of rank " + std::to_string(rank));
  auto& st = self->state;
  st.rank = rank;
  st.pool = std::make_unique<ThreadPool>(num_threads);
  st.ctx.device = Device::cpu;
  st.ctx.pool = st.pool.get();
  st.cpu_ctx = st.ctx;
  st.host_step = device && host_step;
  if (device) {
    st.ctx = device->ctx();
    st.ctx.pool = st.pool.get();
    st.placement = {st.ctx.cuda_device, reinterpret_cast<uint64_t>(st.ctx.stream)};
    st.device = std::move(device);
  }
  st.segments = std::move(segments);
  st.moments = std::move(moments);
  st.snapshot_buffers = std::move(snapshot_buffers);
  return {
      [self](step_atom, const StepRequest& req) -> caf::result<ok_atom> {
        auto& s = self->state;
        DeviceScope placed(s.placement);
        throw_if_asked("optimizer", s.rank, req.step);
        // Piece by piece (AdamW is elementwise: the same numbers as whole segments).
        Status st = s.moments->visit(MomentAccess::read_write, [&](const MomentPiece& p) {
          const AdamSegment& seg = s.segments[p.segment];
          AdamSegment piece{seg.param.rows(p.begin, p.end), seg.grad.rows(p.begin, p.end),
                            seg.decay};
          if (!s.host_step) return adamw_step(s.ctx, {piece}, {p.exp_avg}, {p.exp_avg_sq}, req);
          // The same AdamW on host copies (each copy waits for the stream: the moments' pieces of
          // an nvme store are reused right after).
          const AdamSegment host{piece.param.to_host(), piece.grad.to_host(), piece.decay};
          adamw_step(s.cpu_ctx, {host}, {p.exp_avg}, {p.exp_avg_sq}, req);
          piece.param.copy_from(host.param);
        });
        if (st && s.device) st = s.device->synchronize();
        if (!st) return optimizer_error(st);
        return ok_atom::value;
      },
      [self](save_atom) -> caf::result<OptimizerMoments> {
        auto& s = self->state;
        DeviceScope placed(s.placement);  // host copies of GPU moments: each waits for its stream
        OptimizerMoments m;
        auto host_copy = [&](const AdamSegment& seg) {
          return s.snapshot_buffers ? s.snapshot_buffers->take(seg.param.shape(), seg.param.dtype())
                                    : Tensor::empty(seg.param.shape(), seg.param.dtype());
        };
        for (const AdamSegment& seg : s.segments) {
          m.exp_avg.push_back(host_copy(seg));
          m.exp_avg_sq.push_back(host_copy(seg));
        }
        Status st = s.moments->visit(MomentAccess::read, [&](const MomentPiece& p) {
          m.exp_avg[p.segment].rows(p.begin, p.end).copy_from(p.exp_avg);
          m.exp_avg_sq[p.segment].rows(p.begin, p.end).copy_from(p.exp_avg_sq);
        });
        if (!st) return optimizer_error(st);
        return m;
      },
      [self](load_atom, const OptimizerMoments& m) -> caf::result<ok_atom> {
        auto& s = self->state;
        DeviceScope placed(s.placement);
        TROUPE_CHECK(
            m.exp_avg.size() == s.segments.size() && m.exp_avg_sq.size() == s.segments.size(),
            "optimizer moments for other segments");
        Status st = s.moments->visit(MomentAccess::write, [&](const MomentPiece& p) {
          p.exp_avg.copy_from(m.exp_avg[p.segment].rows(p.begin, p.end));
          p.exp_avg_sq.copy_from(m.exp_avg_sq[p.segment].rows(p.begin, p.end));
        });
        if (!st) return optimizer_error(st);
        return ok_atom::value;
      },
  };
}

}  // namespace

Result<optimizer_actor> spawn_optimizer(caf::actor_system& system,
                                        std::vector<AdamSegment> segments, int num_threads,
                                        const OptimizerOffload& offload, int cuda_device) {
  std::vector<int64_t> counts;
  DType dtype = DType::f32;
  for (const AdamSegment& s : segments) {
    counts.push_back(s.param.numel());
    dtype = s.param.dtype();
  }
  std::shared_ptr<cuda::DeviceContext> device;
  if (cuda_device >= 0) {
    auto made = cuda::DeviceContext::create(cuda_device);
    if (!made) return made.status().with_context("the optimizer partition of rank " + std::to_string(offload.rank) + ": ");
    device = std::move(made).value();
  }
  DeviceScope on(device ? DevicePlacement{cuda_device, reinterpret_cast<uint64_t>(device->ctx().stream)}
                        : current_placement());
  // Offloaded moments live on the host whatever the parameters' device.
  const bool host_step = device && offload.device != "none";
  auto moments = MomentStore::create(offload, counts, dtype, device && !host_step ? Device::cuda : Device::cpu);
  if (!moments) return moments.status();
  std::shared_ptr<MomentStore> shared = std::move(moments).value();
  return system.spawn<caf::detached>(optimizer_behavior, std::move(segments), num_threads,
                                     std::move(shared), offload.rank, std::move(device), host_step,
                                     offload.snapshot_buffers);
}

}  // namespace troupe
