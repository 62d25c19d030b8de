// Mixed precision: the 16-bit type a run computes in, its loss scaling, and where gradients are
// accumulated and reduced. A section of TrainConfig (train_config.hpp), stored in checkpoints;
// engine/loss_scaler.hpp runs the loss scaling it describes.
//
// Two recipes, because Megatron-LM and DeepSpeed scale the loss by different rules (the
// LossScaler header has both, step by step). Which one a run follows is decided by where its
// precision came from: `recipe` is deepspeed when the --deepspeed-config file enabled its "fp16" or
// "bf16" block (as Megatron-DeepSpeed hands the loss scaling to the DeepSpeed engine then, whatever
// --fp16 says), megatron otherwise (--fp16 / --bf16, or a config built in code).
//
// Defaults, as each project has them (verified in the sources named beside each):
//   Megatron-LM megatron/training/arguments.py, _add_mixed_precision_args: --loss-scale None
//   (dynamic), --initial-loss-scale 2^32, --min-loss-scale 1.0, --loss-scale-window 1000,
//   --hysteresis 2. PrecisionConfig's own defaults are these.
//   DeepSpeed deepspeed/runtime/constants.py (FP16_*_DEFAULT): loss_scale 0 (dynamic),
//   initial_scale_power 16, loss_scale_window 1000, hysteresis 2, consecutive_hysteresis false,
//   min_loss_scale 1 -- but runtime/config.py get_dynamic_loss_scale_args applies them only when
//   the fp16 block names at least one of initial_scale_power, loss_scale_window, min_loss_scale,
//   hysteresis, consecutive_hysteresis; otherwise the ZeRO optimizers' DynamicLossScaler
//   (runtime/fp16/loss_scaler.py, __init__) starts from its own defaults: 2^32, window 1000, min
//   1, hysteresis 1. deepspeed_fp16_defaults(bool) gives either set.
//
// Gradient types (grad_accum_dtype / grad_reduce_dtype):
//   Megatron (arguments.py, validate_args): bf16 always accumulates and all-reduces gradients in
//   fp32 (accumulate_allreduce_grads_in_fp32 is forced on); fp16 in fp16 unless
//   --accumulate-allreduce-grads-in-fp32; fp32 in fp32.
//   DeepSpeed (runtime/engine.py, get_data_types and communication_data_type): gradients
//   accumulate in fp32 for bf16 without ZeRO (the BF16_Optimizer), else in the model's type (fp16;
//   bf16 with ZeRO stage >= 1); they are reduced in "communication_data_type" when given, else in
//   the model's type. bf16.immediate_grad_update (default false) only moves the bf16 -> fp32
//   accumulation into each micro-batch's backward hook: same types. fp16_master_weights_and_grads
//   (default false) would keep master weights in fp16: refused (troupe's are fp32).
//
// Thread safety: a value type.
#pragma once
#include <cstdint>
#include <string>

namespace troupe {

enum class PrecisionDType { fp32, bf16, fp16 };
const char* to_string(PrecisionDType d);        // "fp32", "bf16", "fp16"
bool parse(const std::string& text, PrecisionDType& out);  // those spellings; false otherwise

enum class PrecisionRecipe { megatron, deepspeed };
const char* to_string(PrecisionRecipe r);  // "megatron", "deepspeed"
bool parse(const std::string& text, PrecisionRecipe& out);

struct PrecisionConfig {
  PrecisionDType dtype = PrecisionDType::fp32;  // parameters and activations; master weights are always fp32
  PrecisionRecipe recipe = PrecisionRecipe::megatron;
  // > 0: a static scale (Megatron's --loss-scale, DeepSpeed's fp16.loss_scale); 0: dynamic (fp16).
  double loss_scale = 0;
  double initial_loss_scale = 4294967296.0;  // 2^32 (DeepSpeed: 2^initial_scale_power)
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;  // clean steps before the scale doubles
  int64_t hysteresis = 2;            // overflows before the scale halves (DeepSpeed: delayed_shift)
  bool consecutive_hysteresis = false;  // DeepSpeed: any clean step refills the hysteresis
  // Megatron's switches. apply_query_key_layer_scaling implies attention_softmax_in_fp32 (Megatron:
  // arguments.py and TransformerConfig), which is the only thing it changes in troupe (the scaling
  // itself divides the scores by the layer number and multiplies it back inside the fp32 softmax:
  // the same values up to rounding).
  bool accumulate_allreduce_grads_in_fp32 = false;
  bool attention_softmax_in_fp32 = false;
  // DeepSpeed's bf16 block: immediate_grad_update (types unchanged, see above) and
  // check_grad_overflow (newer DeepSpeed: a non-finite bf16 gradient skips the step; default false).
  bool bf16_immediate_grad_update = false;
  bool bf16_check_grad_overflow = false;
  // DeepSpeed's top-level "communication_data_type": "" (derived: the model's type), fp32, bf16, fp16.
  std::string communication_data_type;

  bool sixteen_bit() const { return dtype != PrecisionDType::fp32; }
  // Whether the loss scale changes during training: fp16 with no static scale.
  bool dynamic_loss_scaling() const { return dtype == PrecisionDType::fp16 && loss_scale <= 0; }
  // The type gradients are accumulated in over micro-batches; zero_stage: TrainConfig's.
  PrecisionDType grad_accum_dtype(int zero_stage = 0) const;
  // The type of the data-parallel gradient all-reduce / reduce-scatter.
  PrecisionDType grad_reduce_dtype(int zero_stage = 0) const;
  // The gradient type (= grad_accum_dtype).
  PrecisionDType grad_dtype(int zero_stage = 0) const { return grad_accum_dtype(zero_stage); }

  bool operator==(const PrecisionConfig&) const = default;
};

// DeepSpeed's fp16 loss-scaling settings (recipe deepspeed, dtype fp16); named_any: whether the
// block names one of the five dynamic keys (see above).
PrecisionConfig deepspeed_fp16_defaults(bool named_any);

}  // namespace troupe
