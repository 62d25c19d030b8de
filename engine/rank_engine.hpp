// What one rank of a tp x pp x dp job computes: its model chunks (one per virtual pipeline stage it
// holds, each a tensor-parallel shard), their ZeRO stores, and one training iteration executed from
// the pipeline schedule table (include/troupe/schedule.hpp). The rank actor (actors/rank_actor.hpp) owns one
// RankEngine and runs it on its own thread; the engine itself is plain, deterministic code (no actors), so tests can run several
// ranks on threads.
//
// One iteration (train_step):
//   1. the stage's schedule, action by action: a forward waits for its input activation (a recv from
//      the previous virtual stage, posted one action ahead so it lands while the stage computes), a
//      backward for its output gradient; outputs are sent without waiting. Activation slots per chunk
//      are the schedule's peak of micro-batches in flight on the stage (+1 for the recv posted ahead):
//      that is the back-pressure bound.
//   2. ZeRO: each unit's gradients are reduced over dp as the backward completes them (the store's
//      hooks), then finish_gradients waits for the rest.
//   3. The tied embedding (pp > 1): the gradient of wte's embedding copy (first stage) and head copy
//      (last stage) are summed over the embedding group, partition by partition.
//   4. Gradient norm over every shard: each rank's owned sum of squares (replicas counted once), one
//      all-reduce over the world, then clipping (Megatron's max_norm / (norm + 1e-6)) and AdamW.
//   5. The loss: the last stage's token-loss sums, all-reduced over the world (tp rank 0 only adds).
// Results equal the 1x1x1 run's up to floating-point summation order (tests: 1e-5 relative in fp32).
//
// Communicators are borrowed (the caller owns them; they outlive the engine): tp, pp and dp groups of
// this rank, the embedding group (first and last stage) and the world. Ranks of the pp group are
// stage indices (the topology lists members by ascending global rank, pp slowest).
// Failures of a peer surface as errors from train_step, never hangs. Not thread-safe.
#pragma once
#include <array>
#include <chrono>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/buffer_recycler.hpp"
#include "engine/activity.hpp"
#include "engine/moe_tally.hpp"
#include "engine/nan_watch.hpp"
#include "engine/stragglers.hpp"
#include "engine/types.hpp"
#include "troupe/schedule.hpp"
#include "engine/zero_store.hpp"
#include "comm/communicator.hpp"
#include "comm/topology.hpp"
#include "kernels/context.hpp"
#include "kernels/device_memory.hpp"
#include "kernels/thread_pool.hpp"
#include "model/stage.hpp"
#include "troupe/stage.hpp"
#include "storage/shard_coverage.hpp"
#include "storage/shard_file.hpp"

