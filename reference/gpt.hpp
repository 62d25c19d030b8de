// The GPT-2 model on one shard: its parameters (flat storage, one view per ParamSpec), their
// gradients, the activations of one micro-batch, and forward/backward built from kernels/ops.
//
// The output head is tied to wte and fused with the loss: the logits are computed, turned into their
// gradient and consumed in row chunks, so no (tokens x vocabulary) buffer bigger than one chunk
// exists. Training therefore runs forward and backward in one call (forward_backward); evaluation
// runs forward_loss.
//
// Dropout (the config's hidden_dropout, attention_dropout): forward_backward applies it with the
// masks of `key`, computed by the reference's own transcription of the rule (reference/dropout.hpp)
// and, for the attention probabilities, a plain attention of its own; forward_loss never drops.
// With both probabilities 0 the model runs exactly the kernels it ran before dropout existed.
//
// Not thread-safe: one shard (actor) owns a GptModel and calls it from its own thread.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/tensor.hpp"
#include "troupe/model_config.hpp"
#include "model/dropout.hpp"
#include "model/params.hpp"

namespace troupe {

class GptModel {
 public:
  // Allocates parameters, gradients and activations for micro-batches of up to max_micro_batch
  // sequences of config.seq_length tokens. dtype f32 for training, f64 for gradient checks.
  GptModel(const GptConfig& config, int max_micro_batch, DType dtype = DType::f32);

  const GptConfig& config() const { return config_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const std::vector<Tensor>& params() const { return params_; }  // spec order, views of flat_params()
  const std::vector<Tensor>& grads() const { return grads_; }
  const Tensor& flat_params() const { return flat_params_; }
  const Tensor& flat_grads() const { return flat_grads_; }
  int max_micro_batch() const { return max_micro_batch_; }

  // Initial values from the seed in global coordinates (model/params.hpp).
  void init(uint64_t seed);
  void zero_grad();

  // One micro-batch: tokens (B, T+1) i32 windows, inputs tokens[:, :T], targets tokens[:, 1:].
  // Accumulates grad_scale * d(sum of token losses)/d(params) into grads() and returns the sum of the
  // B*T token losses (double). key: the dropout masks' key (used when the config has dropout).
  double forward_backward(Context& ctx, const Tensor& tokens, double grad_scale, const MicroBatchKey& key = {});
  // Forward only; returns the sum of the B*T token losses.
  double forward_loss(Context& ctx, const Tensor& tokens);

 private:
  struct Layer {  // views of this layer's parameters and gradients
    Tensor ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  struct LayerActs {  // saved for backward; rows = N = B*T
    Tensor ln1, ln1_mean, ln1_rstd;  // (N,C) (N) (N)
    Tensor qkv;                      // (N,3C)
    Tensor probs;                    // (B,H,T,T)
    Tensor att;                      // (N,C) attention output before c_proj
    Tensor res1;                     // (N,C) x + attn
    Tensor ln2, ln2_mean, ln2_rstd;  // (N,C) (N) (N)
    Tensor fc;                       // (N,4C) before GELU
    Tensor fc_gelu;                  // (N,4C)
    Tensor res2;                     // (N,C) block output
  };

  void split_tokens(const Tensor& tokens, int B);
  // Runs embedding, blocks and ln_f for B sequences; leaves ln_f's output in lnf_.
  void forward_trunk(Context& ctx, int B);
  // Loss head over ln_f's output in row chunks; with grad_scale != 0 also its backward into dlnf_.
  double head(Context& ctx, int B, double grad_scale);
  void backward_trunk(Context& ctx, int B);
  // x (N,C) rows of the micro-batch's B sequences *= their dropout factors at `site` of `layer`; nothing
  // when no training key is set (evaluation) or the hidden probability is 0.
  void drop_hidden(const Tensor& x, DropoutSite site, int layer) const;
  bool drops_attention() const { return key_ != nullptr && config_.attention_dropout > 0; }
  Layer layer_params(const std::vector<Tensor>& from, int layer) const;
  LayerActs acts_view(int layer, int B) const;

  GptConfig config_;
  int max_micro_batch_;
  DType dtype_;
  int64_t padded_vocab_;
  std::vector<ParamSpec> specs_;
  Tensor flat_params_, flat_grads_;
  std::vector<Tensor> params_, grads_;

  // Activations, allocated for max_micro_batch_ rows groups and viewed per call.
  Tensor inputs_, targets_;                // (Bmax*T) i32
  Tensor embed_;                           // (Nmax,C) block 0 input
  std::vector<LayerActs> acts_;            // full-size buffers
  Tensor lnf_, lnf_mean_, lnf_rstd_;       // (Nmax,C) (Nmax) (Nmax)
  Tensor logits_;                          // (chunk,Vp) one chunk of logits / their gradient
  Tensor losses_;                          // (Nmax)
  // Backward scratch shared by all layers.
  Tensor dres_, dln_, datt_, dqkv_, dfc_, dfc_gelu_, dlnf_;
  Tensor dbranch_;                         // (Nmax,C) a residual branch's output gradient, dropped
  const MicroBatchKey* key_ = nullptr;     // forward_backward's key during the call (null: no dropout)
};

}  // namespace troupe
