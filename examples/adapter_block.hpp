// A bottleneck adapter (Houlsby et al.) as a custom stage between GPT's layers:
//   out = h + tanh(h D^T) U^T,  D (r, C) "adapter.<i>.down", U (C, r) "adapter.<i>.up", replicated.
// Written against include/troupe/stage.hpp only, as a user would.
#pragma once
#include <atomic>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <troupe/stage.hpp>

namespace example {

class Adapter : public troupe::Stage {
 public:
  Adapter(const troupe::StagePlace& at, int index, int64_t rank)
      : N_(at.micro_batch * (at.record_length - 1)), C_(at.hidden_size), r_(rank), index_(index) {}
  std::vector<troupe::TensorDecl> inputs() const override { return {{"hidden", {N_, C_}}}; }
  std::vector<troupe::TensorDecl> outputs() const override { return {{"hidden", {N_, C_}}}; }
  std::vector<troupe::ParamDecl> parameters() const override {
    const std::string p = "adapter." + std::to_string(index_);
    troupe::ParamDecl down{p + ".down", {r_, C_}};
    troupe::ParamDecl up{p + ".up", {C_, r_}};
    down.init_std = up.init_std = 0.2;
    return {down, up};
  }
  double forward(troupe::StageContext& ctx, const troupe::ForwardArgs& a) override {
    const float* h = static_cast<const float*>(a.inputs[0].data);
    float* out = static_cast<float*>(a.outputs[0].data);
    std::vector<float> act(static_cast<size_t>(N_ * r_));
    ctx.gemm(false, true, N_, r_, C_, 1.0f, h, C_, a.params[0].data, C_, 0.0f, act.data(), r_);
    for (float& x : act) x = std::tanh(x);
    for (int64_t i = 0; i < N_ * C_; ++i) out[i] = h[i];
    ctx.gemm(false, true, N_, C_, r_, 1.0f, act.data(), r_, a.params[1].data, r_, 1.0f, out, C_);
    if (a.slot >= 0) saved_[a.slot] = {h, std::move(act)};
    return 0;
  }
  void backward(troupe::StageContext& ctx, const troupe::BackwardArgs& a) override {
    const float* dout = static_cast<const float*>(a.output_grads[0].data);
    float* dh = static_cast<float*>(a.input_grads[0].data);
    const auto& s = saved_.at(a.slot);
    const std::vector<float> dz = pre_activation_grad(ctx, dout, a.params[1].data, s.second);
    for (int64_t i = 0; i < N_ * C_; ++i) dh[i] = dout[i];
    ctx.gemm(false, false, N_, C_, r_, 1.0f, dz.data(), r_, a.params[0].data, C_, 1.0f, dh, C_);
    if (a.weight_grads_later) return;  // backward_weight adds dD and dU (a SplitAdapter)
    weight_grads(ctx, a, dout, dz);
    saved_.erase(a.slot);
  }

 protected:
  // dz = (dout U) * (1 - act^2), (N, r).
  std::vector<float> pre_activation_grad(troupe::StageContext& ctx, const float* dout, const float* up,
                                         const std::vector<float>& act) const {
    std::vector<float> dz(static_cast<size_t>(N_ * r_));
    ctx.gemm(false, false, N_, r_, C_, 1.0f, dout, C_, up, r_, 0.0f, dz.data(), r_);
    for (size_t i = 0; i < dz.size(); ++i) dz[i] *= 1.0f - act[i] * act[i];
    return dz;
  }
  void weight_grads(troupe::StageContext& ctx, const troupe::BackwardArgs& a, const float* dout,
                    const std::vector<float>& dz) {
    const auto& s = saved_.at(a.slot);
    ctx.gemm(true, false, C_, r_, N_, 1.0f, dout, C_, s.second.data(), r_, 1.0f, a.param_grads[1].data, r_);  // dU
    ctx.gemm(true, false, r_, C_, N_, 1.0f, dz.data(), r_, s.first, C_, 1.0f, a.param_grads[0].data, C_);  // dD
  }

  int64_t N_, C_, r_;
  int index_;
  std::map<int, std::pair<const float*, std::vector<float>>> saved_;
};

// The same adapter with the zero-bubble split: backward writes dh only, backward_weight (the W pass)
// adds dD and dU from what the slot kept. Counts its weight passes.
class SplitAdapter final : public Adapter {
 public:
  using Adapter::Adapter;
  static inline std::atomic<int> weight_passes{0};
  bool splits_backward() const override { return true; }
  void backward_weight(troupe::StageContext& ctx, const troupe::BackwardArgs& a) override {
    const float* dout = static_cast<const float*>(a.output_grads[0].data);
    weight_grads(ctx, a, dout, pre_activation_grad(ctx, dout, a.params[1].data, saved_.at(a.slot).second));
    saved_.erase(a.slot);
    weight_passes.fetch_add(1);
  }
};

}  // namespace example
