#include "model/custom_stage.hpp"

#include <map>
#include <stdexcept>

#include "kernels/cpu/gemm.hpp"
#include "troupe/check.hpp"

namespace troupe {

View<float> TensorView::f32() const {
  if (type != ElementType::f32) throw std::logic_error("TensorView::f32 of an i32 tensor");
  return View<float>{static_cast<float*>(data), shape};
}

View<int32_t> TensorView::i32() const {
  if (type != ElementType::i32) throw std::logic_error("TensorView::i32 of an f32 tensor");
  return View<int32_t>{static_cast<int32_t*>(data), shape};
}

View<const float> ConstTensorView::f32() const {
  if (type != ElementType::f32) throw std::logic_error("ConstTensorView::f32 of an i32 tensor");
  return View<const float>{static_cast<const float*>(data), shape};
}

View<const int32_t> ConstTensorView::i32() const {
  if (type != ElementType::i32) throw std::logic_error("ConstTensorView::i32 of an f32 tensor");
  return View<const int32_t>{static_cast<const int32_t*>(data), shape};
}

ParamSpec custom_param_spec(const ParamDecl& d, int tp_size, int tp_rank) {
  ParamSpec s;
  s.name = d.name;
  s.global_shape = Shape(d.shape.begin(), d.shape.end());
  s.local_shape = s.global_shape;
  s.init = d.init == ParamDecl::Init::zeros ? InitKind::zeros
           : d.init == ParamDecl::Init::ones ? InitKind::ones
                                             : InitKind::normal;
  s.init_std = d.init_std;
  s.weight_decay = d.weight_decay;
  s.tp_split_dim = d.tp_split_dim;
  if (d.tp_split_dim >= 0) {
    TROUPE_CHECK(d.tp_split_dim < s.global_shape.rank() && s.global_shape[d.tp_split_dim] % tp_size == 0,
                 "custom_param_spec: " + d.name + " cannot be split over the tensor-parallel ranks");
    const int64_t extent = s.global_shape[d.tp_split_dim] / tp_size;
    Shape local;
    for (int i = 0; i < s.global_shape.rank(); ++i) local.push_back(i == d.tp_split_dim ? extent : s.global_shape[i]);
    s.local_shape = local;
    s.slice.dim = d.tp_split_dim;
    s.slice.offsets = {tp_rank * extent};
    s.slice.extents = {extent};
  }
  return s;
}

BoundaryDecl boundary_decl(const TensorDecl& d) {
  return BoundaryDecl{d.name, Shape(d.shape.begin(), d.shape.end()), d.type == ElementType::i32 ? DType::i32 : DType::f32,
                      d.requires_grad && d.type == ElementType::f32};
}

namespace {

ElementType element_type(DType t) { return t == DType::i32 ? ElementType::i32 : ElementType::f32; }

std::vector<int64_t> dims(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

TensorView view_of(const Tensor& t) {
  if (!t.defined()) return {};
  return TensorView{t.raw(), dims(t.shape()), element_type(t.dtype())};
}

std::vector<TensorView> views_of(const std::vector<Tensor>& ts) {
  std::vector<TensorView> out;
  for (const Tensor& t : ts) out.push_back(view_of(t));
  return out;
}

// Read-only views (forward's inputs, backward's output gradients).
std::vector<ConstTensorView> const_views_of(const std::vector<Tensor>& ts) {
  std::vector<ConstTensorView> out;
  for (const Tensor& t : ts) {
    const TensorView v = view_of(t);
    out.push_back(ConstTensorView{v.data, v.shape, v.type});
  }
  return out;
}

// What the user's stage may call: the rank's TP group and compute threads.
class Calls final : public StageContext {
 public:
  Calls(comm::Communicator* tp, int tp_rank, int tp_size) : tp_(tp), rank_(tp_rank), size_(tp_size) {}
  void bind(Context& ctx) { ctx_ = &ctx; }
  int tp_rank() const override { return rank_; }
  int tp_size() const override { return size_; }
  void all_reduce(float* data, int64_t n, Reduce op) override { reduce(data, n, DType::f32, op); }
  void all_reduce(double* data, int64_t n, Reduce op) override { reduce(data, n, DType::f64, op); }
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
            int64_t ldb, float beta, float* C, int64_t ldc) override {
    TROUPE_CHECK(ctx_ != nullptr && ctx_->pool != nullptr, "StageContext::gemm outside a call");
    cpu::gemm<float>(*ctx_->pool, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

 private:
  void reduce(void* data, int64_t n, DType t, Reduce op) {
    if (tp_ == nullptr || size_ == 1 || n == 0) return;
    comm::wait_or_throw(tp_->all_reduce(data, static_cast<size_t>(n), t,
                                        op == Reduce::max ? comm::ReduceOp::max : comm::ReduceOp::sum),
                        "a custom stage's tensor-parallel all-reduce", comm::WaitGroup::tp);
  }
  comm::Communicator* tp_;
  int rank_, size_;
  Context* ctx_ = nullptr;
};

}  // namespace

struct CustomStage::Impl {
  std::unique_ptr<troupe::Stage> user;
  StagePlace place;
  Calls calls;
  UnitHooks hooks;
  bool recompute = false;
  Tensor params, grads;  // the unit's resident parameters / own gradients (either may be undefined)
  std::vector<int64_t> offsets;  // of each spec in the unit
  struct Saved {
    Tensor batch;
    double loss_scale = 0;
    std::vector<Tensor> inputs;  // recompute: copies of the inputs
    // Between a split backward and its weight pass: the output gradients (the engine keeps the
    // slot's buffers until the weight pass).
    bool awaiting_weight = false;
    std::vector<Tensor> dout;
  };
  std::map<int, Saved> saved;
  std::vector<Tensor> scratch_out;  // recompute: the second forward's outputs
  std::string name;                 // the block's, for the probe
  OpProbe* probe = nullptr;

  void look(const std::string& tensor, ProbeDir dir, const Tensor& t) const {
    if (probe != nullptr && t.defined() && t.dtype() != DType::i32)
      probe->after(ProbePoint{kCustomProbe, tensor.c_str(), dir, name.c_str()}, t);
  }
  // The loss sum as the probe sees it (a fault may write it).
  double look_loss(double loss) const {
    if (probe == nullptr) return loss;
    Tensor t = Tensor::empty({1}, DType::f64);
    *t.data<double>() = loss;
    look("loss", ProbeDir::forward, t);
    return *t.data<double>();
  }
  void look_outputs(const std::vector<BoundaryDecl>& decls, const std::vector<Tensor>& out) const {
    for (size_t i = 0; i < out.size() && probe != nullptr; ++i) look(decls[i].name, ProbeDir::forward, out[i]);
  }

  Impl(std::unique_ptr<troupe::Stage> u, const StagePlace& at, comm::Communicator* tp, UnitHooks h, bool rc)
      : user(std::move(u)), place(at), calls(tp, at.tp_rank, at.tp_size), hooks(std::move(h)), recompute(rc) {}

  std::vector<View<const float>> param_views(const Tensor& flat, const std::vector<ParamSpec>& specs) const {
    std::vector<View<const float>> out;
    for (size_t i = 0; i < specs.size(); ++i)
      out.push_back({flat.data<float>() + offsets[i], dims(specs[i].local_shape)});
    return out;
  }
  std::vector<View<float>> grad_views(const Tensor& flat, const std::vector<ParamSpec>& specs) const {
    std::vector<View<float>> out;
    for (size_t i = 0; i < specs.size(); ++i) out.push_back({flat.data<float>() + offsets[i], dims(specs[i].local_shape)});
    return out;
  }
};

CustomStage::CustomStage(std::unique_ptr<troupe::Stage> user, const StagePlace& place, comm::Communicator* tp,
                         UnitHooks hooks, Recompute recompute, DType dtype, std::string name) {
  TROUPE_CHECK(user != nullptr, "CustomStage: the factory returned no stage");
  TROUPE_CHECK(dtype == DType::f32, "CustomStage: custom stages compute in f32");
  const bool own_params = !hooks.acquire_params, own_grads = !hooks.grad_buffer;
  impl_ = std::make_unique<Impl>(std::move(user), place, tp, std::move(hooks), recompute == Recompute::full);
  impl_->name = std::move(name);
  for (const TensorDecl& d : impl_->user->inputs()) inputs_.push_back(boundary_decl(d));
  for (const TensorDecl& d : impl_->user->outputs()) outputs_.push_back(boundary_decl(d));
  reads_batch_ = impl_->user->reads_batch();
  has_loss_ = impl_->user->has_loss();
  int64_t total = 0;
  UnitInfo unit;
  for (const ParamDecl& d : impl_->user->parameters()) {
    specs_.push_back(custom_param_spec(d, place.tp_size, place.tp_rank));
    impl_->offsets.push_back(total);
    unit.specs.push_back(static_cast<int>(specs_.size()) - 1);
    total += specs_.back().local_shape.numel();
  }
  unit.numel = total;
  if (total > 0) units_.push_back(unit);
  if (total > 0 && own_params) impl_->params = Tensor::zeros({total});
  if (total > 0 && own_grads) impl_->grads = Tensor::zeros({total});
  for (const BoundaryDecl& d : outputs_) impl_->scratch_out.push_back(Tensor::zeros(d.shape, d.dtype));
}

CustomStage::~CustomStage() = default;

Tensor CustomStage::unit_params(int) const { return impl_->params; }
Tensor CustomStage::unit_grads(int) const { return impl_->grads; }

bool CustomStage::counts_in_norm(int spec) const {
  return specs_[spec].tp_split_dim >= 0 || impl_->place.tp_rank == 0;  // replicas count once
}

void CustomStage::init(uint64_t seed) {
  if (!impl_->params.defined()) return;
  for (size_t i = 0; i < specs_.size(); ++i)
    init_parameter(specs_[i], seed,
                   impl_->params.rows(impl_->offsets[i], impl_->offsets[i] + specs_[i].local_shape.numel())
                       .view(specs_[i].local_shape));
}

void CustomStage::zero_grad() {
  if (impl_->grads.defined()) impl_->grads.zero_();
}

namespace {

// The unit's parameters for one call: the resident ones, or ZeRO-3's gathered copy (released after).
struct ParamsFor {
  const UnitHooks& hooks;
  Pass pass;
  bool acquired = false;
  Tensor values;
  ParamsFor(const UnitHooks& h, const Tensor& resident, bool any, Pass p) : hooks(h), pass(p) {
    if (any && hooks.acquire_params) {
      values = hooks.acquire_params(0, pass);
      acquired = true;
    } else {
      values = resident;
    }
  }
  ~ParamsFor() {
    if (acquired) hooks.release_params(0, pass);
  }
};

View<const int32_t> batch_view(const Tensor& batch) {
  if (!batch.defined()) return {};
  return {batch.data<int32_t>(), dims(batch.shape())};
}

}  // namespace

double CustomStage::forward(Context& ctx, int slot, const Tensor& batch, const std::vector<Tensor>& in,
                            const std::vector<Tensor>& out, double grad_scale, bool, const MicroBatchKey&) {
  Impl& m = *impl_;
  m.calls.bind(ctx);
  ParamsFor p(m.hooks, m.params, !units_.empty(), Pass::forward);
  ForwardArgs a;
  a.slot = m.recompute ? -1 : slot;
  if (!units_.empty()) a.params = m.param_views(p.values, specs_);
  a.batch = reads_batch_ ? batch_view(batch) : View<const int32_t>{};
  a.inputs = const_views_of(in);
  a.outputs = views_of(out);
  a.valid_samples = m.place.micro_batch;
  a.loss_scale = grad_scale;
  double loss = m.user->forward(m.calls, a);
  if (m.probe != nullptr) {
    m.look_outputs(outputs_, out);
    if (has_loss_) loss = m.look_loss(loss);
  }
  Impl::Saved& s = m.saved[slot];
  s = Impl::Saved{};  // a slot whose backward never came (a failed step) starts afresh
  s.batch = reads_batch_ ? batch : Tensor();
  s.loss_scale = grad_scale;
  if (m.recompute)
    for (const Tensor& t : in) s.inputs.push_back(t.clone());
  return loss;
}

void CustomStage::backward(Context& ctx, int slot, const std::vector<Tensor>& dout, const std::vector<Tensor>& din,
                           bool defer_weight_grads) {
  Impl& m = *impl_;
  m.calls.bind(ctx);
  auto it = m.saved.find(slot);
  TROUPE_CHECK(it != m.saved.end() && !it->second.awaiting_weight, "CustomStage: backward of a slot without a forward");
  const bool any = !units_.empty();
  const bool split = defer_weight_grads && any && m.user->splits_backward();
  Impl::Saved s = split ? it->second : std::move(it->second);
  if (!split) m.saved.erase(it);
  ParamsFor p(m.hooks, m.params, any, Pass::backward);
  const View<const int32_t> rows = reads_batch_ ? batch_view(s.batch) : View<const int32_t>{};
  if (m.recompute) {  // the forward again, now keeping what backward needs
    ForwardArgs a;
    a.slot = slot;
    if (any) a.params = m.param_views(p.values, specs_);
    a.batch = rows;
    a.inputs = const_views_of(s.inputs);
    a.outputs = views_of(m.scratch_out);
    a.valid_samples = m.place.micro_batch;
    a.loss_scale = s.loss_scale;
    const double loss = m.user->forward(m.calls, a);
    if (m.probe != nullptr) {  // the recomputation passes the forward's points again
      m.look_outputs(outputs_, m.scratch_out);
      if (has_loss_) (void)m.look_loss(loss);
    }
  }
  Tensor grads = any && !split ? (m.hooks.grad_buffer ? m.hooks.grad_buffer(0) : m.grads) : Tensor();
  BackwardArgs b;
  b.slot = slot;
  if (any) b.params = m.param_views(p.values, specs_);
  if (any && !split) b.param_grads = m.grad_views(grads, specs_);
  b.batch = rows;
  b.output_grads = const_views_of(dout);
  b.input_grads = views_of(din);
  b.loss_scale = s.loss_scale;
  b.weight_grads_later = split;
  m.user->backward(m.calls, b);
  if (m.probe != nullptr)
    for (size_t i = 0; i < din.size(); ++i) m.look(inputs_[i].name, ProbeDir::backward, din[i]);
  if (split) {  // the weight pass (backward_weight) comes later, on the same slot
    it->second.awaiting_weight = true;
    it->second.dout = dout;
    return;
  }
  if (any && m.probe != nullptr) m.look("params", ProbeDir::weight, grads);
  if (any && m.hooks.grads_ready) m.hooks.grads_ready(0, slot);
}

void CustomStage::backward_weight(Context& ctx, int slot) {
  Impl& m = *impl_;
  auto it = m.saved.find(slot);
  if (it == m.saved.end() || !it->second.awaiting_weight) return;  // computed in backward (no split)
  m.calls.bind(ctx);
  Impl::Saved s = std::move(it->second);
  m.saved.erase(it);
  ParamsFor p(m.hooks, m.params, true, Pass::backward);
  Tensor grads = m.hooks.grad_buffer ? m.hooks.grad_buffer(0) : m.grads;
  BackwardArgs b;
  b.slot = slot;
  b.params = m.param_views(p.values, specs_);
  b.param_grads = m.grad_views(grads, specs_);
  b.batch = reads_batch_ ? batch_view(s.batch) : View<const int32_t>{};
  b.output_grads = const_views_of(s.dout);
  b.loss_scale = s.loss_scale;
  m.user->backward_weight(m.calls, b);
  if (m.probe != nullptr) m.look("params", ProbeDir::weight, grads);
  if (m.hooks.grads_ready) m.hooks.grads_ready(0, slot);
}

double CustomStage::forward_eval(Context& ctx, const Tensor& batch, const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& out, int64_t valid) {
  Impl& m = *impl_;
  m.calls.bind(ctx);
  ParamsFor p(m.hooks, m.params, !units_.empty(), Pass::forward);
  ForwardArgs a;
  a.slot = -1;
  if (!units_.empty()) a.params = m.param_views(p.values, specs_);
  a.batch = reads_batch_ ? batch_view(batch) : View<const int32_t>{};
  a.inputs = const_views_of(in);
  a.outputs = views_of(out);
  a.valid_samples = valid < 0 ? m.place.micro_batch : valid;
  return m.user->forward(m.calls, a);
}

void CustomStage::set_probe(OpProbe* probe) { impl_->probe = probe; }

int64_t CustomStage::param_bytes() const {
  return impl_->params.defined() ? static_cast<int64_t>(impl_->params.nbytes()) : 0;
}
int64_t CustomStage::grad_bytes() const {
  return impl_->grads.defined() ? static_cast<int64_t>(impl_->grads.nbytes()) : 0;
}
int64_t CustomStage::activation_bytes() const {
  int64_t n = 0;
  for (const Tensor& t : impl_->scratch_out) n += static_cast<int64_t>(t.nbytes());
  for (const auto& [slot, s] : impl_->saved)
    for (const Tensor& t : s.inputs) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace troupe
