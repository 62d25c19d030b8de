// One transformer layer of a GptChunk on one tensor-parallel rank (Megatron-LM's scheme):
//
//   res1 = x    + g(c_proj(attn(rope(c_attn(f(norm_1(x)))))))   c_attn column-parallel (own heads' q,
//   res2 = res1 + g(c_proj(act(c_fc(f(norm_2(res1))))))          k, v), c_fc column-parallel, both
//                                                                 c_proj row-parallel
// The family picks the pieces (GptConfig): norm LayerNorm or RMSNorm; rope only with rotary
// positions, on q and k right after c_attn (its inverse on dq, dk before c_attn's backward);
// attention with this rank's Hl query heads over Gl key/value groups (GQA/MQA), ALiBi biases of the
// rank's global heads; act GELU or SwiGLU on c_fc's [gate_r | up_r]; biases only with
// add_bias_linear. GPT-2 (LayerNorm, no rope, MHA, GELU, biases) calls exactly the ops it always did.
// Positions: every call holds whole sequences inside the TP region (sequence parallelism gathers the
// rows before c_attn; pipeline stages split layers, not sequences), so row b*T + t is at position t;
// under context parallelism each sequence's T rows here sit at global positions pos[t] (rotary,
// dropout), and attention is ring attention over the cp group (model/ring_attention.hpp).
//
// f enters a tensor-parallel region, g leaves it (their duals run in backward):
//                      forward                     backward
//   f   plain          identity                    all-reduce of the input gradient's partial sums
//   f   seq. parallel  all-gather the rows         reduce-scatter to this rank's rows
//   g   plain          all-reduce partial sums     identity (every rank has the whole gradient)
//   g   seq. parallel  reduce-scatter to own rows  all-gather the rows
// Outside the regions (norms, residual adds) a rank works on Nl rows: all N, or its block with
// sequence parallelism. A row-parallel bias is added by rank 0 inside its partial product, so the
// reduction adds it exactly once; with t = 1 this is GptModel's fused bias GEMM, bitwise.
//
// Dropout (model/dropout.hpp): on the attention probabilities inside the attention op, and on each
// branch's output (this rank's rows, after g) before the residual add; in backward the same masks
// go on the branch gradients after g's dual, which hold all N rows, and inside the attention op.
//
// The backward is split in two halves (zero-bubble schedules run them apart): the input pass makes
// d(layer input) and keeps, in a LayerStash, the output gradients the weight pass needs; the weight
// pass accumulates the parameter gradients from them. Each half calls the kernels GptModel calls
// (linear_backward and the norms' backward split into their dx and dweight halves), so the results
// are bitwise GptModel's at t = 1.
#include "kernels/ops.hpp"
#include "model/gpt_chunk_impl.hpp"

namespace troupe {

// ---- the family's ops ---------------------------------------------------------------------------

void GptChunk::Impl::norm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                  const Tensor& x, const Tensor& w, const Tensor& b) {
  const double eps = spec.model.layernorm_epsilon;
  if (rms) ops::rmsnorm_forward(ctx, out, rstd, x, w, eps);
  else ops::layernorm_forward(ctx, out, mean, rstd, x, w, b, eps);
}

void GptChunk::Impl::norm_backward(Context& ctx, const Tensor& dx, const Tensor& dw, const Tensor& db,
                                   const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                                   const Tensor& rstd) {
  if (rms) ops::rmsnorm_backward(ctx, dx, dw, dout, x, w, rstd);
  else ops::layernorm_backward(ctx, dx, dw, db, dout, x, w, mean, rstd);
}

// The probabilities (B,Hl,T,T) on the CPU, the rows' log-sum-exp (B,Hl,T) on the GPU (alloc_acts).
Tensor GptChunk::Impl::saved_view(const Tensor& probs) const {
  if (a2a) return probs.view({B, Hu, Tg, Tg});
  return probs.device() == Device::cuda || cps > 1 ? probs.view({B, Hl, T}) : probs.view({B, Hl, T, T});
}

namespace {
// x in f32 when it is 16-bit (a copy), else x itself.
Tensor widened(const Tensor& x) { return is_16bit(x.dtype()) ? x.to(DType::f32) : x; }
}  // namespace

