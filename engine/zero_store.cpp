#include "engine/zero_store.hpp"

#include <algorithm>

#include "troupe/check.hpp"
#include "kernels/ops.hpp"

namespace troupe {

struct ZeroStore::Unit {
  int64_t numel = 0;
  std::vector<size_t> counts;     // dp partition, one count per rank
  int64_t own_start = 0, own_count = 0;
  struct Segment {  // one parameter of the unit, relative to the unit
    int64_t begin = 0, end = 0;
    bool decay = true, norm = true;
  };
  std::vector<Segment> segments;
  Tensor part_params;          // stage 3: own partition (own_count)
  Tensor part_grads;           // stages 2, 3: own partition accumulator; stage 1: reduced partition
  int ready = 0;               // grads_ready calls this iteration
  comm::WorkPtr reduce;        // stages 0, 1: the unit's dp reduction
  // PipelineStage 3: the gathered parameters while in use or prefetched.
  Tensor gathered;
  comm::WorkPtr gather;
  int users = 0;
  // Stages 2, 3: the buffer the current micro-batch's gradients accumulate into.
  Tensor grad_buffer;
};

namespace {

constexpr size_t kMaxPendingReduces = 2;

Tensor flat(const Tensor& t) { return t.view(Shape{t.numel()}); }

}  // namespace

ZeroStore::ZeroStore(int stage, comm::Communicator* dp, DType dtype) : stage_(stage), dp_(dp), dtype_(dtype) {
  TROUPE_CHECK(stage >= 0 && stage <= 3, "ZeroStore: stage must be 0..3");
  if (dp_ != nullptr) {
    dp_rank_ = dp_->rank();
    dp_size_ = dp_->size();
  }
}

ZeroStore::~ZeroStore() {
  // Collectives still in flight use our buffers (after a failure the rank's actor ends mid-step):
  // let them finish or fail first; a failed peer fails them, so this does not hang.
  for (Pending& p : pending_) (void)p.work->wait();
  for (Unit& u : units_)
    if (u.gather) (void)u.gather->wait();
}

UnitHooks ZeroStore::hooks() {
  UnitHooks h;
  h.grads_ready = [this](int unit, int) { on_grads_ready(unit); };
  if (stage_ >= 2) h.grad_buffer = [this](int unit) { return grad_buffer(unit); };
  if (stage_ == 3) {
    h.acquire_params = [this](int unit, Pass pass) { return acquire(unit, pass); };
    h.release_params = [this](int unit, Pass pass) { release(unit, pass); };
  }
  return h;
}

void ZeroStore::attach(PipelineStage* chunk, Context* ctx) {
  chunk_ = chunk;
  ctx_ = ctx;
  const auto& specs = chunk->specs();
  units_.clear();
  units_.resize(chunk->units().size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitInfo& info = chunk->units()[u];
    Unit& unit = units_[u];
    unit.numel = info.numel;
    unit.counts.resize(dp_size_);
    int64_t start = 0;
    for (int r = 0; r < dp_size_; ++r) {
      const int64_t c = unit.numel / dp_size_ + (r < unit.numel % dp_size_ ? 1 : 0);
      unit.counts[r] = static_cast<size_t>(c);
      if (r == dp_rank_) {
        unit.own_start = start;
        unit.own_count = c;
      }
      start += c;
    }
    int64_t at = 0;
    for (int s : info.specs) {
      const int64_t n = specs[s].local_shape.numel();
      unit.segments.push_back({at, at + n, specs[s].weight_decay, chunk->counts_in_norm(s)});
      at += n;
    }
    TROUPE_CHECK(at == unit.numel, "ZeroStore: a unit's specs must cover it exactly");
    if (stage_ >= 2) unit.part_grads = Tensor::zeros({unit.own_count}, dtype_);
    // PipelineStage 1 reduces into a partition buffer of its own (kept: the optimizer's views point into it);
    // with dp == 1 the partition is the whole unit's gradient.
    if (stage_ == 1) {
      if (dp_size_ > 1) {
        unit.part_grads = Tensor::zeros({unit.own_count}, dtype_);
        track_transient(static_cast<int64_t>(unit.part_grads.nbytes()));
      } else {
        unit.part_grads = flat(chunk->unit_grads(static_cast<int>(u)));
      }
    }
    if (stage_ == 3) unit.part_params = Tensor::zeros({unit.own_count}, dtype_);
  }
}

void ZeroStore::init(uint64_t seed) {
  TROUPE_CHECK(chunk_ != nullptr, "ZeroStore: attach() first");
  if (stage_ < 3) {
    chunk_->init(seed);
    chunk_->zero_grad();
    return;
  }
  // PipelineStage 3 keeps no full parameters: build one unit at a time and keep the own range.
  const auto& specs = chunk_->specs();
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    Tensor full = Tensor::zeros({unit.numel}, dtype_);
    const UnitInfo& info = chunk_->units()[u];
    for (size_t k = 0; k < info.specs.size(); ++k) {
      const ParamSpec& spec = specs[info.specs[k]];
      init_parameter(spec, seed, full.rows(unit.segments[k].begin, unit.segments[k].end).view(spec.local_shape));
    }
    unit.part_params.copy_from(full.rows(unit.own_start, unit.own_start + unit.own_count));
    unit.part_grads.zero_();
  }
}

