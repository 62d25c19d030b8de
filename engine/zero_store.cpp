#include "engine/zero_store.hpp"

#include <algorithm>

#include "kernels/ops.hpp"
#include "model/params.hpp"
#include "troupe/check.hpp"

namespace troupe {

struct ZeroStore::Unit {
  int64_t numel = 0;
  // The group the unit is reduced and partitioned over: dp, or for an MoE layer's experts the
  // expert-data-parallel group (null: none); this rank's place in it.
  comm::Communicator* comm = nullptr;
  int rank = 0, size = 1;
  std::vector<size_t> counts;     // the group's partition, one count per rank
  int64_t own_start = 0, own_count = 0;
  struct Segment {  // one parameter of the unit, relative to the unit
    int64_t begin = 0, end = 0;
    bool decay = true, norm = true;
    int64_t valid_end = 0;  // end, less the vocabulary padding's trailing rows (wte, lm_head)
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
  // Mixed precision: the fp32 master weights of the owned range, and (16-bit gradients) the fp32
  // main gradients of the same range, widened from the reduced gradients by finish_gradients.
  Tensor master, main_grads;
  // Stages 0, 1 with a wire type other than the gradients': the unit's gradients (wire) and, stage
  // 1, the reduced partition (wire_part) in that type while the reduction runs.
  Tensor wire, wire_part;
};

namespace {

constexpr size_t kMaxPendingReduces = 2;

Tensor flat(const Tensor& t) { return t.view(Shape{t.numel()}); }

// The local elements of `spec` before its vocabulary padding (a suffix of rows: model/params.hpp).
int64_t unpadded_elements(const ParamSpec& spec) {
  int64_t k = spec.local_shape.numel();
  while (k > 0 && slice_global_index(spec, k - 1) < 0) --k;
  return k;
}

// Exactly zero elements of `t` (any float type; a device tensor is read on the host).
int64_t count_zeros(const Tensor& t) {
  const Tensor h = t.to_host().to(DType::f64);
  const double* x = h.data<double>();
  int64_t zeros = 0;
  for (int64_t i = 0; i < h.numel(); ++i) zeros += x[i] == 0.0 ? 1 : 0;
  return zeros;
}

}  // namespace

ZeroStore::ZeroStore(int stage, comm::Communicator* dp, DType param_dtype, DType grad_dtype, DType reduce_dtype,
                     comm::Communicator* expert_dp)
    : stage_(stage),
      dp_(dp),
      expert_dp_(expert_dp != nullptr ? expert_dp : dp),
      dtype_(param_dtype),
      grad_dtype_(grad_dtype),
      reduce_dtype_(reduce_dtype),
      mixed_(is_16bit(param_dtype)) {
  TROUPE_CHECK(stage >= 0 && stage <= 3, "ZeroStore: stage must be 0..3");
  TROUPE_CHECK(mixed_ ? (grad_dtype == DType::f32 || grad_dtype == param_dtype) : grad_dtype == param_dtype,
               "ZeroStore: gradients are the parameters' dtype, or f32 under mixed precision");
  TROUPE_CHECK(mixed_ ? (reduce_dtype == DType::f32 || is_16bit(reduce_dtype)) : reduce_dtype == grad_dtype,
               "ZeroStore: gradients travel in f32, bf16 or f16 under mixed precision, else in their own type");
}

ZeroStore::~ZeroStore() {
  // Collectives still in flight use our buffers (after a failure the rank's actor ends mid-step):
  // let them finish or fail first; a failed peer fails them, so this does not hang.
  for (Pending& p : pending_) (void)p.work->wait();
  for (Unit& u : units_) {
    if (u.gather) (void)u.gather->wait();
    if (u.reduce) (void)u.reduce->wait();
  }
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
  device_ = ctx->device;  // the store's buffers live where the chunk's do
  chunk_ = chunk;
  ctx_ = ctx;
  const auto& specs = chunk->specs();
  units_.clear();
  units_.resize(chunk->units().size());
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitInfo& info = chunk->units()[u];
    Unit& unit = units_[u];
    unit.numel = info.numel;
    unit.comm = info.expert ? expert_dp_ : dp_;
    unit.rank = unit.comm != nullptr ? unit.comm->rank() : 0;
    unit.size = unit.comm != nullptr ? unit.comm->size() : 1;
    unit.counts.resize(unit.size);
    int64_t start = 0;
    for (int r = 0; r < unit.size; ++r) {
      const int64_t c = unit.numel / unit.size + (r < unit.numel % unit.size ? 1 : 0);
      unit.counts[r] = static_cast<size_t>(c);
      if (r == unit.rank) {
        unit.own_start = start;
        unit.own_count = c;
      }
      start += c;
    }
    int64_t at = 0;
    for (int s : info.specs) {
      const int64_t n = specs[s].local_shape.numel();
      unit.segments.push_back(
          {at, at + n, specs[s].weight_decay, chunk->counts_in_norm(s), at + unpadded_elements(specs[s])});
      at += n;
    }
    TROUPE_CHECK(at == unit.numel, "ZeroStore: a unit's specs must cover it exactly");
    if (stage_ >= 2) unit.part_grads = Tensor::zeros({unit.own_count}, grad_dtype_, device_);
    // PipelineStage 1 reduces into a partition buffer of its own (kept: the optimizer's views point into it);
    // with dp == 1 the partition is the whole unit's gradient.
    if (stage_ == 1) {
      if (unit.size > 1) {
        unit.part_grads = Tensor::zeros({unit.own_count}, grad_dtype_, device_);
        track_transient(static_cast<int64_t>(unit.part_grads.nbytes()));
      } else {
        unit.part_grads = flat(chunk->unit_grads(static_cast<int>(u)));
      }
    }
    if (stage_ == 3) unit.part_params = Tensor::zeros({unit.own_count}, dtype_, device_);
    if (mixed_) {
      const int64_t owned = owned_last(unit) - owned_first(unit);
      unit.master = Tensor::zeros({owned}, DType::f32, device_);
      if (grad_dtype_ != DType::f32) unit.main_grads = Tensor::zeros({owned}, DType::f32, device_);
    }
  }
}

int64_t ZeroStore::owned_first(const Unit& unit) const { return stage_ == 0 ? 0 : unit.own_start; }
int64_t ZeroStore::owned_last(const Unit& unit) const {
  return stage_ == 0 ? unit.numel : unit.own_start + unit.own_count;
}

void ZeroStore::init(uint64_t seed) {
  TROUPE_CHECK(chunk_ != nullptr, "ZeroStore: attach() first");
  if (stage_ < 3 && !mixed_) {
    chunk_->init(seed);
    chunk_->zero_grad();
    return;
  }
  // PipelineStage 3 keeps no full parameters, and mixed precision initialises the fp32 master
  // weights: build one unit at a time (in f32 under mixed precision) and keep what this rank holds.
  const auto& specs = chunk_->specs();
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    Tensor full = Tensor::zeros({unit.numel}, mixed_ ? DType::f32 : dtype_, device_);
    const UnitInfo& info = chunk_->units()[u];
    for (size_t k = 0; k < info.specs.size(); ++k) {
      const ParamSpec& spec = specs[info.specs[k]];
      init_parameter(spec, seed, full.rows(unit.segments[k].begin, unit.segments[k].end).view(spec.local_shape));
    }
    const Tensor own = full.rows(unit.own_start, unit.own_start + unit.own_count);
    if (mixed_) {
      unit.master.copy_from(full.rows(owned_first(unit), owned_last(unit)));
      ops::convert(*ctx_, stage_ == 3 ? unit.part_params : flat(chunk_->unit_params(static_cast<int>(u))),
                   stage_ == 3 ? own : full);
    } else {
      unit.part_params.copy_from(own);
    }
  }
  zero_gradients();
}

