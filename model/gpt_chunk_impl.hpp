// Private to model/: the state behind GptChunk, shared by its three source files:
//   gpt_chunk.cpp        layout (specs, units, slots), hooks, and the public calls that sequence the work
//   gpt_chunk_layer.cpp  one transformer layer: forward, input-gradient pass, weight-gradient pass
//   gpt_chunk_tp.cpp     the tensor-parallel pieces: row collectives, vocabulary-parallel embedding
//                        and the fused vocabulary-parallel head
// Names: B micro-batch, T sequence, C hidden, t TP size, r TP rank, N = B*T rows, Nl this rank's
// rows between the TP regions (N/t-ish with sequence parallelism, else N), hs head size, Hl = H/t
// query heads and Gl = G/t key/value groups of this rank, Al = Hl*hs the attention width, QKVl =
// (Hl + 2 Gl) hs the local fused qkv width, Fl = F/t, FCl = Fl (GELU) or 2 Fl (SwiGLU: [gate | up])
// the local c_fc width, Vl = Vp/t local vocabulary rows starting at v0. GPT-2: Al = C/t, QKVl = 3C/t.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/ops.hpp"
#include "model/gpt_chunk.hpp"
#include "model/moe_routing.hpp"
#include "model/op_probe.hpp"
#include "model/ring_attention.hpp"

