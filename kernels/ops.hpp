// The op interface: every op of the GPT model, forward and backward side by side, on Tensors.
// Shapes are written beside each argument; B batch, T sequence, C channels, H heads, hs = C/H,
// N = B*T rows, V real vocabulary, Vp padded vocabulary (>= V), P max positions.
//
// Conventions: every op computes in f32 or f64 (f64 exists for the finite-difference tests). A call is
// either all-f64, or f32 with any of its floating tensors in one 16-bit storage type (bf16 or f16,
// not both): 16-bit arguments are widened exactly to f32 temporaries, the f32 op runs, and every
// written 16-bit argument is rounded back to nearest even (docs/PRECISION.md; kernels/half.hpp). So an
// op's 16-bit result is bitwise RNE16(op32(widen(inputs))); arguments read and written (+= gradients,
// in-place ops) are widened first and narrowed after; aliased arguments stay aliased. Statistics (norm
// mean/rstd, losses) may be f32 beside 16-bit activations; the xent row statistics stay f64. The f32
// and f64 paths are unchanged by the layer. All tensors of one call share the device. Gradients of
// parameters accumulate (+=) so micro-batches add up; gradients of activations overwrite unless the
// name says "accumulate". Every op is deterministic: reductions run in a fixed order that does not
// depend on the number of threads.
// Preconditions are checked (TROUPE_CHECK); a violated one is a bug in the caller.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/dropout.hpp"
#include "kernels/tensor.hpp"

namespace troupe::cpu {
class PackedWeight;
}

