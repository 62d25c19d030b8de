// A non-GPT model made of custom stages, written as a user would against include/troupe/stage.hpp
// only: a classifier MLP on samples of F integer features in 0..255 followed by a label,
//   input   h = tanh(W_in x + b_in), x = feature / 128 - 1      W_in (H, F) split by rows over TP
//   hidden  h = tanh(W h + b)                                   W (H, H) split by columns over TP
//   head    softmax cross-entropy over K classes                W_out (K, H) replicated
// The label travels from the input block through every stage as an integer tensor without
// gradient, beside the f32 activations. Tensor parallelism: the input block computes its rows of
// h and all-reduces the zero-padded rest; a hidden block multiplies its columns of h and
// all-reduces the partial sums (Megatron's row-parallel layer); every output is whole on every rank.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <troupe/stage.hpp>

namespace example {

struct MlpShape {
  int64_t features = 0, hidden = 0, classes = 0;
};

inline std::vector<troupe::TensorDecl> mlp_boundary(int64_t B, const MlpShape& s) {
  troupe::TensorDecl h{"h", {B, s.hidden}};
  troupe::TensorDecl label{"label", {B}, troupe::ElementType::i32, false};
  return {h, label};
}

inline troupe::ParamDecl mlp_param(std::string name, std::vector<int64_t> shape, int split, bool bias) {
  troupe::ParamDecl p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.tp_split_dim = split;
  p.init = bias ? troupe::ParamDecl::Init::zeros : troupe::ParamDecl::Init::normal;
  p.init_std = 0.3;
  p.weight_decay = !bias;
  return p;
}

class MlpInput final : public troupe::Stage {
 public:
  MlpInput(const troupe::StagePlace& at, MlpShape s) : at_(at), s_(s), B_(at.micro_batch) {
    Hl_ = s.hidden / at.tp_size;
    h0_ = at.tp_rank * Hl_;
  }
  std::vector<troupe::TensorDecl> inputs() const override { return {}; }
  std::vector<troupe::TensorDecl> outputs() const override { return mlp_boundary(B_, s_); }
  std::vector<troupe::ParamDecl> parameters() const override {
    return {mlp_param("mlp.in.weight", {s_.hidden, s_.features}, 0, false), mlp_param("mlp.in.bias", {s_.hidden}, 0, true)};
  }
  bool reads_batch() const override { return true; }

  double forward(troupe::StageContext& ctx, const troupe::ForwardArgs& a) override {
    const std::vector<float> x = features(a.batch);
    std::vector<float> y(static_cast<size_t>(B_ * Hl_));
    ctx.gemm(false, true, B_, Hl_, s_.features, 1.0f, x.data(), s_.features, a.params[0].data, s_.features, 0.0f, y.data(), Hl_);
    float* h = static_cast<float*>(a.outputs[0].data);
    std::fill(h, h + B_ * s_.hidden, 0.0f);
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t j = 0; j < Hl_; ++j) h[b * s_.hidden + h0_ + j] = std::tanh(y[b * Hl_ + j] + a.params[1][j]);
    ctx.all_reduce(h, B_ * s_.hidden);  // the other ranks' rows (zero here)
    int32_t* label = static_cast<int32_t*>(a.outputs[1].data);
    const int64_t R = s_.features + 1;
    for (int64_t b = 0; b < B_; ++b) label[b] = static_cast<int32_t>(a.batch[b * R + s_.features] % s_.classes);
    if (a.slot >= 0) out_[a.slot] = h;  // stays valid until backward(slot)
    return 0;
  }

