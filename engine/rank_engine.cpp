#include "engine/rank_engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>

#include "engine/fault_injection.hpp"
#include "engine/step_timers.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device_memory.hpp"
#include "kernels/ops.hpp"
#include "model/pipeline_model.hpp"
#include "troupe/check.hpp"

namespace troupe {

// ---- the inspector's capture of an op's result (StepRequest::capture_activation) ------------------

// The first result of the op `want` names in micro-batch want.micro_batch (recomputation passes
// the same values again), copied as f32; every result goes on to the chunks' own probe.
class CaptureProbe final : public OpProbe {
 public:
  CaptureProbe(NanFault want, OpProbe* inner) : want_(std::move(want)), inner_(inner) {}
  void set_micro(int micro) { micro_ = micro; }
  void after(const ProbePoint& at, const Tensor& given) override {
    if (inner_ != nullptr) inner_->after(at, given);
    if (got_ || micro_ != want_.micro_batch || !want_.matches(at)) return;
    const Tensor result = given.to_host();  // a GPU rank's result, read back
    if (result.dtype() != DType::f32 && result.dtype() != DType::f64 && !is_16bit(result.dtype())) return;
    shape_ = result.shape();
    values_ = Tensor::empty({result.numel()});
    float* dst = values_.data<float>();
    if (is_16bit(result.dtype())) {  // mixed precision: widened exactly
      values_.copy_from(result.view({result.numel()}).to(DType::f32));
    } else if (result.dtype() == DType::f32) {
      std::memcpy(dst, result.data<float>(), static_cast<size_t>(result.numel()) * sizeof(float));
    } else {
      const double* src = result.data<double>();
      for (int64_t i = 0; i < result.numel(); ++i) dst[i] = static_cast<float>(src[i]);
    }
    got_ = true;
  }
  bool got() const { return got_; }
  // The rank's own tensor as one piece of its own shape.
  TensorPiece piece(const std::string& name) const {
    TensorPiece p;
    p.name = name;
    p.global_shape = shape_;
    if (values_.numel() > 0) p.runs.push_back({0, values_.numel()});
    p.values = values_;
    return p;
  }

 private:
  NanFault want_;
  OpProbe* inner_;
  int micro_ = -1;
  bool got_ = false;
  Shape shape_;
  Tensor values_;
};


using Clock = std::chrono::steady_clock;

// steady_clock is CLOCK_MONOTONIC (time since boot), shared by every process of a host: the spans of a
// multi-process job on one host line up without any clock exchange.
std::pair<int64_t, int64_t> replica_windows(int64_t n, int micro_batch, int dp, int d) {
  TROUPE_CHECK(micro_batch >= 1 && dp >= 1 && d >= 0 && d < dp && n >= 0, "replica_windows: bad arguments");
  const int64_t micro = (n + micro_batch - 1) / micro_batch;
  const int64_t lo = micro * d / dp, hi = micro * (d + 1) / dp;
  return {std::min(n, lo * micro_batch), std::min(n, hi * micro_batch)};
}

std::string ParallelConfig::to_json() const {
  return "{\"tensor_model_parallel_size\": " + std::to_string(tp) + ", \"pipeline_model_parallel_size\": " +
         std::to_string(pp) + ", \"data_parallel_size\": " + std::to_string(dp) + ", \"zero_stage\": " +
         std::to_string(zero_stage) + ", \"schedule\": \"" + sched::schedule_name(schedule) +
         "\", \"virtual_chunks\": " + std::to_string(virtual_chunks) +
         (ep > 1 ? ", \"expert_model_parallel_size\": " + std::to_string(ep) : std::string()) +
         (cp > 1 ? ", \"context_parallel_size\": " + std::to_string(cp) : std::string()) +
         (tp > 1 && !expert_tensor_parallel ? ", \"expert_tensor_parallel_size\": 1" : "") + "}";
}

std::chrono::steady_clock::time_point span_epoch() { return Clock::time_point{}; }

// Per chunk: the boundary tensors of each slot (inputs() / outputs() of the stage, and the gradients
// of those that take one: undefined otherwise), the sends still reading them, and which micro-batch
// holds which slot.
struct RankEngine::ChunkBuffers {
  std::vector<std::vector<Tensor>> in_act, out_act, in_grad, out_grad;
  std::vector<std::vector<comm::WorkPtr>> sends;
  std::vector<int> free_slots;
  std::map<int, int> slot_of_micro;
};

// What a watched step keeps to replay itself (engine/nan_watch.hpp): the rank's token rows, the
// boundary tensors it received, per chunk and micro-batch, and its parameters before the step (the
// values of the stores' param_ranges, store by store).
struct RankEngine::Kept {
  Tensor tokens;
  double grad_scale = 0;
  std::vector<std::vector<std::vector<Tensor>>> in_act, in_grad;  // [chunk][micro][tensor]
  std::vector<Tensor> params;
};

namespace {
// dst becomes a copy of src's tensors (undefined ones stay undefined), reusing dst's buffers.
void keep_copy(std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
  dst.resize(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (!src[i].defined()) {
      dst[i] = Tensor();
    } else if (dst[i].defined() && dst[i].shape() == src[i].shape() && dst[i].dtype() == src[i].dtype()) {
      dst[i].copy_from(src[i]);
    } else {
      dst[i] = src[i].clone();
    }
  }
}
}  // namespace

struct RankEngine::Listener final : comm::WaitListener {
  RankEngine* engine = nullptr;
  void begin(const std::string& what, comm::WaitGroup group) override {
    const std::vector<int>& members = group == comm::WaitGroup::tp   ? engine->tp_members_
                                      : group == comm::WaitGroup::dp ? engine->dp_members_
                                                                     : std::vector<int>{};
    engine->board_->wait(engine->collective_wait(what, members));
  }
  void end(bool ok) override {
    if (ok) engine->board_->done_waiting();  // a failed wait stays on the board: where the rank stopped
  }
  // Inside the forward, backward or weight span that is running: the timeline nests it there.
  void collective_span(const std::string& what, Clock::time_point issued) override {
    engine->record(what, kCollectiveSpan, issued);
  }
};

namespace {

constexpr int kF = 0, kB = 1;

// The engine's listener on the calling thread for the duration of an entry point.
class ListenScope {
 public:
  explicit ListenScope(comm::WaitListener* l) : before_(comm::set_thread_wait_listener(l)) {}
  ~ListenScope() { comm::set_thread_wait_listener(before_); }
  ListenScope(const ListenScope&) = delete;
  ListenScope& operator=(const ListenScope&) = delete;

