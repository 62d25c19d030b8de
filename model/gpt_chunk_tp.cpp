// The tensor-parallel pieces of GptChunk: row collectives over the TP group, the vocabulary-parallel
// embedding and the fused vocabulary-parallel head (Megatron's VocabParallelEmbedding and
// vocab_parallel_cross_entropy).
//
// Embedding. Rank r holds rows [v0, v0 + Vl) of the padded table. Every rank looks up all N tokens
// (zero rows for tokens it does not hold) and rank 0 adds the positions (learned_absolute only), so
// the sum over the ranks (g: all-reduce, or reduce-scatter to own rows) is the embedding; with
// exactly one nonzero term per element the sum is exact, bitwise GptModel's e + p. With
// embed_layernorm (BLOOM) a LayerNorm follows on this rank's rows, before the embedding dropout (the
// placement of Megatron-DeepSpeed's --embed-layernorm, on the embedding output). Backward: the
// gradient of all N rows (the dual all-gather under sequence parallelism) scatters into the rows
// this rank holds; wpe's gradient is the same full sum on every rank.
//
// The head's weight is wte (tied, GPT-2's) or the untied lm_head, vocabulary-parallel the same way.
//
// Head. logits = ln_f(x) wte^T is column-parallel over the vocabulary: (N, Vl) per rank, processed in
// row chunks so no buffer of all N rows' logits exists. Per chunk the cross-entropy needs three
// reductions over the group: the row max (all-reduce max), then the sum of exponentials and the
// target logit (one all-reduce sum over both; the target logit is zero on the ranks not holding it,
// so that sum is exact). Padding columns (global index >= V) are masked out of every piece, so the
// loss does not depend on t. Forward keeps only the row statistics (max, sum of exponentials: 2N
// doubles); backward recomputes each chunk's logits with the same GEMM (bitwise the forward's) and
// forms grad_scale * (softmax - onehot) in place. That costs one extra (N x C x Vl) GEMM per
// backward but no (N, Vl) buffer per slot in flight; Megatron keeps the softmax instead.
// d(ln_f output) is a partial sum over the vocabulary blocks: f's dual reduces it.
#include <string>

#include "kernels/ops.hpp"
#include "model/gpt_chunk_impl.hpp"