namespace troupe {

namespace cuda {
class DeviceContext;
}

struct ParallelConfig {
  int tp = 1, pp = 1, dp = 1;
  // Expert parallelism (MoE layers): the dp ranks form groups of ep consecutive dp ranks that split
  // each MoE layer's experts (comm/topology.hpp: expert_parallel_group); ep divides dp.
  int ep = 1;
  // Context parallelism (--context-parallel-size): every sequence split over cp ranks
  // (model/ring_attention.hpp); the parameters are replicated over them as over dp, so gradients are
  // reduced, and ZeRO partitions, over the dp x cp ranks (RankComms::dp).
  int cp = 1;
  CpComm cp_comm = CpComm::p2p;  // --cp-comm-type
  // DeepSpeed-Ulysses (--ds-sequence-parallel-size): cp ranks holding contiguous rows, cp_comm a2a.
  bool cp_contiguous = false;
  int zero_stage = 0;
  sched::ScheduleType schedule = sched::ScheduleType::one_f_one_b;
  int virtual_chunks = 1;  // v, from --num-layers-per-virtual-pipeline-stage (interleaved only)
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  // MoE layers: experts split over the TP ranks (expert-TP = TP) or whole on each (expert-TP 1).
  bool expert_tensor_parallel = true;
  // A schedule given as data (troupe::RunOptions::schedule) instead of the generated one of
  // `schedule`: checked by check_custom_schedule before any rank is built.
  std::shared_ptr<const sched::Schedule> custom_schedule;
  int world_size() const { return tp * cp * pp * dp; }
  // The layout as a JSON object (recorded in checkpoints: informational).
  std::string to_json() const;
};

// The windows [first, second) of a batch of n that data-parallel replica d of dp takes: whole
// micro-batches of micro_batch windows (the last one partial), replica d the d-th contiguous share of
// them. So every micro-batch holds the windows the 1x1x1 run's does, whatever dp: an MoE layer routes a
// micro-batch's tokens as one group (capacity, drops). A training batch (a multiple of
// micro_batch * dp) splits evenly.
std::pair<int64_t, int64_t> replica_windows(int64_t n, int micro_batch, int dp, int d);

struct RankSpec {
  GptConfig model;
  ParallelConfig par;
  int micro_batch_size = 1;
  int micro_batches = 1;  // per dp rank and iteration: global batch / (micro batch * dp)
  // The counts a batch-size ramp-up's steps run before reaching micro_batches (empty: no ramp-up);
  // each chunk's activation slots cover them too (sched::engine_slots).
  std::vector<int> ramp_micro_batches;
  int num_threads = 1;
  // Where the rank computes: the CPU (its num_threads threads), or GPU cuda_device, where it keeps
  // parameters, gradients, activations and optimizer state and runs every op on a stream of its
  // own (docs/CUDA.md).
  Device device = Device::cpu;
  int cuda_device = 0;
  DType dtype = DType::f32;       // parameters and activations (bf16/f16: mixed precision)
  DType grad_dtype = DType::f32;  // with a 16-bit dtype: the gradients' (f32 or dtype)
  // With a 16-bit dtype: the type gradients are reduced in over dp (DeepSpeed's
  // communication_data_type); unset: grad_dtype.
  std::optional<DType> reduce_dtype;
  // Spans of the first this-many steps are kept for the timeline (take_spans); later steps' spans
  // are dropped at the start of the next step (a long run's trace would not fit in memory).
  int keep_span_steps = 0;
  // The rank only evaluates a loaded model (troupe eval): whoever runs it keeps no optimizer state.
  bool evaluation_only = false;
  // The run's --seed: the key of the dropout masks (model/dropout.hpp), which depend on it, the
  // iteration (StepRequest::step) and each sample's index in the global batch, never on the layout.
  uint64_t seed = 0;
  // A model given in code (include/troupe/stage.hpp: GPT blocks and custom stages), checked by
  // check_model before any rank is built; null: GPT's own split of `model` (troupe::gpt_model).
  std::shared_ptr<const Model> custom_model;
  // The NaN watch (engine/nan_watch.hpp): the process's control, shared by its ranks and the
  // inspector (null: the watch is never on), and the NaN TROUPE_FAULT_NAN asks to inject.
  std::shared_ptr<NanControl> nan;
  std::optional<NanFault> nan_fault;
  // In-memory snapshots are taken (--save-memory-interval): the rank actor gives each rank a
  // recycler of its own as snapshot_buffers.
  bool recycle_snapshots = false;
  // Where shard_contents' copies come from (in-memory snapshots: buffers and snapshot files reused
  // from one snapshot to the next, engine/buffer_recycler.hpp); null: fresh memory each time.
  std::shared_ptr<BufferRecycler> snapshot_buffers;
  // In-memory snapshots over several hosts (one rank per process): the rank actor puts its
  // shard_coverage() here once the rank is built, for the snapshot's exchange (null: none).
  std::shared_ptr<CoverageSlot> coverage;
};

// The parameter/activation and gradient types of a run's precision (include/troupe/precision.hpp):
// fp32: f32, f32; bf16: bf16 with its recipe's gradient type (Megatron: f32); fp16: f16, f16 unless
// gradients accumulate in fp32.
void set_precision(RankSpec& spec, const PrecisionConfig& precision);

// A pipeline link's communicator for one direction, and the peer's rank in it.
struct PipeLink {
  comm::Communicator* comm = nullptr;
  int peer = 0;
};
// The stage that stage `sender`'s messages in direction dir (0 activations, 1 gradients) go to, of p.
inline int pipe_link_receiver(int dir, int sender, int p) { return dir == 0 ? (sender + 1) % p : (sender + p - 1) % p; }

struct RankComms {
  comm::Communicator* tp = nullptr;
  comm::Communicator* pp = nullptr;
  // The ranks holding the same parameters, over which gradients are reduced and ZeRO partitions:
  // the dp group, or with context parallelism the dp x cp group (Topology::dp_cp_group).
  comm::Communicator* dp = nullptr;
  comm::Communicator* embedding = nullptr;
  comm::Communicator* world = nullptr;
  // Expert parallelism (ParallelConfig::ep > 1): the expert-parallel group (tokens to the experts'
  // holders and back) and the expert-data-parallel group (the replicas of the same experts, over
  // which their gradients are reduced). Null without expert parallelism (expert_dp: dp's role).
  comm::Communicator* ep = nullptr;
  comm::Communicator* expert_dp = nullptr;
  // Context parallelism (ParallelConfig::cp > 1): the cp group, over which ring attention passes
  // key/value blocks. Null otherwise.
  comm::Communicator* cp = nullptr;
  // GPU ranks: the pipeline's messages on communicators of their own, one per link and direction,
  // each carrying messages one way only (NCCL matches point-to-point messages in issue order,
  // whatever the tag, and blocks its one stream until the peer's matching operation runs: a stream
  // holding both a receive and a send can stop at the receive with the send its peer waits for
  // queued behind). pp_link(dir, peer_stage, sending): dir 0 activations, 1 gradients; this
  // stage's sends to peer_stage, or its receives from it. Unset: pp carries everything.
  std::function<PipeLink(int dir, int peer_stage, bool sending)> pp_link;
};

// One span of the timeline (Chrome trace "X" event), microseconds since span_epoch().
// The category of a collective inside a layer (the MoE token all-to-alls): its span lies inside the
// forward, backward or weight span that issued it, and counts in no busy time of its own.
inline constexpr const char* kCollectiveSpan = "collective";

struct Span {
  std::string name;  // "F3", "B3.1" (micro 3, chunk 1), "W2", "optimizer", "MoE dispatch, layer 2", ...
  std::string cat;   // forward | backward | weight | wait | reduce | optimizer | collective
  double start_us = 0, dur_us = 0;
};

struct StepOutcome {
  double loss_sum = 0;   // all token losses of the global batch (every rank gets the same)
  double grad_norm = 0;  // before clipping, over the whole model
  double busy_us = 0;    // this rank's forward/backward/weight/optimizer time in the step
  double step_us = 0;    // wall time of the step on this rank
  // This rank's step by Megatron's timer names (step_timers in engine/types.hpp), milliseconds.
  std::vector<TimerReading> timers;
  bool stop = false;     // a process of the job asked to stop after this step (StepRequest::stop)
  bool regroup = false;  // ... for a node that asks to join (StepRequest::regroup; stop is set too)
  int64_t control = 0;   // rank 0's StepRequest::control: the inspector commands to apply after this step
  std::vector<TensorPiece> captured;  // StepRequest::capture_grad's pieces on this rank
  // The gradient overflowed under loss scaling (StepRequest::skip_on_overflow): no optimizer step;
  // the caller calls skip_step() instead (every rank agrees: the norm is all-reduced).
  bool skipped = false;
  // StepRequest::zeros_in_grad: gradient elements exactly zero, over the whole model (every rank
  // gets the same); -1 when not asked for.
  int64_t zeros_in_grad = -1;
  // StepRequest::params_norm: the parameters' L2 norm after the step (of a skipped step: as they
  // stand), over the whole model; -1 when not asked for. compute_gradients fills it for a skipped
  // step; otherwise finish_step computes it (params_norm()).
  double params_norm = -1;
  // Each MoE layer's load in the step over the whole job (engine/moe_tally.hpp: carried by the
  // norm's all-reduce, so every rank gets the same); empty for a dense model.
  std::vector<MoeLayerLoad> moe;
  // Every rank's compute sections of its previous step (engine/stragglers.hpp: world size x
  // kStragglerSections milliseconds, rank-major; carried by the norm's all-reduce, so every rank gets
  // the same); empty for a job of one rank. All zero in the first step.
  std::vector<double> world_sections;
};

struct MemoryReport {
  int64_t shard_params = 0;  // Psi: parameter elements of this rank's (pp, tp) shard, all chunks
  int zero_stage = 0, dp = 1;
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;  // model states, resident
  // ZeRO's model-state bytes with a bytes of weights, g of gradients and o of optimizer states per
  // parameter: stage 0: (a+g+o) Psi; 1: (a+g) Psi + o Psi/dp; 2: a Psi + (g+o) Psi/dp; 3: (a+g+o) Psi/dp.
  // fp32 training: a = g = 4, o = 8 (the weights are the master weights; Adam's two moments): 16 Psi,
  // ... Mixed precision: a = 2, g = 4 or 2, o = 12 (master weights and moments; + 4 of fp32 main
  // gradients when g = 2), ZeRO's paper's K = 12.
  double weight_bytes = 4, gradient_bytes = 4, optimizer_state_bytes = 8;
  double formula_bytes() const;
  int64_t transient_peak_bytes = 0;  // ZeRO buffers (gathered parameters, gradient buckets)
  int64_t activation_bytes = 0;
};

// A rank's spans and memory, as the actors gather them from every rank of a job.
struct RankTimeline {
  int rank = 0;
  int stage = 0;
  std::vector<Span> spans;
};

struct RankMemory {
  int rank = 0;
  MemoryReport memory;
};

class CaptureProbe;  // StepRequest::capture_activation's probe (rank_engine.cpp)

class RankEngine {
 public:
  // board: where the engine records what it is doing (engine/activity.hpp), shared with whoever
  // reports it (the job's inspector); null: the engine keeps its own.
  RankEngine(const RankSpec& spec, const comm::Topology& topology, int rank, RankComms comms,
             std::shared_ptr<ActivityBoard> board = nullptr);
  ~RankEngine();

