// PrecisionConfig's spellings and derived gradient types (include/troupe/precision.hpp has the
// rules and their sources).
#include "troupe/precision.hpp"

namespace troupe {

const char* to_string(PrecisionDType d) {
  switch (d) {
    case PrecisionDType::fp32: return "fp32";
    case PrecisionDType::bf16: return "bf16";
    case PrecisionDType::fp16: return "fp16";
  }
  return "fp32";
}

bool parse(const std::string& text, PrecisionDType& out) {
  if (text == "fp32") out = PrecisionDType::fp32;
  else if (text == "bf16") out = PrecisionDType::bf16;
  else if (text == "fp16") out = PrecisionDType::fp16;
  else return false;
  return true;
}

const char* to_string(PrecisionRecipe r) { return r == PrecisionRecipe::deepspeed ? "deepspeed" : "megatron"; }

bool parse(const std::string& text, PrecisionRecipe& out) {
  if (text == "megatron") out = PrecisionRecipe::megatron;
  else if (text == "deepspeed") out = PrecisionRecipe::deepspeed;
  else return false;
  return true;
}

PrecisionDType PrecisionConfig::grad_accum_dtype(int zero_stage) const {
  if (dtype == PrecisionDType::fp32) return PrecisionDType::fp32;
  if (recipe == PrecisionRecipe::megatron) {
    // validate_args: bf16 forces accumulate_allreduce_grads_in_fp32 (no --grad-reduce-in-bf16 here).
    if (dtype == PrecisionDType::bf16 || accumulate_allreduce_grads_in_fp32) return PrecisionDType::fp32;
    return PrecisionDType::fp16;
  }
  // DeepSpeed's engine.get_data_types with no data_types.grad_accum_dtype.
  if (dtype == PrecisionDType::bf16 && zero_stage == 0) return PrecisionDType::fp32;
  return dtype;
}

PrecisionDType PrecisionConfig::grad_reduce_dtype(int zero_stage) const {
  if (recipe == PrecisionRecipe::megatron) return grad_accum_dtype(zero_stage);
  // DeepSpeed's engine.communication_data_type: the key when given, else the model's type.
  PrecisionDType d = dtype;
  if (!communication_data_type.empty() && parse(communication_data_type, d)) return d;
  return dtype;
}

PrecisionConfig deepspeed_fp16_defaults(bool named_any) {
  PrecisionConfig p;
  p.dtype = PrecisionDType::fp16;
  p.recipe = PrecisionRecipe::deepspeed;
  p.loss_scale = 0;           // FP16_LOSS_SCALE_DEFAULT
  p.min_loss_scale = 1;       // FP16_MIN_LOSS_SCALE_DEFAULT, DynamicLossScaler's min_scale
  p.loss_scale_window = 1000; // FP16_LOSS_SCALE_WINDOW_DEFAULT, DynamicLossScaler's scale_window
  p.consecutive_hysteresis = false;
  if (named_any) {
    p.initial_loss_scale = 65536.0;  // 2 ** FP16_INITIAL_SCALE_POWER_DEFAULT (16)
    p.hysteresis = 2;                // FP16_HYSTERESIS_DEFAULT
  } else {
    p.initial_loss_scale = 4294967296.0;  // DynamicLossScaler(init_scale=2**32)
    p.hysteresis = 1;                     // DynamicLossScaler(delayed_shift=1)
  }
  return p;
}

}  // namespace troupe