namespace troupe {

struct GptChunk::Impl {
  // An MoE layer's own parameters (or their gradients), model/params.hpp's names: the router, PR-MoE's
  // coefficient (its dense MLP is the Layer's fc fields), the shared expert, and the local experts
  // (c_fc weight, c_fc bias, c_proj weight, c_proj bias; undefined where absent).
  struct MoeParams {
    Tensor router, router_b, coef_w, coef_b;
    Tensor sh_fc_w, sh_fc_b, sh_proj_w, sh_proj_b;
    std::vector<std::array<Tensor, 4>> experts;
  };
  // Parameter views of one layer's unit (or their gradients). A parameter the family lacks (norm
  // biases under RMSNorm, linear biases with add_bias_linear off) is an undefined tensor.
  struct Layer {
    Tensor ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
    MoeParams moe;  // MoE layers only
  };
  static constexpr int kLayerFields = 12;
  // Where an MoE layer's parameters sit: its global expert count, the local experts [e0, e0 + El),
  // widths (local: split over TP or whole), and the views' positions in the layer unit (router, ...)
  // and in its experts unit (4 per expert, -1: absent).
  struct MoeLayout {
    int E = 0, El = 0, e0 = 0;
    bool split = true;                // experts split over the TP ranks
    int64_t Fe = 0, FCe = 0;          // an expert's local width, c_fc's local rows
    int64_t Fs = 0, FCs = 0;          // the shared expert's
    int router = -1, router_b = -1, coef_w = -1, coef_b = -1;
    int sh[4] = {-1, -1, -1, -1};
    std::vector<std::array<int, 4>> ex;
  };
  // What an MoE layer's backward reads (model/gpt_chunk_moe.cpp), filled by each forward: the
  // routing, and the K kept assignments of the local experts as dispatch rows, expert by expert.
  struct MoeActs {
    Tensor xr;                        // (N,C) the router's jittered input (input jitter only)
    Tensor logits;                    // (N,E)
    std::vector<double> logits_host;  // (N*E) the same in double: what the routing and its backward read
    MoeRouting routing;               // this rank's rows (N)
    // Context parallelism: the whole sequences' logits (B*Tg*E, global rows b*Tg + position) and
    // their routing, alike on every cp rank; `routing` holds this rank's rows of it.
    std::vector<double> logits_whole;
    MoeRouting routing_whole;
    // Send side (this rank's tokens): the Ks kept assignments n * k + j, peer by peer, expert by
    // expert, rows in order; each assignment's send row (-1: dropped); the rows to each peer.
    std::vector<int64_t> send_assign;
    std::vector<int64_t> row_of;      // (N*k)
    std::vector<size_t> send_rows, recv_rows;  // (P) rows to / from each peer of the ep group
    std::vector<int64_t> recv_cnt;    // (P*El) rows from peer q for local expert j
    // Expert side (the rows the ep group sent to this rank's El experts), expert-major: K rows, expert
    // j's from offs[j]; perm[r]: the received (peer-major) row of row r.
    std::vector<int64_t> offs, perm;
    Tensor xd, h, act, y;             // (K,C) (K,FCe) (K,Fe) (K,C): inputs, c_fc, activation, outputs (whole)
    Tensor y_mine;                    // (Ks,C) the outputs of this rank's assignments (y itself when P = 1)
    Tensor routed;                    // (N,C) sum of weighted expert outputs (residual only)
    Tensor sh_fc, sh_act;             // (N,FCs) (N,Fs) the shared expert
    Tensor mlp_fc, mlp_act, mlp_out;  // (N,FCe) (N,Fe) (N,C) PR-MoE's dense MLP, split over TP (its output whole)
    std::vector<double> coef;         // (N*2) PR-MoE's mixing weights
  };
  // What an MoE layer's weight pass needs from its input pass.
  struct MoeStash {
    Tensor dy;                        // (K,C) d(expert outputs)
    Tensor dh;                        // (K,FCe) d(c_fc outputs)
    Tensor dlogits;                   // (N,E)
    Tensor dsh_fc;                    // (N,FCs)
    Tensor dmlp_out, dmlp_fc;         // (N,C) (N,FCe)
    Tensor dcoef;                     // (N,2) d(coefficient logits)
  };
  // What one layer's backward reads. Rows: Nl = this rank's rows, N = all rows (inside the TP region).
  struct LayerActs {
    Tensor ln1, ln1_mean, ln1_rstd;  // (Nl,C) (Nl) (Nl)  ln_1 output, local rows (mean: LayerNorm only)
    Tensor qkv;                      // (N,QKVl)          [q_r | k_r | v_r], q and k rotated (rope)
    Tensor qkv_u;                    // (B*Tg,Wu)         a2a: qkv of whole sequences, this rank's heads
    Tensor probs;                    // (B*Hl*T, T)       attention probabilities (scratch when selective)
    Tensor att;                      // (N,Al)            attention output, this rank's heads
    Tensor res1;                     // (Nl,C)            x + attention branch
    Tensor ln2, ln2_mean, ln2_rstd;  // (Nl,C) (Nl) (Nl)
    Tensor fc, fc_gelu;              // (N,FCl) (N,Fl)    c_fc output before / after GELU (or SwiGLU)
    Tensor res2;                     // (Nl,C)            layer output = next layer's input
    std::shared_ptr<MoeActs> moe;    // MoE layers: the MoE block's
  };
  // Output gradients a layer's weight pass needs; written by its input pass (split backward keeps
  // them in the slot until backward_weight).
  struct LayerStash {
    Tensor dy2;   // (N,C)   d(mlp c_proj output), all rows (gathered under sequence parallelism)
    Tensor dfc;   // (N,FCl) d(c_fc output)
    Tensor dln2;  // (Nl,C)  d(ln_2 output), reduced over TP
    Tensor dy1;   // (N,C)   d(attn c_proj output)
    Tensor dqkv;  // (N,QKVl) d(c_attn output) (rope: rotated back)
    Tensor dln1;  // (Nl,C)  d(ln_1 output)
    std::shared_ptr<MoeStash> moe;  // MoE layers
  };
  enum class SlotState : uint8_t { free, forwarded, weight_pending };
  struct Slot {
    SlotState state = SlotState::free;
    double grad_scale = 0;
    MicroBatchKey key;             // the dropout masks' key of the micro-batch in the slot
    Tensor inputs, targets;        // (N) i32, when the chunk has the embedding or the head
    std::vector<Tensor> xs;        // L+1 of (Nl,C): xs[l] input of layer l, xs[L] the chunk's output
    Tensor emb, emb_mean, emb_rstd;  // (Nl,C) (Nl) (Nl) embedding LayerNorm's input (embed_layernorm)
    std::vector<LayerActs> acts;   // per layer; empty under full recompute (and for evaluation)
    Tensor lnf_full;               // (N,C) ln_f output, all rows (this rank's block written, rest gathered)
    Tensor lnf_mean, lnf_rstd;     // (Nl) (Nl)
    Tensor row_max, sum_exp;       // (N) f64: the reduced softmax statistics of every row
    bool head_done = false;        // forward ran the head's backward too (fused head): d(ln_f output)
                                   // is in dlnf_now and dwte has this micro-batch's head contribution
    // Split backward only (allocated on first use):
    std::vector<LayerStash> stash;
    Tensor demb;                   // (N,C) d(embedding output), all rows (before ln_embd)
    Tensor dembln;                 // (Nl,C) d(ln_embd output) (embed_layernorm)
    Tensor dlnf;                   // (Nl,C) d(ln_f output)
  };