 private:
  comm::WaitListener* before_;
};
// Tensors per boundary and direction a tag can tell apart (check_model's models have few).
constexpr uint64_t kMaxBoundaryTensors = 64;


bool any_defined(const std::vector<Tensor>& ts) {
  return std::any_of(ts.begin(), ts.end(), [](const Tensor& t) { return t.defined(); });
}

Status wait_sends(std::vector<comm::WorkPtr>& sends) {
  Status st = comm::wait_all(sends);
  sends.clear();
  return st;
}

}  // namespace

Status check_custom_schedule(const sched::Schedule& schedule, const ParallelConfig& par, int micro_batches) {
  const sched::ScheduleSpec& s = schedule.spec;
  std::string wrong;
  auto expect = [&](const char* what, int given, int job) {
    if (given != job)
      wrong += std::string(wrong.empty() ? "" : "; ") + what + " " + std::to_string(given) + " but the job has " +
               std::to_string(job);
  };
  expect("spec.stages", s.stages, par.pp);
  expect("spec.micro_batches", s.micro_batches, micro_batches);
  expect("spec.chunks", s.chunks, par.virtual_chunks);
  expect("stage tables", static_cast<int>(schedule.stages.size()), par.pp);
  if (!wrong.empty())
    return Status::bad_input("the schedule given as data does not fit this job: " + wrong +
                             " -- build it for the job's pipeline stages, micro-batches per replica (global batch / "
                             "(micro batch x data-parallel size)) and model chunks per stage");
  if (Status st = sched::validate(schedule); !st)
    return Status::bad_input("the schedule given as data cannot run: " + st.message());
  return Status::ok();
}

sched::Schedule job_schedule(const RankSpec& spec) {
  const ParallelConfig& par = spec.par;
  if (par.custom_schedule) {
    const Status fits = check_custom_schedule(*par.custom_schedule, par, spec.micro_batches);
    TROUPE_CHECK(fits.is_ok(), "RankEngine: the job checks a given schedule first: " + fits.message());
    return *par.custom_schedule;
  }
  sched::ScheduleSpec ss;
  ss.type = par.schedule;
  ss.stages = par.pp;
  ss.micro_batches = spec.micro_batches;
  ss.chunks = par.virtual_chunks;
  auto made = sched::make_schedule(ss);
  TROUPE_CHECK(made.is_ok(), "RankEngine: the schedule was validated by the config: " + made.status().message());
  return std::move(made).value();
}

RankEngine::RankEngine(const RankSpec& spec, const comm::Topology& topology, int rank, RankComms comms,
                       std::shared_ptr<ActivityBoard> board)
    : moe_tally_(spec.model), spec_(spec), rank_(rank), comms_(comms), board_(std::move(board)) {
  const comm::Coords at = topology.coords(rank);
  stage_ = at.pp;
  tp_rank_ = at.tp;
  cp_rank_ = at.cp;
  slow_forward_ms_ = slow_forward_ms(rank);
  dp_rank_ = at.dp;
  if (!board_)
    board_ = std::make_shared<ActivityBoard>(rank, at.pp, at.tp, at.dp, topology.sizes().cp > 1 ? at.cp : -1);
  listener_ = std::make_unique<Listener>();
  listener_->engine = this;
  pp_members_ = topology.pp_group(rank);
  tp_members_ = topology.tp_group(rank);
  dp_members_ = topology.dp_cp_group(rank);  // the gradients' group (RankComms::dp)
  for (int r = 0; r < topology.world_size(); ++r) world_members_.push_back(r);
  const ParallelConfig& par = spec_.par;
  schedule_ = job_schedule(spec_);
  micro_batches_ = spec_.micro_batches;

  pool_ = std::make_unique<ThreadPool>(spec_.num_threads);
  ctx_.device = Device::cpu;
  ctx_.pool = pool_.get();
  if (spec_.device == Device::cuda) {
    // The rank's own stream, cuBLASLt handle and workspace: every op, copy and allocation of its
    // entry points goes to them (Placed).
    auto made = cuda::DeviceContext::create(spec_.cuda_device);
    if (!made) throw DeviceError(made.status().message());  // the rank actor names the rank
    device_ = std::move(made).value();
    ctx_ = device_->ctx();
    ctx_.pool = pool_.get();
    placement_ = {spec_.cuda_device, reinterpret_cast<uint64_t>(ctx_.stream)};
  }
  Placed placed(*this);

  // Each chunk's activation slots: what its free list hands out as the schedule runs (slots taken a
  // receive ahead, freed by B or W, last freed first: Schedule::slots_held), so a device reserves
  // what the chunk writes and no more (peak in flight + 1 per chunk had been up to v times that).
  const std::vector<int> chunk_slots =
      sched::engine_slots(schedule_, stage_, par.custom_schedule ? std::vector<int>{} : spec_.ramp_micro_batches);
  const int at_cp = at.cp;
  TROUPE_CHECK(par.cp == 1 || (comms_.cp != nullptr && comms_.cp->size() == par.cp && comms_.cp->rank() == at_cp),
               "RankEngine: context parallelism needs the cp group (RankComms::cp)");
  const int virtual_stages = par.pp * par.virtual_chunks;
  const Model model = spec_.custom_model ? *spec_.custom_model : gpt_model(spec_.model, virtual_stages);
  tied_ = ties_embedding(model);
  for (int c = 0; c < par.virtual_chunks; ++c) {
    const int slots = chunk_slots[static_cast<size_t>(c)];
    StageBuild at;
    at.gpt = spec_.model;
    at.virtual_stage = c * par.pp + stage_;
    at.virtual_stages = virtual_stages;
    at.tp_size = par.tp;
    at.tp_rank = tp_rank_;
    at.sequence_parallel = par.sequence_parallel && par.tp > 1;
    at.expert_tensor_parallel = par.expert_tensor_parallel;
    at.ep_size = par.ep;
    at.ep_rank = dp_rank_ % par.ep;
    at.ep = par.ep > 1 ? comms_.ep : nullptr;
    at.cp_size = par.cp;
    at.cp_rank = at_cp;
    at.cp_comm = par.cp_comm;
    at.cp_contiguous = par.cp_contiguous;
    at.cp = par.cp > 1 ? comms_.cp : nullptr;
    at.recompute = par.recompute;
    at.micro_batch = spec_.micro_batch_size;
    at.slots = slots;
    at.dtype = spec_.dtype;
    at.grad_dtype = is_16bit(spec_.dtype) ? spec_.grad_dtype : spec_.dtype;
    at.device = spec_.device;
    at.tp = comms_.tp;
    const DType reduce = is_16bit(spec_.dtype) ? spec_.reduce_dtype.value_or(at.grad_dtype) : at.grad_dtype;
    auto store = std::make_unique<ZeroStore>(par.zero_stage, comms_.dp, at.dtype, at.grad_dtype, reduce,
                                             par.ep > 1 ? comms_.expert_dp : nullptr);
    std::unique_ptr<PipelineStage> chunk = build_stage(model, at, store->hooks());
    store->attach(chunk.get(), &ctx_);
    TROUPE_CHECK(chunk->inputs().size() <= kMaxBoundaryTensors && chunk->outputs().size() <= kMaxBoundaryTensors,
                 "RankEngine: too many tensors between two stages");
    auto buf = std::make_unique<ChunkBuffers>();
    for (int s = 0; s < slots; ++s) {
      buf->in_act.push_back(boundary_tensors(chunk->inputs(), false, spec_.device));
      buf->out_grad.push_back(boundary_tensors(chunk->inputs(), true, spec_.device));
      buf->out_act.push_back(boundary_tensors(chunk->outputs(), false, spec_.device));
      buf->in_grad.push_back(boundary_tensors(chunk->outputs(), true, spec_.device));
      buf->free_slots.push_back(slots - 1 - s);  // pop_back hands out slot 0 first
    }
    buf->sends.resize(slots);
    stores_.push_back(std::move(store));
    chunks_.push_back(std::move(chunk));
    buffers_.push_back(std::move(buf));
  }
  // The NaN watch's probe: the chunks see it always where TROUPE_FAULT_NAN injects on this rank,
  // else only during a replay.
  const std::optional<NanFault>& fault = spec_.nan_fault;
  const bool injects = fault && !fault->optimizer && (fault->rank < 0 || fault->rank == rank_);
  if (injects || spec_.nan) probe_ = std::make_unique<WatchProbe>(injects ? fault : std::nullopt);
  probe_injects_ = injects;
  if (injects)
    for (auto& chunk : chunks_) chunk->set_probe(probe_.get());
}

RankEngine::~RankEngine() {
  Placed placed(*this);
  // Sends still in flight read our buffers: let them finish (a failed peer fails them, no hang).
  for (auto& b : buffers_)
    for (auto& s : b->sends) (void)wait_sends(s);
}

void RankEngine::init(uint64_t seed) {
  Placed placed(*this);
  for (auto& store : stores_) store->init(seed);
}

void RankEngine::record(const std::string& name, const char* cat, Clock::time_point t0, int micro, int chunk) {
  const auto t1 = Clock::now();
  Span s;
  s.name = name;
  s.cat = cat;
  s.start_us = std::chrono::duration<double, std::micro>(t0 - span_epoch()).count();
  s.dur_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
  if (const auto kind = span_kind_from_name(cat)) board_->recent().add(*kind, micro, chunk, s.start_us, s.dur_us);
  spans_.push_back(std::move(s));
}

std::vector<Span> RankEngine::take_spans() {
  std::vector<Span> out;
  out.swap(spans_);
  return out;
}

// Replica d holds the global batch's samples [d * micro_batches * B, (d + 1) * micro_batches * B)
// (the group's split, actors/rank_actor.cpp), micro-batch m the B of them from m * B on.
MicroBatchKey RankEngine::micro_key(int micro) const {
  MicroBatchKey key;
  key.seed = spec_.seed;
  key.iteration = iteration_;
  key.first_sample = (int64_t{dp_rank_} * micro_batches_ + micro) * spec_.micro_batch_size;
  return key;
}

// The job's schedule, or (during a batch-size ramp-up) the same type's table for this step's
// micro-batches, made once per count. Its activations fit the job's slots: fewer micro-batches keep
// no more in flight.
const sched::Schedule& RankEngine::step_schedule() {
  if (micro_batches_ == spec_.micro_batches || micro_batches_ <= 0) return schedule_;
  auto it = ramp_schedules_.find(micro_batches_);
  if (it == ramp_schedules_.end()) {
    RankSpec smaller = spec_;
    smaller.micro_batches = micro_batches_;
    it = ramp_schedules_.emplace(micro_batches_, job_schedule(smaller)).first;
    for (int c = 0; c < spec_.par.virtual_chunks; ++c)
      TROUPE_CHECK(it->second.slots_held(stage_, c, stage_ > 0 || c > 0) <= static_cast<int>(buffers_[c]->in_act.size()),
                   "RankEngine: a ramp-up step of " + std::to_string(micro_batches_) +
                       " micro-batches holds more activations than RankSpec::ramp_micro_batches allowed for");
  }
  return it->second;
}

Status RankEngine::run_schedule(const Tensor& tokens, double grad_scale, std::vector<double>& micro_losses) {
  const int p = spec_.par.pp, v = spec_.par.virtual_chunks, B = spec_.micro_batch_size;
  const sched::Schedule& schedule = step_schedule();
  const bool split = schedule.split_backward;
  const auto& actions = schedule.stages[stage_];
  // Virtual stage k = c*p + stage holds chunk c; its neighbours k-1, k+1 live on stages (k +- 1) mod p.
  auto vstage = [&](int c) { return c * p + stage_; };
  // One tag per (micro-batch, boundary, direction, tensor): the activations from virtual stage k to
  // k+1 and their gradients from k+1 back to k share boundary k.
  auto tag = [&](int micro, int boundary, int dir, size_t tensor) {
    return ((static_cast<uint64_t>(micro) * static_cast<uint64_t>(v * p) + static_cast<uint64_t>(boundary)) * 2 +
            static_cast<uint64_t>(dir)) * kMaxBoundaryTensors + tensor;
  };
  // Receives (into `dst`'s defined tensors) and sends (of `src`'s) of one boundary.
  auto recv_all = [&](const std::vector<Tensor>& dst, int from, int micro, int boundary, int dir) {
    std::vector<comm::WorkPtr> works;
    const PipeLink l = link(dir, from, false);
    for (size_t i = 0; i < dst.size(); ++i)
      if (dst[i].defined())
        works.push_back(l.comm->recv(dst[i].raw(), static_cast<size_t>(dst[i].numel()), dst[i].dtype(), l.peer,
                                     tag(micro, boundary, dir, i)));
    return works;
  };
  auto send_all = [&](std::vector<comm::WorkPtr>& sends, const std::vector<Tensor>& src, int to, int micro,
                      int boundary, int dir) {
    const PipeLink l = link(dir, to, true);
    for (size_t i = 0; i < src.size(); ++i)
      if (src[i].defined())
        sends.push_back(l.comm->send(src[i].raw(), static_cast<size_t>(src[i].numel()), src[i].dtype(), l.peer,
                                     tag(micro, boundary, dir, i)));
  };
  auto alloc_slot = [&](int c, int micro) -> Result<int> {
    ChunkBuffers& b = *buffers_[c];
    TROUPE_CHECK(!b.free_slots.empty(), "RankEngine: more micro-batches in flight than the schedule's slots_held");
    const int slot = b.free_slots.back();
    b.free_slots.pop_back();
    TROUPE_RETURN_IF_ERROR(wait_sends(b.sends[slot]));  // the slot's buffers are ours again
    b.slot_of_micro[micro] = slot;
    return slot;
  };
  auto release_slot = [&](int c, int micro) {
    ChunkBuffers& b = *buffers_[c];
    auto it = b.slot_of_micro.find(micro);
    TROUPE_CHECK(it != b.slot_of_micro.end(), "RankEngine: release of a micro-batch without a slot");
    b.free_slots.push_back(it->second);
    b.slot_of_micro.erase(it);
  };
  auto needs_recv = [&](const sched::Action& a) {
    const PipelineStage& st = *chunks_[a.chunk];
    if (a.kind == sched::Kind::forward) return !st.inputs().empty();
    if (a.kind == sched::Kind::backward) return any_defined(buffers_[a.chunk]->in_grad.front());
    return false;
  };
  std::map<std::tuple<int, int, int>, std::vector<comm::WorkPtr>> posted;  // (kind, micro, chunk) -> recvs
  auto post = [&](const sched::Action& a) -> Status {
    if (!needs_recv(a)) return Status::ok();
    const auto key = std::make_tuple(static_cast<int>(a.kind), a.micro, a.chunk);
    if (posted.count(key)) return Status::ok();
    ChunkBuffers& b = *buffers_[a.chunk];
    const int k = vstage(a.chunk);
    if (a.kind == sched::Kind::forward) {
      auto slot = alloc_slot(a.chunk, a.micro);
      if (!slot.is_ok()) return slot.status();
      posted[key] = recv_all(b.in_act[slot.value()], (k - 1) % p, a.micro, k - 1, kF);
    } else {
      // The first stage allocates a micro-batch's slot when its forward runs: a backward right
      // after its own forward (fewer micro-batches than stages) is posted at its turn instead.
      const auto slot = b.slot_of_micro.find(a.micro);
      if (slot == b.slot_of_micro.end()) return Status::ok();
      posted[key] = recv_all(b.in_grad[slot->second], (k + 1) % p, a.micro, k, kB);
    }
    return Status::ok();
  };
  auto await = [&](const sched::Action& a) -> Status {
    if (!needs_recv(a)) return Status::ok();
    const auto key = std::make_tuple(static_cast<int>(a.kind), a.micro, a.chunk);
    const auto t0 = Clock::now();
    TROUPE_CHECK(posted.count(key) == 1, "RankEngine: a receive was not posted");
    const bool fwd = a.kind == sched::Kind::forward;
    const int from = (vstage(a.chunk) + (fwd ? -1 : 1) + p) % p;
    board_->wait({std::string(fwd ? "the activation" : "the gradient") + " of micro-batch " + std::to_string(a.micro) +
                      " (chunk " + std::to_string(a.chunk) + ") from stage " + std::to_string(from),
                  {pp_members_[static_cast<size_t>(from)]},
                  false});
    Status st = comm::wait_all(posted.at(key));
    if (st.is_ok()) board_->done_waiting();  // a failed wait stays on the board: where the rank stopped
    posted.erase(key);
    const double waited = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (waited > 20)
      record(std::string("wait ") + sched::kind_name(a.kind) + std::to_string(a.micro), "wait", t0, a.micro, a.chunk);
    return st;
  };

  board_->begin_step(static_cast<int>(actions.size()));
  for (size_t j = 0; j < actions.size(); ++j) {
    const sched::Action& a = actions[j];
    board_->set(a.kind == sched::Kind::forward    ? Doing::forward
                : a.kind == sched::Kind::backward ? Doing::backward
                                                  : Doing::weight,
                a.micro, a.chunk, static_cast<int>(j));
    TROUPE_RETURN_IF_ERROR(post(a));
    if (j + 1 < actions.size()) TROUPE_RETURN_IF_ERROR(post(actions[j + 1]));
    TROUPE_RETURN_IF_ERROR(await(a));
    PipelineStage& chunk = *chunks_[a.chunk];
    ChunkBuffers& b = *buffers_[a.chunk];
    const bool first = chunk.inputs().empty();
    const int k = vstage(a.chunk);
    std::string label = sched::kind_name(a.kind);  // "F3", or "F3.1" for chunk 1 of an interleaved stage
    label += std::to_string(a.micro);
    if (v > 1) label += '.' + std::to_string(a.chunk);
    const auto t0 = Clock::now();
    if (capture_) capture_->set_micro(a.micro);
    if (probe_injects_) {
      const bool fwd = a.kind == sched::Kind::forward;
      probe_->at(a.micro, a.chunk, k, fwd ? 0 : 1, fwd ? k : v * p - 1 - k);
    }
    if (a.kind == sched::Kind::forward) {
      int slot;
      if (first) {
        auto s = alloc_slot(a.chunk, a.micro);
        if (!s.is_ok()) return s.status();
        slot = s.value();
      } else {
        slot = b.slot_of_micro.at(a.micro);
      }
      if (watch_step_) keep_copy(kept_->in_act[a.chunk][a.micro], b.in_act[slot]);
      const Tensor mb = chunk.reads_batch() ? tokens.rows(int64_t{a.micro} * B, int64_t{a.micro + 1} * B) : Tensor();
      // The head's backward right after its forward (1F1B at pp 1 and on its last stage, ...):
      // the chunk runs the head's backward in the forward, on logits it need not recompute.
      const bool backward_next = chunk.has_loss() && !split && j + 1 < actions.size() &&
                                 actions[j + 1].kind == sched::Kind::backward && actions[j + 1].micro == a.micro &&
                                 actions[j + 1].chunk == a.chunk;
      const double loss =
          chunk.forward(ctx_, slot, mb, b.in_act[slot], b.out_act[slot], grad_scale, backward_next, micro_key(a.micro));
      if (slow_forward_ms_ > 0)  // TROUPE_FAULT_SLOW: a slow rank, inside its forward's span
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(slow_forward_ms_));
      record(label, "forward", t0, a.micro, a.chunk);
      if (chunk.has_loss()) micro_losses[a.micro] = loss;
      send_all(b.sends[slot], b.out_act[slot], (k + 1) % p, a.micro, k, kF);
    } else if (a.kind == sched::Kind::backward) {
      const int slot = b.slot_of_micro.at(a.micro);
      if (watch_step_) keep_copy(kept_->in_grad[a.chunk][a.micro], b.in_grad[slot]);
      chunk.backward(ctx_, slot, b.in_grad[slot], b.out_grad[slot], split);
      record(label, "backward", t0, a.micro, a.chunk);
      send_all(b.sends[slot], b.out_grad[slot], (k - 1) % p, a.micro, k - 1, kB);
      if (!split) release_slot(a.chunk, a.micro);
    } else {
      chunk.backward_weight(ctx_, b.slot_of_micro.at(a.micro));
      record(label, "weight", t0, a.micro, a.chunk);
      release_slot(a.chunk, a.micro);
    }
  }
  board_->set(Doing::reducing);
  WaitTarget sends{"its sends to the neighbouring stages to be received", {}, false};
  for (int next : {(stage_ + 1) % p, (stage_ + p - 1) % p})
    if (next != stage_ && std::find(sends.ranks.begin(), sends.ranks.end(), pp_members_[next]) == sends.ranks.end())
      sends.ranks.push_back(pp_members_[static_cast<size_t>(next)]);
  board_->wait(std::move(sends));
  for (auto& buf : buffers_)
    for (auto& s : buf->sends) TROUPE_RETURN_IF_ERROR(wait_sends(s));
  board_->done_waiting();
  return Status::ok();
}

