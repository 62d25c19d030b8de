// ZeRO for one model chunk of one rank: where its parameters, gradients and Adam moments live, how
// gradients are reduced over the data-parallel group, and the optimizer step on this rank's partition.
//
// Partitioning. Every parameter unit of the chunk (model/stage.hpp; GPT's: wte, wpe and / or ln_embd,
// each layer, ln_f, an untied lm_head; model/gpt_chunk.hpp)
// is split over the dp ranks by element ranges: rank r owns elements [start_r, start_r + count_r)
// of the unit, count_r = n/dp plus one for the first n % dp ranks (the counts of comm's
// reduce_scatter_v / all_gather_v). Splitting per unit, not over the whole flat buffer, gives wte the
// same partition on the first and the last pipeline stage, so the tied embedding's two gradient
// copies are summed partition by partition. An MoE layer's experts (UnitInfo::expert) are held only
// by the ranks of their expert-parallel shard: their units are reduced and split over the
// expert-data-parallel group instead (the dp ranks holding the same experts; docs/MOE.md), and
// "dp" below means the unit's group.
//
// Stages (fp32: parameters are the master weights; Psi = parameters of the chunk):
// The Adam moments live with the optimizer partition (actors/optimizer_actor.hpp), which updates the
// ranges adam_segments() names; optimizer bytes below count them.
//   0  params, grads, moments all full (4 + 4 + 8 bytes x Psi); gradients all-reduced over dp
//      (unit by unit, as soon as the last micro-batch's backward completes a unit) and every rank
//      steps the whole chunk (DDP).
//   1  params and grads full; moments of the own partition only (8 Psi / dp); gradients
//      reduce-scattered after the last micro-batch, each rank steps its partition, then the updated
//      partitions are all-gathered into every rank's parameters.
//   2  params full; gradients partitioned (4 Psi / dp): each micro-batch's unit gradients go to a
//      transient buffer that is reduce-scattered and added into the partition (DeepSpeed's ZeRO-2
//      reduces every micro-step); step, then all-gather as in stage 1.
//   3  params partitioned too (4 Psi / dp): a unit's parameters are all-gathered into a transient
//      buffer when the chunk needs them (forward and backward), the next unit prefetched, and freed
//      after use; gradients as in stage 2; the step updates the partition in place, nothing is
//      gathered after it.
//
// Mixed precision (a 16-bit parameter dtype, bf16 or f16): the chunk's parameters are the 16-bit
// working copy and the store keeps the fp32 master weights of the range this rank's optimizer
// updates (stage 0: every unit whole; stages 1-3: the own partition), Megatron's and DeepSpeed's
// recipe. Gradients are the grad dtype (f32: reduced in fp32; 16-bit: reduced in 16 bits, half the
// bytes, and widened into fp32 main gradients of the owned range after the reduction). The
// optimizer steps the master weights with the fp32 main gradients (adam_segments); finish_step
// rounds the updated master range to 16 bits (nearest even) and all-gathers the 16-bit copy
// (stages 1, 2: half the bytes of fp32). param_ranges() are then the master ranges (what
// checkpoints hold: fp32 master weights, which load into any precision and layout), partitioned
// over dp in stages 1-3 (partitioned_params()).
//
// Collective order: every dp rank of one (pp, tp) coordinate runs the same schedule, so the chunk
// calls the hooks in the same order on all of them and their dp collectives match.
// Not thread-safe: the owning rank's thread calls everything.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/types.hpp"
#include "comm/communicator.hpp"
#include "kernels/context.hpp"
#include "model/stage.hpp"

