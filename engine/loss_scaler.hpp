// The loss scaler: the factor the loss is multiplied by before the backward pass (so that small
// fp16 gradients do not flush to zero), and what an overflowing step does to it. Built from a
// PrecisionConfig (include/troupe/precision.hpp); the engine asks scale() before each iteration's
// backward, divides the gradients by it, checks them for inf/NaN and reports the outcome to
// update(), which says whether the optimizer step must be skipped.
//
// The rules, per recipe (each step: one update() call with found_overflow = some gradient element
// of the iteration is inf or NaN, after the all-reduce, on every rank alike):
//
// megatron, fp16 dynamic -- Megatron-LM megatron/core/optimizer/grad_scaler.py,
// DynamicGradScaler.update (growth_factor 2, backoff_factor 0.5, as
// megatron/core/optimizer/__init__.py builds it):
//   overflow:  growth_tracker = 0; hysteresis_tracker -= 1;
//              if hysteresis_tracker <= 0: scale = max(scale / 2, min_scale)
//   clean:     growth_tracker += 1; if growth_tracker == window: growth_tracker = 0,
//              hysteresis_tracker = hysteresis, scale *= 2
//   (hysteresis_tracker starts at hysteresis and is refilled only by a growth: once exhausted,
//   every further overflow halves.) The scale is a float32 tensor there; it is held in float32
//   here too, so that it doubles and halves (and saturates to inf) as Megatron's does.
// megatron, static (--loss-scale S > 0, fp16 or bf16) -- ConstantGradScaler: the scale stays S;
//   Float16OptimizerWithFloat16Params.prepare_grads still checks for inf/NaN and step() returns
//   without updating on one, so an overflow skips the step.
// megatron, bf16 without --loss-scale, and fp32: no scaler (get_megatron_optimizer builds none):
//   scale 1, and no overflow check -- update() never skips. A non-finite gradient is the
//   engine's business: Megatron does not skip then either; its DDP's check_for_nan_in_grad
//   (--check-for-nan-in-loss-and-grad, on by default, off only for fp16 dynamic scaling) stops
//   the job, as troupe's engine stops on a non-finite gradient norm.
//
// deepspeed, fp16 dynamic -- DeepSpeed deepspeed/runtime/fp16/loss_scaler.py,
// DynamicLossScaler.update_scale (scale_factor 2; delayed_shift = hysteresis), the scaler of its
// ZeRO optimizers (runtime/zero/stage_1_and_2.py, stage3.py via CreateLossScaler):
//   overflow:  if hysteresis == 1 or cur_hysteresis == 1:
//                if scale == min_scale: DeepSpeed raises "Current loss scale already at minimum"
//                (raise_error_at_min_scale, on by default): here exhausted() turns true and the
//                state is left as it was (the exception leaves it so);
//                else scale = max(scale / 2, min_scale)
//              else cur_hysteresis -= 1
//              last_overflow_iter = cur_iter
//   clean:     if consecutive_hysteresis: cur_hysteresis = hysteresis
//              if (cur_iter - last_overflow_iter) % window == 0:
//                if not consecutive_hysteresis: cur_hysteresis = hysteresis
//                scale *= 2
//   then cur_iter += 1 (cur_iter starts at 0, last_overflow_iter at -1: the first doubling comes
//   at the window-th clean step, and each window after, counted from the last overflow). Doubles,
//   as Python's floats. DeepSpeed's stage-0 FP16_Optimizer (FusedAdam without ZeRO) has a simpler
//   rule without hysteresis (fused_optimizer.py, _update_scale); troupe applies the ZeRO rule at
//   every stage.
// deepspeed, fp16 static (fp16.loss_scale S > 0) -- LossScaler: the scale stays S; ZeRO's step()
//   still checks fp16 gradients (check_overflow) and skips on an overflow.
// deepspeed, bf16 -- scale 1 (config.py get_loss_scale: 1.0 for bf16). The step is skipped on an
//   overflow only with bf16.check_grad_overflow true (newer DeepSpeed), the scale unchanged.
// deepspeed, fp32 -- scale 1, never skips.
//
// Counters: steps() (update calls) and skipped() (those that returned true). state() / restore()
// carry everything across a checkpoint (a restored scaler continues exactly as an uninterrupted
// one); the state is also a flat vector of doubles (every integer in it is < 2^53).
//
// Not thread-safe: one scaler per rank, updated by the rank's optimizer step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/precision.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct LossScalerState {
  double scale = 1;
  int64_t growth_tracker = 0;       // megatron: clean steps since the last growth or overflow
  int64_t hysteresis_tracker = 0;   // megatron's _hysteresis_tracker, deepspeed's cur_hysteresis
  int64_t cur_iter = 0;             // deepspeed: update_scale calls
  int64_t last_overflow_iter = -1;  // deepspeed: the cur_iter of the last overflow (-1: none)
  int64_t steps = 0;                // update() calls
  int64_t skipped = 0;              // of them, skipped steps
  bool exhausted = false;           // deepspeed: an overflow at the minimum scale

  // [scale, growth_tracker, hysteresis_tracker, cur_iter, last_overflow_iter, steps, skipped,
  // exhausted (0/1)]: kSize values.
  static constexpr size_t kSize = 8;
  std::vector<double> to_vector() const;
  // Fails (bad input, naming the entry) on a wrong length, a non-integer counter, a negative
  // count or a scale that is not positive.
  static Result<LossScalerState> from_vector(const std::vector<double>& v);
  bool operator==(const LossScalerState&) const = default;
};

class LossScaler {
 public:
  // `p` must be valid (validate_train_config's precision checks: window, hysteresis >= 1, scales
  // > 0, min <= initial for a dynamic scale).
  explicit LossScaler(const PrecisionConfig& p);

  // The factor of this step's loss.
  double scale() const { return state_.scale; }
  // The outcome of a step: true when it must be skipped (no optimizer update). See the header.
  bool update(bool found_overflow);

  bool dynamic() const { return dynamic_; }
  // deepspeed: an overflow came at the minimum scale; the engine should stop the job with
  // describe() (DeepSpeed raises there).
  bool exhausted() const { return state_.exhausted; }
  int64_t steps() const { return state_.steps; }
  int64_t skipped() const { return state_.skipped; }

  const LossScalerState& state() const { return state_; }
  // Continues from a saved state (of a scaler of the same PrecisionConfig; a state saved in another
  // precision may be restored: its scale is then the one this run resumes with).
  void restore(const LossScalerState& s);

  // One line for logs, e.g. "fp16 dynamic loss scale 65536 (megatron: hysteresis 1 of 2, 12 of 1000
  // clean steps; 3 of 200 steps skipped)".
  std::string describe() const;

 private:
  bool update_megatron(bool overflow);
  bool update_deepspeed(bool overflow);

  PrecisionConfig p_;
  bool dynamic_ = false;
  bool checks_overflow_ = false;  // whether an overflow skips the step
  LossScalerState state_;
};

}  // namespace troupe