  void backward(troupe::StageContext& ctx, const troupe::BackwardArgs& a) override {
    const float* h = out_.at(a.slot);
    out_.erase(a.slot);
    const float* dh = static_cast<const float*>(a.output_grads[0].data);
    std::vector<float> dy(static_cast<size_t>(B_ * Hl_));
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t j = 0; j < Hl_; ++j) {
        const float v = h[b * s_.hidden + h0_ + j];
        dy[b * Hl_ + j] = dh[b * s_.hidden + h0_ + j] * (1.0f - v * v);
        a.param_grads[1][j] += dy[b * Hl_ + j];
      }
    const std::vector<float> x = features(a.batch);
    ctx.gemm(true, false, Hl_, s_.features, B_, 1.0f, dy.data(), Hl_, x.data(), s_.features, 1.0f, a.param_grads[0].data,
             s_.features);
  }

 private:
  std::vector<float> features(const troupe::View<const int32_t>& batch) const {
    const int64_t F = s_.features, R = F + 1;
    std::vector<float> x(static_cast<size_t>(B_ * F));
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t f = 0; f < F; ++f) x[b * F + f] = static_cast<float>(batch[b * R + f]) / 128.0f - 1.0f;
    return x;
  }
  troupe::StagePlace at_;
  MlpShape s_;
  int64_t B_, Hl_ = 0, h0_ = 0;
  std::map<int, const float*> out_;
};

class MlpHidden final : public troupe::Stage {
 public:
  MlpHidden(const troupe::StagePlace& at, MlpShape s, int index) : at_(at), s_(s), index_(index), B_(at.micro_batch) {
    Hl_ = s.hidden / at.tp_size;
    c0_ = at.tp_rank * Hl_;
  }
  std::vector<troupe::TensorDecl> inputs() const override { return mlp_boundary(B_, s_); }
  std::vector<troupe::TensorDecl> outputs() const override { return mlp_boundary(B_, s_); }
  std::vector<troupe::ParamDecl> parameters() const override {
    const std::string p = "mlp.hidden." + std::to_string(index_);
    return {mlp_param(p + ".weight", {s_.hidden, s_.hidden}, 1, false), mlp_param(p + ".bias", {s_.hidden}, -1, true)};
  }

  double forward(troupe::StageContext& ctx, const troupe::ForwardArgs& a) override {
    const int64_t H = s_.hidden;
    const float* x = static_cast<const float*>(a.inputs[0].data);
    float* h = static_cast<float*>(a.outputs[0].data);
    // This rank's columns of x times its columns of W, summed over the ranks.
    ctx.gemm(false, true, B_, H, Hl_, 1.0f, x + c0_, H, a.params[0].data, Hl_, 0.0f, h, H);
    ctx.all_reduce(h, B_ * H);
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t j = 0; j < H; ++j) h[b * H + j] = std::tanh(h[b * H + j] + a.params[1][j]);
    std::copy_n(static_cast<const int32_t*>(a.inputs[1].data), B_, static_cast<int32_t*>(a.outputs[1].data));
    if (a.slot >= 0) saved_[a.slot] = {x, h};
    return 0;
  }

  void backward(troupe::StageContext& ctx, const troupe::BackwardArgs& a) override {
    const int64_t H = s_.hidden;
    const auto [x, h] = saved_.at(a.slot);
    saved_.erase(a.slot);
    const float* dh = static_cast<const float*>(a.output_grads[0].data);
    std::vector<float> dy(static_cast<size_t>(B_ * H));
    for (int64_t i = 0; i < B_ * H; ++i) dy[i] = dh[i] * (1.0f - h[i] * h[i]);
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t j = 0; j < H; ++j) a.param_grads[1][j] += dy[b * H + j];
    ctx.gemm(true, false, H, Hl_, B_, 1.0f, dy.data(), H, x + c0_, H, 1.0f, a.param_grads[0].data, Hl_);
    float* dx = static_cast<float*>(a.input_grads[0].data);
    std::fill(dx, dx + B_ * H, 0.0f);
    ctx.gemm(false, false, B_, Hl_, H, 1.0f, dy.data(), H, a.params[0].data, Hl_, 0.0f, dx + c0_, H);
    ctx.all_reduce(dx, B_ * H);  // the other ranks' columns
  }

 private:
  troupe::StagePlace at_;
  MlpShape s_;
  int index_;
  int64_t B_, Hl_ = 0, c0_ = 0;
  std::map<int, std::pair<const float*, const float*>> saved_;
};