void ZeroStore::zero_gradients() {
  if (stage_ <= 1) chunk_->zero_grad();
  for (Unit& unit : units_)
    if (unit.part_grads.defined()) unit.part_grads.zero_();
}

Tensor ZeroStore::take(int64_t numel, DType dtype) {
  // The smallest free buffer of the type that holds numel, if it is at most twice as large.
  auto best = pool_.end();
  for (auto it = pool_.begin(); it != pool_.end(); ++it)
    if (it->dtype() == dtype && it->numel() >= numel && it->numel() <= 2 * std::max<int64_t>(numel, 1) &&
        (best == pool_.end() || it->numel() < best->numel()))
      best = it;
  Tensor whole;
  if (best != pool_.end()) {
    whole = std::move(*best);
    pool_.erase(best);
  } else {
    whole = Tensor::empty({std::max<int64_t>(numel, 1)}, dtype, device_);
  }
  lent_[whole.raw()] = whole;
  return whole.rows(0, numel);
}

void ZeroStore::give(Tensor& t) {
  if (!t.defined()) return;
  auto it = lent_.find(t.raw());
  if (it != lent_.end()) {
    pool_.push_back(std::move(it->second));
    lent_.erase(it);
  }
  t = Tensor();
}

void ZeroStore::track_transient(int64_t delta) {
  transient_bytes_ += delta;
  transient_peak_ = std::max(transient_peak_, transient_bytes_);
}