void GptChunk::Impl::ring_core(Context& ctx, const Tensor& att /*(N,Al)*/, const Tensor& lse /*(B*Hl,T)*/,
                               const Tensor& qkv /*(N,QKVl)*/, int layer) {
  ring.mask = mask(DropoutSite::attention_probs, layer);
  ring.layer = layer;
  const Tensor in = widened(qkv).view({B, T, QKVl});
  const Tensor out = is_16bit(dtype) ? Tensor::empty({B, T, Al}, DType::f32) : att.view({B, T, Al});
  ring_attention_forward(ctx, *cp, ring, in, out, lse.view({B, Hl, T}));
  if (is_16bit(dtype)) att.copy_from(out.to(dtype).view({N, Al}));
}

void GptChunk::Impl::ring_core_backward(Context& ctx, const Tensor& dqkv /*(N,QKVl)*/, const Tensor& datt /*(N,Al)*/,
                                        const Tensor& qkv, const Tensor& lse, const Tensor& att, int layer) {
  ring.mask = mask(DropoutSite::attention_probs, layer);
  ring.layer = layer;
  const Tensor in = widened(qkv).view({B, T, QKVl}), out = widened(att).view({B, T, Al}),
               dout = widened(datt).view({B, T, Al});
  const Tensor dq = is_16bit(dtype) ? Tensor::empty({B, T, QKVl}, DType::f32) : dqkv.view({B, T, QKVl});
  ring_attention_backward(ctx, *cp, ring, in, out, lse.view({B, Hl, T}), dout, dq);
  if (is_16bit(dtype)) dqkv.copy_from(dq.to(dtype).view({N, QKVl}));
}

void GptChunk::Impl::attention_core(Context& ctx, const Tensor& att /*(N,Al)*/, const Tensor& probs,
                                    const Tensor& qkv /*(N,QKVl)*/, const Tensor& qkv_u, int layer) {
  if (a2a) return ulysses_core(ctx, att, probs, qkv, qkv_u, layer);
  if (cps > 1) return ring_core(ctx, att, probs, qkv, layer);
  const DropoutMask m = mask(DropoutSite::attention_probs, layer);
  const Tensor out = att.view({B, T, Al}), p = saved_view(probs), in = qkv.view({B, T, QKVl});
  ops::attention_forward(ctx, out, p, in, layout, m, int64_t{r} * Hl);
}

void GptChunk::Impl::attention_core_backward(Context& ctx, const Tensor& dqkv /*(N,QKVl)*/,
                                             const Tensor& datt /*(N,Al)*/, const Tensor& qkv, const Tensor& probs,
                                             const Tensor& att, const Tensor& qkv_u, int layer) {
  if (a2a) return ulysses_core_backward(ctx, dqkv, datt, qkv_u, probs, layer);
  if (cps > 1) return ring_core_backward(ctx, dqkv, datt, qkv, probs, att, layer);
  const DropoutMask m = mask(DropoutSite::attention_probs, layer);
  const Tensor dq = dqkv.view({B, T, QKVl}), dout = datt.view({B, T, Al}), in = qkv.view({B, T, QKVl}),
               p = saved_view(probs);
  ops::attention_backward(ctx, dq, dout, in, p, layout, m, int64_t{r} * Hl);
}

void GptChunk::Impl::rotate_qk(Context& ctx, const Tensor& qkv /*(N,QKVl)*/, bool inverse) {
  const Tensor x = qkv.view({B, T, QKVl});
  auto op = inverse ? &ops::rotary_backward : &ops::rotary_forward;
  op(ctx, x, 0, Hl, hs, rotary);        // q: this rank's heads, columns [0, Hl hs)
  op(ctx, x, Al, Gl, hs, rotary);       // k: its groups, columns [Hl hs, (Hl + Gl) hs)
}

// ---- the layer ------------------------------------------------------------------------------------