PipeLink RankEngine::link(int dir, int peer_stage, bool sending) const {
  if (comms_.pp_link) return comms_.pp_link(dir, peer_stage, sending);
  return {comms_.pp, peer_stage};
}

// A GPU rank's groups are NCCL's, which read device memory only: host values travel through a
// device copy (a few numbers per step).
Status RankEngine::host_all_reduce(comm::Communicator& c, void* data, size_t count, DType dtype, comm::ReduceOp op) {
  if (!device_) return c.all_reduce(data, count, dtype, op)->wait();
  const Tensor host = Tensor::wrap(data, {static_cast<int64_t>(count)}, dtype, nullptr);
  const Tensor on_device = host.on(Device::cuda);
  TROUPE_RETURN_IF_ERROR(c.all_reduce(on_device.raw(), count, dtype, op)->wait());
  host.copy_from(on_device);
  return Status::ok();
}

Status RankEngine::host_all_gather_v(comm::Communicator& c, const void* send, void* recv, std::span<const size_t> counts,
                                     DType dtype) {
  if (!device_) return c.all_gather_v(send, recv, counts, dtype)->wait();
  size_t total = 0;
  for (size_t n : counts) total += n;
  const size_t mine = counts[static_cast<size_t>(c.rank())];
  const Tensor host_send = Tensor::wrap(const_cast<void*>(send), {static_cast<int64_t>(mine)}, dtype, nullptr);
  const Tensor host_recv = Tensor::wrap(recv, {static_cast<int64_t>(total)}, dtype, nullptr);
  const Tensor d_send = host_send.on(Device::cuda), d_recv = Tensor::empty(host_recv.shape(), dtype, Device::cuda);
  TROUPE_RETURN_IF_ERROR(c.all_gather_v(d_send.raw(), d_recv.raw(), counts, dtype)->wait());
  host_recv.copy_from(d_recv);
  return Status::ok();
}