class MlpHead final : public troupe::Stage {
 public:
  MlpHead(const troupe::StagePlace& at, MlpShape s) : s_(s), B_(at.micro_batch) {}
  std::vector<troupe::TensorDecl> inputs() const override { return mlp_boundary(B_, s_); }
  std::vector<troupe::TensorDecl> outputs() const override { return {}; }
  std::vector<troupe::ParamDecl> parameters() const override {
    return {mlp_param("mlp.out.weight", {s_.classes, s_.hidden}, -1, false), mlp_param("mlp.out.bias", {s_.classes}, -1, true)};
  }
  bool has_loss() const override { return true; }

  double forward(troupe::StageContext& ctx, const troupe::ForwardArgs& a) override {
    const int64_t H = s_.hidden, K = s_.classes;
    const float* x = static_cast<const float*>(a.inputs[0].data);
    const int32_t* label = static_cast<const int32_t*>(a.inputs[1].data);
    std::vector<float> p(static_cast<size_t>(B_ * K));
    ctx.gemm(false, true, B_, K, H, 1.0f, x, H, a.params[0].data, H, 0.0f, p.data(), K);
    double loss = 0;
    for (int64_t b = 0; b < B_; ++b) {
      float* row = p.data() + b * K;
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < K; ++k) mx = std::max(mx, double(row[k] += a.params[1][k]));
      for (int64_t k = 0; k < K; ++k) sum += std::exp(double(row[k]) - mx);
      if (b < a.valid_samples) loss += mx + std::log(sum) - row[label[b]];
      for (int64_t k = 0; k < K; ++k) row[k] = static_cast<float>(std::exp(double(row[k]) - mx) / sum);  // softmax
    }
    if (a.slot >= 0) saved_[a.slot] = {x, label, std::move(p)};
    return loss;
  }

  void backward(troupe::StageContext& ctx, const troupe::BackwardArgs& a) override {
    const int64_t H = s_.hidden, K = s_.classes;
    Saved s = std::move(saved_.at(a.slot));
    saved_.erase(a.slot);
    std::vector<float>& g = s.probs;  // becomes d loss / d logits
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t k = 0; k < K; ++k) {
        g[b * K + k] = static_cast<float>((g[b * K + k] - (k == s.label[b] ? 1.0 : 0.0)) * a.loss_scale);
        a.param_grads[1][k] += g[b * K + k];
      }
    ctx.gemm(true, false, K, H, B_, 1.0f, g.data(), K, s.x, H, 1.0f, a.param_grads[0].data, H);
    ctx.gemm(false, false, B_, H, K, 1.0f, g.data(), K, a.params[0].data, H, 0.0f,
             static_cast<float*>(a.input_grads[0].data), H);
  }

 private:
  struct Saved {
    const float* x;
    const int32_t* label;
    std::vector<float> probs;
  };
  MlpShape s_;
  int64_t B_;
  std::map<int, Saved> saved_;
};

// The MLP with `hidden_blocks` hidden layers, its 2 + hidden_blocks blocks spread over
// `virtual_stages` in order (the first ones get one more), one loss term per sample.
inline troupe::Model mlp_model(const MlpShape& s, int hidden_blocks, int virtual_stages) {
  std::vector<troupe::Block> blocks;
  blocks.push_back(troupe::Block::custom("mlp.in", [s](const troupe::StagePlace& at) {
    return std::make_unique<MlpInput>(at, s);
  }));
  for (int i = 0; i < hidden_blocks; ++i)
    blocks.push_back(troupe::Block::custom("mlp.hidden." + std::to_string(i), [s, i](const troupe::StagePlace& at) {
      return std::make_unique<MlpHidden>(at, s, i);
    }));
  blocks.push_back(troupe::Block::custom("mlp.out", [s](const troupe::StagePlace& at) {
    return std::make_unique<MlpHead>(at, s);
  }));
  troupe::Model m;
  m.loss_terms_per_sample = 1;
  const int n = static_cast<int>(blocks.size());
  for (int k = 0, at = 0; k < virtual_stages; ++k) {
    const int take = n / virtual_stages + (k < n % virtual_stages ? 1 : 0);
    m.stages.emplace_back(blocks.begin() + at, blocks.begin() + at + take);
    at += take;
  }
  return m;
}

}  // namespace example