Tensor ZeroStore::gather_unit(int u) {
  Unit& unit = units_[u];
  if (!unit.gathered.defined()) {
    unit.gathered = take(unit.numel, dtype_);
    track_transient(static_cast<int64_t>(unit.gathered.nbytes()));
    unit.gather = unit.comm != nullptr
                      ? unit.comm->all_gather_v(unit.part_params.raw(), unit.gathered.raw(), unit.counts, dtype_)
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
  give(unit.gathered);
  unit.gather.reset();
}

Tensor ZeroStore::grad_buffer(int u) {
  Unit& unit = units_[u];
  if (!unit.grad_buffer.defined()) {
    unit.grad_buffer = take(unit.numel, grad_dtype_);
    unit.grad_buffer.zero_();
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
    if (converts_for_wire()) {
      Tensor wire = to_wire(p.send);
      track_transient(-static_cast<int64_t>(p.send.nbytes()));
      give(p.send);
      p.send = std::move(wire);
    }
    p.recv = take(unit.own_count, reduce_dtype_);
    track_transient(static_cast<int64_t>(p.recv.nbytes()));
    p.work = unit.comm != nullptr ? unit.comm->reduce_scatter_v(p.send.raw(), p.recv.raw(), unit.counts,
                                                                reduce_dtype_, comm::ReduceOp::sum)
                                  : comm::completed_work();
    if (unit.comm == nullptr) p.recv.copy_from(p.send);
    pending_.push_back(std::move(p));
    drain_pending(false);
    // A bound on gradient buckets in flight (DeepSpeed's reduce_bucket_size, counted in units): the
    // oldest is waited for, so ZeRO-2/3 never hold much more than two units' gradients at once.
    while (pending_.size() > kMaxPendingReduces) drain_one();
    return;
  }
  if (unit.ready < micro_batches_ || unit.comm == nullptr || unit.size == 1) return;
  Tensor region = flat(chunk_->unit_grads(u));
  if (converts_for_wire()) {
    unit.wire = to_wire(region);
    region = unit.wire;
  }
  if (stage_ == 0) {
    unit.reduce =
        unit.comm->all_reduce(region.raw(), static_cast<size_t>(unit.numel), reduce_dtype_, comm::ReduceOp::sum);
  } else {
    Tensor into = unit.part_grads;
    if (converts_for_wire()) {
      unit.wire_part = take(unit.own_count, reduce_dtype_);
      track_transient(static_cast<int64_t>(unit.wire_part.nbytes()));
      into = unit.wire_part;
    }
    unit.reduce = unit.comm->reduce_scatter_v(region.raw(), into.raw(), unit.counts, reduce_dtype_, comm::ReduceOp::sum);
  }
}

Tensor ZeroStore::to_wire(const Tensor& grads) {
  Tensor wire = take(grads.numel(), reduce_dtype_);
  track_transient(static_cast<int64_t>(wire.nbytes()));
  ops::convert(*ctx_, wire, grads);
  return wire;
}

// Adds finished reductions into their partitions, oldest first; with `all`, waits for every one.
void ZeroStore::drain_pending(bool all) {
  while (!pending_.empty() && (all || pending_.front().work->test())) drain_one();
}

void ZeroStore::drain_one() {
  Pending& p = pending_.front();
  comm::wait_or_throw(p.work, "ZeRO gradient reduce-scatter", comm::WaitGroup::dp);
  if (p.recv.dtype() != grad_dtype_) {
    Tensor back = take(p.recv.numel(), grad_dtype_);
    ops::convert(*ctx_, back, p.recv);
    ops::add_inplace(*ctx_, units_[p.unit].part_grads, back);
    give(back);
  } else {
    ops::add_inplace(*ctx_, units_[p.unit].part_grads, p.recv);
  }
  track_transient(-static_cast<int64_t>(p.send.nbytes() + p.recv.nbytes()));
  give(p.send);
  give(p.recv);
  pending_.pop_front();
}

Status ZeroStore::finish_gradients() {
  drain_pending(true);
  std::vector<bool> main_done(units_.size(), false);
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (unit.reduce) TROUPE_RETURN_IF_ERROR(unit.reduce->wait());
    unit.reduce.reset();
    if (!unit.wire.defined()) continue;  // reduced in the gradients' own type
    const Tensor reduced = stage_ == 0 ? unit.wire : unit.wire_part;
    if (unit.main_grads.defined() && reduce_dtype_ == DType::f32) {
      // 16-bit gradients summed in fp32: the fp32 sum is the main gradient, not rounded to 16 bits.
      ops::convert(*ctx_, unit.main_grads, reduced);
      main_done[u] = true;
    } else {  // back from the wire type (nearest even into 16-bit gradients)
      ops::convert(*ctx_, stage_ == 0 ? flat(chunk_->unit_grads(static_cast<int>(u))) : unit.part_grads, reduced);
    }
    if (stage_ != 0) {
      track_transient(-static_cast<int64_t>(unit.wire_part.nbytes()));
      give(unit.wire_part);
    }
    track_transient(-static_cast<int64_t>(unit.wire.nbytes()));
    give(unit.wire);
  }
  // Prefetched stage-3 units nobody used (the pass ended) are dropped.
  for (Unit& unit : units_) {
    if (unit.gathered.defined() && unit.users == 0) {
      if (unit.gather) TROUPE_RETURN_IF_ERROR(unit.gather->wait());
      track_transient(-static_cast<int64_t>(unit.gathered.nbytes()));
      give(unit.gathered);
      unit.gather.reset();
    }
  }
  // 16-bit gradients: the optimizer's fp32 main gradients of the owned range.
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (!unit.main_grads.defined() || main_done[u]) continue;
    ops::convert(*ctx_, unit.main_grads, stage_ == 0 ? flat(chunk_->unit_grads(static_cast<int>(u))) : unit.part_grads);
  }
  return Status::ok();
}

