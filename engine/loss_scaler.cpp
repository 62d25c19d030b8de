// LossScaler (engine/loss_scaler.hpp): the two recipes' update rules as the header writes them.
#include "engine/loss_scaler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace troupe {

std::vector<double> LossScalerState::to_vector() const {
  return {scale,
          static_cast<double>(growth_tracker),
          static_cast<double>(hysteresis_tracker),
          static_cast<double>(cur_iter),
          static_cast<double>(last_overflow_iter),
          static_cast<double>(steps),
          static_cast<double>(skipped),
          exhausted ? 1.0 : 0.0};
}

Result<LossScalerState> LossScalerState::from_vector(const std::vector<double>& v) {
  if (v.size() != kSize)
    return Status::bad_input(fmt::format("loss scaler state: {} values, expected {} -- the checkpoint is damaged or "
                                         "from another troupe version",
                                         v.size(), kSize));
  static const char* const names[kSize] = {"scale", "growth_tracker", "hysteresis_tracker", "cur_iter",
                                           "last_overflow_iter", "steps", "skipped", "exhausted"};
  constexpr double kMaxExact = 9007199254740992.0;  // 2^53
  for (size_t i = 1; i < kSize; ++i) {
    const double lo = i == 4 ? -1.0 : (i == 2 ? -kMaxExact : 0.0);  // Megatron's tracker may go below 0
    const double hi = i == 7 ? 1.0 : kMaxExact;
    if (!(v[i] >= lo && v[i] <= hi) || std::floor(v[i]) != v[i])
      return Status::bad_input(fmt::format("loss scaler state: {} is {}, not a whole number in [{}, {}] -- the "
                                           "checkpoint is damaged",
                                           names[i], v[i], lo, hi));
  }
  if (!(v[0] > 0))  // inf is a scale Megatron's float32 doubling can reach
    return Status::bad_input(fmt::format("loss scaler state: scale is {}, not positive -- the checkpoint is damaged", v[0]));
  LossScalerState s;
  s.scale = v[0];
  s.growth_tracker = static_cast<int64_t>(v[1]);
  s.hysteresis_tracker = static_cast<int64_t>(v[2]);
  s.cur_iter = static_cast<int64_t>(v[3]);
  s.last_overflow_iter = static_cast<int64_t>(v[4]);
  s.steps = static_cast<int64_t>(v[5]);
  s.skipped = static_cast<int64_t>(v[6]);
  s.exhausted = v[7] != 0;
  return s;
}

LossScaler::LossScaler(const PrecisionConfig& p) : p_(p) {
  dynamic_ = p.dynamic_loss_scaling();
  const bool megatron = p.recipe == PrecisionRecipe::megatron;
  if (dynamic_) {
    // Megatron keeps the scale (and min_scale) in float32 tensors.
    state_.scale = megatron ? static_cast<double>(static_cast<float>(p.initial_loss_scale)) : p.initial_loss_scale;
    checks_overflow_ = true;
  } else if (p.dtype == PrecisionDType::fp16 || (megatron && p.dtype == PrecisionDType::bf16 && p.loss_scale > 0)) {
    // Static: Megatron's ConstantGradScaler (fp16 or bf16 with --loss-scale), DeepSpeed's LossScaler (fp16).
    state_.scale = megatron ? static_cast<double>(static_cast<float>(p.loss_scale)) : p.loss_scale;
    checks_overflow_ = true;
  } else {
    state_.scale = 1;
    checks_overflow_ = !megatron && p.dtype == PrecisionDType::bf16 && p.bf16_check_grad_overflow;
  }
  state_.hysteresis_tracker = p.hysteresis;
}

void LossScaler::restore(const LossScalerState& s) { state_ = s; }

bool LossScaler::update(bool found_overflow) {
  ++state_.steps;
  bool skip = false;
  if (dynamic_) {
    skip = p_.recipe == PrecisionRecipe::megatron ? update_megatron(found_overflow) : update_deepspeed(found_overflow);
  } else {
    skip = checks_overflow_ && found_overflow;
    if (p_.recipe == PrecisionRecipe::deepspeed) ++state_.cur_iter;  // DeepSpeed's step counter, kept for the state
  }
  if (skip) ++state_.skipped;
  return skip;
}

bool LossScaler::update_megatron(bool overflow) {
  LossScalerState& s = state_;
  const float min_scale = static_cast<float>(p_.min_loss_scale);
  if (overflow) {
    s.growth_tracker = 0;
    s.hysteresis_tracker -= 1;
    if (s.hysteresis_tracker <= 0) s.scale = std::max(static_cast<float>(s.scale) * 0.5f, min_scale);
  } else {
    s.growth_tracker += 1;
    if (s.growth_tracker == p_.loss_scale_window) {
      s.growth_tracker = 0;
      s.hysteresis_tracker = p_.hysteresis;
      s.scale = static_cast<float>(s.scale) * 2.0f;
    }
  }
  return overflow;
}

bool LossScaler::update_deepspeed(bool overflow) {
  LossScalerState& s = state_;
  if (overflow) {
    if (p_.hysteresis == 1 || s.hysteresis_tracker == 1) {
      if (s.scale == p_.min_loss_scale) {
        // DeepSpeed raises here, before touching its counters.
        s.exhausted = true;
        return true;
      }
      s.scale = std::max(s.scale / 2.0, p_.min_loss_scale);
    } else {
      s.hysteresis_tracker -= 1;
    }
    s.last_overflow_iter = s.cur_iter;
  } else {
    if (p_.consecutive_hysteresis) s.hysteresis_tracker = p_.hysteresis;
    if ((s.cur_iter - s.last_overflow_iter) % p_.loss_scale_window == 0) {
      if (!p_.consecutive_hysteresis) s.hysteresis_tracker = p_.hysteresis;
      s.scale *= 2.0;
    }
  }
  s.cur_iter += 1;
  return overflow;
}

std::string LossScaler::describe() const {
  const LossScalerState& s = state_;
  const std::string counts = fmt::format("{} of {} steps skipped", s.skipped, s.steps);
  if (!dynamic_) {
    if (!checks_overflow_ && s.scale == 1)
      return fmt::format("{}: no loss scaling ({})", to_string(p_.dtype), counts);
    return fmt::format("{} static loss scale {} ({}: an overflow skips the step; {})", to_string(p_.dtype), s.scale,
                       to_string(p_.recipe), counts);
  }
  if (p_.recipe == PrecisionRecipe::megatron)
    return fmt::format("fp16 dynamic loss scale {} (megatron: hysteresis {} of {}, {} of {} clean steps; {})", s.scale,
                       s.hysteresis_tracker, p_.hysteresis, s.growth_tracker, p_.loss_scale_window, counts);
  std::string line = fmt::format(
      "fp16 dynamic loss scale {} (deepspeed: hysteresis {} of {}{}, iteration {}, last overflow {}; {})", s.scale,
      s.hysteresis_tracker, p_.hysteresis, p_.consecutive_hysteresis ? " consecutive" : "", s.cur_iter,
      s.last_overflow_iter, counts);
  if (s.exhausted)
    line += fmt::format(" -- an overflow at the minimum loss scale {}: DeepSpeed stops here (lower min_loss_scale, "
                        "or find the op that overflows with --watch-nan)",
                        p_.min_loss_scale);
  return line;
}

}  // namespace troupe