namespace troupe {

namespace {

// The chunk's interface has no error channel: a failed TP collective (a lost peer) throws
// comm::CollectiveFailed, which ends the rank's actor with that message (its supervisors see it).
void wait_ok(const comm::WorkPtr& work, const char* what) {
  comm::wait_or_throw(work, std::string("the GPT layers' tensor-parallel ") + what, comm::WaitGroup::tp);
}

}  // namespace

// ---- row collectives ------------------------------------------------------------------------------

void GptChunk::Impl::all_reduce(const Tensor& x, comm::ReduceOp op) {
  if (t == 1) return;
  wait_ok(tp->all_reduce(x.raw(), static_cast<size_t>(x.numel()), x.dtype(), op), "all-reduce");
}

void GptChunk::Impl::gather_rows(const Tensor& local, const Tensor& full) {
  const int64_t width = full.numel() / N;
  TROUPE_CHECK(full.numel() == N * width && local.numel() == Nl * width, "gather_rows: (Nl,X) into (N,X)");
  if (!sp) {
    if (local.raw() != full.raw()) full.copy_from(local.view(full.shape()));
    return;
  }
  std::vector<size_t> counts(t);
  for (int q = 0; q < t; ++q) counts[q] = static_cast<size_t>(rows_of(q) * width);
  wait_ok(tp->all_gather_v(local.raw(), full.raw(), counts, full.dtype()), "all-gather");
}

void GptChunk::Impl::reduce_rows(const Tensor& full, const Tensor& local) {
  const int64_t width = full.numel() / N;
  TROUPE_CHECK(full.numel() == N * width && local.numel() == Nl * width, "reduce_rows: (N,X) into (Nl,X)");
  if (!sp) {
    all_reduce(full, comm::ReduceOp::sum);
    if (local.raw() != full.raw()) local.copy_from(full.view(local.shape()));
    return;
  }
  std::vector<size_t> counts(t);
  for (int q = 0; q < t; ++q) counts[q] = static_cast<size_t>(rows_of(q) * width);
  wait_ok(tp->reduce_scatter_v(full.raw(), local.raw(), counts, full.dtype(), comm::ReduceOp::sum), "reduce-scatter");
}

void GptChunk::Impl::ln_weight_grads(Context& ctx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                     const Tensor& x, const Tensor& mean, const Tensor& rstd, bool layernorm) {
  const Tensor none;
  auto weights = [&](const Tensor& w, const Tensor& b) {
    if (layernorm) ops::layernorm_backward(ctx, none, w, b, dout, x, none, mean, rstd);
    else norm_backward(ctx, none, w, b, dout, x, none, mean, rstd);
  };
  if (!sp) {
    weights(dw, db);
    return;
  }
  // This micro-batch's part over own rows, summed over the group, then accumulated: reducing the
  // accumulated buffer instead would count earlier micro-batches t times. RMSNorm has no bias row.
  const bool bias = db.defined();
  const Tensor both = ln_grads.rows(0, bias ? 2 : 1);
  both.zero_();
  const Tensor gw = ln_grads.rows(0, 1).view({C}), gb = bias ? ln_grads.rows(1, 2).view({C}) : Tensor();
  weights(gw, gb);
  all_reduce(both, comm::ReduceOp::sum);
  ops::add_inplace(ctx, dw, gw);
  if (bias) ops::add_inplace(ctx, db, gb);
}

// ---- vocabulary-parallel embedding ----------------------------------------------------------------

void GptChunk::Impl::embedding_forward(Context& ctx, const Tensor& wte /*(Vl,C)*/,
                                       const std::vector<Tensor>& e /*[wpe (P,C)] [ln_embd w, b (C)]*/,
                                       const Slot& s) {
  const Tensor sum = ln_embd ? s.emb : s.xs[0];  // (Nl,C) the embedding (ln_embd's input)
  const Tensor full = sp ? partial : sum;        // (N,C) this rank's term of the sum
  Tensor wpe = r == 0 && emb_wpe >= 0 ? e[static_cast<size_t>(emb_wpe)] : Tensor();
  if (wpe.defined() && cps > 1) {  // context parallelism: the rows of this rank's positions
    for (int64_t i = 0; i < T; ++i) wpe_rows.rows(i, i + 1).copy_from(wpe.rows(pos[i], pos[i] + 1));
    wpe = wpe_rows;
  }
  ops::vocab_embedding_forward(ctx, full.view({B, T, C}), s.inputs.view({B, T}), wte, v0, wpe);
  reduce_rows(full, sum);                        // g -> (Nl,C)
  if (ln_embd) {
    look(kEmbeddingProbe, "lookup", ProbeDir::forward, sum);
    ops::layernorm_forward(ctx, s.xs[0], s.emb_mean, s.emb_rstd, sum, e[static_cast<size_t>(emb_ln_w)],
                           e[static_cast<size_t>(emb_ln_b)], spec.model.layernorm_epsilon);
    look(kEmbeddingProbe, "ln_embd", ProbeDir::forward, s.xs[0]);
    drop_rows(ctx, s.xs[0], DropoutSite::embedding, 0, row0);
    return;
  }
  drop_rows(ctx, s.xs[0], DropoutSite::embedding, 0, row0);
  look(kEmbeddingProbe, "lookup", ProbeDir::forward, s.xs[0]);
}

void GptChunk::Impl::embedding_backward_input(Context& ctx, const std::vector<Tensor>& e, const Slot& s,
                                              const Tensor& demb /*(N,C)*/, const Tensor& dembln /*(Nl,C)*/) {
  if (!ln_embd) {
    gather_rows(dres, demb);                              // dual of the forward's all-reduce / reduce-scatter
    drop_rows(ctx, demb, DropoutSite::embedding, 0, 0);   // the forward's mask, on all N rows
    return;
  }
  // The mask of this rank's rows (dres is scratch), then ln_embd's backward on them, then the rows
  // gathered for the scatter into the vocabulary shard.
  drop_rows(ctx, dres, DropoutSite::embedding, 0, row0);
  dembln.copy_from(dres);                                 // d(ln_embd output): the weight pass's
  demb_ln.zero_();
  ops::layernorm_backward(ctx, demb_ln, Tensor(), Tensor(), dembln, s.emb, e[static_cast<size_t>(emb_ln_w)],
                          s.emb_mean, s.emb_rstd);
  look(kEmbeddingProbe, "ln_embd", ProbeDir::backward, demb_ln);
  gather_rows(demb_ln, demb);
}

void GptChunk::Impl::embedding_weight(Context& ctx, const Tensor& dwte, const std::vector<Tensor>& g,
                                      const Slot& s, const Tensor& demb /*(N,C)*/, const Tensor& dembln) {
  const Tensor dwpe = emb_wpe >= 0 ? g[static_cast<size_t>(emb_wpe)] : Tensor();
  if (dwpe.defined() && cps > 1) {  // context parallelism: this rank's positions' rows of dwpe
    dwpe_rows.zero_();
    ops::vocab_embedding_backward(ctx, dwte, dwpe_rows, demb.view({B, T, C}), s.inputs.view({B, T}), v0);
    for (int64_t i = 0; i < T; ++i) ops::add_inplace(ctx, dwpe.rows(pos[i], pos[i] + 1), dwpe_rows.rows(i, i + 1));
  } else {
    ops::vocab_embedding_backward(ctx, dwte, dwpe, demb.view({B, T, C}), s.inputs.view({B, T}), v0);
  }
  look(kEmbeddingProbe, "lookup", ProbeDir::weight, dwte);
  look(kEmbeddingProbe, "lookup", ProbeDir::weight, dwpe);
  if (ln_embd) {
    const Tensor dw = g[static_cast<size_t>(emb_ln_w)], db = g[static_cast<size_t>(emb_ln_b)];
    ln_weight_grads(ctx, dw, db, dembln, s.emb, s.emb_mean, s.emb_rstd, true);
    look(kEmbeddingProbe, "ln_embd", ProbeDir::weight, dw);
    look(kEmbeddingProbe, "ln_embd", ProbeDir::weight, db);
  }
}

// ---- vocabulary-parallel head ---------------------------------------------------------------------

double GptChunk::Impl::head_forward(Context& ctx, Slot& s, const Tensor& wte /*(Vl,C)*/, const Tensor& lnf_w,
                                    const Tensor& lnf_b, const Tensor& fused_dwte) {
  const Tensor lnf = s.lnf_full.rows(row0, row0 + Nl);  // this rank's rows of ln_f's output   (Nl,C)
  norm_forward(ctx, lnf, s.lnf_mean, s.lnf_rstd, s.xs[L], lnf_w, lnf_b);
  look(kHeadProbe, "ln_f", ProbeDir::forward, lnf);
  gather_rows(lnf, s.lnf_full);                         // f: all rows for the vocabulary split (N,C)
  for (int64_t r0 = 0; r0 < N; r0 += head_rows) {
    const int64_t r1 = std::min(N, r0 + head_rows), rows = r1 - r0;
    const Tensor lg = logits.rows(0, rows);              // (rows,Vl)
    if (fused_dwte.defined()) {  // t = 1: the pieces below are bitwise this op (kernels/ops.hpp)
      const Tensor x = s.lnf_full.rows(r0, r1);
      ops::linear_forward(ctx, lg, x, wte, Tensor());
      look(kHeadProbe, "logits", ProbeDir::forward, lg);
      ops::softmax_cross_entropy(ctx, losses.rows(r0, r1), lg, s.targets.rows(r0, r1), valid, s.grad_scale);
      look(kHeadProbe, "loss", ProbeDir::forward, losses.rows(r0, r1));
      look(kHeadProbe, "loss", ProbeDir::backward, lg);
      // lg now holds d loss / d logits: dx = dlogits wte, dwte += dlogits^T x (head_backward's call).
      ops::linear_backward(ctx, dlnf_now.rows(r0, r1), fused_dwte, Tensor(), lg, x, wte);
      continue;
    }
    const Tensor mx = s.row_max.rows(r0, r1);            // (rows) f64
    const Tensor both = stats.rows(0, 2 * rows);         // [sum_exp | target_logit] (2*rows) f64
    const Tensor sum = both.rows(0, rows), target = both.rows(rows, 2 * rows);
    ops::linear_forward(ctx, lg, s.lnf_full.rows(r0, r1), wte, Tensor());
    look(kHeadProbe, "logits", ProbeDir::forward, lg);
    ops::xent_local_stats(ctx, mx, target, lg, s.targets.rows(r0, r1), v0, valid);
    all_reduce(mx, comm::ReduceOp::max);
    ops::xent_exp_sum(ctx, sum, lg, mx, valid);
    all_reduce(both, comm::ReduceOp::sum);
    s.sum_exp.rows(r0, r1).copy_from(sum);
    ops::xent_loss(ctx, losses.rows(r0, r1), mx, sum, target);
    look(kHeadProbe, "loss", ProbeDir::forward, losses.rows(r0, r1));
  }
  if (fused_dwte.defined()) look(kHeadProbe, "logits", ProbeDir::weight, fused_dwte);
  // Every rank holds the same reduced losses; sum them in a fixed order (GptModel's). Evaluation of a
  // padded micro-batch sums only the rows of its real sequences (loss_rows).
  double total = 0;
  const Tensor host = losses.rows(0, loss_rows).to_host();  // on the GPU: the step's one read-back per micro-batch
  if (host.dtype() == DType::f32) {
    const float* l = host.data<float>();
    for (int64_t i = 0; i < loss_rows; ++i) total += l[i];
  } else {
    const double* l = host.data<double>();
    for (int64_t i = 0; i < loss_rows; ++i) total += l[i];
  }
  return total;
}

void GptChunk::Impl::head_backward(Context& ctx, Slot& s, const Tensor& wte, const Tensor& lnf_w,
                                   const Tensor& dlnf /*(Nl,C)*/, bool input, const Tensor& dwte,
                                   const Tensor& dlnf_w, const Tensor& dlnf_b) {
  const bool weights = dwte.defined();
  const Tensor none;
  const Tensor dpart = sp ? partial : dlnf;  // this rank's vocabulary share of d(ln_f output)   (N,C)
  for (int64_t r0 = 0; r0 < N; r0 += head_rows) {
    const int64_t r1 = std::min(N, r0 + head_rows), rows = r1 - r0;
    const Tensor lg = logits.rows(0, rows);  // (rows,Vl): the forward's logits again, then their gradient
    const Tensor x = s.lnf_full.rows(r0, r1);
    ops::linear_forward(ctx, lg, x, wte, none);
    look(kHeadProbe, "logits", ProbeDir::forward, lg);  // recomputed: the forward's values again
    ops::xent_backward(ctx, lg, s.row_max.rows(r0, r1), s.sum_exp.rows(r0, r1), s.targets.rows(r0, r1), v0, valid,
                       s.grad_scale);
    look(kHeadProbe, "loss", ProbeDir::backward, lg);
    // dx = dlogits wte, dwte += dlogits^T x: GptModel's call per chunk.
    ops::linear_backward(ctx, input ? dpart.rows(r0, r1) : none, weights ? dwte : none, none, lg, x, wte);
  }
  if (weights) look(kHeadProbe, "logits", ProbeDir::weight, dwte);
  head_backward_ln(ctx, s, lnf_w, dlnf, input, dlnf_w, dlnf_b);
}

void GptChunk::Impl::head_backward_ln(Context& ctx, Slot& s, const Tensor& lnf_w, const Tensor& dlnf, bool input,
                                      const Tensor& dlnf_w, const Tensor& dlnf_b) {
  const Tensor none;
  if (input) {
    reduce_rows(sp ? partial : dlnf, dlnf);  // f's dual -> (Nl,C)
    look(kHeadProbe, "logits", ProbeDir::backward, dlnf);
    dres.zero_();
    norm_backward(ctx, dres, none, none, dlnf, s.xs[L], lnf_w, s.lnf_mean, s.lnf_rstd);
    look(kHeadProbe, "ln_f", ProbeDir::backward, dres);
  }
  if (dlnf_w.defined()) {
    ln_weight_grads(ctx, dlnf_w, dlnf_b, dlnf, s.xs[L], s.lnf_mean, s.lnf_rstd);
    look(kHeadProbe, "ln_f", ProbeDir::weight, dlnf_w);
    look(kHeadProbe, "ln_f", ProbeDir::weight, dlnf_b);
  }
}

}  // namespace troupe
