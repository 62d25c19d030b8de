// GPT's block as a PipelineStage (model/stage.hpp): one GptChunk, whose boundary is the one tensor
// {"hidden", (boundary_rows, C), f32}. tied: the model ties the output layer to the token embedding
// in two blocks (GPT's own head in the model's last, the embedding in its first); then wte is the
// tied unit of each of the two chunks.
#pragma once
#include <memory>

#include "model/gpt_chunk.hpp"
#include "model/stage.hpp"

namespace troupe {

class GptStage final : public PipelineStage {
 public:
  GptStage(const ChunkSpec& spec, comm::Communicator* tp, UnitHooks hooks, bool tied, comm::Communicator* ep = nullptr,
           comm::Communicator* cp = nullptr);
  GptChunk& chunk() { return chunk_; }
  const GptChunk& chunk() const { return chunk_; }

  const std::vector<ParamSpec>& specs() const override { return chunk_.specs(); }
  const std::vector<UnitInfo>& units() const override { return chunk_.units(); }
  Tensor unit_params(int unit) const override;
  Tensor unit_grads(int unit) const override;
  bool counts_in_norm(int spec) const override { return chunk_.counts_in_norm(spec); }
  std::vector<int> tied_units() const override;
  void init(uint64_t seed) override { chunk_.init(seed); }
  void zero_grad() override { chunk_.zero_grad(); }
  const std::vector<BoundaryDecl>& inputs() const override { return inputs_; }
  const std::vector<BoundaryDecl>& outputs() const override { return outputs_; }
  bool reads_batch() const override { return chunk_.spec().has_embedding || chunk_.spec().has_head; }
  bool has_loss() const override { return chunk_.spec().has_head; }
  double forward(Context& ctx, int slot, const Tensor& batch, const std::vector<Tensor>& in,
                 const std::vector<Tensor>& out, double grad_scale, bool backward_next,
                 const MicroBatchKey& key) override;
  void backward(Context& ctx, int slot, const std::vector<Tensor>& dout, const std::vector<Tensor>& din,
                bool defer_weight_grads) override;
  void backward_weight(Context& ctx, int slot) override { chunk_.backward_weight(ctx, slot); }
  double forward_eval(Context& ctx, const Tensor& batch, const std::vector<Tensor>& in, const std::vector<Tensor>& out,
                      int64_t valid) override;
  void set_probe(OpProbe* probe) override { chunk_.set_probe(probe); }
  std::vector<MoeLayerStats> take_moe_stats() override { return chunk_.take_moe_stats(); }
  int64_t param_bytes() const override { return chunk_.param_bytes(); }
  int64_t grad_bytes() const override { return chunk_.grad_bytes(); }
  int64_t activation_bytes() const override { return chunk_.activation_bytes(); }

 private:
  GptChunk chunk_;
  bool tied_;
  std::vector<BoundaryDecl> inputs_, outputs_;
};

}  // namespace troupe