void ZeroStore::zero_gradients() {
  if (stage_ <= 1) chunk_->zero_grad();
  for (Unit& unit : units_)
    if (unit.part_grads.defined()) unit.part_grads.zero_();
}

void ZeroStore::track_transient(int64_t delta) {
  transient_bytes_ += delta;
  transient_peak_ = std::max(transient_peak_, transient_bytes_);
}

Tensor ZeroStore::gather_unit(int u) {
  Unit& unit = units_[u];
  if (!unit.gathered.defined()) {
    unit.gathered = Tensor::empty({unit.numel}, dtype_);
    track_transient(static_cast<int64_t>(unit.gathered.nbytes()));
    unit.gather = dp_ != nullptr ? dp_->all_gather_v(unit.part_params.raw(), unit.gathered.raw(), unit.counts, dtype_)
                                 : comm::completed_work();
  }
  return unit.gathered;
}

Tensor ZeroStore::acquire(int u, Pass pass) {
  if (replay_) return replay_params_[u];
  Unit& unit = units_[u];
  Tensor t = gather_unit(u);
  comm::wait_or_throw(unit.gather, "ZeRO-3 parameter all-gather", comm::WaitGroup::dp);
  ++unit.users;
  // Prefetch the unit the pass uses next, so its gather overlaps this unit's compute.
  const int next = pass == Pass::forward ? u + 1 : u - 1;
  if (next >= 0 && next < static_cast<int>(units_.size())) gather_unit(next);
  return t;
}

void ZeroStore::release(int u, Pass) {
  if (replay_) return;
  Unit& unit = units_[u];
  TROUPE_CHECK(unit.users > 0, "ZeroStore: release without acquire");
  if (--unit.users > 0) return;
  track_transient(-static_cast<int64_t>(unit.gathered.nbytes()));
  unit.gathered = Tensor();
  unit.gather.reset();
}

Tensor ZeroStore::grad_buffer(int u) {
  Unit& unit = units_[u];
  if (!unit.grad_buffer.defined()) {
    unit.grad_buffer = Tensor::zeros({unit.numel}, dtype_);
    track_transient(static_cast<int64_t>(unit.grad_buffer.nbytes()));
  }
  return unit.grad_buffer;
}

void ZeroStore::begin_iteration(int micro_batches) {
  micro_batches_ = micro_batches;
  for (Unit& unit : units_) {
    unit.ready = 0;
    unit.reduce.reset();
  }
}

// Stages 0, 1 reduce a unit once its last micro-batch is in; stages 2, 3 every micro-batch, into a
// fresh buffer (the next micro-batch's gradients must not land in one still being reduced).
void ZeroStore::on_grads_ready(int u) {
  if (replay_) return;  // the replay's gradients stay in their buffers
  Unit& unit = units_[u];
  ++unit.ready;
  if (stage_ >= 2) {
    Pending p;
    p.unit = u;
    p.send = unit.grad_buffer;
    unit.grad_buffer = Tensor();
    p.recv = Tensor::empty({unit.own_count}, dtype_);
    track_transient(static_cast<int64_t>(p.recv.nbytes()));
    p.work = dp_ != nullptr ? dp_->reduce_scatter_v(p.send.raw(), p.recv.raw(), unit.counts, dtype_, comm::ReduceOp::sum)
                            : comm::completed_work();
    if (dp_ == nullptr) p.recv.copy_from(p.send);
    pending_.push_back(std::move(p));
    drain_pending(false);
    // A bound on gradient buckets in flight (DeepSpeed's reduce_bucket_size, counted in units): the
    // oldest is waited for, so ZeRO-2/3 never hold much more than two units' gradients at once.
    while (pending_.size() > kMaxPendingReduces) drain_one();
    return;
  }
  if (unit.ready < micro_batches_ || dp_ == nullptr || dp_size_ == 1) return;
  Tensor region = flat(chunk_->unit_grads(u));
  if (stage_ == 0) {
    unit.reduce = dp_->all_reduce(region.raw(), static_cast<size_t>(unit.numel), dtype_, comm::ReduceOp::sum);
  } else {
    unit.reduce = dp_->reduce_scatter_v(region.raw(), unit.part_grads.raw(), unit.counts, dtype_, comm::ReduceOp::sum);
  }
}