void GptChunk::Impl::layer_forward(Context& ctx, int layer, const Layer& p, const Tensor& x /*(Nl,C)*/,
                                   const LayerActs& a) {
  const Tensor none;
  constexpr ProbeDir F = ProbeDir::forward;
  // Attention branch.
  norm_forward(ctx, a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b);                 // (Nl,C)
  look(layer, "ln1", F, a.ln1);
  const Tensor ln1 = sp ? gathered : a.ln1;                                              // (N,C)
  gather_rows(a.ln1, ln1);                                                               // f
  ops::linear_forward(ctx, a.qkv, ln1, p.attn_w, p.attn_b);                              // (N,QKVl)
  look(layer, "attention_qkv", F, a.qkv);
  if (rope) {
    rotate_qk(ctx, a.qkv, false);
    look(layer, "attention_rotary", F, a.qkv);
  }
  attention_core(ctx, a.att, a.probs, a.qkv, a.qkv_u, layer);                            // (N,Al)
  look(layer, "attention_scores", F, a.probs);
  look(layer, "attention_output", F, a.att);
  const Tensor proj = sp ? partial : a.res1;                                             // (N,C) partial
  ops::linear_forward(ctx, proj, a.att, p.proj_w, r == 0 ? p.proj_b : none);
  reduce_rows(proj, a.res1);                                                             // g -> (Nl,C)
  look(layer, "attention_proj", F, a.res1);
  drop_rows(ctx, a.res1, DropoutSite::attention_output, layer, row0);
  ops::add_inplace(ctx, a.res1, x);
  look(layer, "residual1", F, a.res1);
  // MLP branch.
  norm_forward(ctx, a.ln2, a.ln2_mean, a.ln2_rstd, a.res1, p.ln2_w, p.ln2_b);                // (Nl,C)
  look(layer, "ln2", F, a.ln2);
  const Tensor ln2 = sp ? gathered : a.ln2;                                                   // (N,C)
  gather_rows(a.ln2, ln2);                                                                    // f
  if (a.moe) {  // an MoE layer (gpt_chunk_moe.cpp): its output is whole on every rank
    const Tensor moe = sp ? partial : a.res2;                                                 // (N,C) whole
    moe_forward(ctx, layer - spec.first_layer, layer, p, ln2, *a.moe, moe);
    if (sp) a.res2.copy_from(partial.rows(row0, row0 + Nl));                                  // this rank's rows
  } else {
    ops::linear_forward(ctx, a.fc, ln2, p.fc_w, p.fc_b);                                      // (N,FCl)
    look(layer, "mlp_fc1", F, a.fc);
    if (swiglu) {
      ops::glu_forward(ctx, a.fc_gelu, a.fc, ops::GluKind::swiglu);                          // (N,Fl)
      look(layer, "mlp_swiglu", F, a.fc_gelu);
    } else {
      ops::gelu_forward(ctx, a.fc_gelu, a.fc);
      look(layer, "mlp_gelu", F, a.fc_gelu);
    }
    const Tensor mlp = sp ? partial : a.res2;                                                 // (N,C) partial
    ops::linear_forward(ctx, mlp, a.fc_gelu, p.fcproj_w, r == 0 ? p.fcproj_b : none);
    reduce_rows(mlp, a.res2);                                                                 // g -> (Nl,C)
  }
  look(layer, "mlp_fc2", F, a.res2);
  drop_rows(ctx, a.res2, DropoutSite::mlp_output, layer, row0);
  ops::add_inplace(ctx, a.res2, a.res1);
  look(layer, "residual2", F, a.res2);
}

void GptChunk::Impl::layer_backward_input(Context& ctx, int layer, const Layer& p, const Tensor& x,
                                          const LayerActs& a, const Tensor& dres /*(Nl,C)*/, const LayerStash& st) {
  const Tensor none;
  constexpr ProbeDir Bk = ProbeDir::backward;
  // MLP branch: dres = d res2; the residual passes it on to res1, ln_2's backward adds the branch.
  gather_rows(dres, st.dy2);  // g's dual; without SP a copy, since dres changes below    (N,C)
  drop_rows(ctx, st.dy2, DropoutSite::mlp_output, layer, 0);  // d(c_proj output): the forward's mask
  look(layer, "residual2", Bk, st.dy2);
  const Tensor dln2 = sp ? partial : st.dln2;  // this rank's share of d(ln_2 output)       (N,C)
  if (a.moe) {
    moe_backward_input(ctx, layer - spec.first_layer, layer, p, Tensor(), *a.moe, st.dy2, *st.moe, dln2);
  } else {
    ops::linear_backward(ctx, dgelu, none, none, st.dy2, none, p.fcproj_w);                // (N,Fl)
    look(layer, "mlp_fc2", Bk, dgelu);
    if (swiglu) {
      ops::glu_backward(ctx, st.dfc, dgelu, a.fc, ops::GluKind::swiglu);                   // (N,FCl)
      look(layer, "mlp_swiglu", Bk, st.dfc);
    } else {
      ops::gelu_backward(ctx, st.dfc, dgelu, a.fc);                                        // (N,Fl)
      look(layer, "mlp_gelu", Bk, st.dfc);
    }
    ops::linear_backward(ctx, dln2, none, none, st.dfc, none, p.fc_w);
  }
  reduce_rows(dln2, st.dln2);                  // f's dual                                  (Nl,C)
  look(layer, "mlp_fc1", Bk, st.dln2);
  norm_backward(ctx, dres, none, none, st.dln2, a.res1, p.ln2_w, a.ln2_mean, a.ln2_rstd);
  look(layer, "ln2", Bk, dres);
  // Attention branch: dres = d res1, becomes d x.
  gather_rows(dres, st.dy1);                                                                // (N,C)
  drop_rows(ctx, st.dy1, DropoutSite::attention_output, layer, 0);
  look(layer, "residual1", Bk, st.dy1);
  ops::linear_backward(ctx, datt, none, none, st.dy1, none, p.proj_w);                     // (N,Al)
  look(layer, "attention_proj", Bk, datt);
  Tensor probs = a.probs, att = a.att;
  if (!probs.defined()) {
    // Selective recompute: the probabilities were not kept; the attention core is rebuilt from the
    // saved qkv, rotated already (same kernel, same inputs: bitwise the forward's).
    if (a2a) ulysses_recompute(ctx, rc.probs, a.qkv_u, layer);  // from the kept q, k, v: no all-to-all
    else attention_core(ctx, rc.att, rc.probs, a.qkv, Tensor(), layer);
    look(layer, "attention_scores", ProbeDir::forward, rc.probs);
    look(layer, "attention_output", ProbeDir::forward, rc.att);
    probs = rc.probs;
    att = rc.att;
  }
  attention_core_backward(ctx, st.dqkv, datt, a.qkv, probs, att, a.qkv_u, layer);                        // (N,QKVl)
  look(layer, "attention_scores", Bk, st.dqkv);
  if (rope) {  // d(c_attn output): the gradient of the rotated q, k rotated back
    rotate_qk(ctx, st.dqkv, true);
    look(layer, "attention_rotary", Bk, st.dqkv);
  }
  const Tensor dln1 = sp ? partial : st.dln1;                                               // (N,C)
  ops::linear_backward(ctx, dln1, none, none, st.dqkv, none, p.attn_w);
  reduce_rows(dln1, st.dln1);                                                               // (Nl,C)
  look(layer, "attention_qkv", Bk, st.dln1);
  norm_backward(ctx, dres, none, none, st.dln1, x, p.ln1_w, a.ln1_mean, a.ln1_rstd);
  look(layer, "ln1", Bk, dres);
}