WaitTarget RankEngine::collective_wait(const std::string& what, const std::vector<int>& members) const {
  WaitTarget t;
  t.what = what;
  t.collective = true;
  for (int m : members)
    if (m != rank_) t.ranks.push_back(m);
  return t;
}

// The embedding copy of wte (first block) and the head copy (last block) get the sum of both
// gradients; their units have the same dp partition, so partitions are summed directly: inside the
// rank when both blocks are on it (one virtual stage), then over the embedding group (first and
// last pipeline stage).
Status RankEngine::sync_tied_embedding() {
  if (!tied_) return Status::ok();
  std::vector<Tensor> copies;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int unit : chunks_[c]->tied_units()) copies.push_back(stores_[c]->unit_gradient(unit));
  if (copies.empty()) return Status::ok();
  const Tensor& sum = copies.front();
  for (size_t i = 1; i < copies.size(); ++i) ops::add_inplace(ctx_, sum, copies[i]);
  if (comms_.embedding != nullptr && comms_.embedding->size() >= 2)
    TROUPE_RETURN_IF_ERROR(
        comms_.embedding->all_reduce(sum.raw(), static_cast<size_t>(sum.numel()), sum.dtype(), comm::ReduceOp::sum)->wait());
  for (size_t i = 1; i < copies.size(); ++i) copies[i].copy_from(sum);
  return Status::ok();
}

// The chunk's layers and ZeRO's hooks have no error channel: a collective that fails inside them
// throws comm::CollectiveFailed (comm/communicator.hpp), which the engine's entry points return as
// their error, so no exception leaves the engine.
namespace {
template <class F>
auto returning_collective_failures(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const comm::CollectiveFailed& e) {
    return Status::error(e.what());
  } catch (const DeviceError& e) {  // a CUDA call failed, or the GPU is out of memory
    return Status::error(e.what());
  } catch (const std::exception& e) {  // thrown by a custom stage's own code (include/troupe/stage.hpp)
    return Status::error(std::string("a custom stage failed: ") + e.what());
  }
}
}  // namespace

void set_precision(RankSpec& spec, const PrecisionConfig& precision) {
  auto type = [](PrecisionDType d) {
    return d == PrecisionDType::bf16 ? DType::bf16 : d == PrecisionDType::fp16 ? DType::f16 : DType::f32;
  };
  spec.dtype = type(precision.dtype);
  spec.grad_dtype = type(precision.grad_dtype(spec.par.zero_stage));
  spec.reduce_dtype = type(precision.grad_reduce_dtype(spec.par.zero_stage));
}