  Impl(const ChunkSpec& spec, comm::Communicator* tp, UnitHooks hooks, comm::Communicator* ep,
       comm::Communicator* cp);

  // ---- layout (gpt_chunk.cpp) ----
  ChunkSpec spec;
  comm::Communicator* tp = nullptr;
  comm::Communicator* ep = nullptr;  // the expert-parallel group (null: ep_size 1)
  // Context parallelism (cps > 1): the group, the sequence's length Tg (T = Tg / cps rows of each
  // sequence here), the global position of each of this rank's T rows, and the ring's spec (every
  // cp rank's positions, this rank's heads; the attention dropout mask set per call).
  comm::Communicator* cp = nullptr;
  int cps = 1, cpr = 0;
  int64_t Tg = 0;
  std::vector<int64_t> pos;          // (T) empty without context parallelism (position = t)
  RingAttentionSpec ring;
  RingWorkspace ring_ws;             // the ring's buffers, reused by every layer and call
  Tensor wpe_rows, dwpe_rows;        // (T,C) wpe's rows at pos, their gradient (cp > 1, with wpe)
  // All-to-all attention (cp_comm a2a: Ulysses; model/gpt_chunk_ulysses.cpp): Hu = Hl / cp heads and
  // Gu = Gl / cp groups of whole sequences, Wu = (Hu + 2 Gu) hs, Au = Hu hs; their layout (ALiBi
  // slopes) and first global head; the output and its gradient (B*Tg, Au) and the q/k/v gradient
  // (B*Tg, Wu) of whole sequences (scratch).
  bool a2a = false;
  int Hu = 0, Gu = 0;
  int64_t Wu = 0, Au = 0, u_head0 = 0;
  ops::AttentionLayout ulayout;
  Tensor u_att, u_dqkv;
  // The all-to-alls' send and receive staging, once per chunk: (N * QKVl) each, the widest exchange's.
  Tensor u_send, u_recv;
  UnitHooks hooks;
  std::vector<ParamSpec> specs;
  std::vector<UnitInfo> units;
  std::vector<int64_t> spec_offset;  // offset of spec i in the flat buffers
  // Units: wte (the embedding's, or the tied head's copy), emb (wpe and / or ln_embd, when the
  // family has either), the layers, head (ln_f), out (the untied head's lm_head). -1: absent.
  int wte_unit = -1, emb_unit = -1, head_unit = -1, out_unit = -1;
  std::vector<int> layer_units;   // (L) each layer's unit
  std::vector<int> expert_units;  // (L) an MoE layer's experts unit (right after its layer unit), else -1
  int out_weight_unit = -1;   // the head's weight: out_unit untied, else wte_unit
  // Where each Layer field sits in a layer unit's spec list (-1: not in this family or not in this
  // layer: an MoE layer has no dense MLP but PR-MoE's). emb unit: wpe, ln_embd weight and bias.
  std::vector<std::array<int, kLayerFields>> layer_fields;
  std::vector<MoeLayout> moe_layout;  // (L) E = 0 for a dense layer
  bool any_moe = false;
  // MoE statistics of the training forwards since the last take_moe_stats (recomputes not counted).
  std::vector<MoeLayerStats> moe_stats;
  bool count_moe = false;
  int emb_wpe = -1, emb_ln_w = -1, emb_ln_b = -1;
  int64_t loss_rows = 0;  // rows whose losses the head sums: N, fewer for a padded evaluation batch
  int t = 1, r = 0;
  bool sp = false;                   // sequence parallelism in effect (requested and t > 1)
  int64_t B = 0, T = 0, C = 0, Fl = 0, FCl = 0, Al = 0, QKVl = 0, N = 0, Nl = 0, row0 = 0;
  int Hl = 0, Gl = 0, hs = 0, L = 0;
  // The family (GptConfig's fields, resolved once).
  bool rms = false;                  // RMSNorm (weight only) instead of LayerNorm
  bool swiglu = false;               // c_fc is [gate | up], the activation silu(gate) * up
  bool rope = false;                 // rotary on q and k of every layer
  bool ln_embd = false;              // LayerNorm on the embedding output
  ops::AttentionLayout layout;       // this rank's heads, groups, head size, ALiBi slopes
  ops::RotaryParams rotary;
  int64_t Vl = 0, v0 = 0, valid = 0, head_rows = 0;
  DType dtype = DType::f32;       // parameters and activations
  DType grad_dtype = DType::f32;  // parameter gradients (dtype, or f32 under mixed precision)
  DType stat_dtype = DType::f32;  // normalisation statistics and token losses (f32 under mixed precision)