namespace troupe {

// One contiguous run of parameters the optimizer updates and its gradient (1-D views of equal
// length into the store's buffers, valid for the store's lifetime), with its weight-decay flag.
struct AdamSegment {
  Tensor param, grad;
  bool decay = true;
};

// AdamW over segments with their moments (exp_avg[i], exp_avg_sq[i] shaped like segments[i].param).
void adamw_step(Context& ctx, const std::vector<AdamSegment>& segments, const std::vector<Tensor>& exp_avg,
                const std::vector<Tensor>& exp_avg_sq, const StepRequest& req);

struct ZeroCounts {
  int64_t param_bytes = 0;      // resident parameters (stage 3: the partition)
  int64_t grad_bytes = 0;       // resident gradients (stages 2, 3: the partition accumulator)
  int64_t optimizer_bytes = 0;  // Adam moments
  int64_t transient_peak_bytes = 0;  // most bytes of gathered parameters / gradient buffers at once
};

class ZeroStore {
 public:
  // dp: the data-parallel group (size 1 allowed). Call attach() once the chunk exists (the chunk
  // needs hooks() at construction, the store needs the chunk's units).
  ZeroStore(int stage, comm::Communicator* dp, DType dtype) : ZeroStore(stage, dp, dtype, dtype) {}
  // param_dtype 16-bit: mixed precision (above), grad_dtype f32 or param_dtype. Otherwise grad_dtype
  // must equal param_dtype.
  ZeroStore(int stage, comm::Communicator* dp, DType param_dtype, DType grad_dtype)
      : ZeroStore(stage, dp, param_dtype, grad_dtype, grad_dtype) {}
  // reduce_dtype: the type gradients travel in over dp (DeepSpeed's communication_data_type; under
  // mixed precision f32, bf16 or f16, otherwise grad_dtype). When it differs from grad_dtype each
  // reduction converts its input into a buffer of that type (nearest even), reduces it and converts
  // the result back; the sum itself is fp32 in comm whatever the wire type.
  // expert_dp: the expert-data-parallel group, which the units of MoE experts (UnitInfo::expert) are
  // reduced and partitioned over (null: dp, as without expert parallelism).
  ZeroStore(int stage, comm::Communicator* dp, DType param_dtype, DType grad_dtype, DType reduce_dtype,
            comm::Communicator* expert_dp = nullptr);
  ~ZeroStore();
  ZeroStore(const ZeroStore&) = delete;
  ZeroStore& operator=(const ZeroStore&) = delete;
  UnitHooks hooks();
  void attach(PipelineStage* chunk, Context* ctx);

  // Fills the partition / parameters from the seed (global coordinates); zeroes the gradients.
  void init(uint64_t seed);
  // Zeroes the gradients (after parameters were loaded from a checkpoint).
  void zero_gradients();

  // Before the micro-batches of an iteration.
  void begin_iteration(int micro_batches);
  // After the last micro-batch's backward: finishes the dp reduction of every unit's gradients.
  Status finish_gradients();
  // This rank's gradient partition of unit u (stages 1-3; stage 0: the whole unit), after
  // finish_gradients. The runtime sums the tied wte copies over the embedding group here.
  Tensor unit_gradient(int unit) const;
  // Sum of squares of the gradients this rank owns, counting only elements whose spec counts in the
  // norm (PipelineStage::counts_in_norm), in double, in a fixed order.
  double owned_grad_sum_squares();
  // The same elements, after finish_gradients: how many are exactly zero, the vocabulary padding's
  // rows left out (their gradient is always zero: the loss leaves the padded logits out).
  // Megatron's count_zeros_fp32 over the gradients its optimizer steps on. Reads device gradients
  // on the host.
  int64_t owned_grad_zeros() const;
  // Sum of squares of the parameters this rank's optimizer updates (the fp32 master range under
  // mixed precision), over the same elements: Megatron's calc_params_l2_norm counts each once.
  double owned_param_sum_squares();
  // Scales the owned gradients (clipping).
  void scale_gradients(double factor);
  // Element ranges of the chunk's parameters (spec index into the chunk's specs, [begin, end) in the
  // spec's local row-major order) with views of their values, for checkpoints:
  //   param_ranges    what this rank holds resident: every spec whole (stage 3: its partition)
  //   segment_ranges  what adam_segments() covers, in the same order (the moments' ranges)
  struct OwnedRange {
    int spec = 0;
    int64_t begin = 0, end = 0;
    Tensor values;  // 1-D view, end - begin elements
    // The unit's group rank is 0: where a range every replica of the group holds alike (stage 0,
    // unpartitioned parameters) is written once.
    bool first_replica = true;
  };
  std::vector<OwnedRange> param_ranges() const;
  std::vector<OwnedRange> segment_ranges() const;

  // What this rank's optimizer partition updates: its owned range of every unit (stage 0: all of it),
  // split where the weight-decay flag changes. The optimizer partition actor owns the moments.
  std::vector<AdamSegment> adam_segments() const;
  // After the optimizer updated the owned ranges: stages 1, 2 all-gather the parameters (mixed
  // precision: after rounding the master range into the 16-bit copy); every stage zeroes the
  // gradients for the next iteration.
  Status finish_step();
  // Mixed precision: rounds the master ranges into the 16-bit parameters and all-gathers them
  // (stages 1, 2; collective over dp), as finish_step does, without touching the gradients: after
  // param_ranges() were written (a checkpoint's load, the NaN watch's restore). Nothing otherwise.
  Status publish_params();
  // A step the loss scaler skips (an fp16 overflow): the parameters stay, the gradients are zeroed.
  void skip_step();
  bool mixed() const { return mixed_; }
  DType reduce_dtype() const { return reduce_dtype_; }
  // Whether param_ranges() differ between dp ranks (each holds its partition): stage 3, and stages
  // 1, 2 under mixed precision (the master weights are partitioned). Otherwise every dp rank holds
  // the same whole parameters.
  bool partitioned_params() const { return stage_ == 3 || (mixed_ && stage_ >= 1); }