Result<StepOutcome> RankEngine::compute_gradients(const Tensor& tokens, double grad_scale, const StepRequest& req) {
  Placed placed(*this);
  auto done = returning_collective_failures([&]() -> Result<StepOutcome> {
    ListenScope listen(listener_.get());
    if (steps_++ >= spec_.keep_span_steps) spans_.clear();
    step_first_span_ = spans_.size();
    step_start_ = Clock::now();
    // --rampup-batch-size: fewer micro-batches than the job's while the global batch ramps up.
    const int64_t rows = tokens.defined() ? tokens.dim(0) : 0;
    micro_batches_ = rows > 0 ? static_cast<int>(rows / spec_.micro_batch_size) : spec_.micro_batches;
    if (micro_batches_ < 1 || micro_batches_ > spec_.micro_batches ||
        (rows > 0 && rows % spec_.micro_batch_size != 0))
      return Status::bad_input("a step of " + std::to_string(rows) + " rows does not split into at most " +
                               std::to_string(spec_.micro_batches) + " micro-batches of " +
                               std::to_string(spec_.micro_batch_size));
    if (micro_batches_ != spec_.micro_batches && spec_.par.custom_schedule)
      return Status::bad_input("a schedule given as data runs its own micro-batch count only: no batch-size ramp-up");
    board_->recent().begin_step(req.step, std::chrono::duration<double, std::micro>(step_start_ - span_epoch()).count());
    iteration_ = req.step;
    if (probe_) probe_->set_iteration(req.step);
    watch_step_ = spec_.nan && spec_.nan->wanted();
    if (watch_step_) keep_step(tokens, grad_scale);
    StepOutcome out;
    // An op's result the inspector asked for (StepRequest::capture_activation): a probe in front of
    // the chunks' own for this step's schedule, removed however the step ends.
    struct Uncapture {
      RankEngine* e;
      ~Uncapture() {
        if (!e->capture_) return;
        for (auto& chunk : e->chunks_) chunk->set_probe(e->probe_injects_ ? e->probe_.get() : nullptr);
        e->capture_.reset();
      }
    } uncapture{this};
    if (!req.capture_activation.empty() && req.capture_rank == rank_) {
      auto want = parse_nan_fault(req.capture_activation + "@1/" + std::to_string(req.capture_micro));
      if (want) {
        capture_ = std::make_shared<CaptureProbe>(std::move(want).value(), probe_injects_ ? probe_.get() : nullptr);
        for (auto& chunk : chunks_) chunk->set_probe(capture_.get());
      }
    }
    for (auto& store : stores_) store->begin_iteration(micro_batches_);
    for (auto& chunk : chunks_) (void)chunk->take_moe_stats();  // anything an earlier, failed step left
    std::vector<double> micro_losses(static_cast<size_t>(micro_batches_), 0.0);
    TROUPE_RETURN_IF_ERROR(run_schedule(tokens, grad_scale, micro_losses));
    schedule_end_ = Clock::now();
    if (capture_ && capture_->got()) out.captured.push_back(capture_->piece(req.capture_activation));
    auto t0 = Clock::now();
    board_->wait(collective_wait("the data-parallel gradient reduction", dp_members_));
    for (auto& store : stores_) TROUPE_RETURN_IF_ERROR(store->finish_gradients());
    board_->done_waiting();
    TROUPE_RETURN_IF_ERROR(sync_tied_embedding());
    board_->wait(collective_wait("the world's reduction of gradient norm, loss and stop votes", world_members_));
    // One all-reduce over the world carries the squared norm, the loss, the stop votes (so every
    // process of a job learns in the same step that one of them wants to stop), the NaN watch's
    // votes (the step is watched when every rank wanted it as it began: engine/nan_watch.hpp),
    // rank 0's latest inspector command and, when asked for, the zero gradient elements (integers
    // below 2^53: exact in f64). Each element of the model counts once, as in the norm. An MoE
    // model's layers add their step's load after those six (engine/moe_tally.hpp).
    // After them every rank's sections of its previous step (engine/stragglers.hpp): each rank
    // writes its own row, the sum is the gather.
    const int world = comms_.world != nullptr ? comms_.world->size() : 1;
    const size_t sections_at = 6 + moe_tally_.size();
    std::vector<double> sums(sections_at + (world > 1 ? static_cast<size_t>(world) * kStragglerSections : 0), 0.0);
    if (world > 1)
      std::copy(last_sections_.begin(), last_sections_.end(),
                sums.begin() + static_cast<std::ptrdiff_t>(sections_at + static_cast<size_t>(rank_) * kStragglerSections));
    // A regroup vote counts kRegroupVote (more than the ranks of any job), a stop vote one.
    constexpr double kRegroupVote = 16777216.0;
    sums[2] = (req.stop ? 1.0 : 0.0) + (req.regroup ? kRegroupVote : 0.0);
    sums[3] = watch_step_ ? 1.0 : 0.0;
    sums[4] = rank_ == 0 ? static_cast<double>(req.control) : 0.0;
    for (auto& store : stores_) sums[0] += store->owned_grad_sum_squares();
    if (req.zeros_in_grad)
      for (auto& store : stores_) sums[5] += static_cast<double>(store->owned_grad_zeros());
    const bool adds_loss = tp_rank_ == 0;  // every TP rank of the last stage has the same loss
    for (double l : micro_losses) sums[1] += adds_loss ? l : 0.0;
    const std::span<double> moe_slots(sums.data() + 6, moe_tally_.size());
    for (auto& chunk : chunks_) {
      const std::vector<MoeLayerStats> stats = chunk->take_moe_stats();
      // Every TP rank routes alike, and every cp rank routes the whole sequences (model/gpt_chunk_moe.cpp).
      if (tp_rank_ == 0 && cp_rank_ == 0) moe_tally_.add(moe_slots, stats);
    }
    if (comms_.world != nullptr && comms_.world->size() > 1)
      TROUPE_RETURN_IF_ERROR(
          host_all_reduce(*comms_.world, sums.data(), sums.size(), DType::f64, comm::ReduceOp::sum));
    board_->done_waiting();
    out.moe = moe_tally_.loads(moe_slots);
    if (world > 1) out.world_sections.assign(sums.begin() + static_cast<std::ptrdiff_t>(sections_at), sums.end());
    if (req.zeros_in_grad) out.zeros_in_grad = static_cast<int64_t>(sums[5]);
    want_params_norm_ = req.params_norm;
    params_norm_ = -1;
    // The gradients are loss_scale times the loss's (mixed precision); the norm is the loss's.
    out.grad_norm = std::sqrt(sums[0]) / req.loss_scale;
    out.loss_sum = sums[1];
    out.stop = sums[2] > 0;
    out.regroup = sums[2] >= kRegroupVote;
    out.control = static_cast<int64_t>(sums[4]);
    const int ranks = comms_.world != nullptr ? comms_.world->size() : 1;
    watching_ = sums[3] > ranks - 0.5;
    if (spec_.nan) spec_.nan->set_watching(watching_);
    // An overflow of the scaled gradients is the loss scaler's to handle (fp16), not a NaN to hunt.
    const bool overflow = !std::isfinite(out.grad_norm) && std::isfinite(out.loss_sum) && req.skip_on_overflow;
    if (watching_ && !overflow && !(std::isfinite(out.grad_norm) && std::isfinite(out.loss_sum)))
      return locate_nan(std::isfinite(out.loss_sum) ? "the gradient norm" : "the loss", "");
    if (overflow) {
      out.skipped = true;
      // The parameters stay as they are; every rank skips, so the reduction below matches.
      if (want_params_norm_) {
        TROUPE_RETURN_IF_ERROR(reduce_params_norm());
        out.params_norm = params_norm_;
      }
      record("grad reduce", "reduce", t0);
      return out;
    }
    // Unscaling and clipping in one pass over the gradients (Megatron unscales, then clips).
    double factor = 1.0 / req.loss_scale;
    if (std::isfinite(out.grad_norm) && req.clip_grad > 0 && out.grad_norm > req.clip_grad)
      factor *= req.clip_grad / (out.grad_norm + 1e-6);
    if (factor != 1.0)
      for (auto& store : stores_) store->scale_gradients(factor);
    if (!req.capture_grad.empty()) out.captured = tensor_pieces(req.capture_grad, TensorKind::grad, {}, {});
    record("grad reduce", "reduce", t0);
    board_->set(Doing::optimizer);
    return out;
  });
  // On a GPU the optimizer partition (another thread, its own stream) reads the clipped gradients
  // next: the rank's stream is drained first (a kernel's failure surfaces here, as the step's).
  if (done && device_) TROUPE_RETURN_IF_ERROR(device_->synchronize());
  return done;
}

Status RankEngine::finish_step() {
  Placed placed(*this);
  return returning_collective_failures([&]() -> Status {
    ListenScope listen(listener_.get());
    const auto t0 = Clock::now();
    board_->set(Doing::gathering);
    board_->wait(collective_wait("the data-parallel parameter gather", dp_members_));
    for (auto& store : stores_) TROUPE_RETURN_IF_ERROR(store->finish_step());
    if (watching_) TROUPE_RETURN_IF_ERROR(check_parameters());
    if (want_params_norm_) TROUPE_RETURN_IF_ERROR(reduce_params_norm());
    board_->set(Doing::idle);
    record("param gather", "reduce", t0);
    board_->recent().end_step(std::chrono::duration<double, std::micro>(Clock::now() - span_epoch()).count());
    return Status::ok();
  });
}

Status RankEngine::reduce_params_norm() {
  double sum = 0;
  for (auto& store : stores_) sum += store->owned_param_sum_squares();
  if (comms_.world != nullptr && comms_.world->size() > 1) {
    board_->wait(collective_wait("the world's reduction of the parameter norm", world_members_));
    TROUPE_RETURN_IF_ERROR(host_all_reduce(*comms_.world, &sum, 1, DType::f64, comm::ReduceOp::sum));
    board_->done_waiting();
  }
  params_norm_ = std::sqrt(sum);
  return Status::ok();
}

std::vector<AdamSegment> RankEngine::adam_segments() const {
  std::vector<AdamSegment> out;
  for (const auto& store : stores_)
    for (AdamSegment& s : store->adam_segments()) out.push_back(std::move(s));
  return out;
}

void RankEngine::skip_step() {
  Placed placed(*this);
  for (auto& store : stores_) store->skip_step();
  board_->set(Doing::idle);
  board_->recent().end_step(std::chrono::duration<double, std::micro>(Clock::now() - span_epoch()).count());
}