  Tensor flat_params, flat_grads;
  std::vector<Tensor> params, grads;  // resident views, spec order
  std::vector<Slot> slots;
  Slot eval_slot;                     // forward_eval's buffers (allocated on first use)
  int64_t act_bytes = 0;
  int fused_slot = -1;                // the slot whose fused head awaits its backward (the next call)
  OpProbe* probe = nullptr;           // set_probe: every op's result is shown to it (model/op_probe.hpp)
  // The dropout key of the micro-batch being computed: set by forward, backward and backward_weight
  // to their slot's key for the call; null in evaluation (no dropout).
  const MicroBatchKey* key_now = nullptr;
  bool any_dropout = false;           // the model drops anything (else no mask is ever built)

  // The mask of `site` of global layer `layer` for the micro-batch being computed (inactive in
  // evaluation or at probability 0).
  DropoutMask mask(DropoutSite site, int layer) const {
    if (key_now == nullptr || !any_dropout) return DropoutMask{};
    return dropout_mask(spec.model, *key_now, site, layer);
  }
  // Hidden dropout of x, rows [first_row, first_row + rows) of the micro-batch, in place (forward, or
  // the same mask on a gradient in backward); nothing when the mask is inactive.
  void drop_rows(Context& ctx, const Tensor& x /*(rows,C)*/, DropoutSite site, int layer, int64_t first_row);

  // The probe's look at an op's result; `layer` global (or a k*Probe value).
  // A parameter the family lacks (undefined) shows nothing.
  void look(int layer, const char* op, ProbeDir dir, const Tensor& result) const {
    if (probe != nullptr && result.defined()) probe->after(ProbePoint{layer, op, dir, ""}, result);
  }