// Adds finished reductions into their partitions, oldest first; with `all`, waits for every one.
void ZeroStore::drain_pending(bool all) {
  while (!pending_.empty() && (all || pending_.front().work->test())) drain_one();
}

void ZeroStore::drain_one() {
  Pending& p = pending_.front();
  comm::wait_or_throw(p.work, "ZeRO gradient reduce-scatter", comm::WaitGroup::dp);
  ops::add_inplace(*ctx_, units_[p.unit].part_grads, p.recv);
  track_transient(-static_cast<int64_t>(p.send.nbytes() + p.recv.nbytes()));
  pending_.pop_front();
}

Status ZeroStore::finish_gradients() {
  drain_pending(true);
  for (Unit& unit : units_) {
    if (unit.reduce) TROUPE_RETURN_IF_ERROR(unit.reduce->wait());
    unit.reduce.reset();
  }
  // Prefetched stage-3 units nobody used (the pass ended) are dropped.
  for (Unit& unit : units_) {
    if (unit.gathered.defined() && unit.users == 0) {
      if (unit.gather) TROUPE_RETURN_IF_ERROR(unit.gather->wait());
      track_transient(-static_cast<int64_t>(unit.gathered.nbytes()));
      unit.gathered = Tensor();
      unit.gather.reset();
    }
  }
  return Status::ok();
}

Tensor ZeroStore::unit_gradient(int u) const {
  const Unit& unit = units_[u];
  if (stage_ == 0) return flat(chunk_->unit_grads(u));
  return unit.part_grads;
}

// The owned range of each unit: stage 0 counts its dp partition only (every dp rank holds the same
// reduced gradients), the other stages their partition buffer.
double ZeroStore::owned_grad_sum_squares() {
  double sum = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const Tensor grads = unit_gradient(static_cast<int>(u));
    const int64_t base = stage_ == 0 ? unit.own_start : 0;  // index of the owned range in `grads`
    for (const auto& seg : unit.segments) {
      if (!seg.norm) continue;
      const int64_t lo = std::max(seg.begin, unit.own_start), hi = std::min(seg.end, unit.own_start + unit.own_count);
      if (lo >= hi) continue;
      sum += ops::sum_squares(*ctx_, grads.rows(lo - unit.own_start + base, hi - unit.own_start + base));
    }
  }
  return sum;
}

void ZeroStore::scale_gradients(double factor) {
  for (size_t u = 0; u < units_.size(); ++u) ops::scale_inplace(*ctx_, unit_gradient(static_cast<int>(u)), factor);
}

std::vector<AdamSegment> ZeroStore::adam_segments() const {
  std::vector<AdamSegment> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const Tensor grads = unit_gradient(static_cast<int>(u));
    // [first, last): the range this rank updates, relative to the unit.
    const int64_t first = stage_ == 0 ? 0 : unit.own_start;
    const int64_t last = stage_ == 0 ? unit.numel : unit.own_start + unit.own_count;
    const Tensor params = stage_ == 3 ? unit.part_params
                                      : flat(chunk_->unit_params(static_cast<int>(u))).rows(first, last);
    for (const auto& seg : unit.segments) {
      const int64_t lo = std::max(seg.begin, first), hi = std::min(seg.end, last);
      if (lo < hi) out.push_back({params.rows(lo - first, hi - first), grads.rows(lo - first, hi - first), seg.decay});
    }
  }
  return out;
}

std::vector<ZeroStore::OwnedRange> ZeroStore::param_ranges() const {
  std::vector<OwnedRange> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const UnitInfo& info = chunk_->units()[u];
    const int64_t first = stage_ == 3 ? unit.own_start : 0;
    const int64_t last = stage_ == 3 ? unit.own_start + unit.own_count : unit.numel;
    const Tensor values = stage_ == 3 ? unit.part_params
                                      : flat(chunk_->unit_params(static_cast<int>(u)));
    for (size_t k = 0; k < unit.segments.size(); ++k) {
      const auto& seg = unit.segments[k];
      const int64_t lo = std::max(seg.begin, first), hi = std::min(seg.end, last);
      if (lo < hi) out.push_back({info.specs[k], lo - seg.begin, hi - seg.begin, values.rows(lo - first, hi - first)});
    }
  }
  return out;
}

