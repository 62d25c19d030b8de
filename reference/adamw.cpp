#include "reference/adamw.hpp"

#include <cmath>

#include "engine/zero_store.hpp"
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
  std::vector<AdamSegment> segments;
  for (size_t i = 0; i < params.size(); ++i) segments.push_back({params[i], grads[i], decay_[i]});
  adamw_step(ctx, segments, exp_avg_, exp_avg_sq_, req);
  return norm;
}

}  // namespace troupe