void GptChunk::Impl::layer_backward_weight(Context& ctx, int layer, const Layer& g, const Tensor& x,
                                           const LayerActs& a, const LayerStash& st) {
  const Tensor none;
  constexpr ProbeDir W = ProbeDir::weight;
  // Column-parallel c_fc reads ln_2's output on all rows; sequence parallelism kept only this rank's
  // rows, so they are gathered again (as Megatron does) rather than kept N rows wide.
  const Tensor ln2 = sp ? gathered : a.ln2;
  gather_rows(a.ln2, ln2);
  if (a.moe) {
    moe_backward_weight(ctx, layer - spec.first_layer, layer, g, ln2, *a.moe, st.dy2, *st.moe);
  } else {
    // Row-parallel c_proj: dW from this rank's input columns; the replicated bias from all N rows of
    // d(output), which every rank holds alike, so its gradient is identical on every rank.
    ops::linear_backward(ctx, none, g.fcproj_w, g.fcproj_b, st.dy2, a.fc_gelu, none);
    look(layer, "mlp_fc2", W, g.fcproj_w);
    look(layer, "mlp_fc2", W, g.fcproj_b);
    ops::linear_backward(ctx, none, g.fc_w, g.fc_b, st.dfc, ln2, none);
    look(layer, "mlp_fc1", W, g.fc_w);
    look(layer, "mlp_fc1", W, g.fc_b);
  }
  ln_weight_grads(ctx, g.ln2_w, g.ln2_b, st.dln2, a.res1, a.ln2_mean, a.ln2_rstd);
  look(layer, "ln2", W, g.ln2_w);
  look(layer, "ln2", W, g.ln2_b);
  ops::linear_backward(ctx, none, g.proj_w, g.proj_b, st.dy1, a.att, none);
  look(layer, "attention_proj", W, g.proj_w);
  look(layer, "attention_proj", W, g.proj_b);
  const Tensor ln1 = sp ? gathered : a.ln1;
  gather_rows(a.ln1, ln1);
  ops::linear_backward(ctx, none, g.attn_w, g.attn_b, st.dqkv, ln1, none);
  look(layer, "attention_qkv", W, g.attn_w);
  look(layer, "attention_qkv", W, g.attn_b);
  ln_weight_grads(ctx, g.ln1_w, g.ln1_b, st.dln1, x, a.ln1_mean, a.ln1_rstd);
  look(layer, "ln1", W, g.ln1_w);
  look(layer, "ln1", W, g.ln1_b);
}

}  // namespace troupe
