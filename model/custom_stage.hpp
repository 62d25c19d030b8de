// A user's troupe::Stage (include/troupe/stage.hpp) as the engine's (model/stage.hpp): troupe holds its
// parameters (one unit, ParamDecl order), their tensor-parallel slices and gradients, and calls the
// user's forward and backward on host views of them and of the boundary tensors. Recompute full
// keeps only the inputs and runs the user's forward again before backward. Under a split schedule
// (ZB-H1) a user stage that splits_backward() gets backward without parameter gradients and
// backward_weight later for them; one that does not computes both in backward (W does nothing).
// Exceptions the user's code throws pass through (the engine returns them as the rank's error).
#pragma once
#include <memory>

#include "model/gpt_chunk.hpp"
#include "model/stage.hpp"
#include "troupe/stage.hpp"

namespace troupe {

// The ParamSpec of a declared parameter as tensor-parallel rank `tp_rank` of `tp_size` holds it.
// A declaration that cannot be split so is a TROUPE_CHECK (check_model refuses it first).
ParamSpec custom_param_spec(const ParamDecl& decl, int tp_size, int tp_rank);
BoundaryDecl boundary_decl(const TensorDecl& decl);

class CustomStage final : public PipelineStage {
 public:
  // tp: the stage's tensor-parallel group (null or size 1 at tp 1). dtype must be f32. name: the
  // block's (troupe::Block::name), how a probe's points name it.
  CustomStage(std::unique_ptr<troupe::Stage> user, const StagePlace& place, comm::Communicator* tp, UnitHooks hooks,
              Recompute recompute, DType dtype, std::string name = "custom");
  ~CustomStage() override;

  const std::vector<ParamSpec>& specs() const override { return specs_; }
  const std::vector<UnitInfo>& units() const override { return units_; }
  Tensor unit_params(int unit) const override;
  Tensor unit_grads(int unit) const override;
  bool counts_in_norm(int spec) const override;
  void init(uint64_t seed) override;
  void zero_grad() override;
  const std::vector<BoundaryDecl>& inputs() const override { return inputs_; }
  const std::vector<BoundaryDecl>& outputs() const override { return outputs_; }
  bool reads_batch() const override { return reads_batch_; }
  bool has_loss() const override { return has_loss_; }
  double forward(Context& ctx, int slot, const Tensor& batch, const std::vector<Tensor>& in,
                 const std::vector<Tensor>& out, double grad_scale, bool backward_next,
                 const MicroBatchKey& key) override;
  void backward(Context& ctx, int slot, const std::vector<Tensor>& dout, const std::vector<Tensor>& din,
                bool defer_weight_grads) override;
  void backward_weight(Context& ctx, int slot) override;
  double forward_eval(Context& ctx, const Tensor& batch, const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                      int64_t valid) override;
  // The probe sees each output after forward (by its name; "loss" for the loss block), each input's
  // gradient after backward (by the input's name) and the parameter gradients ("params", weight).
  void set_probe(OpProbe* probe) override;
  int64_t param_bytes() const override;
  int64_t grad_bytes() const override;
  int64_t activation_bytes() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<ParamSpec> specs_;
  std::vector<UnitInfo> units_;
  std::vector<BoundaryDecl> inputs_, outputs_;
  bool reads_batch_ = false, has_loss_ = false;
};

}  // namespace troupe
