#include "model/sequence_stage.hpp"

#include <algorithm>

#include "troupe/check.hpp"

namespace troupe {

namespace {

// Hooks of a block whose unit u is the sequence's unit base + u.
UnitHooks shifted(const UnitHooks& h, int base) {
  UnitHooks out;
  if (h.acquire_params) out.acquire_params = [f = h.acquire_params, base](int u, Pass p) { return f(base + u, p); };
  if (h.release_params) out.release_params = [f = h.release_params, base](int u, Pass p) { f(base + u, p); };
  if (h.grad_buffer) out.grad_buffer = [f = h.grad_buffer, base](int u) { return f(base + u); };
  if (h.grads_ready) out.grads_ready = [f = h.grads_ready, base](int u, int slot) { f(base + u, slot); };
  return out;
}


}  // namespace

std::vector<Tensor> boundary_tensors(const std::vector<BoundaryDecl>& decls, bool grads, Device device) {
  std::vector<Tensor> out;
  for (const BoundaryDecl& d : decls)
    out.push_back(!grads || d.requires_grad ? Tensor::zeros(d.shape, d.dtype, device) : Tensor());
  return out;
}

std::string describe(const std::vector<BoundaryDecl>& decls) {
  if (decls.empty()) return "nothing";
  std::string s;
  for (const BoundaryDecl& d : decls) {
    if (!s.empty()) s += ", ";
    s += d.name + " " + d.shape.str() + " " + dtype_name(d.dtype) + (d.requires_grad ? "" : " no-grad");
  }
  return s;
}

SequenceStage::SequenceStage(int blocks, const MakeBlock& make, const UnitHooks& hooks, int slots) : slots_(slots) {
  TROUPE_CHECK(blocks >= 2, "SequenceStage: a sequence of one block is that block");
  int units = 0;
  for (int i = 0; i < blocks; ++i) {
    unit_base_.push_back(units);
    spec_base_.push_back(static_cast<int>(specs_.size()));
    blocks_.push_back(make(i, shifted(hooks, units)));
    const PipelineStage& b = *blocks_.back();
    for (const UnitInfo& u : b.units()) {
      UnitInfo v = u;
      for (int& s : v.specs) s += spec_base_.back();
      units_.push_back(std::move(v));
    }
    specs_.insert(specs_.end(), b.specs().begin(), b.specs().end());
    units += static_cast<int>(b.units().size());
  }
  for (size_t i = 0; i + 1 < blocks_.size(); ++i) {
    TROUPE_CHECK(blocks_[i]->outputs() == blocks_[i + 1]->inputs(),
                 "SequenceStage: block " + std::to_string(i) + " gives " + describe(blocks_[i]->outputs()) +
                     " but block " + std::to_string(i + 1) + " takes " + describe(blocks_[i + 1]->inputs()));
    TROUPE_CHECK(!blocks_[i]->has_loss(), "SequenceStage: only the last block may have the loss");
    Joint j;
    for (int s = 0; s <= slots; ++s) {
      j.act.push_back(boundary_tensors(blocks_[i]->outputs(), false));
      j.grad.push_back(boundary_tensors(blocks_[i]->outputs(), true));
    }
    joints_.push_back(std::move(j));
  }
}

std::pair<int, int> SequenceStage::locate_unit(int unit) const {
  const int b = static_cast<int>(std::upper_bound(unit_base_.begin(), unit_base_.end(), unit) - unit_base_.begin()) - 1;
  return {b, unit - unit_base_[b]};
}

std::pair<int, int> SequenceStage::locate_spec(int spec) const {
  const int b = static_cast<int>(std::upper_bound(spec_base_.begin(), spec_base_.end(), spec) - spec_base_.begin()) - 1;
  return {b, spec - spec_base_[b]};
}

Tensor SequenceStage::unit_params(int unit) const {
  const auto [b, u] = locate_unit(unit);
  return blocks_[b]->unit_params(u);
}

Tensor SequenceStage::unit_grads(int unit) const {
  const auto [b, u] = locate_unit(unit);
  return blocks_[b]->unit_grads(u);
}

bool SequenceStage::counts_in_norm(int spec) const {
  const auto [b, s] = locate_spec(spec);
  return blocks_[b]->counts_in_norm(s);
}

std::vector<int> SequenceStage::tied_units() const {
  std::vector<int> out;
  for (size_t b = 0; b < blocks_.size(); ++b)
    for (int u : blocks_[b]->tied_units()) out.push_back(unit_base_[b] + u);
  return out;
}

void SequenceStage::init(uint64_t seed) {
  for (auto& b : blocks_) b->init(seed);
}

void SequenceStage::zero_grad() {
  for (auto& b : blocks_) b->zero_grad();
}

bool SequenceStage::reads_batch() const {
  return std::any_of(blocks_.begin(), blocks_.end(), [](const auto& b) { return b->reads_batch(); });
}

double SequenceStage::forward(Context& ctx, int slot, const Tensor& batch, const std::vector<Tensor>& in,
                              const std::vector<Tensor>& out, double grad_scale, bool backward_next,
                              const MicroBatchKey& key) {
  double loss = 0;
  const size_t n = blocks_.size();
  for (size_t i = 0; i < n; ++i) {
    const std::vector<Tensor>& x = i == 0 ? in : joints_[i - 1].act[slot];
    const std::vector<Tensor>& y = i + 1 == n ? out : joints_[i].act[slot];
    const Tensor& rows = blocks_[i]->reads_batch() ? batch : Tensor();
    loss += blocks_[i]->forward(ctx, slot, rows, x, y, grad_scale, backward_next && i + 1 == n, key);
  }
  return loss;
}

void SequenceStage::backward(Context& ctx, int slot, const std::vector<Tensor>& dout, const std::vector<Tensor>& din,
                             bool defer_weight_grads) {
  for (size_t i = blocks_.size(); i-- > 0;) {
    const std::vector<Tensor>& dy = i + 1 == blocks_.size() ? dout : joints_[i].grad[slot];
    const std::vector<Tensor>& dx = i == 0 ? din : joints_[i - 1].grad[slot];
    blocks_[i]->backward(ctx, slot, dy, dx, defer_weight_grads);
  }
}

void SequenceStage::backward_weight(Context& ctx, int slot) {
  for (size_t i = blocks_.size(); i-- > 0;) blocks_[i]->backward_weight(ctx, slot);
}

double SequenceStage::forward_eval(Context& ctx, const Tensor& batch, const std::vector<Tensor>& in,
                                   const std::vector<Tensor>& out, int64_t valid) {
  double loss = 0;
  const size_t n = blocks_.size();
  for (size_t i = 0; i < n; ++i) {
    const std::vector<Tensor>& x = i == 0 ? in : joints_[i - 1].act[slots_];
    const std::vector<Tensor>& y = i + 1 == n ? out : joints_[i].act[slots_];
    const Tensor& rows = blocks_[i]->reads_batch() ? batch : Tensor();
    loss += blocks_[i]->forward_eval(ctx, rows, x, y, valid);
  }
  return loss;
}

void SequenceStage::set_probe(OpProbe* probe) {
  for (auto& b : blocks_) b->set_probe(probe);
}

std::vector<MoeLayerStats> SequenceStage::take_moe_stats() {
  std::vector<MoeLayerStats> out;
  for (auto& b : blocks_)
    for (MoeLayerStats& st : b->take_moe_stats()) out.push_back(std::move(st));
  return out;
}

int64_t SequenceStage::param_bytes() const {
  int64_t n = 0;
  for (const auto& b : blocks_) n += b->param_bytes();
  return n;
}

int64_t SequenceStage::grad_bytes() const {
  int64_t n = 0;
  for (const auto& b : blocks_) n += b->grad_bytes();
  return n;
}

int64_t SequenceStage::activation_bytes() const {
  int64_t n = 0;
  for (const auto& b : blocks_) n += b->activation_bytes();
  for (const Joint& j : joints_)
    for (size_t s = 0; s < j.act.size(); ++s) {
      for (const Tensor& t : j.act[s]) n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
      for (const Tensor& t : j.grad[s]) n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
    }
  return n;
}

}  // namespace troupe
