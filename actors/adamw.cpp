#include "actors/adamw.hpp"

#include <cmath>

#include "kernels/ops.hpp"

namespace troupe {

AdamW::AdamW(const std::vector<ParamSpec>& specs, const std::vector<Tensor>& params) {
  TROUPE_CHECK(specs.size() == params.size(), "AdamW: one spec per parameter");
  for (size_t i = 0; i < params.size(); ++i) {
    decay_.push_back(specs[i].weight_decay);
    exp_avg_.push_back(Tensor::zeros(params[i].shape(), params[i].dtype()));
    exp_avg_sq_.push_back(Tensor::zeros(params[i].shape(), params[i].dtype()));
  }
}

double AdamW::step(Context& ctx, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                   const Tensor& flat_grads, const StepRequest& req) {
  const double norm = ops::clip_grad_norm(ctx, {flat_grads}, req.clip_grad);
  if (!std::isfinite(norm)) return norm;
  ops::AdamWParams hp;
  hp.lr = req.lr;
  hp.beta1 = req.beta1;
  hp.beta2 = req.beta2;
  hp.eps = req.eps;
  hp.step = req.step;
  for (size_t i = 0; i < params.size(); ++i) {
    hp.weight_decay = decay_[i] ? req.weight_decay : 0.0;
    ops::adamw_update(ctx, params[i], grads[i], exp_avg_[i], exp_avg_sq_[i], hp);
  }
  return norm;
}

}  // namespace troupe
