// The op interface: every op of the GPT model, forward and backward side by side, on Tensors.
// Shapes are written beside each argument; B batch, T sequence, C channels, H heads, hs = C/H,
// N = B*T rows, V real vocabulary, Vp padded vocabulary (>= V), P max positions.
//
// Conventions: f32 and f64 tensors are accepted (f64 exists for the finite-difference tests); all
// tensors of one call share dtype and device. Gradients of parameters accumulate (+=) so micro-
// batches add up; gradients of activations overwrite unless the name says "accumulate". Every op is
// deterministic: reductions run in a fixed order that does not depend on the number of threads.
// Preconditions are checked (TROUPE_CHECK); a violated one is a bug in the caller.
#pragma once
#include <vector>

#include "kernels/context.hpp"
#include "kernels/tensor.hpp"

namespace troupe::ops {

// ---- token + position embedding -------------------------------------------------------------
// out[b,t,:] = wte[tokens[b,t],:] + wpe[pos0 + t,:]
void embedding_forward(Context& ctx, const Tensor& out /*(B,T,C)*/, const Tensor& tokens /*(B,T) i32*/,
                       const Tensor& wte /*(Vp,C)*/, const Tensor& wpe /*(P,C)*/);
// dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[t,:] += sum_b dout[b,t,:]
void embedding_backward(Context& ctx, const Tensor& dwte /*(Vp,C)*/, const Tensor& dwpe /*(P,C)*/,
                        const Tensor& dout /*(B,T,C)*/, const Tensor& tokens /*(B,T) i32*/);

// ---- LayerNorm over the last dimension ------------------------------------------------------
void layernorm_forward(Context& ctx, const Tensor& out /*(N,C)*/, const Tensor& mean /*(N)*/,
                       const Tensor& rstd /*(N)*/, const Tensor& x /*(N,C)*/,
                       const Tensor& weight /*(C)*/, const Tensor& bias /*(C)*/, double eps);
// dx += ...  (accumulates: the residual stream's gradient flows through it), dweight += , dbias +=
void layernorm_backward(Context& ctx, const Tensor& dx_accumulate /*(N,C)*/, const Tensor& dweight /*(C)*/,
                        const Tensor& dbias /*(C)*/, const Tensor& dout /*(N,C)*/, const Tensor& x /*(N,C)*/,
                        const Tensor& weight /*(C)*/, const Tensor& mean /*(N)*/, const Tensor& rstd /*(N)*/);

// ---- linear: out = x W^T + b (W stored (out_features, in_features), as Megatron/torch) ---------
void linear_forward(Context& ctx, const Tensor& out /*(N,O)*/, const Tensor& x /*(N,I)*/,
                    const Tensor& weight /*(O,I)*/, const Tensor& bias /*(O) or undefined*/);
// dx = dout W (skipped when dx is undefined); dweight += dout^T x; dbias += sum_n dout
void linear_backward(Context& ctx, const Tensor& dx /*(N,I) or undefined*/, const Tensor& dweight /*(O,I)*/,
                     const Tensor& dbias /*(O) or undefined*/, const Tensor& dout /*(N,O)*/,
                     const Tensor& x /*(N,I)*/, const Tensor& weight /*(O,I)*/);

// ---- GELU, GPT-2's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -----------------
void gelu_forward(Context& ctx, const Tensor& out /*(N)*/, const Tensor& x /*(N)*/);
// dx = dout * gelu'(x); dx may alias dout
void gelu_backward(Context& ctx, const Tensor& dx /*(N)*/, const Tensor& dout /*(N)*/, const Tensor& x /*(N)*/);

// ---- residual add ---------------------------------------------------------------------------
// out = a + b (out may alias a or b). Its backward is the identity into both inputs: callers pass the
// same gradient on, or use add_inplace to merge two gradient streams.
void residual_forward(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);
void add_inplace(Context& ctx, const Tensor& dst, const Tensor& src);  // dst += src

// ---- causal multi-head self-attention -------------------------------------------------------
// qkv holds [q | k | v] along the last dim, head h in columns [h*hs, (h+1)*hs) of each part.
// probs keeps softmax(q k^T / sqrt(hs)) with the causal mask (zeros above the diagonal) for backward.
void attention_forward(Context& ctx, const Tensor& out /*(B,T,C)*/, const Tensor& probs /*(B,H,T,T)*/,
                       const Tensor& qkv /*(B,T,3C)*/, int n_head);
void attention_backward(Context& ctx, const Tensor& dqkv /*(B,T,3C)*/, const Tensor& dout /*(B,T,C)*/,
                        const Tensor& qkv /*(B,T,3C)*/, const Tensor& probs /*(B,H,T,T)*/, int n_head);

// ---- fused softmax + cross-entropy over the vocabulary ----------------------------------------
// Only the first `valid` columns of each row are the real vocabulary; the padding columns [valid, Vp)
// are masked out of the softmax, so the loss never depends on the padding. losses[n] =
// logsumexp(logits[n, :valid]) - logits[n, targets[n]]. When grad_scale != 0 the logits are
// overwritten in place by d(grad_scale * sum_n losses[n]) / d logits (zeros in the padding columns):
// the backward is fused into the forward so no second (N, Vp) buffer exists. Without a gradient the
// logits are left as scratch values.
void softmax_cross_entropy(Context& ctx, const Tensor& losses /*(N)*/, const Tensor& logits /*(N,Vp)*/,
                           const Tensor& targets /*(N) i32*/, int64_t valid, double grad_scale);

// ---- optimizer ------------------------------------------------------------------------------
struct AdamWParams {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;  // 1-based, for the bias corrections 1 - beta^step
};
// AdamW (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)
void adamw_update(Context& ctx, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const AdamWParams& p);

// Sum of squares of all elements, accumulated in double in a fixed order.
double sum_squares(Context& ctx, const Tensor& t);
void scale_inplace(Context& ctx, const Tensor& t, double factor);
// Global L2 norm over all tensors; when max_norm > 0 and the norm exceeds it, scales every tensor by
// max_norm / (norm + 1e-6) (Megatron's rule). Returns the norm before clipping.
double clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm);

}  // namespace troupe::ops