  const sched::Schedule& schedule() const { return schedule_; }
  // What this rank is doing now (engine/activity.hpp); safe to read from any thread.
  const ActivityBoard& activity() const { return *board_; }
  int stage() const { return stage_; }
  const std::vector<std::unique_ptr<PipelineStage>>& chunks() const { return chunks_; }

  void init(uint64_t seed);
  // tokens: this dp rank's micro_batches * micro_batch_size windows (rows, T+1) i32, in micro-batch
  // order; only read on ranks whose chunks include the embedding or the head (others may pass an
  // undefined tensor). grad_scale: 1 / tokens of the global batch.
  // The whole step, optimizer included (tests, and embedding the engine without actors).
  Result<StepOutcome> train_step(const Tensor& tokens, double grad_scale, const StepRequest& req);
  // The step in two halves around the optimizer partition's AdamW (the rank actor hands that to the
  // optimizer actor): everything up to clipped gradients; then, after AdamW updated adam_segments(),
  // the ZeRO all-gathers. A non-finite norm means no update: skip both AdamW and finish_step.
  // A watched step (engine/nan_watch.hpp) whose loss or norm is not finite (compute_gradients), or
  // one of whose parameters is not after the update (finish_step), replays the iteration to find
  // where the NaN came from and fails with the report (also in RankSpec::nan).
  Result<StepOutcome> compute_gradients(const Tensor& tokens, double grad_scale, const StepRequest& req);
  Status finish_step();
  // The parameters' L2 norm finish_step all-reduced for the step's StepRequest::params_norm (-1: not
  // asked for): Megatron's calc_params_l2_norm after the update, each element once (the fp32 master
  // weights under mixed precision).
  double params_norm() const { return params_norm_; }
  // Instead of AdamW and finish_step when compute_gradients reported skipped (a loss-scaling
  // overflow): the parameters stay, the gradients are zeroed.
  void skip_step();
  // What the optimizer partition updates, over every chunk (views into this engine's buffers).
  std::vector<AdamSegment> adam_segments() const;
  // A span from t0 to now: kept for the timeline (take_spans) and in the board's ring of recent
  // steps (engine/span_ring.hpp) with the pass's micro-batch and chunk (-1: none).
  void record(const std::string& name, const char* cat, std::chrono::steady_clock::time_point t0, int micro = -1,
              int chunk = -1);
  // Busy and wall time of the step begun by compute_gradients, up to now.
  void fill_times(StepOutcome& out);  // and keeps this step's sections for the next
  // Sum of the token losses of `tokens` (this dp rank's windows, any count divisible by nothing),
  // forward only, micro-batch by micro-batch, all-reduced over the world.
  Result<double> eval_loss_sum(const Tensor& tokens);

