// A custom loss head for GPT, written as a user would against include/troupe/stage.hpp only: an
// untied output layer (its own weight, not the token embedding's) with PaLM's z-loss,
//   loss per token = logsumexp(logits) - logit[target] + z * logsumexp(logits)^2,
// vocabulary-parallel: the weight (Vp, C) is split over the tensor-parallel ranks by rows, each rank
// computes its block of logits, and the row max, the sum of exponentials and the target logit are
// all-reduced (Megatron's vocabulary-parallel cross-entropy). Vp is the vocabulary rounded up to a
// multiple of 64, the same on every layout; padding columns are masked out of the softmax.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include <troupe/stage.hpp>

namespace example {

class ZLossHead final : public troupe::Stage {
 public:
  // GPT's width and vocabulary come from the place; B * seq_length rows per micro-batch.
  explicit ZLossHead(const troupe::StagePlace& at, double z = 1e-4)
      : at_(at), C_(at.hidden_size), V_(at.vocab_size), Vp_((at.vocab_size + 63) / 64 * 64), z_(z) {
    T_ = at.record_length - 1;
    N_ = at.micro_batch * T_;
    Vl_ = Vp_ / at.tp_size;
    v0_ = at.tp_rank * Vl_;
  }

  std::vector<troupe::TensorDecl> inputs() const override { return {{"hidden", {N_, C_}}}; }
  std::vector<troupe::TensorDecl> outputs() const override { return {}; }
  std::vector<troupe::ParamDecl> parameters() const override {
    troupe::ParamDecl w;
    w.name = "zloss_head.weight";
    w.shape = {Vp_, C_};
    w.tp_split_dim = 0;  // vocabulary-parallel
    w.init_std = 0.02;
    return {w};
  }
  bool reads_batch() const override { return true; }  // the targets
  bool has_loss() const override { return true; }

  double forward(troupe::StageContext& ctx, const troupe::ForwardArgs& a) override {
    const float* h = static_cast<const float*>(a.inputs[0].data);
    const float* W = a.params[0].data;
    std::vector<float> logits(static_cast<size_t>(N_ * Vl_));
    ctx.gemm(false, true, N_, Vl_, C_, 1.0f, h, C_, W, C_, 0.0f, logits.data(), Vl_);
    // Row max over the real vocabulary, then the sum of exponentials and the target's logit.
    std::vector<double> mx(N_, -INFINITY), se(N_, 0.0), tl(N_, 0.0);
    for (int64_t n = 0; n < N_; ++n)
      for (int64_t j = 0; j < Vl_ && v0_ + j < V_; ++j) mx[n] = std::max(mx[n], double(logits[n * Vl_ + j]));
    ctx.all_reduce(mx.data(), N_, troupe::StageContext::Reduce::max);
    for (int64_t n = 0; n < N_; ++n) {
      for (int64_t j = 0; j < Vl_ && v0_ + j < V_; ++j) se[n] += std::exp(double(logits[n * Vl_ + j]) - mx[n]);
      const int64_t t = target(a.batch, n);
      if (t >= v0_ && t < v0_ + Vl_) tl[n] = logits[n * Vl_ + (t - v0_)];
    }
    ctx.all_reduce(se.data(), N_);
    ctx.all_reduce(tl.data(), N_);
    double loss = 0;
    std::vector<double> lse(N_);
    for (int64_t n = 0; n < N_; ++n) {
      lse[n] = mx[n] + std::log(se[n]);
      if (n / T_ < a.valid_samples) loss += lse[n] - tl[n] + z_ * lse[n] * lse[n];
    }
    if (a.slot >= 0) saved_[a.slot] = Saved{h, std::move(logits), std::move(lse)};
    return loss;
  }

  void backward(troupe::StageContext& ctx, const troupe::BackwardArgs& a) override {
    auto it = saved_.find(a.slot);
    Saved s = std::move(it->second);
    saved_.erase(it);
    // d loss / d logit_j = (1 + 2 z lse) softmax_j - [j == target], scaled; padding columns get 0.
    std::vector<float>& g = s.logits;
    for (int64_t n = 0; n < N_; ++n) {
      const double dlse = 1.0 + 2.0 * z_ * s.lse[n];
      const int64_t t = target(a.batch, n);
      for (int64_t j = 0; j < Vl_; ++j) {
        double d = 0;
        if (v0_ + j < V_) d = dlse * std::exp(double(g[n * Vl_ + j]) - s.lse[n]) - (v0_ + j == t ? 1.0 : 0.0);
        g[n * Vl_ + j] = static_cast<float>(d * a.loss_scale);
      }
    }
    const float* W = a.params[0].data;
    ctx.gemm(true, false, Vl_, C_, N_, 1.0f, g.data(), Vl_, s.hidden, C_, 1.0f, a.param_grads[0].data, C_);  // dW +=
    float* dh = static_cast<float*>(a.input_grads[0].data);
    ctx.gemm(false, false, N_, C_, Vl_, 1.0f, g.data(), Vl_, W, C_, 0.0f, dh, C_);  // this rank's share
    ctx.all_reduce(dh, N_ * C_);
  }

 private:
  struct Saved {
    const float* hidden;
    std::vector<float> logits;
    std::vector<double> lse;
  };
  int64_t target(const troupe::View<const int32_t>& batch, int64_t n) const {
    const int64_t b = n / T_, t = n % T_;
    return batch[b * (T_ + 1) + t + 1];  // the next token
  }
  troupe::StagePlace at_;
  int64_t C_, V_, Vp_, T_ = 0, N_ = 0, Vl_ = 0, v0_ = 0;
  double z_;
  std::map<int, Saved> saved_;
};

// GPT's layers as troupe train splits them, with the z-loss head after the last one.
inline troupe::Model gpt_with_zloss_head(const troupe::TrainConfig& cfg) {
  troupe::Model m = troupe::gpt_model(cfg, /*with_head=*/false);
  m.stages.back().push_back(troupe::Block::custom(
      "zloss_head", [](const troupe::StagePlace& at) { return std::make_unique<ZLossHead>(at); }));
  return m;
}

}  // namespace example