Result<StepOutcome> RankEngine::train_step(const Tensor& tokens, double grad_scale, const StepRequest& req) {
  Placed placed(*this);
  auto out = compute_gradients(tokens, grad_scale, req);
  if (out && out.value().skipped) {
    skip_step();
    StepOutcome done = out.value();
    fill_times(done);
    return done;
  }
  if (!out || !std::isfinite(out.value().grad_norm)) return out;
  const auto t0 = Clock::now();
  const std::vector<AdamSegment> segments = adam_segments();
  if (exp_avg_.empty()) {
    for (const AdamSegment& s : segments) {
      exp_avg_.push_back(Tensor::zeros(s.param.shape(), s.param.dtype(), ctx_.device));
      exp_avg_sq_.push_back(Tensor::zeros(s.param.shape(), s.param.dtype(), ctx_.device));
    }
  }
  adamw_step(ctx_, segments, exp_avg_, exp_avg_sq_, req);
  record("optimizer", "optimizer", t0);
  TROUPE_RETURN_IF_ERROR(finish_step());
  StepOutcome done = out.value();
  done.params_norm = params_norm_;
  fill_times(done);
  return done;
}

void RankEngine::fill_times(StepOutcome& out) {
  out.step_us = std::chrono::duration<double, std::micro>(Clock::now() - step_start_).count();
  out.busy_us = 0;
  for (size_t i = step_first_span_; i < spans_.size(); ++i)
    if (spans_[i].cat != "wait" && spans_[i].cat != kCollectiveSpan) out.busy_us += spans_[i].dur_us;
  // This step's spans in place (no copy on the step's path).
  const std::span<const Span> step(spans_.data() + step_first_span_, spans_.size() - step_first_span_);
  out.timers = step_timers(step, std::chrono::duration<double, std::micro>(schedule_end_ - step_start_).count());
  for (int k = 0; k < kStragglerSections; ++k)
    for (const TimerReading& t : out.timers)
      if (t.name == kStragglerSectionNames[static_cast<size_t>(k)]) last_sections_[static_cast<size_t>(k)] = t.ms;
}

Result<double> RankEngine::eval_loss_sum(const Tensor& tokens) {
  Placed placed(*this);
  return returning_collective_failures([&]() -> Result<double> {
    ListenScope listen(listener_.get());
    if (probe_) probe_->set_iteration(-1);  // TROUPE_FAULT_NAN is for training steps only
    const int p = spec_.par.pp, v = spec_.par.virtual_chunks, B = spec_.micro_batch_size;
    const int64_t rows = tokens.defined() ? tokens.dim(0) : 0;
    // Every replica runs as many micro-batches as the largest one: under ZeRO-3 each forward gathers
    // parameters over dp, so the replicas' collectives must match even when the windows do not split
    // evenly. A partial (or, for a replica with fewer windows, empty) micro-batch is padded with
    // copies of a window, whose losses the head leaves out. All ranks of a replica get the same
    // windows, so they agree on the count.
    int64_t micros = (rows + B - 1) / B;
    board_->set(Doing::evaluating);
    if (comms_.dp != nullptr && comms_.dp->size() > 1)
      TROUPE_RETURN_IF_ERROR(host_all_reduce(*comms_.dp, &micros, 1, DType::i64, comm::ReduceOp::max));
    double loss = 0;
    Tensor padded;
    for (int64_t i = 0; i < micros; ++i) {
      const int64_t r0 = i * B, valid = std::clamp<int64_t>(rows - r0, 0, B);
      Tensor mb = valid > 0 ? tokens.rows(r0, r0 + valid) : Tensor();
      if (valid < B) {
        padded = Tensor::zeros({B, spec_.model.seq_length + 1}, DType::i32);
        if (valid > 0) {
          padded.rows(0, valid).copy_from(mb);
          for (int64_t k = valid; k < B; ++k) padded.rows(k, k + 1).copy_from(mb.rows(valid - 1, valid));
        }
        mb = padded;
      }
      for (int c = 0; c < v; ++c) {
        PipelineStage& chunk = *chunks_[c];
        ChunkBuffers& b = *buffers_[c];
        const int k = c * p + stage_;
        // Evaluation's own tags (a window index where training has micro-batches), tensor by tensor.
        auto tag = [&](int boundary, size_t tensor) {
          return ((static_cast<uint64_t>(i) * static_cast<uint64_t>(v * p) + static_cast<uint64_t>(boundary)) * 2) *
                     kMaxBoundaryTensors + tensor;
        };
        std::vector<comm::WorkPtr> works;
        if (!b.in_act[0].empty()) {
          const PipeLink l = link(kF, (k - 1 + p) % p, false);
          for (size_t t = 0; t < b.in_act[0].size(); ++t)
            works.push_back(l.comm->recv(b.in_act[0][t].raw(), static_cast<size_t>(b.in_act[0][t].numel()),
                                         b.in_act[0][t].dtype(), l.peer, tag(k - 1, t)));
        }
        if (!works.empty()) {
          const int from = (k - 1 + p) % p;
          board_->wait({"the activation of evaluation micro-batch " + std::to_string(i) + " (chunk " + std::to_string(c) +
                            ") from stage " + std::to_string(from),
                        {pp_members_[static_cast<size_t>(from)]},
                        false});
        }
        TROUPE_RETURN_IF_ERROR(comm::wait_all(works));
        board_->set(Doing::evaluating, static_cast<int>(i), c);
        const double l = chunk.forward_eval(ctx_, chunk.reads_batch() ? mb : Tensor(), b.in_act[0], b.out_act[0], valid);
        if (chunk.has_loss() && tp_rank_ == 0) loss += l;
        if (!b.out_act[0].empty()) {
          const PipeLink l = link(kF, (k + 1) % p, true);
          for (size_t t = 0; t < b.out_act[0].size(); ++t)
            works.push_back(l.comm->send(b.out_act[0][t].raw(), static_cast<size_t>(b.out_act[0][t].numel()),
                                         b.out_act[0][t].dtype(), l.peer, tag(k, t)));
        }
        TROUPE_RETURN_IF_ERROR(comm::wait_all(works));
      }
    }
    board_->wait(collective_wait("the world's reduction of the evaluation loss", world_members_));
    if (comms_.world != nullptr && comms_.world->size() > 1)
      TROUPE_RETURN_IF_ERROR(host_all_reduce(*comms_.world, &loss, 1, DType::f64, comm::ReduceOp::sum));
    board_->set(Doing::idle);
    return loss;
  });
}

// ---- the NaN watch (engine/nan_watch.hpp) ---------------------------------------------------------

void RankEngine::keep_step(const Tensor& tokens, double grad_scale) {
  if (!kept_) kept_ = std::make_unique<Kept>();
  Kept& k = *kept_;
  k.grad_scale = grad_scale;
  if (tokens.defined()) {
    if (k.tokens.defined() && k.tokens.shape() == tokens.shape()) k.tokens.copy_from(tokens);
    else k.tokens = tokens.clone();
  } else {
    k.tokens = Tensor();
  }
  const size_t v = chunks_.size(), m = static_cast<size_t>(micro_batches_);
  k.in_act.resize(v);
  k.in_grad.resize(v);
  for (size_t c = 0; c < v; ++c) {
    k.in_act[c].resize(m);
    k.in_grad[c].resize(m);
  }
  std::vector<Tensor> now;
  for (const auto& store : stores_)
    for (const auto& r : store->param_ranges()) now.push_back(r.values);
  keep_copy(k.params, now);
}

// After the optimizer step of a watched step: this rank's own parameters (what its optimizer
// partition updated) must be finite; the flag is combined over the world so every rank agrees.
Status RankEngine::check_parameters() {
  const std::optional<NanFault>& fault = spec_.nan_fault;
  if (fault && fault->optimizer && fault->iteration == iteration_ && (fault->rank < 0 || fault->rank == rank_)) {
    const std::vector<AdamSegment> segments = adam_segments();
    if (!segments.empty()) poison(segments.front().param);
  }
  std::string bad;
  for (size_t c = 0; c < stores_.size() && bad.empty(); ++c)
    for (const auto& r : stores_[c]->segment_ranges())
      if (first_non_finite(r.values) >= 0) {
        bad = chunks_[c]->specs()[static_cast<size_t>(r.spec)].name;
        break;
      }
  double flag = bad.empty() ? 0.0 : 1.0;
  board_->wait(collective_wait("the NaN watch's parameter check", world_members_));
  if (comms_.world != nullptr && comms_.world->size() > 1)
    TROUPE_RETURN_IF_ERROR(host_all_reduce(*comms_.world, &flag, 1, DType::f64, comm::ReduceOp::max));
  board_->done_waiting();
  if (flag == 0) return Status::ok();
  // The replay computes the step again from the parameters it began with.
  size_t i = 0;
  for (const auto& store : stores_)
    for (const auto& r : store->param_ranges()) r.values.copy_from(kept_->params[i++]);
  for (const auto& store : stores_) TROUPE_RETURN_IF_ERROR(store->publish_params());
  return locate_nan("a parameter after the optimizer step", bad);
}

