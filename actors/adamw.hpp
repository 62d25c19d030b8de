// AdamW over a shard's parameters: the fp32 moments, the step count, global-norm clipping. Plain
// object, no actor: today the shard owns one; with ZeRO an optimizer-partition actor owns one over
// its partition. Not thread-safe.
#pragma once
#include <vector>

#include "actors/messages.hpp"
#include "kernels/context.hpp"
#include "model/params.hpp"

namespace troupe {

class AdamW {
 public:
  // Moments shaped like `params` (zero), weight decay per spec (Megatron: none for biases and norms).
  AdamW(const std::vector<ParamSpec>& specs, const std::vector<Tensor>& params);

  // Clips flat_grads to req.clip_grad (global L2 norm), then updates every parameter. Returns the norm
  // before clipping; when it is not finite nothing is updated.
  double step(Context& ctx, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              const Tensor& flat_grads, const StepRequest& req);

  const std::vector<Tensor>& exp_avg() const { return exp_avg_; }
  const std::vector<Tensor>& exp_avg_sq() const { return exp_avg_sq_; }

 private:
  std::vector<bool> decay_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace troupe