  // Scratch shared by all slots and layers (each call uses it and leaves nothing in it).
  LayerActs rc;                  // recomputed (or not kept) layer activations; res2 set per use;
                                 // rc.att and rc.probs also take the selective recompute
  Tensor rc_res2;                // (Nl,C) output of a layer recomputed in backward
  Tensor gathered;               // (N,C) an all-gathered LayerNorm output
  Tensor partial;                // (N,C) row-parallel partial products / column-parallel input grads
  Tensor dres;                   // (Nl,C) gradient of the residual stream
  Tensor dgelu, datt;            // (N,Fl) (N,Al)
  LayerStash now;                // the stash when weight gradients are computed at once
  Tensor demb_now, dlnf_now;     // (N,C) (Nl,C)
  Tensor dembln_now;             // (Nl,C) d(ln_embd output) (embed_layernorm)
  Tensor logits;                 // (head_rows,Vl) one row chunk of logits / their gradient
  Tensor stats;                  // (2*head_rows) f64: [sum_exp | target_logit] of one row chunk
  Tensor losses;                 // (N)
  Tensor ln_grads;               // (2,C) one LayerNorm's weight gradients before the TP all-reduce
  Tensor demb_ln;                // (Nl,C) d(ln_embd input), local rows (embed_layernorm)
  // Gradient views of each unit for the current backward / backward_weight call (grad_buffer is
  // asked once per unit and call).
  std::vector<std::vector<Tensor>> grad_cache;

  Tensor alloc(const Shape& shape, DType type);  // counted in act_bytes
  Tensor alloc(const Shape& shape) { return alloc(shape, dtype); }
  LayerActs alloc_acts(bool with_probs);
  Tensor saved_view(const Tensor& probs) const;
  void alloc_slot(Slot& s, bool keep_acts);
  void alloc_stash(Slot& s);
  int64_t rows_of(int rank) const;     // sequence-parallel row counts (all_gather_v's)
  int64_t offset_of(int rank) const;

  // Units: parameter views (acquired from the hooks when not resident) and gradient views.
  std::vector<Tensor> unit_views(const Tensor& flat_unit, int u) const;
  std::vector<Tensor> acquire(int u, Pass pass);
  void release(int u, Pass pass);
  const std::vector<Tensor>& unit_grads(int u);
  void grads_ready(int u, int slot);
  int layer_unit(int l) const { return layer_units[l]; }
  // Layer l's parameters (its unit and, for an MoE layer, its experts unit), acquired / released together;
  // its gradient views; its units' grads_ready.
  Layer acquire_layer(int l, Pass pass);
  void release_layer(int l, Pass pass);
  Layer layer_grads(int l);
  void layer_grads_ready(int l, int slot);
  Layer as_layer(int l, const std::vector<Tensor>& v, const std::vector<Tensor>& experts) const;

  // fuse_head: run the head's backward inside the forward (t = 1 only; see GptChunk::forward).
  double forward_impl(Context& ctx, Slot& s, const Tensor& tokens, const Tensor& input, const Tensor& out,
                      bool keep, bool fuse_head = false);
  void split_tokens(Slot& s, const Tensor& tokens);
  LayerActs acts_for_backward(Context& ctx, Slot& s, int l, const Layer& p);