Tensor ZeroStore::unit_gradient(int u) const {
  const Unit& unit = units_[u];
  if (unit.main_grads.defined()) return unit.main_grads;
  if (stage_ == 0) return flat(chunk_->unit_grads(u));
  return unit.part_grads;
}

template <class F>
void ZeroStore::for_counted(const Unit& unit, const Tensor& values, int64_t first, bool without_padding, F&& f) const {
  for (const auto& seg : unit.segments) {
    if (!seg.norm) continue;
    const int64_t end = without_padding ? seg.valid_end : seg.end;
    const int64_t lo = std::max(seg.begin, unit.own_start), hi = std::min(end, unit.own_start + unit.own_count);
    if (lo < hi) f(values.rows(lo - first, hi - first));
  }
}

// The owned range of each unit: stage 0 counts its dp partition only (every dp rank holds the same
// reduced gradients), the other stages their partition buffer.
double ZeroStore::owned_grad_sum_squares() {
  double sum = 0;
  for (size_t u = 0; u < units_.size(); ++u)
    for_counted(units_[u], unit_gradient(static_cast<int>(u)), owned_first(units_[u]), false,
                [&](const Tensor& run) { sum += ops::sum_squares(*ctx_, run); });
  return sum;
}

int64_t ZeroStore::owned_grad_zeros() const {
  int64_t zeros = 0;
  for (size_t u = 0; u < units_.size(); ++u)
    for_counted(units_[u], unit_gradient(static_cast<int>(u)), owned_first(units_[u]), true,
                [&](const Tensor& run) { zeros += count_zeros(run); });
  return zeros;
}

