// The transformer on one shard, every family GptConfig describes: its parameters (flat storage, one
// view per ParamSpec), their gradients, the activations of one micro-batch, and forward/backward built
// from kernels/ops. Nothing is split or scheduled; the parallel model (model/gpt_chunk.hpp) is held to
// it. One block, written from the published architectures (GPT-2, LLaMA, BLOOM):
//   x0 = wte[tokens] (+ wpe[t] when learned_absolute);  BLOOM: x0 = LayerNorm_embd(x0)
//   per layer: a = norm_1(x);  qkv = a W_attn^T (+ b)  ((H + 2G) hs columns [q | k | v])
//              rope: q, k rotated per head (rotate-half or interleaved pairs, rotary_dim of hs dims)
//              att = softmax(q k^T / sqrt(hs) (+ ALiBi slope_h (j - i)), causal) v, head h reading
//                    key/value group h / (H/G)
//              x = x + att W_proj^T (+ b);  m = norm_2(x);  u = m W_fc^T (+ b)  (F, or SwiGLU's 2F)
//              x = x + act(u) W_fcproj^T (+ b)  (act: GELU (tanh), or silu(gate) * up)
//   y = norm_f(x);  logits = y wte^T (tied) or y lm_head^T (untied);  loss = cross-entropy over V
// norm: LayerNorm (weight, bias) or RMSNorm (weight). Parameters are found by their names
// (model/params.hpp), so the spec order is the specs' own.
//
// The output head is fused with the loss: the logits are computed, turned into their gradient and
// consumed in row chunks, so no (tokens x vocabulary) buffer bigger than one chunk exists. Training
// therefore runs forward and backward in one call (forward_backward); evaluation runs forward_loss.
//
// GPT-2 (the config's defaults) runs exactly the kernels it ran before the families existed, so its
// results are bitwise what they were.
//
// Dropout (the config's hidden_dropout, attention_dropout; the embedding's after BLOOM's ln_embd):
// forward_backward applies it with the masks of `key`, computed by the reference's own transcription
// of the rule (reference/dropout.hpp) and, for the attention probabilities, a plain attention of its
// own (grouped-query, ALiBi); forward_loss never drops.
// With both probabilities 0 the model runs exactly the kernels it ran before dropout existed.
//
// Not thread-safe: one shard (actor) owns a GptModel and calls it from its own thread.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/ops.hpp"
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
  // Views of this layer's parameters and gradients; absent ones (RMSNorm biases, bias-free linears)
  // are undefined tensors, which the ops take as "no bias".
  struct Layer {
    Tensor ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };
  // Indices into specs_ of the model's parameters by role; -1: the config has none.
  struct Index {
    int wte = -1, wpe = -1, ln_embd_w = -1, ln_embd_b = -1, lnf_w = -1, lnf_b = -1, lm_head = -1;
    std::vector<std::array<int, 12>> layers;  // in Layer's member order
  };
  struct LayerActs {  // saved for backward; rows = N = B*T
    Tensor ln1, ln1_mean, ln1_rstd;  // (N,C) (N) (N)   (RMSNorm: mean unused)
    Tensor qkv;                      // (N,(H+2G)hs), q and k rotated with rope
    Tensor probs;                    // (B,H,T,T)
    Tensor att;                      // (N,H hs) attention output before c_proj
    Tensor res1;                     // (N,C) x + attn
    Tensor ln2, ln2_mean, ln2_rstd;  // (N,C) (N) (N)
    Tensor fc;                       // (N,F) before GELU; SwiGLU: (N,2F) [gate | up]
    Tensor fc_gelu;                  // (N,F) the activation's output
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
  static Tensor at(const std::vector<Tensor>& from, int index) { return index >= 0 ? from[index] : Tensor(); }
  // a = norm(x) with LayerNorm (w, b, mean, rstd) or RMSNorm (w, rstd); dx += its backward.
  void norm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                    const Tensor& w, const Tensor& b) const;
  void norm_backward(Context& ctx, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                     const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) const;
  // The general attention's layout of the whole model (every head, its groups, ALiBi slopes).
  ops::AttentionLayout attention_layout() const;
  // GPT-2's attention: the int-n_head kernels of before the families (bitwise as they were).
  bool plain_attention() const;

  GptConfig config_;
  int max_micro_batch_;
  DType dtype_;
  int64_t padded_vocab_;
  std::vector<ParamSpec> specs_;
  Index index_;
  Tensor flat_params_, flat_grads_;
  std::vector<Tensor> params_, grads_;

  // Activations, allocated for max_micro_batch_ rows groups and viewed per call.
  Tensor inputs_, targets_;                // (Bmax*T) i32
  Tensor embed_;                           // (Nmax,C) block 0 input
  Tensor embed_raw_, embed_mean_, embed_rstd_, dembed_raw_;  // BLOOM: (Nmax,C) before ln_embd, its stats
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
