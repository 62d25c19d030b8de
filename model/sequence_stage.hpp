// Several blocks on one virtual stage, run one after the other (model/stage.hpp): block i's outputs
// are block i+1's inputs. Their parameter units and specs are concatenated in block order (block i's
// unit u is unit base_i + u); the tensors between the blocks live in this stage's slots.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "model/stage.hpp"

namespace troupe {

class SequenceStage final : public PipelineStage {
 public:
  // make(i, hooks) builds block i with hooks whose unit indices are the block's own; blocks.size()
  // >= 2; block i's outputs() must equal block i+1's inputs() (TROUPE_CHECK: validate the model).
  using MakeBlock = std::function<std::unique_ptr<PipelineStage>(int block, UnitHooks hooks)>;
  SequenceStage(int blocks, const MakeBlock& make, const UnitHooks& hooks, int slots);

  const std::vector<ParamSpec>& specs() const override { return specs_; }
  const std::vector<UnitInfo>& units() const override { return units_; }
  Tensor unit_params(int unit) const override;
  Tensor unit_grads(int unit) const override;
  bool counts_in_norm(int spec) const override;
  std::vector<int> tied_units() const override;
  void init(uint64_t seed) override;
  void zero_grad() override;
  const std::vector<BoundaryDecl>& inputs() const override { return blocks_.front()->inputs(); }
  const std::vector<BoundaryDecl>& outputs() const override { return blocks_.back()->outputs(); }
  bool reads_batch() const override;
  bool has_loss() const override { return blocks_.back()->has_loss(); }
  double forward(Context& ctx, int slot, const Tensor& batch, const std::vector<Tensor>& in,
                 const std::vector<Tensor>& out, double grad_scale, bool backward_next,
                 const MicroBatchKey& key) override;
  void backward(Context& ctx, int slot, const std::vector<Tensor>& dout, const std::vector<Tensor>& din,
                bool defer_weight_grads) override;
  void backward_weight(Context& ctx, int slot) override;
  double forward_eval(Context& ctx, const Tensor& batch, const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                      int64_t valid) override;
  void set_probe(OpProbe* probe) override;
  std::vector<MoeLayerStats> take_moe_stats() override;  // every block's, in block order
  int64_t param_bytes() const override;
  int64_t grad_bytes() const override;
  int64_t activation_bytes() const override;

 private:
  // Between block i and i+1: the activations and their gradients, per slot (and one set for
  // evaluation, the last index).
  struct Joint {
    std::vector<std::vector<Tensor>> act, grad;
  };
  std::vector<std::unique_ptr<PipelineStage>> blocks_;
  std::vector<int> unit_base_, spec_base_;
  std::vector<ParamSpec> specs_;
  std::vector<UnitInfo> units_;
  std::vector<Joint> joints_;
  int slots_ = 1;
  // (block of a unit, its own index there), by this stage's unit index
  std::pair<int, int> locate_unit(int unit) const;
  std::pair<int, int> locate_spec(int spec) const;
};

}  // namespace troupe