  // Checkpoints (storage/shard_file.hpp). The pieces this rank writes: its parameters and the moments
  // of its optimizer segments (exp_avg[i], exp_avg_sq[i] for adam_segments()[i]), each element of
  // the job once: tensor-parallel replicas and the head's copy of wte are left to their owner (tp rank
  // 0, the embedding stage), data-parallel replicas to dp rank 0 (ZeRO-3 parameters and ZeRO >= 1
  // moments are partitioned: every dp rank writes its part).
  // moments_are_copies: the moments are snapshots nobody changes (the optimizer actor's copies), so
  // pieces may view them instead of copying them a second time.
  ShardContents shard_contents(const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                               bool moments_are_copies = false) const;
  // What shard_contents holds (writes) and what load_shards with the moments reads (reads), as
  // global element groups (storage/shard_coverage.hpp): which shards of a snapshot of this layout
  // the rank needs when it resumes it.
  RankCoverage shard_coverage() const;
  // Fills this rank's parameters and the given moments (shaped like adam_segments(); empty vectors:
  // parameters only) from any set of shards, whatever layout wrote them.
  Status load_shards(ShardSetReader& reader, const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq);
  // The same with train_step's own moments (tests, embedding without actors).
  ShardContents own_shard_contents() const { return shard_contents(exp_avg_, exp_avg_sq_); }
  // One tensor's pieces on this rank, copied (troupe inspect's tensor): the parameter `name`'s
  // values, its Adam moments (exp_avg, exp_avg_sq as for shard_contents), or its gradient (the part
  // this rank owns, reduced and clipped: between compute_gradients and the optimizer step). The
  // pieces of all ranks cover the tensor once, as a checkpoint's do. None: no such parameter here.
  std::vector<TensorPiece> tensor_pieces(const std::string& name, TensorKind kind, const std::vector<Tensor>& exp_avg,
                                         const std::vector<Tensor>& exp_avg_sq) const;
  // Every parameter's global name and global shape on this rank (completion, `tensor` help).
  std::vector<std::pair<std::string, Shape>> parameter_names() const;
  Status load_own_shards(ShardSetReader& reader);