// Every rank of the job runs this at the same point (they saw the same all-reduced value): the
// replay's collectives are the tensor-parallel ones inside the chunks (the same calls on every tp
// rank of a stage), ZeRO-3's gathers before it (the same on every dp rank), and the all-gather of
// the findings at the end.
Status RankEngine::locate_nan(const std::string& trigger, const std::string& bad_parameter) {
  TROUPE_CHECK(probe_ && kept_, "RankEngine: a watched step keeps its inputs and has a probe");
  const int p = spec_.par.pp, v = spec_.par.virtual_chunks, K = p * v, B = spec_.micro_batch_size;
  const Kept& kept = *kept_;
  for (auto& store : stores_) TROUPE_RETURN_IF_ERROR(store->begin_replay());
  for (auto& chunk : chunks_) chunk->set_probe(probe_.get());
  NanFinding who;
  who.rank = rank_;
  who.pp = stage_;
  who.tp = tp_rank_;
  who.dp = dp_rank_;
  probe_->start_checking(who);
  // The parameters the step began with.
  for (size_t c = 0; c < chunks_.size(); ++c) {
    probe_->at(-1, static_cast<int>(c), static_cast<int>(c) * p + stage_, -1, 0);
    for (const auto& r : stores_[c]->param_ranges())
      probe_->check_input(r.values, "parameter " + chunks_[c]->specs()[static_cast<size_t>(r.spec)].name +
                                        " before the step");
  }
  const Tensor none;
  for (int m = 0; m < micro_batches_; ++m) {
    for (int c = 0; c < v; ++c) {
      PipelineStage& chunk = *chunks_[c];
      const int k = c * p + stage_;
      probe_->at(m, c, k, 0, k);
      for (const Tensor& t : kept.in_act[c][m])
        probe_->check_input(t, "the activation received from virtual stage " + std::to_string(k - 1));
      const Tensor mb = chunk.reads_batch() ? kept.tokens.rows(int64_t{m} * B, int64_t{m + 1} * B) : none;
      (void)chunk.forward(ctx_, 0, mb, kept.in_act[c][m], buffers_[c]->out_act[0], kept.grad_scale, false,
                          micro_key(m));
    }
    for (int c = v - 1; c >= 0; --c) {
      PipelineStage& chunk = *chunks_[c];
      const int k = c * p + stage_;
      probe_->at(m, c, k, 1, K - 1 - k);
      for (const Tensor& t : kept.in_grad[c][m])
        probe_->check_input(t, "the gradient received from virtual stage " + std::to_string(k + 1));
      const std::vector<Tensor>& dout = chunk.outputs().empty() ? buffers_[c]->in_grad[0] : kept.in_grad[c][m];
      chunk.backward(ctx_, 0, dout, buffers_[c]->out_grad[0], false);
    }
  }
  NanFinding mine = probe_->stop_checking();
  mine.bad_parameter = bad_parameter;
  if (!probe_injects_)
    for (auto& chunk : chunks_) chunk->set_probe(nullptr);
  for (auto& store : stores_) store->end_replay();
  // Every rank's finding, to every rank.
  const std::vector<int64_t> words = encode_finding(mine);
  std::vector<NanFinding> all;
  const int ranks = comms_.world != nullptr ? comms_.world->size() : 1;
  if (ranks > 1) {
    std::vector<int64_t> gathered(words.size() * static_cast<size_t>(ranks));
    const std::vector<size_t> counts(static_cast<size_t>(ranks), words.size());
    board_->wait(collective_wait("the NaN watch's findings", world_members_));
    TROUPE_RETURN_IF_ERROR(host_all_gather_v(*comms_.world, words.data(), gathered.data(), counts, DType::i64));
    board_->done_waiting();
    for (int r = 0; r < ranks; ++r)
      all.push_back(decode_finding(gathered.data() + static_cast<size_t>(r) * words.size()));
  } else {
    all.push_back(mine);
  }
  const NanReport report = combine_findings(iteration_, trigger, std::move(all));
  if (spec_.nan) spec_.nan->set_report(report);
  return Status::error(report.message());
}

Result<std::vector<Tensor>> RankEngine::param_values(int c) {
  Placed placed(*this);
  const PipelineStage& chunk = *chunks_[c];
  std::vector<Tensor> out(chunk.specs().size());
  for (size_t u = 0; u < chunk.units().size(); ++u) {
    auto unit = stores_[c]->unit_params(static_cast<int>(u));
    if (!unit) return unit.status();
    int64_t at = 0;
    for (int s : chunk.units()[u].specs) {
      const Shape& shape = chunk.specs()[s].local_shape;
      out[s] = unit.value().rows(at, at + shape.numel()).view(shape).clone();
      at += shape.numel();
    }
  }
  return out;
}

double MemoryReport::formula_bytes() const {
  const double psi = static_cast<double>(shard_params), d = dp;
  const double a = weight_bytes, g = gradient_bytes, o = optimizer_state_bytes;
  switch (zero_stage) {
    case 0: return (a + g + o) * psi;
    case 1: return (a + g) * psi + o * psi / d;
    case 2: return a * psi + (g + o) * psi / d;
    default: return (a + g + o) * psi / d;
  }
}

namespace {

// Elements [begin, end) of a spec's local tensor as runs: (local offset from begin, global run). The
// local-to-global map of a tensor-parallel slice is strictly increasing (padding rows, -1, come last),
// so a run [i, i + L) is consecutive exactly when its last element's index is g(i) + L - 1: its length
// is found by galloping on that test instead of visiting every element.
std::vector<std::pair<int64_t, GlobalRun>> local_runs(const ParamSpec& spec, int64_t begin, int64_t end) {
  std::vector<std::pair<int64_t, GlobalRun>> out;
  const int64_t n = end - begin;
  auto g = [&](int64_t i) { return slice_global_index(spec, begin + i); };
  int64_t i = 0;
  while (i < n) {
    const int64_t start = g(i);
    if (start < 0) {  // padding: never saved
      ++i;
      continue;
    }
    auto consecutive = [&](int64_t len) { return i + len <= n && g(i + len - 1) == start + len - 1; };
    int64_t good = 1, step = 1;
    while (consecutive(good + step)) {
      good += step;
      step *= 2;
    }
    for (step /= 2; step >= 1; step /= 2)
      if (consecutive(good + step)) good += step;
    out.push_back({i, GlobalRun{start, good}});
    i += good;
  }
  return out;
}

// values_are_copies: `values` is already a snapshot nobody changes (the optimizer's copies of the
// moments), so a piece of one run may view it instead of copying it again.
TensorPiece make_piece(const ParamSpec& spec, int64_t begin, int64_t end, const Tensor& given,
                       bool values_are_copies = false, BufferRecycler* buffers = nullptr) {
  // A GPU rank's values: one read-back, itself a copy nobody changes.
  const Tensor values = given.to_host();
  values_are_copies = values_are_copies || given.device() != Device::cpu;
  TensorPiece p;
  p.name = spec.name;
  p.global_shape = spec.global_shape;
  const auto runs = local_runs(spec, begin, end);
  if (values_are_copies && runs.size() == 1) {
    const auto& [local, run] = runs.front();
    p.values = values.view(Shape{values.numel()}).rows(local, local + run.length);
    p.runs.push_back(run);
    return p;
  }
  int64_t total = 0;
  for (const auto& [local, run] : runs) total += run.length;
  p.values = buffers != nullptr ? buffers->take({total}, DType::f32) : Tensor::empty({total});
  const float* src = values.data<float>();
  float* dst = p.values.data<float>();
  for (const auto& [local, run] : runs) {
    std::memcpy(dst, src + local, static_cast<size_t>(run.length) * sizeof(float));
    dst += run.length;
    p.runs.push_back(run);
  }
  return p;
}

Status read_range(ShardSetReader& reader, ShardSection section, const ParamSpec& spec, int64_t begin, int64_t end,
                  const Tensor& target) {
  // A GPU rank's tensor: filled on the host, then one upload.
  const bool on_device = target.device() != Device::cpu;
  const Tensor into = on_device ? Tensor::empty(target.shape(), target.dtype()) : target;
  const auto runs = local_runs(spec, begin, end);
  std::vector<GlobalRun> global;
  int64_t total = 0;
  for (const auto& [local, run] : runs) {
    global.push_back(run);
    total += run.length;
  }
  Tensor tmp = Tensor::empty({total});
  if (total > 0) TROUPE_RETURN_IF_ERROR(reader.read(section, spec.name, spec.global_shape, global, tmp));
  into.zero_();  // padding stays zero
  const float* src = tmp.data<float>();
  float* dst = into.data<float>();
  for (const auto& [local, run] : runs) {
    std::memcpy(dst + local, src, static_cast<size_t>(run.length) * sizeof(float));
    src += run.length;
  }
  if (on_device) target.copy_from(into);
  return Status::ok();
}

// Which of a rank's ranges its shard holds (shard_contents): a tensor-parallel replica's on TP rank
// 0, the tied head's copy on the embedding stage, a data-parallel replica's on its first replica
// (ZeRO-3 parameters and ZeRO >= 1 moments are partitioned: every dp rank writes its part).
bool writes_params(const PipelineStage& chunk, const ZeroStore& store, const ZeroStore::OwnedRange& r) {
  return chunk.counts_in_norm(r.spec) && (store.partitioned_params() || r.first_replica);
}
bool writes_moments(const PipelineStage& chunk, int zero_stage, const ZeroStore::OwnedRange& r) {
  return chunk.counts_in_norm(r.spec) && !(zero_stage == 0 && !r.first_replica);
}

}  // namespace