  // ---- the family's ops (gpt_chunk_layer.cpp) ----
  // The layers' norm (LayerNorm or RMSNorm; mean unused by RMSNorm, b undefined) and its backward
  // halves, as ops::layernorm_* (dx accumulates; dw / db undefined skip the weight part).
  void norm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                    const Tensor& w, const Tensor& b);
  void norm_backward(Context& ctx, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                     const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd);
  // The attention core on (N,QKVl) -> (N,Al) (GPT-2's multi-head attention is the layout G = H,
  // no ALiBi), and its backward into dqkv.
  // qkv_u: the a2a path's (B*Tg, Wu) buffer of whole sequences (undefined otherwise).
  void attention_core(Context& ctx, const Tensor& att, const Tensor& probs, const Tensor& qkv, const Tensor& qkv_u,
                      int layer);
  // att: the forward's output (context parallelism's backward reads it; probs is then each row's
  // log-sum-exp, (B,Hl,T)).
  void attention_core_backward(Context& ctx, const Tensor& dqkv, const Tensor& datt, const Tensor& qkv,
                               const Tensor& probs, const Tensor& att, const Tensor& qkv_u, int layer);
  // Ring attention over the cp group (cps > 1): the same contract as attention_core with probs the
  // rows' log-sum-exp; 16-bit activations go through f32 copies.
  void ring_core(Context& ctx, const Tensor& att, const Tensor& lse, const Tensor& qkv, int layer);
  void ring_core_backward(Context& ctx, const Tensor& dqkv, const Tensor& datt, const Tensor& qkv,
                          const Tensor& lse, const Tensor& att, int layer);
  // The a2a path (model/gpt_chunk_ulysses.cpp): probs (B*Hu*Tg, Tg) of whole sequences; qkv_u keeps
  // the gathered q, k, v for the backward (and selective recompute, which needs no communication).
  void ulysses_core(Context& ctx, const Tensor& att, const Tensor& probs, const Tensor& qkv, const Tensor& qkv_u,
                    int layer);
  void ulysses_recompute(Context& ctx, const Tensor& probs, const Tensor& qkv_u, int layer);
  void ulysses_core_backward(Context& ctx, const Tensor& dqkv, const Tensor& datt, const Tensor& qkv_u,
                             const Tensor& probs, int layer);
  // The two all-to-alls: this rank's rows of every head (local (B,T,W)) <-> whole sequences of its
  // heads (whole (B,Tg,W/cp)); qkv_columns: the columns are q, k, v (else the attention output's).
  void ulysses_to_heads(const Tensor& local, const Tensor& whole, bool qkv_columns, const char* what, int layer);
  void ulysses_to_rows(const Tensor& whole, const Tensor& local, bool qkv_columns, const char* what, int layer);
  // Rotary on the q and k columns of a (N,QKVl) qkv (forward), or the inverse on its gradient.
  void rotate_qk(Context& ctx, const Tensor& qkv, bool inverse);

  // ---- one transformer layer (gpt_chunk_layer.cpp); layer: its global index (for the probe) ----
  void layer_forward(Context& ctx, int layer, const Layer& p, const Tensor& x, const LayerActs& a);
  // dres: d(layer output) in, d(layer input) out, (Nl,C).
  void layer_backward_input(Context& ctx, int layer, const Layer& p, const Tensor& x, const LayerActs& a,
                            const Tensor& dres, const LayerStash& st);
  void layer_backward_weight(Context& ctx, int layer, const Layer& g, const Tensor& x, const LayerActs& a,
                             const LayerStash& st);

  // ---- an MoE layer's MLP (gpt_chunk_moe.cpp); l local, layer global ----
  // x: ln_2's output, all N rows (gathered); out: (N,C) the MoE output, whole on every TP rank.
  void moe_forward(Context& ctx, int l, int layer, const Layer& p, const Tensor& x, MoeActs& a, const Tensor& out);
  // dy: d(MoE output), all rows, alike on every TP rank; dx: (N,C) this rank's share of d(x) (the TP
  // reduction of the shares is the gradient), overwritten.
  void moe_backward_input(Context& ctx, int l, int layer, const Layer& p, const Tensor& x, const MoeActs& a,
                          const Tensor& dy, MoeStash& st, const Tensor& dx);
  void moe_backward_weight(Context& ctx, int l, int layer, const Layer& g, const Tensor& x, const MoeActs& a,
                           const Tensor& dy, const MoeStash& st);
  // Expert parallelism: rows to and from the ep group's peers (all_to_all_v of whole rows; `what` and
  // the global `layer` name its span on the timeline), and a row permutation (to[r] = from[perm[r]];
  // inverse: to[perm[r]] = from[r]).
  void moe_exchange(const Tensor& send, const std::vector<size_t>& send_rows, const Tensor& recv,
                    const std::vector<size_t>& recv_rows, const char* what, int layer);
  void permute_rows(const Tensor& from, const Tensor& to, const std::vector<int64_t>& perm, bool inverse);
  // Context parallelism: route the whole sequences from every cp rank's logits (a.logits_host) into
  // a.routing_whole, alike on every cp rank, and keep this rank's rows in a.routing; the backward's
  // logits gradient of this rank's rows from the whole routing and every rank's dweight.
  void moe_route_whole(const MoeConfig& cfg, int64_t E, int64_t routed_seqs, bool training, const MoeDraws& draws,
                       MoeActs& a, int layer);
  void moe_route_whole_backward(const MoeConfig& cfg, const MoeActs& a, const std::vector<double>& dweight,
                                double lb_scale, double z_scale, std::vector<double>& dlogits, int layer);
  // The global position of row n's token (context parallelism: pos, else n % T).
  int64_t position_of(int64_t n) const { return pos.empty() ? n % T : pos[static_cast<size_t>(n % T)]; }
  // The objective's weight on the micro-batch's load-balancing and z losses (grad_scale * B * Tg).
  double moe_loss_weight = 0;