std::vector<ZeroStore::OwnedRange> ZeroStore::segment_ranges() const {
  std::vector<OwnedRange> out;
  const std::vector<AdamSegment> segments = adam_segments();
  size_t i = 0;
  for (size_t u = 0; u < units_.size(); ++u) {  // the walk of adam_segments()
    const Unit& unit = units_[u];
    const UnitInfo& info = chunk_->units()[u];
    const int64_t first = stage_ == 0 ? 0 : unit.own_start;
    const int64_t last = stage_ == 0 ? unit.numel : unit.own_start + unit.own_count;
    for (size_t k = 0; k < unit.segments.size(); ++k) {
      const auto& seg = unit.segments[k];
      const int64_t lo = std::max(seg.begin, first), hi = std::min(seg.end, last);
      if (lo < hi) out.push_back({info.specs[k], lo - seg.begin, hi - seg.begin, segments[i++].param});
    }
  }
  return out;
}

Status ZeroStore::finish_step() {
  std::vector<comm::WorkPtr> gathers;
  if ((stage_ == 1 || stage_ == 2) && dp_ != nullptr && dp_size_ > 1) {
    for (size_t u = 0; u < units_.size(); ++u) {
      const Unit& unit = units_[u];
      Tensor region = flat(chunk_->unit_params(static_cast<int>(u)));
      Tensor own = region.rows(unit.own_start, unit.own_start + unit.own_count);
      gathers.push_back(dp_->all_gather_v(own.raw(), region.raw(), unit.counts, dtype_));
    }
  }
  TROUPE_RETURN_IF_ERROR(comm::wait_all(gathers));
  // The next iteration's gradients start from zero.
  if (stage_ >= 1)
    for (Unit& unit : units_)
      if (stage_ >= 2 || dp_size_ > 1) unit.part_grads.zero_();
  if (stage_ <= 1) chunk_->zero_grad();
  return Status::ok();
}

void adamw_step(Context& ctx, const std::vector<AdamSegment>& segments, const std::vector<Tensor>& exp_avg,
                const std::vector<Tensor>& exp_avg_sq, const StepRequest& req) {
  ops::AdamWParams hp;
  hp.lr = req.lr;
  hp.beta1 = req.beta1;
  hp.beta2 = req.beta2;
  hp.eps = req.eps;
  hp.step = req.step - req.adam_step_offset;
  for (size_t i = 0; i < segments.size(); ++i) {
    hp.weight_decay = segments[i].decay ? req.weight_decay : 0.0;
    ops::adamw_update(ctx, segments[i].param, segments[i].grad, exp_avg[i], exp_avg_sq[i], hp);
  }
}

Result<Tensor> ZeroStore::unit_params(int u) {
  const Unit& unit = units_[u];
  Tensor out = Tensor::empty({unit.numel}, dtype_);
  if (stage_ < 3) {
    out.copy_from(flat(chunk_->unit_params(u)));
    return out;
  }
  if (dp_ == nullptr) {
    out.copy_from(unit.part_params);
    return out;
  }
  TROUPE_RETURN_IF_ERROR(dp_->all_gather_v(unit.part_params.raw(), out.raw(), unit.counts, dtype_)->wait());
  return out;
}

Status ZeroStore::begin_replay() {
  if (stage_ == 3)
    for (size_t u = 0; u < units_.size(); ++u) {
      auto full = unit_params(static_cast<int>(u));
      if (!full) return full.status();
      replay_params_.push_back(std::move(full).value());
    }
  for (Unit& unit : units_) unit.grad_buffer = Tensor();
  if (stage_ <= 1) chunk_->zero_grad();
  replay_ = true;
  return Status::ok();
}

void ZeroStore::end_replay() {
  replay_ = false;
  replay_params_.clear();
  for (Unit& unit : units_) {
    if (unit.grad_buffer.defined()) track_transient(-static_cast<int64_t>(unit.grad_buffer.nbytes()));
    unit.grad_buffer = Tensor();
  }
  zero_gradients();
}

ZeroCounts ZeroStore::counts() const {
  ZeroCounts c;
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype_));
  for (const Unit& unit : units_) {
    c.optimizer_bytes += 2 * (stage_ == 0 ? unit.numel : unit.own_count) * esize;  // the optimizer's moments
    if (stage_ >= 2) c.grad_bytes += unit.own_count * esize;
    if (stage_ == 3) c.param_bytes += unit.own_count * esize;
  }
  if (stage_ <= 1) c.grad_bytes = chunk_->grad_bytes();
  if (stage_ <= 2) c.param_bytes = chunk_->param_bytes();
  c.transient_peak_bytes = transient_peak_;
  return c;
}

}  // namespace troupe