  // The NaN locator's replay of an iteration (engine/nan_watch.hpp): until end_replay the chunk's
  // hooks touch no other rank. Stage 3 serves every unit from a copy gathered here (collective over
  // dp: every dp rank calls it, in the same order); gradients accumulate from zero in buffers of
  // their own and are reduced nowhere. end_replay frees the copies and zeroes the gradients.
  Status begin_replay();
  void end_replay();

  ZeroCounts counts() const;
  // A copy of unit u's full parameters (checkpoints, tests; mixed precision: the fp32 master weights).
  // PipelineStage 3 (and stages 1, 2 under mixed precision): an all-gather over dp, so every dp rank
  // must call it, in the same order.
  Result<Tensor> unit_params(int unit);

 private:
  struct Unit;
  Tensor gather_unit(int unit);
  Result<Tensor> gather_partition(const Unit& unit, const Tensor& part);  // all of a unit from the partitions
  void round_master();        // master ranges -> the 16-bit parameters (nearest even)
  Status gather_params();     // stages 1, 2: the updated partitions into every rank's parameters
  void on_grads_ready(int unit);
  Tensor acquire(int unit, Pass pass);
  void release(int unit, Pass pass);
  Tensor grad_buffer(int unit);
  void track_transient(int64_t delta);
  void drain_pending(bool all);
  void drain_one();
  bool converts_for_wire() const { return reduce_dtype_ != grad_dtype_; }
  Tensor to_wire(const Tensor& grads);  // a transient copy of grads in reduce_dtype_
  // The transient buffers (ZeRO-2/3's gradient buffers and received partitions, ZeRO-3's gathered
  // units, the wire copies) come from the store's own pool: a buffer given back is reused by the next
  // request of its type it holds, up to twice the size asked for. So the process holds the most
  // buffers in use at once (what the memory plan counts), not what the allocator keeps of every
  // freed one (glibc's heap keeps freed buffers below its moving mmap threshold resident: ZeRO-2/3
  // held 15% more on the CPU without the pool). take(): uninitialised, `numel` elements; give():
  // back to the pool, t left empty.
  Tensor take(int64_t numel, DType dtype);
  void give(Tensor& t);

  struct Pending {  // stages 2, 3: one micro-batch's unit gradients being reduce-scattered
    int unit = 0;
    Tensor send, recv;
    comm::WorkPtr work;
  };

  // Calls f(run) for each run of unit's own partition whose spec counts in the norm, `values` holding
  // the unit's elements from `first` on; without_padding: each spec's vocabulary padding left out.
  template <class F>
  void for_counted(const Unit& unit, const Tensor& values, int64_t first, bool without_padding, F&& f) const;
  // The range of unit u this rank's optimizer updates, [first, last) of the unit.
  int64_t owned_first(const Unit& unit) const;
  int64_t owned_last(const Unit& unit) const;

  int stage_;
  comm::Communicator* dp_;
  comm::Communicator* expert_dp_;  // MoE experts' units (dp when there is no expert parallelism)
  DType dtype_;       // parameters
  DType grad_dtype_;  // gradients
  DType reduce_dtype_;  // gradients on the wire
  bool mixed_ = false;
  PipelineStage* chunk_ = nullptr;
  Context* ctx_ = nullptr;
  Device device_ = Device::cpu;  // ctx_'s: where every buffer of the store lives
  std::vector<Unit> units_;
  int micro_batches_ = 1;
  int64_t transient_bytes_ = 0, transient_peak_ = 0;
  std::deque<Pending> pending_;  // finished in issue order: micro-batches sum in a fixed order
  std::vector<Tensor> pool_;                     // free transient buffers, whole
  std::unordered_map<const void*, Tensor> lent_; // taken ones, whole, by their data
  bool replay_ = false;
  std::vector<Tensor> replay_params_;  // stage 3 during a replay: every unit, gathered
};

}  // namespace troupe