  // ---- tensor-parallel pieces (gpt_chunk_tp.cpp) ----
  void all_reduce(const Tensor& t, comm::ReduceOp op);
  // Megatron's g in forward / f's dual in backward with sequence parallelism: all rows from each
  // rank's block. Without it the rows are already everywhere: a copy (or nothing when same tensor).
  void gather_rows(const Tensor& local /*(Nl,X)*/, const Tensor& full /*(N,X)*/);
  // Sum of the ranks' partial (N,X) products: reduce-scatter to this rank's rows with sequence
  // parallelism, else all-reduce (in place when full is local).
  void reduce_rows(const Tensor& full /*(N,X)*/, const Tensor& local /*(Nl,X)*/);
  // dW += / db += of a norm applied to this rank's rows: all-reduced over TP under sequence
  // parallelism so the replicated gradient is the sum over every row, identical on all ranks.
  // layernorm: the norm is a LayerNorm whatever the family's (ln_embd); else the layers' norm.
  void ln_weight_grads(Context& ctx, const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& x,
                       const Tensor& mean, const Tensor& rstd, bool layernorm = false);
  // e: wte (Vl,C), and the emb unit's views (or empty when the family has no emb unit).
  void embedding_forward(Context& ctx, const Tensor& wte, const std::vector<Tensor>& e, const Slot& s);
  // d(chunk input) in dres -> d(embedding output) of all rows in demb (the dual of the forward's
  // reduction, the dropout mask, ln_embd's input gradient; keeps d(ln_embd output) in dembln).
  void embedding_backward_input(Context& ctx, const std::vector<Tensor>& e, const Slot& s, const Tensor& demb,
                                const Tensor& dembln);
  // dwte (Vl,C) and the emb unit's gradient views (empty: none).
  void embedding_weight(Context& ctx, const Tensor& dwte, const std::vector<Tensor>& g, const Slot& s,
                        const Tensor& demb, const Tensor& dembln);
  // fused_dwte defined (t = 1): GptModel's fused softmax cross-entropy, row chunk by row chunk: the
  // loss, then at once d(ln_f output) into dlnf_now and the head's contribution to fused_dwte, so
  // backward need not recompute the logits.
  // wte: the head's weight (tied: wte; untied: lm_head), (Vl,C) either way.
  double head_forward(Context& ctx, Slot& s, const Tensor& wte, const Tensor& lnf_w, const Tensor& lnf_b,
                      const Tensor& fused_dwte = Tensor());
  // input: compute d(chunk output) into dres (and keep d(ln_f output) in dlnf); weights: accumulate
  // the head's parameter gradients (dwte: the head weight's, dlnf_w, dlnf_b; null when !weights).
  void head_backward(Context& ctx, Slot& s, const Tensor& wte, const Tensor& lnf_w, const Tensor& dlnf,
                     bool input, const Tensor& dwte, const Tensor& dlnf_w, const Tensor& dlnf_b);
  // What follows the logits in head_backward: d(ln_f output) summed over the vocabulary split into
  // dlnf, ln_f's backward into dres (input), ln_f's weight gradients (dlnf_w defined).
  void head_backward_ln(Context& ctx, Slot& s, const Tensor& lnf_w, const Tensor& dlnf, bool input,
                        const Tensor& dlnf_w, const Tensor& dlnf_b);
};

}  // namespace troupe