  // Copies of chunk c's parameters in spec order (local slice shapes). Collective over dp under
  // ZeRO-3: every dp rank calls it.
  Result<std::vector<Tensor>> param_values(int chunk);

  // The spans recorded since the last take (train_step and eval append).
  std::vector<Span> take_spans();
  MemoryReport memory() const;

 private:
  struct ChunkBuffers;
  Status run_schedule(const Tensor& tokens, double grad_scale, std::vector<double>& micro_losses);
  // The dropout key of this rank's micro-batch `micro` in the step under way.
  MicroBatchKey micro_key(int micro) const;
  Status sync_tied_embedding();
  // The communicator of this stage's pipeline messages to (sending) or from peer_stage in direction
  // dir (RankComms::pp_link), and the peer's rank in it.
  PipeLink link(int dir, int peer_stage, bool sending) const;
  // Collectives over host values (the step's sums and votes, counts, the NaN watch's findings),
  // through device copies on a GPU rank.
  Status host_all_reduce(comm::Communicator& c, void* data, size_t count, DType dtype, comm::ReduceOp op);
  Status host_all_gather_v(comm::Communicator& c, const void* send, void* recv, std::span<const size_t> counts,
                           DType dtype);
  // The NaN watch: what a watched step keeps, the parameter check, and the replay.
  struct Kept;
  void keep_step(const Tensor& tokens, double grad_scale);
  Status check_parameters();
  Status locate_nan(const std::string& trigger, const std::string& bad_parameter);
  std::unique_ptr<WatchProbe> probe_;
  std::shared_ptr<CaptureProbe> capture_;  // during a step that captures an op's result
  bool probe_injects_ = false;  // the chunks always see probe_ (TROUPE_FAULT_NAN on this rank)
  bool watch_step_ = false;     // this rank wanted the watch when the step began
  bool watching_ = false;       // every rank did: the step is watched
  bool want_params_norm_ = false;  // StepRequest::params_norm of the step
  double params_norm_ = -1;        // what finish_step all-reduced for it
  // The parameters' L2 norm over the world (a collective): this rank's owned, counted elements.
  Status reduce_params_norm();
  int64_t iteration_ = 0;       // StepRequest::step of the step
  MoeTally moe_tally_;          // the MoE layers' slots in the step's all-reduce (none: dense)
  std::unique_ptr<Kept> kept_;

