// What the engine runs on one virtual pipeline stage of one rank: a block (GPT's, model/gpt_stage.hpp,
// or a user's, model/custom_stage.hpp) or a sequence of blocks (model/sequence_stage.hpp). The rank
// engine and the ZeRO store see only this interface.
//
// Boundary. A stage takes the tensors inputs() declares from the previous virtual stage and gives
// outputs() to the next, per micro-batch; every call names the activation slot of its micro-batch
// (0 .. slots - 1). Gradients flow back for the f32 tensors that require one; the others (integer
// ids, masks) have none, and their places in the gradient vectors are undefined tensors.
//
// Parameters. Grouped in units (ZeRO partitions each unit over dp; model/gpt_chunk.hpp explains
// GPT's). unit_params(u) / unit_grads(u) are 1-D views of a unit's resident parameters and own
// gradient buffer (undefined under UnitHooks that provide them instead, as GptChunk documents).
// tied_units(): units whose parameters another block holds a copy of (GPT's wte, in the embedding's
// block and in the head's), whose gradients the engine sums: over the embedding group when the two
// blocks are on different virtual stages, inside the rank when they are on one.
//
// Failures: misuse is a TROUPE_CHECK; a failed collective throws comm::CollectiveFailed, which the
// engine returns as its error. Not thread-safe.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/tensor.hpp"
#include "model/gpt_chunk.hpp"
#include "model/op_probe.hpp"
#include "model/params.hpp"

namespace troupe {

struct BoundaryDecl {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  bool requires_grad = true;
  bool operator==(const BoundaryDecl&) const = default;
};
std::string describe(const std::vector<BoundaryDecl>& decls);  // "hidden (56, 16) f32, ids (56) i32 no-grad"
// Zeroed tensors for `decls`; grads: only for those that take a gradient (undefined for the others).
std::vector<Tensor> boundary_tensors(const std::vector<BoundaryDecl>& decls, bool grads, Device device = Device::cpu);

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;

  virtual const std::vector<ParamSpec>& specs() const = 0;
  virtual const std::vector<UnitInfo>& units() const = 0;
  virtual Tensor unit_params(int unit) const = 0;
  virtual Tensor unit_grads(int unit) const = 0;
  virtual bool counts_in_norm(int spec) const = 0;
  virtual std::vector<int> tied_units() const { return {}; }
  virtual void init(uint64_t seed) = 0;
  virtual void zero_grad() = 0;

  virtual const std::vector<BoundaryDecl>& inputs() const = 0;   // empty: the model's first stage
  virtual const std::vector<BoundaryDecl>& outputs() const = 0;  // empty: the stage with the loss
  virtual bool reads_batch() const = 0;  // needs the micro-batch's samples, (B, record_length) i32
  virtual bool has_loss() const = 0;

  // forward returns the loss sum when has_loss(). backward_next: the caller's next call is
  // backward(slot) without deferral (a loss head may fuse its backward in, GptChunk::forward).
  // key: what the micro-batch's dropout masks are keyed by (model/dropout.hpp); GPT's blocks keep
  // it for the slot's backward, custom stages have no dropout of troupe's and ignore it.
  virtual double forward(Context& ctx, int slot, const Tensor& batch, const std::vector<Tensor>& in,
                         const std::vector<Tensor>& out, double grad_scale, bool backward_next,
                         const MicroBatchKey& key) = 0;
  // dout: outputs()' gradients; din: inputs()' gradients to write. defer_weight_grads: keep what
  // backward_weight(slot) needs (a stage that cannot split computes its weight gradients here).
  virtual void backward(Context& ctx, int slot, const std::vector<Tensor>& dout, const std::vector<Tensor>& din,
                        bool defer_weight_grads) = 0;
  virtual void backward_weight(Context& ctx, int slot) = 0;
  // Forward of a micro-batch whose first `valid` samples count in the loss; keeps nothing.
  virtual double forward_eval(Context& ctx, const Tensor& batch, const std::vector<Tensor>& in,
                              const std::vector<Tensor>& out, int64_t valid) = 0;

  // Shows every op's result to `probe` (model/op_probe.hpp), or to nobody (null, the default).
  virtual void set_probe(OpProbe* probe) = 0;

  // The routing statistics of the stage's MoE layers over the training forwards since the last call
  // (model/gpt_chunk.hpp's MoeLayerStats, one per layer that routed; recomputes and evaluation are
  // not counted), and resets them. Stages without MoE layers have none.
  virtual std::vector<MoeLayerStats> take_moe_stats() { return {}; }

  virtual int64_t param_bytes() const = 0;
  virtual int64_t grad_bytes() const = 0;
  virtual int64_t activation_bytes() const = 0;
};

}  // namespace troupe