namespace troupe::ops {

// ---- dtype conversion and overflow check (mixed precision) -------------------------------------
// dst = src element by element (same numel), any of f32, f64, bf16, f16 each way; narrowing rounds to
// nearest even in one rounding (kernels/half.hpp's rules); parallel over ctx.pool.
void convert(Context& ctx, const Tensor& dst, const Tensor& src);
// The number of Inf and NaN elements of a f32, f64, bf16 or f16 tensor (loss scaling's overflow check).
int64_t count_nonfinite(Context& ctx, const Tensor& t);

// ---- token + position embedding -------------------------------------------------------------
// out[b,t,:] = wte[tokens[b,t],:] + wpe[pos0 + t,:]
void embedding_forward(Context& ctx, const Tensor& out /*(B,T,C)*/, const Tensor& tokens /*(B,T) i32*/,
                       const Tensor& wte /*(Vp,C)*/, const Tensor& wpe /*(P,C)*/);
// dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[t,:] += sum_b dout[b,t,:]
void embedding_backward(Context& ctx, const Tensor& dwte /*(Vp,C)*/, const Tensor& dwpe /*(P,C)*/,
                        const Tensor& dout /*(B,T,C)*/, const Tensor& tokens /*(B,T) i32*/);

// ---- vocabulary-parallel token embedding: one shard's part (Megatron's VocabParallelEmbedding) ---
// The shard holds rows [vocab_begin, vocab_begin + Vl) of the padded table. Tokens outside them give
// zero rows, so summing every shard's `out` over the tensor-parallel group (the caller's all-reduce or
// reduce-scatter) gives the embedding. Exactly one shard passes wpe: the positions are then part of
// that sum (with one shard, out is bitwise embedding_forward's).
// out[b,t,:] = (tokens[b,t] held ? wte[tokens[b,t] - vocab_begin,:] : 0) + (wpe ? wpe[t,:] : 0)
void vocab_embedding_forward(Context& ctx, const Tensor& out /*(B,T,C)*/, const Tensor& tokens /*(B,T) i32*/,
                             const Tensor& wte /*(Vl,C)*/, int64_t vocab_begin,
                             const Tensor& wpe /*(P,C) or undefined*/);
// dwte[tokens[b,t] - vocab_begin,:] += dout[b,t,:] for held tokens;  dwpe[t,:] += sum_b dout[b,t,:]
// when dwpe is defined. dout is the full (all-gathered) gradient, identical on every shard.
void vocab_embedding_backward(Context& ctx, const Tensor& dwte /*(Vl,C)*/, const Tensor& dwpe /*(P,C) or undefined*/,
                              const Tensor& dout /*(B,T,C)*/, const Tensor& tokens /*(B,T) i32*/,
                              int64_t vocab_begin);

// ---- LayerNorm over the last dimension ------------------------------------------------------
void layernorm_forward(Context& ctx, const Tensor& out /*(N,C)*/, const Tensor& mean /*(N)*/,
                       const Tensor& rstd /*(N)*/, const Tensor& x /*(N,C)*/,
                       const Tensor& weight /*(C)*/, const Tensor& bias /*(C)*/, double eps);
// dx += ...  (accumulates: the residual stream's gradient flows through it), dweight += , dbias +=.
// The two halves can run apart (split backward): dx undefined skips the input gradient (then weight
// may be undefined too); dweight and dbias undefined skip the parameter gradients. Either way each
// result is bitwise what the full call computes.
void layernorm_backward(Context& ctx, const Tensor& dx_accumulate /*(N,C)*/, const Tensor& dweight /*(C)*/,
                        const Tensor& dbias /*(C)*/, const Tensor& dout /*(N,C)*/, const Tensor& x /*(N,C)*/,
                        const Tensor& weight /*(C)*/, const Tensor& mean /*(N)*/, const Tensor& rstd /*(N)*/);

// ---- RMSNorm over the last dimension (LLaMA): out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps)
void rmsnorm_forward(Context& ctx, const Tensor& out /*(N,C)*/, const Tensor& rstd /*(N)*/, const Tensor& x /*(N,C)*/,
                     const Tensor& weight /*(C)*/, double eps);
// dx += ... (accumulates, as layernorm_backward), dweight += . Split halves as layernorm_backward: dx
// undefined skips the input gradient, dweight undefined the parameter gradient; each bitwise the full call's.
void rmsnorm_backward(Context& ctx, const Tensor& dx_accumulate /*(N,C)*/, const Tensor& dweight /*(C)*/,
                      const Tensor& dout /*(N,C)*/, const Tensor& x /*(N,C)*/, const Tensor& weight /*(C)*/,
                      const Tensor& rstd /*(N)*/);

// ---- linear: out = x W^T + b (W stored (out_features, in_features), as Megatron/torch) ---------
void linear_forward(Context& ctx, const Tensor& out /*(N,O)*/, const Tensor& x /*(N,I)*/,
                    const Tensor& weight /*(O,I)*/, const Tensor& bias /*(O) or undefined*/);
// The same with W packed once (cpu::PackedWeight of W (O,I): kernels/cpu/gemm_packed.hpp, for weights
// that stay as they are, as a decoder's): f32 x, out and bias on the CPU, cpu::packed_gemm_kernel()
// not none. Each element is the fused multiply-adds in k order (+ b): bitwise on every CPU and pool.
void linear_forward_packed(Context& ctx, const Tensor& out /*(N,O)*/, const Tensor& x /*(N,I)*/,
                           const cpu::PackedWeight& weight /*(O,I)*/, const Tensor& bias /*(O) or undefined*/);
// dx = dout W (skipped when dx is undefined); dweight += dout^T x (skipped when dweight is
// undefined; then x may be undefined); dbias += sum_n dout. Split backward runs the dx half and the
// dweight/dbias half apart (the latter without the weight); each result is bitwise the full call's.
void linear_backward(Context& ctx, const Tensor& dx /*(N,I) or undefined*/,
                     const Tensor& dweight /*(O,I) or undefined*/, const Tensor& dbias /*(O) or undefined*/,
                     const Tensor& dout /*(N,O)*/, const Tensor& x /*(N,I) or undefined*/,
                     const Tensor& weight /*(O,I), or undefined without dx*/);

// ---- GELU, GPT-2's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -----------------
void gelu_forward(Context& ctx, const Tensor& out /*(N)*/, const Tensor& x /*(N)*/);
// dx = dout * gelu'(x); dx may alias dout
void gelu_backward(Context& ctx, const Tensor& dx /*(N)*/, const Tensor& dout /*(N)*/, const Tensor& x /*(N)*/);

// ---- gated linear units: each row of gate_up holds [gate (F) | up (F)] (Megatron's fc1 halves) ----
// swiglu: out = silu(gate) * up, silu(x) = x / (1 + exp(-x));  geglu: out = gelu_tanh(gate) * up.
enum class GluKind : uint8_t { swiglu, geglu };
void glu_forward(Context& ctx, const Tensor& out /*(N,F)*/, const Tensor& gate_up /*(N,2F)*/, GluKind kind);
// dgate_up = d(out)/d(gate_up) applied to dout (overwrites)
void glu_backward(Context& ctx, const Tensor& dgate_up /*(N,2F)*/, const Tensor& dout /*(N,F)*/,
                  const Tensor& gate_up /*(N,2F)*/, GluKind kind);

// ---- rotary position embedding (RoPE), in place on n_heads heads of head_dim columns ----------
// The heads start at column col0 of x (B,T,W) (q: col0 0; k: col0 H*hs of a fused qkv). For
// position p = pos0 + t and pair i < rotary_dim/2, angle = p * base^(-2i / rotary_dim) (computed in
// double); the pair is (x[i], x[i + rotary_dim/2]) (rotate-half: Hugging Face, Megatron's default)
// or (x[2i], x[2i+1]) (interleaved: Meta's original, Megatron's --rotary-interleaved), rotated
// (a, b) -> (a cos - b sin, b cos + a sin). Dims [rotary_dim, head_dim) pass through (--rotary-percent).
struct RotaryParams {
  int rotary_dim = 0;     // even, <= head_dim
  double base = 10000;    // --rotary-base
  bool interleaved = false;
  int64_t pos0 = 0;       // position of t = 0
  // Context parallelism: the position of each t (T of them; a rank's rows are not one range), used
  // instead of pos0 + t; empty: pos0 + t. CPU only.
  std::vector<int64_t> positions;
};
void rotary_forward(Context& ctx, const Tensor& x /*(B,T,W)*/, int64_t col0, int n_heads, int head_dim,
                    const RotaryParams& p);
// The backward is the inverse rotation (angle -> -angle), in place on the gradient, same arguments.
void rotary_backward(Context& ctx, const Tensor& dx /*(B,T,W)*/, int64_t col0, int n_heads, int head_dim,
                     const RotaryParams& p);

// ---- residual add ---------------------------------------------------------------------------
// out = a + b (out may alias a or b). Its backward is the identity into both inputs: callers pass the
// same gradient on, or use add_inplace to merge two gradient streams.
void residual_forward(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);
void add_inplace(Context& ctx, const Tensor& dst, const Tensor& src);  // dst += src

// ---- dropout (kernels/dropout.hpp: the mask rule) ---------------------------------------------
// In place on rows [row0, row0 + rows) of a micro-batch's (B*T, C) activation, row g = b*T + t being
// element t*C + c of sample mask.first_sample + b: x *= factor. The backward is the same call on the
// gradient (same mask, same scale). mask.p must be > 0 (callers skip the op at p = 0).
// positions (context parallelism, CPU only): row g is at position positions[g % seq_len] of its
// sequence (seq_len: the rows a sequence has here, positions' size) instead of g % seq_len.
void dropout_rows(Context& ctx, const Tensor& x /*(rows,C)*/, const DropoutMask& mask, int64_t row0,
                  int64_t seq_len, const std::vector<int64_t>& positions = {});

// ---- causal multi-head self-attention -------------------------------------------------------
// qkv holds [q | k | v] along the last dim, head h in columns [h*hs, (h+1)*hs) of each part.
// probs keeps softmax(q k^T / sqrt(hs)) with the causal mask (zeros above the diagonal) for backward.
// Attention dropout (mask.p > 0): out = dropout(probs) v, where probability (b, h, i, j) is element
// ((head0 + h) T + i) T + j of sample mask.first_sample + b (head0: the first head this call holds
// of the model's, for tensor parallelism). probs stays the softmax before dropout; the backward
// regenerates the mask from the same arguments (nothing else is stored). mask.p == 0: none.
void attention_forward(Context& ctx, const Tensor& out /*(B,T,C)*/, const Tensor& probs /*(B,H,T,T)*/,
                       const Tensor& qkv /*(B,T,3C)*/, int n_head, const DropoutMask& mask = {},
                       int64_t head0 = 0);
void attention_backward(Context& ctx, const Tensor& dqkv /*(B,T,3C)*/, const Tensor& dout /*(B,T,C)*/,
                        const Tensor& qkv /*(B,T,3C)*/, const Tensor& probs /*(B,H,T,T)*/, int n_head,
                        const DropoutMask& mask = {}, int64_t head0 = 0);

// ---- the general form: grouped-query attention (GQA/MQA), any head size, ALiBi ----------------
// qkv holds [q (H*hs) | k (G*hs) | v (G*hs)] along the last dim; query head h uses key/value group
// h / (H/G). out is (B,T,H*hs). ALiBi (BLOOM): score(i, j) = q_i.k_j / sqrt(hs) + slope_h * (j - i)
// before the causal softmax; with ALiBi, probabilities below exp(-80) (f64: exp(-700)) times the row's
// largest are stored as 0 (no subnormal numbers). The backward needs no slopes (a constant bias leaves
// the softmax's backward unchanged); with G < H it allocates a scratch of 2 B (H-G) T hs elements (the
// dK, dV of each group's other heads, summed in head order after all heads ran). The int-n_head
// overloads above are this with G = H, hs = C/H, no ALiBi, bitwise.
struct AttentionLayout {
  int n_head = 0;    // query heads this call holds
  int n_group = 0;   // key/value groups this call holds, dividing n_head; 0: n_head
  int head_dim = 0;  // 0: out's last dim / n_head
  std::vector<double> alibi_slopes;  // one per held head, or empty: no ALiBi
};
void attention_forward(Context& ctx, const Tensor& out /*(B,T,H*hs)*/, const Tensor& probs /*(B,H,T,T)*/,
                       const Tensor& qkv /*(B,T,(H+2G)*hs)*/, const AttentionLayout& layout,
                       const DropoutMask& mask = {}, int64_t head0 = 0);
void attention_backward(Context& ctx, const Tensor& dqkv /*(B,T,(H+2G)*hs)*/, const Tensor& dout /*(B,T,H*hs)*/,
                        const Tensor& qkv /*(B,T,(H+2G)*hs)*/, const Tensor& probs /*(B,H,T,T)*/,
                        const AttentionLayout& layout, const DropoutMask& mask = {}, int64_t head0 = 0);
// What attention_forward keeps for attention_backward in its `probs` argument, allocated for ctx's
// backend: the CPU keeps the (B,H,T,T) softmax in the activations' dtype; the CUDA backend (flash
// attention: no (T,T) matrix) each row's log-sum-exp, (B,H,T) f32.
Tensor attention_saved_tensor(Context& ctx, int64_t B, int64_t H, int64_t T, DType activations);
// The ALiBi slopes of a model's n_heads heads (Press et al.; BLOOM's rule): n a power of 2:
// slope_h = 2^(-8 (h+1) / n); otherwise the slopes of the power of 2 below n, then every other slope of
// twice that power for the remaining heads. Tensor-parallel rank r takes heads [head0, head0 + H/t).
std::vector<double> alibi_slopes(int n_heads);

// ---- blockwise causal attention (context parallelism) ------------------------------------------
// A rank's queries meet the keys and values one block at a time (context parallelism's ring), with
// flash attention's online softmax. Positions are global: query row i of the block sits at qpos[i]
// of a sequence of seq_len rows, key row j at kpos[j]; key j is seen by query i when kpos[j] <=
// qpos[i] (causal); ALiBi adds slope_h * (kpos[j] - qpos[i]); attention dropout keeps element
// ((head0 + h) * seq_len + qpos[i]) * seq_len + kpos[j] of the sample, as attention_forward does over
// the whole sequence. So a query block that meets every key block (in any order) and is finished
// equals attention_forward's rows at qpos up to rounding, and the backward's dQ and the dK, dV summed
// over the query blocks equal attention_backward's. All tensors f32, or all f64 (the gradient checks).
struct AttentionBlock {
  AttentionLayout layout;     // this rank's heads and key/value groups (head_dim required)
  int64_t seq_len = 0;        // the whole sequence: the dropout element's T
  std::vector<int64_t> qpos;  // (Tq) global positions of the query rows
  std::vector<int64_t> kpos;  // (Tk) global positions of the key/value rows
};
// The running state of a query block, per (b, head, row): m the largest visible score so far, l the
// sum of exp(score - m), acc the sum of exp(score - m) * dropout factor * v. begin: m = -inf, l = 0,
// acc = 0.
void attention_block_begin(Context& ctx, const Tensor& acc /*(B,Tq,H*hs)*/, const Tensor& m /*(B,H,Tq)*/,
                           const Tensor& l /*(B,H,Tq)*/);
// Adds key/value block kv (rows [k (G*hs) | v (G*hs)]) to the state of the queries in qkv's q part.
void attention_block_forward(Context& ctx, const Tensor& acc /*(B,Tq,H*hs)*/, const Tensor& m /*(B,H,Tq)*/,
                             const Tensor& l /*(B,H,Tq)*/, const Tensor& qkv /*(B,Tq,(H+2G)*hs)*/,
                             const Tensor& kv /*(B,Tk,2G*hs)*/, const AttentionBlock& block,
                             const DropoutMask& mask = {}, int64_t head0 = 0);
// out = acc / l; lse = m + log(l), each row's log-sum-exp, which the backward reads.
void attention_block_finish(Context& ctx, const Tensor& out /*(B,Tq,H*hs)*/, const Tensor& lse /*(B,H,Tq)*/,
                            const Tensor& acc, const Tensor& m, const Tensor& l);
// delta = rowsum(dout * out) per head (accumulated in double): the softmax backward's row term.
void attention_block_delta(Context& ctx, const Tensor& delta /*(B,H,Tq)*/, const Tensor& dout /*(B,Tq,H*hs)*/,
                           const Tensor& out /*(B,Tq,H*hs)*/);
// One key/value block's share of the backward: dq += (B,Tq,H*hs), dkv += (B,Tk,2G*hs) (the block's dK,
// dV, which travel back to its owner). A group's query heads add into its dK, dV in head order.
void attention_block_backward(Context& ctx, const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                              const Tensor& delta, const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                              const AttentionBlock& block, const DropoutMask& mask = {}, int64_t head0 = 0);
// Decoding (model/decoder_shard.cpp): several sequences' new rows attend to their key/value caches in
// one pass over the pool. Sequence i's rows [row0[i], row0[i+1]) of qkv (its q part) are the last of
// the sequence, at positions kv_len[i] - Tq_i ...; each sees, causally, the first kv_len[i] rows of
// kv[i] ([k (G*hs) | v (G*hs)] rows), with the layout's ALiBi and grouped-query. out (R, H*hs) gets
// the rows' attention: bit for bit what attention_block_begin, _forward and _finish give over each
// sequence alone, with one task per (sequence, head, row tile). fp32 qkv and out on the CPU; the
// caches f32, or all bf16 or all f16 (a 16-bit decoder's: each task widens its group's keys and values,
// exactly, so the result is what the f32 kernel gives on the widened caches, without widening whole
// caches every step).
void attention_cached_forward(Context& ctx, const Tensor& out /*(R,H*hs)*/, const Tensor& qkv /*(R,(H+2G)*hs)*/,
                              const std::vector<int64_t>& row0, const std::vector<Tensor>& kv,
                              const std::vector<int64_t>& kv_len, const AttentionLayout& layout);

// ---- fused softmax + cross-entropy over the vocabulary ----------------------------------------
// Only the first `valid` columns of each row are the real vocabulary; the padding columns [valid, Vp)
// are masked out of the softmax, so the loss never depends on the padding. losses[n] =
// logsumexp(logits[n, :valid]) - logits[n, targets[n]]. When grad_scale != 0 the logits are
// overwritten in place by d(grad_scale * sum_n losses[n]) / d logits (zeros in the padding columns):
// the backward is fused into the forward so no second (N, Vp) buffer exists. Without a gradient the
// logits are left as scratch values.
void softmax_cross_entropy(Context& ctx, const Tensor& losses /*(N)*/, const Tensor& logits /*(N,Vp)*/,
                           const Tensor& targets /*(N) i32*/, int64_t valid, double grad_scale);

// ---- vocabulary-parallel softmax + cross-entropy, in pieces -----------------------------------
// A shard holds the logits' columns [vocab_begin, vocab_begin + Vl); its first `valid` local columns
// (0 <= valid <= Vl) are real vocabulary, the rest padding (masked). kernels/ knows no communication,
// so the caller combines the shards between the pieces (Megatron's vocab-parallel cross-entropy):
//   xent_local_stats          row_max, target_logit           -> all-reduce max over row_max
//   xent_exp_sum              sum_exp                         -> all-reduce sum over sum_exp and
//                                                                target_logit
//   xent_loss                 losses (identical on every shard)
//   xent_backward             the gradient of the local columns (after recomputing the logits, or
//                             on the logits xent_exp_sum left)
// The row statistics are f64 (exact for max and target: they hold one logit). With one shard each
// result is bitwise softmax_cross_entropy's.
// row_max[n] = max_{j < valid} logits[n,j] (-inf when valid == 0);
// target_logit[n] = logits[n, targets[n] - vocab_begin] when the shard holds a real target column, else 0.
void xent_local_stats(Context& ctx, const Tensor& row_max /*(N) f64*/, const Tensor& target_logit /*(N) f64*/,
                      const Tensor& logits /*(N,Vl)*/, const Tensor& targets /*(N) i32*/, int64_t vocab_begin,
                      int64_t valid);
// logits[n,j] = exp(logits[n,j] - row_max[n]) for j < valid (row_max: the all-reduced maximum);
// sum_exp[n] = sum over those j, accumulated in double. Padding columns are left as they are.
void xent_exp_sum(Context& ctx, const Tensor& sum_exp /*(N) f64*/, const Tensor& logits /*(N,Vl)*/,
                  const Tensor& row_max /*(N) f64*/, int64_t valid);
// losses[n] = row_max[n] + log(sum_exp[n]) - target_logit[n]  (all three reduced over the shards)
void xent_loss(Context& ctx, const Tensor& losses /*(N)*/, const Tensor& row_max /*(N) f64*/,
               const Tensor& sum_exp /*(N) f64*/, const Tensor& target_logit /*(N) f64*/);
// In place, from the raw logits: logits[n,j] = grad_scale * (exp(logits[n,j] - row_max[n]) / sum_exp[n]
// - [j == targets[n] - vocab_begin]) for j < valid, 0 in the padding columns: d(grad_scale * sum_n
// losses[n]) / d logits on this shard's columns.
void xent_backward(Context& ctx, const Tensor& logits /*(N,Vl)*/, const Tensor& row_max /*(N) f64*/,
                   const Tensor& sum_exp /*(N) f64*/, const Tensor& targets /*(N) i32*/, int64_t vocab_begin,
                   int64_t valid, double grad_scale);

// ---- optimizer ------------------------------------------------------------------------------
struct AdamWParams {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;  // 1-based, for the bias corrections 1 - beta^step
};
// AdamW (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p). Each of
// param, grad, exp_avg, exp_avg_sq may be f32 or the call's 16-bit type (mixed precision keeps f32
// master weights and moments beside a 16-bit gradient; a 16-bit param or moment is rounded back).
void adamw_update(Context& ctx, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const AdamWParams& p);

// Sum of squares of all elements, accumulated in double in a fixed order (a 16-bit tensor: of its
// exactly widened values). scale_inplace and clip_grad_norm take 16-bit tensors too (rounded back).
double sum_squares(Context& ctx, const Tensor& t);
void scale_inplace(Context& ctx, const Tensor& t, double factor);
// Global L2 norm over all tensors; when max_norm > 0 and the norm exceeds it, scales every tensor by
// max_norm / (norm + 1e-6) (Megatron's rule). Returns the norm before clipping.
double clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm);

}  // namespace troupe::ops
