#include "model/gpt_stage.hpp"

#include "troupe/check.hpp"

namespace troupe {

namespace {
Tensor flat_range(const Tensor& flat, const UnitInfo& u) {
  if (!flat.defined()) return Tensor();
  return flat.view(Shape{flat.numel()}).rows(u.param_offset, u.param_offset + u.numel);
}
const Tensor& one(const std::vector<Tensor>& v) {
  static const Tensor none;
  return v.empty() ? none : v.front();
}
}  // namespace

GptStage::GptStage(const ChunkSpec& spec, comm::Communicator* tp, UnitHooks hooks, bool tied, comm::Communicator* ep,
                   comm::Communicator* cp)
    : chunk_(spec, tp, std::move(hooks), ep, cp), tied_(tied) {
  const BoundaryDecl hidden{"hidden", Shape{chunk_.boundary_rows(), spec.model.hidden_size}, spec.dtype, true};
  if (!spec.has_embedding) inputs_.push_back(hidden);
  if (!spec.has_head) outputs_.push_back(hidden);
}

Tensor GptStage::unit_params(int unit) const { return flat_range(chunk_.flat_params(), chunk_.units()[unit]); }
Tensor GptStage::unit_grads(int unit) const { return flat_range(chunk_.flat_grads(), chunk_.units()[unit]); }

std::vector<int> GptStage::tied_units() const {
  const ChunkSpec& s = chunk_.spec();
  // wte is unit 0 of both chunks; an untied head (lm_head) shares nothing with the embedding.
  if (tied_ && !s.model.untie_embeddings_and_output_weights && s.has_embedding != s.has_head) return {0};
  return {};
}

double GptStage::forward(Context& ctx, int slot, const Tensor& batch, const std::vector<Tensor>& in,
                         const std::vector<Tensor>& out, double grad_scale, bool backward_next,
                         const MicroBatchKey& key) {
  return chunk_.forward(ctx, slot, batch, one(in), one(out), grad_scale, backward_next, key);
}

void GptStage::backward(Context& ctx, int slot, const std::vector<Tensor>& dout, const std::vector<Tensor>& din,
                        bool defer_weight_grads) {
  chunk_.backward(ctx, slot, one(dout), one(din), defer_weight_grads);
}

double GptStage::forward_eval(Context& ctx, const Tensor& batch, const std::vector<Tensor>& in,
                              const std::vector<Tensor>& out, int64_t valid) {
  return chunk_.forward_eval(ctx, batch, one(in), one(out), valid);
}

}  // namespace troupe
