// AdamW over the reference model's parameters (reference/gpt.hpp): the fp32 moments, global-norm
// clipping over one flat gradient buffer, the update of engine/zero_store.hpp's adamw_step. The
// tests' yardstick for the engine's optimizer step; nothing trains with it. Not thread-safe.
#pragma once
#include <vector>

#include "engine/types.hpp"
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