  RankSpec spec_;
  int rank_ = 0, stage_ = 0, tp_rank_ = 0, dp_rank_ = 0, cp_rank_ = 0;
  double slow_forward_ms_ = 0;                       // TROUPE_FAULT_SLOW (engine/fault_injection.hpp)
  std::array<double, kStragglerSections> last_sections_{};  // this rank's previous step, for the world
  RankComms comms_;
  sched::Schedule schedule_;                    // for spec_.micro_batches
  std::map<int, sched::Schedule> ramp_schedules_;  // by micro-batch count, for ramp-up steps
  int micro_batches_ = 0;                       // of the step being run (< spec_.micro_batches in a ramp-up)
  const sched::Schedule& step_schedule();
  std::unique_ptr<ThreadPool> pool_;
  Context ctx_;
  // On a GPU: the rank's stream, cuBLASLt handle and workspace (ctx_ is its Context), and the
  // placement each entry point puts on its thread (Placed) so Tensor's methods use that stream.
  std::unique_ptr<cuda::DeviceContext> device_;
  DevicePlacement placement_;
  struct Placed {
    explicit Placed(const RankEngine& e) : scope(e.placement_) {}
    DeviceScope scope;
  };
  std::vector<std::unique_ptr<ZeroStore>> stores_;
  std::vector<std::unique_ptr<PipelineStage>> chunks_;
  bool tied_ = false;  // the model ties GPT's output layer to the embedding (step 3)
  std::vector<std::unique_ptr<ChunkBuffers>> buffers_;
  std::vector<Span> spans_;
  int steps_ = 0;
  std::chrono::steady_clock::time_point step_start_;
  std::chrono::steady_clock::time_point schedule_end_;  // the step's last pass of the schedule ended
  size_t step_first_span_ = 0;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;  // train_step's own optimizer state (the actor has its own)
  std::shared_ptr<ActivityBoard> board_;
  std::vector<int> tp_members_;
  // Tells the board about the waits inside the chunks' layers and ZeRO's hooks (comm::WaitListener),
  // while an entry point runs on the rank's thread.
  struct Listener;
  std::unique_ptr<Listener> listener_;
  std::vector<int> pp_members_, dp_members_, world_members_;  // global ranks (pp: by stage)
  // The board's wait on the other members of a collective group.
  WaitTarget collective_wait(const std::string& what, const std::vector<int>& members) const;
};

// A schedule given as data fits a job of these ranks: pp stages, `micro_batches` per replica, the
// layout's model chunks per stage, and sched::validate (every action once, no deadlock). The error
// says which, as bad input.
Status check_custom_schedule(const sched::Schedule& schedule, const ParallelConfig& par, int micro_batches);

// The schedule table every rank of a job with this spec executes: the one given as data
// (par.custom_schedule, checked first by check_custom_schedule), else the generated one of
// par.schedule.
sched::Schedule job_schedule(const RankSpec& spec);

// The common epoch of every span: the steady clock's, shared by the processes of one host.
std::chrono::steady_clock::time_point span_epoch();

}  // namespace troupe