ShardContents RankEngine::shard_contents(const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                         bool moments_are_copies) const {
  Placed placed(*this);
  TROUPE_CHECK(spec_.dtype == DType::f32 || is_16bit(spec_.dtype),
               "checkpoints hold f32 tensors (under mixed precision: the f32 master weights)");
  ShardContents out;
  size_t seg = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const PipelineStage& chunk = *chunks_[c];
    const int zero = spec_.par.zero_stage;
    for (const auto& r : stores_[c]->param_ranges())
      if (writes_params(chunk, *stores_[c], r))
        out.sections[ShardSection::model].push_back(
            make_piece(chunk.specs()[r.spec], r.begin, r.end, r.values, false, spec_.snapshot_buffers.get()));
    for (const auto& r : stores_[c]->segment_ranges()) {
      const size_t i = seg++;
      if (exp_avg.empty() || !writes_moments(chunk, zero, r)) continue;
      out.sections[ShardSection::exp_avg].push_back(
          make_piece(chunk.specs()[r.spec], r.begin, r.end, exp_avg[i], moments_are_copies));
      out.sections[ShardSection::exp_avg_sq].push_back(
          make_piece(chunk.specs()[r.spec], r.begin, r.end, exp_avg_sq[i], moments_are_copies));
    }
  }
  return out;
}

std::vector<TensorPiece> RankEngine::tensor_pieces(const std::string& name, TensorKind kind,
                                                   const std::vector<Tensor>& exp_avg,
                                                   const std::vector<Tensor>& exp_avg_sq) const {
  Placed placed(*this);
  std::vector<TensorPiece> out;
  const int zero = spec_.par.zero_stage;
  size_t seg = 0;
  std::vector<AdamSegment> segments;
  if (kind == TensorKind::grad) segments = adam_segments();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const PipelineStage& chunk = *chunks_[c];
    if (kind == TensorKind::value) {
      for (const auto& r : stores_[c]->param_ranges())
        if (chunk.specs()[r.spec].name == name && writes_params(chunk, *stores_[c], r))
          out.push_back(make_piece(chunk.specs()[r.spec], r.begin, r.end, r.values));
      continue;
    }
    for (const auto& r : stores_[c]->segment_ranges()) {
      const size_t i = seg++;
      if (chunk.specs()[r.spec].name != name || !writes_moments(chunk, zero, r)) continue;
      const Tensor& values = kind == TensorKind::grad      ? segments.at(i).grad
                             : kind == TensorKind::exp_avg ? exp_avg.at(i)
                                                           : exp_avg_sq.at(i);
      out.push_back(make_piece(chunk.specs()[r.spec], r.begin, r.end, values));
    }
  }
  return out;
}

RankCoverage RankEngine::shard_coverage() const {
  RankCoverage out;
  auto add = [](ShardCoverage& into, ShardSection section, const ParamSpec& spec, int64_t begin, int64_t end) {
    std::vector<GlobalRun> runs;
    for (const auto& [local, run] : local_runs(spec, begin, end)) runs.push_back(run);
    if (!runs.empty()) into.push_back({section, spec.name, group_runs(runs)});
  };
  const int zero = spec_.par.zero_stage;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const PipelineStage& chunk = *chunks_[c];
    for (const auto& r : stores_[c]->param_ranges()) {  // load_shards reads every range it holds
      const ParamSpec& spec = chunk.specs()[r.spec];
      add(out.reads, ShardSection::model, spec, r.begin, r.end);
      if (writes_params(chunk, *stores_[c], r)) add(out.writes, ShardSection::model, spec, r.begin, r.end);
    }
    for (const auto& r : stores_[c]->segment_ranges()) {
      const ParamSpec& spec = chunk.specs()[r.spec];
      for (ShardSection section : {ShardSection::exp_avg, ShardSection::exp_avg_sq}) {
        add(out.reads, section, spec, r.begin, r.end);
        if (writes_moments(chunk, zero, r)) add(out.writes, section, spec, r.begin, r.end);
      }
    }
  }
  return out;
}

std::vector<std::pair<std::string, Shape>> RankEngine::parameter_names() const {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& chunk : chunks_)
    for (const ParamSpec& spec : chunk->specs()) out.emplace_back(spec.name, spec.global_shape);
  return out;
}

Status RankEngine::load_shards(ShardSetReader& reader, const std::vector<Tensor>& exp_avg,
                               const std::vector<Tensor>& exp_avg_sq) {
  Placed placed(*this);
  size_t seg = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const PipelineStage& chunk = *chunks_[c];
    for (const auto& r : stores_[c]->param_ranges())
      TROUPE_RETURN_IF_ERROR(read_range(reader, ShardSection::model, chunk.specs()[r.spec], r.begin, r.end, r.values));
    for (const auto& r : stores_[c]->segment_ranges()) {
      const size_t i = seg++;
      if (exp_avg.empty()) continue;
      TROUPE_RETURN_IF_ERROR(read_range(reader, ShardSection::exp_avg, chunk.specs()[r.spec], r.begin, r.end, exp_avg[i]));
      TROUPE_RETURN_IF_ERROR(
          read_range(reader, ShardSection::exp_avg_sq, chunk.specs()[r.spec], r.begin, r.end, exp_avg_sq[i]));
    }
  }
  // Mixed precision: the master weights just read, rounded into the 16-bit copy (and gathered).
  for (auto& store : stores_) TROUPE_RETURN_IF_ERROR(store->publish_params());
  for (auto& store : stores_) store->zero_gradients();
  return Status::ok();
}

Status RankEngine::load_own_shards(ShardSetReader& reader) {
  Placed placed(*this);
  if (exp_avg_.empty()) {
    for (const AdamSegment& s : adam_segments()) {
      exp_avg_.push_back(Tensor::zeros(s.param.shape(), s.param.dtype(), ctx_.device));
      exp_avg_sq_.push_back(Tensor::zeros(s.param.shape(), s.param.dtype(), ctx_.device));
    }
  }
  return load_shards(reader, exp_avg_, exp_avg_sq_);
}

MemoryReport RankEngine::memory() const {
  MemoryReport m;
  m.zero_stage = spec_.par.zero_stage;
  m.dp = spec_.par.dp;
  if (is_16bit(spec_.dtype)) {
    m.weight_bytes = 2;
    m.gradient_bytes = static_cast<double>(dtype_size(spec_.grad_dtype));
    m.optimizer_state_bytes = 12 + (m.gradient_bytes == 2 ? 4 : 0);
  }
  for (const auto& chunk : chunks_)
    for (const UnitInfo& u : chunk->units()) m.shard_params += u.numel;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const ZeroCounts z = stores_[c]->counts();
    m.param_bytes += z.param_bytes;
    m.grad_bytes += z.grad_bytes;
    m.optimizer_bytes += z.optimizer_bytes;
    m.transient_peak_bytes += z.transient_peak_bytes;
    m.activation_bytes += chunks_[c]->activation_bytes();
  }
  return m;
}

}  // namespace troupe