// The values adam_segments() updates: the fp32 master range (mixed precision), stage 3's partition,
// or the chunk's parameters.
double ZeroStore::owned_param_sum_squares() {
  double sum = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const Tensor values = mixed_        ? unit.master
                          : stage_ == 3 ? unit.part_params
                                        : flat(chunk_->unit_params(static_cast<int>(u)));
    const int64_t first = mixed_ ? owned_first(unit) : stage_ == 3 ? unit.own_start : 0;
    for_counted(unit, values, first, false, [&](const Tensor& run) { sum += ops::sum_squares(*ctx_, run); });
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
    const Tensor params = mixed_        ? unit.master
                          : stage_ == 3 ? unit.part_params
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
    const int64_t first = mixed_ ? owned_first(unit) : stage_ == 3 ? unit.own_start : 0;
    const int64_t last = mixed_ ? owned_last(unit) : stage_ == 3 ? unit.own_start + unit.own_count : unit.numel;
    const Tensor values = mixed_        ? unit.master
                          : stage_ == 3 ? unit.part_params
                                        : flat(chunk_->unit_params(static_cast<int>(u)));
    for (size_t k = 0; k < unit.segments.size(); ++k) {
      const auto& seg = unit.segments[k];
      const int64_t lo = std::max(seg.begin, first), hi = std::min(seg.end, last);
      if (lo < hi)
        out.push_back({info.specs[k], lo - seg.begin, hi - seg.begin, values.rows(lo - first, hi - first), unit.rank == 0});
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
      if (lo < hi) out.push_back({info.specs[k], lo - seg.begin, hi - seg.begin, segments[i++].param, unit.rank == 0});
    }
  }
  return out;
}

void ZeroStore::round_master() {
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const Tensor into = stage_ == 3 ? unit.part_params
                                    : flat(chunk_->unit_params(static_cast<int>(u))).rows(owned_first(unit), owned_last(unit));
    ops::convert(*ctx_, into, unit.master);
  }
}

Status ZeroStore::publish_params() {
  if (!mixed_) return Status::ok();
  round_master();
  return gather_params();
}

void ZeroStore::skip_step() { zero_gradients(); }

Status ZeroStore::finish_step() {
  if (mixed_) round_master();
  TROUPE_RETURN_IF_ERROR(gather_params());
  // The next iteration's gradients start from zero.
  if (stage_ >= 1)
    for (Unit& unit : units_)
      if (stage_ >= 2 || unit.size > 1) unit.part_grads.zero_();
  if (stage_ <= 1) chunk_->zero_grad();
  return Status::ok();
}

Status ZeroStore::gather_params() {
  std::vector<comm::WorkPtr> gathers;
  if (stage_ == 1 || stage_ == 2) {
    for (size_t u = 0; u < units_.size(); ++u) {
      const Unit& unit = units_[u];
      if (unit.comm == nullptr || unit.size == 1) continue;
      Tensor region = flat(chunk_->unit_params(static_cast<int>(u)));
      Tensor own = region.rows(unit.own_start, unit.own_start + unit.own_count);
      gathers.push_back(unit.comm->all_gather_v(own.raw(), region.raw(), unit.counts, dtype_));
    }
  }
  return comm::wait_all(gathers);
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
  if (mixed_ && stage_ == 0) return unit.master.clone();
  if (mixed_) return gather_partition(unit, unit.master);
  if (stage_ < 3) return flat(chunk_->unit_params(u)).clone();
  return gather_partition(unit, unit.part_params);
}

Result<Tensor> ZeroStore::gather_partition(const Unit& unit, const Tensor& part) {
  Tensor out = Tensor::empty({unit.numel}, part.dtype(), device_);
  if (unit.comm == nullptr) {
    out.copy_from(part);
    return out;
  }
  TROUPE_RETURN_IF_ERROR(unit.comm->all_gather_v(part.raw(), out.raw(), unit.counts, part.dtype())->wait());
  return out;
}

Status ZeroStore::begin_replay() {
  if (stage_ == 3)  // the working copy the chunk computes with (16-bit under mixed precision)
    for (size_t u = 0; u < units_.size(); ++u) {
      auto full = gather_partition(units_[u], units_[u].part_params);
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
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype_)), gsize = static_cast<int64_t>(dtype_size(grad_dtype_));
  const int64_t msize = mixed_ ? 4 : esize;  // the moments' (and master weights') element size
  for (const Unit& unit : units_) {
    const int64_t owned = owned_last(unit) - owned_first(unit);
    c.optimizer_bytes += 2 * owned * msize;  // the optimizer's moments
    if (mixed_) c.optimizer_bytes += owned * 4;  // the fp32 master weights
    if (unit.main_grads.defined()) c.grad_bytes += owned * 4;
    if (stage_ >= 2) c.grad_bytes += unit.own_count * gsize;
    if (stage_ == 3) c.param_bytes += unit.own_count * esize;
  }
  if (stage_ <= 1) c.grad_bytes += chunk_->grad_bytes();
  if (stage_ <= 2) c.param_bytes = chunk_->param_bytes();
  c.transient_peak_bytes = transient_peak_;
  return c;
}

}  // namespace troupe
