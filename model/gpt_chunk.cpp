// GptChunk: layout (specs, units, flat buffers, activation slots), the unit hooks, and the public
// calls, which sequence the work of gpt_chunk_layer.cpp (layers) and gpt_chunk_tp.cpp (embedding,
// head, collectives). See model/gpt_chunk_impl.hpp for the names.
//
// Order of work, chosen so that t = 1, p = 1 repeats GptModel's operations one for one:
//   forward    embedding -> layers 0..L-1 -> head (loss; keeps the softmax row statistics)
//   backward   head -> layers L-1..0 -> embedding; each step's input-gradient part, then (unless
//              deferred) its weight-gradient part, which accumulates into the gradient buffers
//   weight     the deferred weight parts, same order
// Every parameter gradient therefore receives its contributions in the same order whatever the
// schedule (F0 F1 B0 B1 or F0 B0 F1 B1): per micro-batch, in backward order.
#include "model/gpt_chunk.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "kernels/ops.hpp"
#include "model/gpt_chunk_impl.hpp"

namespace troupe {

namespace {
// The Layer fields' parameter names (after "transformer.h.<l>."), in Layer's and the specs' order.
constexpr const char* kLayerNames[12] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
// v[i], or an undefined tensor past v's end (a parameter the family lacks: ln_f's bias under RMSNorm).
Tensor at(const std::vector<Tensor>& v, size_t i) { return i < v.size() ? v[i] : Tensor(); }
// Logits row-chunk budget in elements: GptModel's, so that t = 1 chunks rows identically.
constexpr int64_t kLogitChunkElems = int64_t{16} << 20;
}  // namespace

ChunkSpec chunk_layers(const GptConfig& model, int stages, int chunks, int stage, int chunk) {
  TROUPE_CHECK(stages >= 1 && chunks >= 1, "chunk_layers: stages and chunks must be positive");
  TROUPE_CHECK(stage >= 0 && stage < stages && chunk >= 0 && chunk < chunks, "chunk_layers: index out of range");
  const int K = stages * chunks, k = chunk * stages + stage;
  const int base = model.num_layers / K, extra = model.num_layers % K;
  ChunkSpec s;
  s.model = model;
  s.first_layer = k * base + std::min(k, extra);
  s.num_layers = base + (k < extra ? 1 : 0);
  s.has_embedding = k == 0;
  s.has_head = k == K - 1;
  return s;
}

// ---- layout -------------------------------------------------------------------------------------

GptChunk::Impl::Impl(const ChunkSpec& cs, comm::Communicator* tp_comm, UnitHooks h, comm::Communicator* ep_comm,
                     comm::Communicator* cp_comm)
    : spec(cs), tp(tp_comm), ep(ep_comm), cp(cp_comm), hooks(std::move(h)) {
  const GptConfig& m = cs.model;
  TROUPE_CHECK(m.validate().is_ok(), "GptChunk needs a validated GptConfig");
  TROUPE_CHECK(cs.tp_size >= 1 && cs.tp_rank >= 0 && cs.tp_rank < cs.tp_size, "GptChunk: TP rank out of range");
  TROUPE_CHECK(m.num_attention_heads % cs.tp_size == 0,
               "GptChunk: the tensor-parallel size must divide the number of attention heads");
  TROUPE_CHECK(m.query_groups() % cs.tp_size == 0 && m.num_attention_heads % m.query_groups() == 0,
               "GptChunk: the tensor-parallel size must divide the query groups, and the groups the heads");
  TROUPE_CHECK(m.ffn_hidden_size() % cs.tp_size == 0, "GptChunk: the tensor-parallel size must divide the ffn size");
  TROUPE_CHECK(cs.first_layer >= 0 && cs.num_layers >= 0 && cs.first_layer + cs.num_layers <= m.num_layers,
               "GptChunk: layers outside the model (use chunk_layers)");
  TROUPE_CHECK(cs.micro_batch >= 1 && cs.slots >= 1, "GptChunk: micro_batch and slots must be positive");
  TROUPE_CHECK(cs.dtype == DType::f32 || cs.dtype == DType::f64 || cs.dtype == DType::bf16 || cs.dtype == DType::f16,
               "GptChunk holds f32, f64, bf16 or f16 tensors");
  TROUPE_CHECK(!is_16bit(cs.dtype) || cs.grad_dtype == DType::f32 || cs.grad_dtype == cs.dtype,
               "GptChunk: 16-bit parameters take f32 gradients or gradients of their own type");
  TROUPE_CHECK(cs.head_chunk_rows >= 0, "GptChunk: head_chunk_rows must not be negative");
  if (cs.tp_size > 1) {
    TROUPE_CHECK(tp != nullptr && tp->size() == cs.tp_size && tp->rank() == cs.tp_rank,
                 "GptChunk: the TP communicator must have tp_size ranks, this one at tp_rank");
  } else {
    TROUPE_CHECK(tp == nullptr || tp->size() == 1, "GptChunk: tp_size 1 with a larger TP communicator");
  }
  TROUPE_CHECK(cs.ep_size >= 1 && cs.ep_rank >= 0 && cs.ep_rank < cs.ep_size &&
                   (cs.ep_size == 1 || (ep != nullptr && ep->size() == cs.ep_size && ep->rank() == cs.ep_rank)),
               "GptChunk: the expert-parallel communicator must have ep_size ranks, this one at ep_rank");
  TROUPE_CHECK(cs.cp_size >= 1 && cs.cp_rank >= 0 && cs.cp_rank < cs.cp_size &&
                   (cs.cp_size == 1 || (cp != nullptr && cp->size() == cs.cp_size && cp->rank() == cs.cp_rank)),
               "GptChunk: the context-parallel communicator must have cp_size ranks, this one at cp_rank");
  TROUPE_CHECK(cs.cp_size == 1 || m.seq_length % ((cs.cp_contiguous ? 1 : 2) * cs.cp_size) == 0,
               "GptChunk: context parallelism needs a sequence length divisible by 2 cp (Ulysses: by cp)");
  TROUPE_CHECK(!cs.cp_contiguous || cs.cp_comm == CpComm::a2a,
               "GptChunk: contiguous context-parallel rows (Ulysses) go with the all-to-all attention");
  TROUPE_CHECK(cs.cp_size == 1 || cs.device == Device::cpu, "GptChunk: context parallelism runs on the CPU only");
  TROUPE_CHECK(static_cast<bool>(hooks.acquire_params) == static_cast<bool>(hooks.release_params),
               "UnitHooks: acquire_params and release_params come together");

  t = cs.tp_size;
  r = cs.tp_rank;
  any_dropout = m.hidden_dropout > 0 || m.attention_dropout > 0;
  sp = cs.sequence_parallel && t > 1;  // with one rank there is nothing to split
  dtype = cs.dtype;
  grad_dtype = is_16bit(dtype) ? cs.grad_dtype : dtype;
  stat_dtype = is_16bit(dtype) ? DType::f32 : dtype;
  B = cs.micro_batch;
  cps = cs.cp_size;
  cpr = cs.cp_rank;
  Tg = m.seq_length;
  T = Tg / cps;
  a2a = cps > 1 && cs.cp_comm == CpComm::a2a;
  C = m.hidden_size;
  hs = m.head_size();
  Hl = m.num_attention_heads / t;
  Gl = m.query_groups() / t;
  Al = int64_t{Hl} * hs;
  QKVl = int64_t{Hl + 2 * Gl} * hs;
  rms = m.normalization == Normalization::rmsnorm;
  swiglu = m.activation == MlpActivation::swiglu;
  rope = m.position_embedding == PositionEmbedding::rope && m.rotary_dim() > 0;
  ln_embd = m.embed_layernorm;
  Fl = m.ffn_hidden_size() / t;
  FCl = swiglu ? 2 * Fl : Fl;
  const bool alibi = m.position_embedding == PositionEmbedding::alibi;
  layout.n_head = Hl;
  layout.n_group = Gl;
  layout.head_dim = hs;
  if (alibi) {  // the slopes of this rank's global heads [r Hl, (r+1) Hl)
    const std::vector<double> all_slopes = ops::alibi_slopes(m.num_attention_heads);
    layout.alibi_slopes.assign(all_slopes.begin() + int64_t{r} * Hl, all_slopes.begin() + int64_t{r + 1} * Hl);
  }
  rotary.rotary_dim = m.rotary_dim();
  rotary.base = m.rotary_base;
  rotary.interleaved = m.rotary_interleaved;
  rotary.pos0 = 0;  // every call sees whole sequences: position = t (context parallelism: pos[t])
  if (cps > 1) {
    ring.layout = layout;
    ring.seq_len = Tg;
    // Megatron's load-balanced chunks, or (Ulysses) one contiguous range per rank.
    for (int q = 0; q < cps; ++q) {
      if (!cs.cp_contiguous) {
        ring.positions.push_back(context_parallel_positions(Tg, cps, q));
        continue;
      }
      std::vector<int64_t> range(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) range[static_cast<size_t>(i)] = q * T + i;
      ring.positions.push_back(std::move(range));
    }
    pos = ring.positions[static_cast<size_t>(cpr)];
    ring.head0 = int64_t{r} * Hl;
    ring.comm = cs.cp_comm;
    ring.workspace = &ring_ws;
  }
  rotary.positions = pos;
  if (a2a) {
    TROUPE_CHECK(Hl % cps == 0 && Gl % cps == 0,
                 "GptChunk: all-to-all attention needs the context-parallel size to divide each tensor-parallel "
                 "rank's heads and key/value groups");
    Hu = Hl / cps;
    Gu = Gl / cps;
    Au = int64_t{Hu} * hs;
    Wu = int64_t{Hu + 2 * Gu} * hs;
    u_head0 = int64_t{r} * Hl + int64_t{cpr} * Hu;
    ulayout.n_head = Hu;
    ulayout.n_group = Gu;
    ulayout.head_dim = hs;
    if (!layout.alibi_slopes.empty())
      ulayout.alibi_slopes.assign(layout.alibi_slopes.begin() + int64_t{cpr} * Hu,
                                  layout.alibi_slopes.begin() + int64_t{cpr + 1} * Hu);
  }
  L = cs.num_layers;
  N = B * T;
  loss_rows = N;
  Nl = sp ? rows_of(r) : N;
  row0 = sp ? offset_of(r) : 0;
  Vl = m.padded_vocab_size(t) / t;
  v0 = r * Vl;
  valid = std::clamp<int64_t>(m.vocab_size - v0, 0, Vl);

  // Specs and units: [embedding], layers, [head], each contiguous, spec order of gpt2_param_specs.
  const std::vector<ParamSpec> all =
      gpt2_shard_specs(m, t, r, ExpertShard{cs.ep_size, cs.ep_rank, cs.expert_tensor_parallel});
  const char* kMlp[4] = {"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"};
  std::map<std::string, int> index;
  for (size_t i = 0; i < all.size(); ++i) index[all[i].name] = static_cast<int>(i);
  auto present = [&](const std::string& name) { return index.count(name) != 0; };
  auto add_unit = [&](const std::vector<int>& global_indices) {
    UnitInfo u;
    u.param_offset = units.empty() ? 0 : units.back().param_offset + units.back().numel;
    for (int gi : global_indices) {
      u.specs.push_back(static_cast<int>(specs.size()));
      spec_offset.push_back(u.param_offset + u.numel);
      u.numel += all[gi].local_shape.numel();
      specs.push_back(all[gi]);
    }
    units.push_back(u);
    return static_cast<int>(units.size()) - 1;
  };
  // wte is a unit of its own (also the head's copy), so the embedding and the head copy have the same
  // unit layout on any two stages: the runtime sums their gradients partition by partition.
  // An untied head has its own weight (lm_head, a unit of its own), so the head's chunk holds no wte.
  const bool tied = !m.untie_embeddings_and_output_weights;
  if (cs.has_embedding || (cs.has_head && tied)) wte_unit = add_unit({index.at("transformer.wte.weight")});
  if (cs.has_embedding) {
    // wpe and ln_embd, whichever the family has, in one unit (GPT-2: wpe alone).
    std::vector<int> e;
    auto take = [&](const std::string& name, int& at) {
      if (!present(name)) return;
      at = static_cast<int>(e.size());
      e.push_back(index.at(name));
    };
    take("transformer.wpe.weight", emb_wpe);
    take("transformer.ln_embd.weight", emb_ln_w);
    take("transformer.ln_embd.bias", emb_ln_b);
    if (!e.empty()) emb_unit = add_unit(e);
  }
  static_assert(sizeof(kLayerNames) / sizeof(kLayerNames[0]) == kLayerFields, "one name per Layer field");
  layer_fields.resize(static_cast<size_t>(L));
  moe_layout.resize(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) {
    const int g = cs.first_layer + l;
    const std::string h = "transformer.h." + std::to_string(g) + ".";
    std::vector<int> idx;
    auto take = [&](const std::string& name) {
      if (!present(name)) return -1;
      idx.push_back(index.at(name));
      return static_cast<int>(idx.size()) - 1;
    };
    for (int k = 0; k < kLayerFields; ++k) layer_fields[l][k] = take(h + kLayerNames[k]);
    MoeLayout& mo = moe_layout[l];
    mo.E = m.moe.experts_of(g, m.num_layers);
    if (mo.E > 0) {
      any_moe = true;
      mo.router = take(h + "mlp.router.weight");
      mo.router_b = take(h + "mlp.router.bias");
      mo.coef_w = take(h + "mlp.coefficient.weight");
      mo.coef_b = take(h + "mlp.coefficient.bias");
      for (int f = 0; f < 4; ++f) mo.sh[f] = take(h + "mlp.shared_expert." + kMlp[f]);
    }
    layer_units.push_back(add_unit(idx));
    expert_units.push_back(-1);
    if (mo.E > 0) {
      // The experts this shard holds: [ep_rank E/ep, (ep_rank + 1) E/ep).
      std::vector<int> ex;
      for (int e = 0; e < mo.E; ++e) {
        const std::string eh = h + "mlp.experts." + std::to_string(e) + ".";
        if (!present(eh + kMlp[0])) continue;
        if (mo.El == 0) mo.e0 = e;
        ++mo.El;
        std::array<int, 4> f{};
        for (int i = 0; i < 4; ++i) {
          f[i] = present(eh + kMlp[i]) ? static_cast<int>(ex.size()) : -1;
          if (f[i] >= 0) ex.push_back(index.at(eh + kMlp[i]));
        }
        mo.ex.push_back(f);
      }
      TROUPE_CHECK(mo.El > 0 && mo.router >= 0, "GptChunk: an MoE layer without its router or experts");
      const ParamSpec& fc = all[static_cast<size_t>(ex[static_cast<size_t>(mo.ex[0][0])])];
      mo.split = fc.slice.dim >= 0 && t > 1;
      mo.FCe = fc.local_shape[0];
      mo.Fe = swiglu ? mo.FCe / 2 : mo.FCe;
      if (mo.sh[0] >= 0) {
        mo.FCs = all[static_cast<size_t>(idx[static_cast<size_t>(mo.sh[0])])].local_shape[0];
        mo.Fs = swiglu ? mo.FCs / 2 : mo.FCs;
      }
      expert_units.back() = add_unit(ex);
      units.back().expert = true;
    }
  }
  if (cs.has_head) {
    std::vector<int> lnf = {index.at("transformer.ln_f.weight")};
    if (present("transformer.ln_f.bias")) lnf.push_back(index.at("transformer.ln_f.bias"));
    head_unit = add_unit(lnf);
    if (!tied) out_unit = add_unit({index.at("lm_head.weight")});
    out_weight_unit = tied ? wte_unit : out_unit;
  }
  const int64_t total = units.empty() ? 0 : units.back().param_offset + units.back().numel;
  if (!hooks.acquire_params) {
    flat_params = Tensor::zeros({total}, dtype, cs.device);
    for (size_t i = 0; i < specs.size(); ++i)
      params.push_back(flat_params.rows(spec_offset[i], spec_offset[i] + specs[i].local_shape.numel())
                           .view(specs[i].local_shape));
  }
  if (!hooks.grad_buffer) {
    flat_grads = Tensor::zeros({total}, grad_dtype, cs.device);
    for (size_t i = 0; i < specs.size(); ++i)
      grads.push_back(flat_grads.rows(spec_offset[i], spec_offset[i] + specs[i].local_shape.numel())
                          .view(specs[i].local_shape));
  }
  grad_cache.resize(units.size());

  // Logit row chunks: GptModel's rule on the local vocabulary (t = 1: the same chunks).
  if (cs.has_head) {
    int64_t rows = std::max<int64_t>(1, kLogitChunkElems / Vl);
    if (rows > 16) rows = rows / 16 * 16;
    head_rows = std::min(cs.head_chunk_rows > 0 ? cs.head_chunk_rows : rows, N);
  }

  // Activations: every slot, then the scratch.
  slots.resize(cs.slots);
  for (Slot& s : slots) alloc_slot(s, cs.recompute != Recompute::full);
  const bool any_scratch_layer = L > 0;
  if (any_scratch_layer) {
    rc = alloc_acts(true);
    rc_res2 = alloc({Nl, C});
    dgelu = alloc({N, Fl});
    datt = alloc({N, Al});
    now.dy2 = alloc({N, C});
    now.dfc = alloc({N, FCl});
    now.dln2 = alloc({Nl, C});
    now.dy1 = alloc({N, C});
    now.dqkv = alloc({N, QKVl});
    now.dln1 = alloc({Nl, C});
    if (a2a) {
      u_att = alloc({B * Tg, Au});
      u_dqkv = alloc({B * Tg, Wu});
      u_send = alloc({N * QKVl});
      u_recv = alloc({N * QKVl});
    }
    if (any_moe) {
      rc.moe = std::make_shared<MoeActs>();
      now.moe = std::make_shared<MoeStash>();
    }
  }
  if (sp) {
    gathered = alloc({N, C});
    ln_grads = alloc({2, C}, grad_dtype);
  }
  if (sp || cs.has_head || any_moe) partial = alloc({N, C});
  dres = alloc({Nl, C});
  if (cs.has_embedding) demb_now = alloc({N, C});
  if (cs.has_embedding && emb_wpe >= 0 && cps > 1) {
    wpe_rows = alloc({T, C});
    dwpe_rows = alloc({T, C}, grad_dtype);
  }
  if (cs.has_embedding && ln_embd) {
    demb_ln = alloc({Nl, C});
    dembln_now = alloc({Nl, C});
  }
  if (cs.has_head) {
    dlnf_now = alloc({Nl, C});
    logits = alloc({head_rows, Vl});
    stats = alloc({2 * head_rows}, DType::f64);
    losses = alloc({N}, stat_dtype);
  }
}

Tensor GptChunk::Impl::alloc(const Shape& shape, DType type) {
  Tensor x = Tensor::empty(shape, type, spec.device);
  act_bytes += static_cast<int64_t>(x.nbytes());
  return x;
}

GptChunk::Impl::LayerActs GptChunk::Impl::alloc_acts(bool with_probs) {
  LayerActs a;
  a.ln1 = alloc({Nl, C});
  if (!rms) a.ln1_mean = alloc({Nl}, stat_dtype);
  a.ln1_rstd = alloc({Nl}, stat_dtype);
  a.qkv = alloc({N, QKVl});
  // What attention's backward reads: the CPU's probabilities (B,Hl,T,T), the GPU's row log-sum-exp
  // (B,Hl,T) f32 (ops::attention_saved_tensor; flash-style, no (T,T) matrix); ring attention's row
  // log-sum-exp (B,Hl,T), f32 for 16-bit activations.
  if (a2a) a.qkv_u = alloc({B * Tg, Wu});  // the all-to-all's q, k, v of whole sequences
  if (with_probs) {
    if (a2a) a.probs = alloc({B * Hu * Tg, Tg});
    else if (cps > 1) a.probs = alloc({B * Hl, T}, is_16bit(dtype) ? DType::f32 : dtype);
    else a.probs = spec.device == Device::cuda ? alloc({B * Hl, T}, DType::f32) : alloc({B * Hl * T, T});
  }
  a.att = alloc({N, Al});
  a.res1 = alloc({Nl, C});
  a.ln2 = alloc({Nl, C});
  if (!rms) a.ln2_mean = alloc({Nl}, stat_dtype);
  a.ln2_rstd = alloc({Nl}, stat_dtype);
  a.fc = alloc({N, FCl});
  a.fc_gelu = alloc({N, Fl});
  return a;  // res2: the slot's xs[l+1] or a scratch, set by the user
}

// keep_acts: the slot saves every layer's activations (recompute none / selective); otherwise only
// the layer inputs (full recompute, evaluation).
void GptChunk::Impl::alloc_slot(Slot& s, bool keep_acts) {
  if (spec.has_embedding || spec.has_head) {
    s.inputs = alloc({N}, DType::i32);
    s.targets = alloc({N}, DType::i32);
  }
  for (int l = 0; l <= L; ++l) s.xs.push_back(alloc({Nl, C}));
  if (spec.has_embedding && ln_embd) {
    s.emb = alloc({Nl, C});
    s.emb_mean = alloc({Nl}, stat_dtype);
    s.emb_rstd = alloc({Nl}, stat_dtype);
  }
  if (keep_acts) {
    for (int l = 0; l < L; ++l) {
      // Selective recompute drops the (T,T) probabilities; ring attention keeps only each row's
      // log-sum-exp, which stays.
      s.acts.push_back(alloc_acts(spec.recompute != Recompute::selective || (cps > 1 && !a2a)));
      s.acts.back().res2 = s.xs[l + 1];
      if (moe_layout[l].E > 0) s.acts.back().moe = std::make_shared<MoeActs>();
    }
  }
  if (spec.has_head) {
    s.lnf_full = alloc({N, C});
    if (!rms) s.lnf_mean = alloc({Nl}, stat_dtype);
    s.lnf_rstd = alloc({Nl}, stat_dtype);
    s.row_max = alloc({N}, DType::f64);
    s.sum_exp = alloc({N}, DType::f64);
  }
}

void GptChunk::Impl::alloc_stash(Slot& s) {
  if (!s.stash.empty() || s.demb.defined() || s.dlnf.defined()) return;
  for (int l = 0; l < L; ++l) {
    LayerStash st;
    st.dy2 = alloc({N, C});
    st.dfc = alloc({N, FCl});
    st.dln2 = alloc({Nl, C});
    st.dy1 = alloc({N, C});
    st.dqkv = alloc({N, QKVl});
    st.dln1 = alloc({Nl, C});
    if (moe_layout[l].E > 0) st.moe = std::make_shared<MoeStash>();
    s.stash.push_back(st);
  }
  if (spec.has_embedding) s.demb = alloc({N, C});
  if (spec.has_embedding && ln_embd) s.dembln = alloc({Nl, C});
  if (spec.has_head) s.dlnf = alloc({Nl, C});
}

void GptChunk::Impl::drop_rows(Context& ctx, const Tensor& x, DropoutSite site, int layer, int64_t first_row) {
  const DropoutMask m = mask(site, layer);
  if (m.active()) ops::dropout_rows(ctx, x, m, first_row, T, pos);
}

int64_t GptChunk::Impl::rows_of(int rank) const { return N / t + (rank < N % t ? 1 : 0); }
int64_t GptChunk::Impl::offset_of(int rank) const { return rank * (N / t) + std::min<int64_t>(rank, N % t); }

// ---- units and hooks ------------------------------------------------------------------------------

std::vector<Tensor> GptChunk::Impl::unit_views(const Tensor& flat_unit, int u) const {
  const UnitInfo& info = units[u];
  std::vector<Tensor> v;
  for (int i : info.specs) {
    const int64_t off = spec_offset[i] - info.param_offset;
    v.push_back(flat_unit.rows(off, off + specs[i].local_shape.numel()).view(specs[i].local_shape));
  }
  return v;
}

std::vector<Tensor> GptChunk::Impl::acquire(int u, Pass pass) {
  const UnitInfo& info = units[u];
  if (!hooks.acquire_params) return unit_views(flat_params.rows(info.param_offset, info.param_offset + info.numel), u);
  Tensor got = hooks.acquire_params(u, pass);
  TROUPE_CHECK(got.defined() && got.numel() == info.numel && got.dtype() == dtype,
               "acquire_params must return the unit's numel elements in the chunk's dtype");
  return unit_views(got.view({info.numel}), u);
}

void GptChunk::Impl::release(int u, Pass pass) {
  if (hooks.release_params) hooks.release_params(u, pass);
}

const std::vector<Tensor>& GptChunk::Impl::unit_grads(int u) {
  std::vector<Tensor>& cached = grad_cache[u];
  if (!cached.empty()) return cached;
  const UnitInfo& info = units[u];
  if (hooks.grad_buffer) {
    Tensor got = hooks.grad_buffer(u);
    TROUPE_CHECK(got.defined() && got.numel() == info.numel && got.dtype() == grad_dtype,
                 "grad_buffer must return the unit's numel elements in the chunk's gradient dtype");
    cached = unit_views(got.view({info.numel}), u);
  } else {
    cached = unit_views(flat_grads.rows(info.param_offset, info.param_offset + info.numel), u);
  }
  return cached;
}

void GptChunk::Impl::grads_ready(int u, int slot) {
  grad_cache[u].clear();  // the next micro-batch asks for its buffer again
  if (hooks.grads_ready) hooks.grads_ready(u, slot);
}

GptChunk::Impl::Layer GptChunk::Impl::as_layer(int l, const std::vector<Tensor>& v,
                                               const std::vector<Tensor>& experts) const {
  Tensor f[kLayerFields];
  for (int k = 0; k < kLayerFields; ++k)
    if (layer_fields[l][k] >= 0) f[k] = v[static_cast<size_t>(layer_fields[l][k])];
  Layer p{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], {}};
  const MoeLayout& mo = moe_layout[l];
  if (mo.E == 0) return p;
  auto pick = [](const std::vector<Tensor>& from, int i) { return i >= 0 ? from[static_cast<size_t>(i)] : Tensor(); };
  p.moe.router = pick(v, mo.router);
  p.moe.router_b = pick(v, mo.router_b);
  p.moe.coef_w = pick(v, mo.coef_w);
  p.moe.coef_b = pick(v, mo.coef_b);
  p.moe.sh_fc_w = pick(v, mo.sh[0]);
  p.moe.sh_fc_b = pick(v, mo.sh[1]);
  p.moe.sh_proj_w = pick(v, mo.sh[2]);
  p.moe.sh_proj_b = pick(v, mo.sh[3]);
  for (const auto& e : mo.ex) p.moe.experts.push_back({pick(experts, e[0]), pick(experts, e[1]), pick(experts, e[2]), pick(experts, e[3])});
  return p;
}

GptChunk::Impl::Layer GptChunk::Impl::acquire_layer(int l, Pass pass) {
  const std::vector<Tensor> v = acquire(layer_units[l], pass);
  const std::vector<Tensor> e = expert_units[l] >= 0 ? acquire(expert_units[l], pass) : std::vector<Tensor>{};
  return as_layer(l, v, e);
}

void GptChunk::Impl::release_layer(int l, Pass pass) {
  if (expert_units[l] >= 0) release(expert_units[l], pass);
  release(layer_units[l], pass);
}

GptChunk::Impl::Layer GptChunk::Impl::layer_grads(int l) {
  const std::vector<Tensor>& v = unit_grads(layer_units[l]);
  return as_layer(l, v, expert_units[l] >= 0 ? unit_grads(expert_units[l]) : std::vector<Tensor>{});
}

void GptChunk::Impl::layer_grads_ready(int l, int slot) {
  if (expert_units[l] >= 0) grads_ready(expert_units[l], slot);
  grads_ready(layer_units[l], slot);
}

// ---- forward --------------------------------------------------------------------------------------

void GptChunk::Impl::split_tokens(Slot& s, const Tensor& tokens) {
  TROUPE_CHECK(tokens.defined() && tokens.dtype() == DType::i32 && tokens.rank() == 2 && tokens.dim(0) == B &&
                   tokens.dim(1) == Tg + 1,
               "GptChunk: tokens must be (micro_batch, seq_length + 1) i32 windows");
  const Tensor host = tokens.to_host();  // the windows come from the host; a GPU copy is read back
  const int32_t* src = host.data<int32_t>();
  for (int64_t i = 0; i < host.numel(); ++i)
    TROUPE_CHECK(src[i] >= 0 && src[i] < spec.model.vocab_size, "GptChunk: token id outside the vocabulary");
  // On the GPU: split on the host, then one upload each (copy_from waits for it: the staging
  // tensors are freed right after).
  const bool on_device = s.inputs.device() != Device::cpu;
  const Tensor inputs = on_device ? Tensor::empty(s.inputs.shape(), DType::i32) : s.inputs;
  const Tensor targets = on_device ? Tensor::empty(s.targets.shape(), DType::i32) : s.targets;
  int32_t* in = inputs.data<int32_t>();
  int32_t* tg = targets.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* window = src + b * (Tg + 1);
    if (cps == 1) {
      std::memcpy(in + b * T, window, T * sizeof(int32_t));
      std::memcpy(tg + b * T, window + 1, T * sizeof(int32_t));
      continue;
    }
    for (int64_t i = 0; i < T; ++i) {  // context parallelism: this rank's positions
      in[b * T + i] = window[pos[static_cast<size_t>(i)]];
      tg[b * T + i] = window[pos[static_cast<size_t>(i)] + 1];
    }
  }
  if (on_device) {
    s.inputs.copy_from(inputs);
    s.targets.copy_from(targets);
  }
}

// keep: save what backward needs (training); false: layers run in the scratch (evaluation).
double GptChunk::Impl::forward_impl(Context& ctx, Slot& s, const Tensor& tokens, const Tensor& input,
                                    const Tensor& out, bool keep, bool fuse_head) {
  key_now = keep ? &s.key : nullptr;  // evaluation: no dropout
  if (spec.has_embedding || spec.has_head) split_tokens(s, tokens);
  if (spec.has_embedding) {
    const Tensor wte = acquire(wte_unit, Pass::forward)[0];
    const std::vector<Tensor> e = emb_unit >= 0 ? acquire(emb_unit, Pass::forward) : std::vector<Tensor>{};
    embedding_forward(ctx, wte, e, s);
    if (emb_unit >= 0) release(emb_unit, Pass::forward);
    release(wte_unit, Pass::forward);
  } else {
    TROUPE_CHECK(input.defined() && input.dtype() == dtype && input.shape() == Shape({Nl, C}),
                 "GptChunk::forward: input must be (boundary_rows(), hidden_size) in the chunk's dtype");
    s.xs[0].copy_from(input);  // the caller may reuse its buffer; backward needs the layer input
  }
  count_moe = keep;  // the training forward's routing is counted (not a recompute's, not evaluation's)
  for (int l = 0; l < L; ++l) {
    const Layer p = acquire_layer(l, Pass::forward);
    LayerActs a;
    if (keep && !s.acts.empty()) {
      a = s.acts[l];
      if (spec.recompute == Recompute::selective && (cps == 1 || a2a)) a.probs = rc.probs;  // recomputed in backward
    } else {
      a = rc;
      a.res2 = s.xs[l + 1];
      if (moe_layout[l].E == 0) a.moe = nullptr;
    }
    layer_forward(ctx, spec.first_layer + l, p, s.xs[l], a);
    release_layer(l, Pass::forward);
  }
  count_moe = false;
  if (!spec.has_head) {
    TROUPE_CHECK(out.defined() && out.dtype() == dtype && out.shape() == Shape({Nl, C}),
                 "GptChunk::forward: out must be (boundary_rows(), hidden_size) in the chunk's dtype");
    out.copy_from(s.xs[L]);
    return 0.0;
  }
  const std::vector<Tensor> h = acquire(head_unit, Pass::forward);  // ln_f weight, bias (LayerNorm)
  const std::vector<Tensor> w = acquire(out_weight_unit, Pass::forward);
  // The fused head adds to its weight's gradient now: that unit's buffer of this backward (grad_cache).
  if (fuse_head) for (auto& g : grad_cache) g.clear();
  const double loss =
      head_forward(ctx, s, w[0], h[0], at(h, 1), fuse_head ? unit_grads(out_weight_unit)[0] : Tensor());
  s.head_done = fuse_head;
  release(out_weight_unit, Pass::forward);
  release(head_unit, Pass::forward);
  return loss;
}

// The activations layer l's backward reads: the saved ones, or (full recompute) the layer's forward
// run again from its saved input into the scratch, which gives them bitwise.
GptChunk::Impl::LayerActs GptChunk::Impl::acts_for_backward(Context& ctx, Slot& s, int l, const Layer& p) {
  if (!s.acts.empty()) return s.acts[l];
  LayerActs a = rc;
  a.res2 = rc_res2;
  if (moe_layout[l].E == 0) a.moe = nullptr;
  count_moe = false;
  layer_forward(ctx, spec.first_layer + l, p, s.xs[l], a);
  return a;
}

// ---- public API -------------------------------------------------------------------------------------

GptChunk::GptChunk(const ChunkSpec& spec, comm::Communicator* tp, UnitHooks hooks, comm::Communicator* ep,
                   comm::Communicator* cp)
    : impl_(std::make_unique<Impl>(spec, tp, std::move(hooks), ep, cp)) {}

GptChunk::~GptChunk() = default;

const ChunkSpec& GptChunk::spec() const { return impl_->spec; }
const std::vector<ParamSpec>& GptChunk::specs() const { return impl_->specs; }
const std::vector<UnitInfo>& GptChunk::units() const { return impl_->units; }
const Tensor& GptChunk::flat_params() const { return impl_->flat_params; }
const Tensor& GptChunk::flat_grads() const { return impl_->flat_grads; }
std::vector<Tensor> GptChunk::params() const { return impl_->params; }
std::vector<Tensor> GptChunk::grads() const { return impl_->grads; }
int64_t GptChunk::boundary_rows() const { return impl_->Nl; }
void GptChunk::set_probe(OpProbe* probe) { impl_->probe = probe; }

bool GptChunk::counts_in_norm(int i) const {
  const Impl& m = *impl_;
  TROUPE_CHECK(i >= 0 && i < static_cast<int>(m.specs.size()), "counts_in_norm: spec index out of range");
  if (m.spec.has_head && !m.spec.has_embedding && m.wte_unit >= 0 && i == m.units[m.wte_unit].specs[0]) return false;
  if (m.specs[i].slice.dim < 0) return m.r == 0;  // replicated over TP: counted once
  return true;
}

void GptChunk::init(uint64_t seed) {
  TROUPE_CHECK(!impl_->hooks.acquire_params, "GptChunk::init: parameters are not resident under acquire_params");
  for (size_t i = 0; i < impl_->specs.size(); ++i) init_parameter(impl_->specs[i], seed, impl_->params[i]);
}

void GptChunk::zero_grad() {
  if (impl_->flat_grads.defined()) impl_->flat_grads.zero_();
}

double GptChunk::forward(Context& ctx, int slot, const Tensor& tokens, const Tensor& input, const Tensor& out,
                         double grad_scale, bool head_backward_now, const MicroBatchKey& key) {
  Impl& m = *impl_;
  TROUPE_CHECK(slot >= 0 && slot < static_cast<int>(m.slots.size()), "GptChunk::forward: slot out of range");
  TROUPE_CHECK(m.fused_slot < 0, "GptChunk::forward: the backward of a fused head must come first");
  Impl::Slot& s = m.slots[slot];
  TROUPE_CHECK(s.state == Impl::SlotState::free, "GptChunk::forward: the slot still holds a micro-batch");
  const bool fuse = head_backward_now && m.spec.has_head && m.t == 1;
  s.grad_scale = grad_scale;
  s.key = key;
  const double loss = m.forward_impl(ctx, s, tokens, input, out, true, fuse);
  s.state = Impl::SlotState::forwarded;
  if (fuse) m.fused_slot = slot;
  return loss;
}

void GptChunk::backward(Context& ctx, int slot, const Tensor& dout, const Tensor& din, bool defer_weight_grads) {
  Impl& m = *impl_;
  TROUPE_CHECK(slot >= 0 && slot < static_cast<int>(m.slots.size()), "GptChunk::backward: slot out of range");
  Impl::Slot& s = m.slots[slot];
  TROUPE_CHECK(s.state == Impl::SlotState::forwarded, "GptChunk::backward: no forward in this slot");
  TROUPE_CHECK(m.fused_slot < 0 || (m.fused_slot == slot && !defer_weight_grads),
               "GptChunk::backward: a fused head's slot must be backward-ed next, without deferral");
  const bool now = !defer_weight_grads;
  m.key_now = &s.key;  // recompute and the masks of the gradients use the forward's key
  if (!now) m.alloc_stash(s);
  // A fused head's forward already took wte's gradient buffer of this backward.
  if (!s.head_done)
    for (auto& g : m.grad_cache) g.clear();
  const Shape boundary{m.Nl, m.C};

  // The head's weight is wte's unit that the embedding adds to below (tied, one chunk): ready then.
  const bool head_weight_later = m.spec.has_embedding && m.out_weight_unit == m.wte_unit;
  // Head (or the gradient from the next stage) -> dres = d(chunk output).
  if (s.head_done) {  // the logits' part ran in forward: ln_f is left
    const std::vector<Tensor> h = m.acquire(m.head_unit, Pass::backward);
    const std::vector<Tensor>& hg = m.unit_grads(m.head_unit);
    m.head_backward_ln(ctx, s, h[0], m.dlnf_now, true, hg[0], at(hg, 1));
    m.release(m.head_unit, Pass::backward);
    m.grads_ready(m.head_unit, slot);
    if (!head_weight_later) m.grads_ready(m.out_weight_unit, slot);
    s.head_done = false;
    m.fused_slot = -1;
  } else if (m.spec.has_head) {
    const std::vector<Tensor> h = m.acquire(m.head_unit, Pass::backward);
    const std::vector<Tensor> w = m.acquire(m.out_weight_unit, Pass::backward);
    Tensor dwte, dlnf_w, dlnf_b;
    if (now) {
      dwte = m.unit_grads(m.out_weight_unit)[0];
      const std::vector<Tensor>& hg = m.unit_grads(m.head_unit);
      dlnf_w = hg[0];
      dlnf_b = at(hg, 1);
    }
    m.head_backward(ctx, s, w[0], h[0], now ? m.dlnf_now : s.dlnf, true, dwte, dlnf_w, dlnf_b);
    m.release(m.out_weight_unit, Pass::backward);
    m.release(m.head_unit, Pass::backward);
    if (now) {
      m.grads_ready(m.head_unit, slot);
      if (!head_weight_later) m.grads_ready(m.out_weight_unit, slot);
    }
  } else {
    TROUPE_CHECK(dout.defined() && dout.dtype() == m.dtype && dout.shape() == boundary,
                 "GptChunk::backward: dout must be (boundary_rows(), hidden_size) in the chunk's dtype");
    m.dres.copy_from(dout);
  }
  // Layers, last to first; dres becomes d(layer input).
  m.moe_loss_weight = s.grad_scale * static_cast<double>(m.B * m.Tg);  // the whole sequences' tokens
  for (int l = m.L - 1; l >= 0; --l) {
    const Impl::Layer p = m.acquire_layer(l, Pass::backward);
    Impl::LayerActs a = m.acts_for_backward(ctx, s, l, p);
    const Impl::LayerStash& st = now ? m.now : s.stash[l];
    m.layer_backward_input(ctx, m.spec.first_layer + l, p, s.xs[l], a, m.dres, st);
    if (now) {
      m.layer_backward_weight(ctx, m.spec.first_layer + l, m.layer_grads(l), s.xs[l], a, st);
      m.layer_grads_ready(l, slot);
    }
    m.release_layer(l, Pass::backward);
  }
  // Embedding (its gradient is a scatter of dres; only ln_embd's backward reads parameters), or
  // d(chunk input).
  if (m.spec.has_embedding) {
    const Tensor& demb = now ? m.demb_now : s.demb;
    const Tensor& dembln = now ? m.dembln_now : s.dembln;
    const bool reads = m.ln_embd;
    const std::vector<Tensor> e = reads ? m.acquire(m.emb_unit, Pass::backward) : std::vector<Tensor>{};
    m.embedding_backward_input(ctx, e, s, demb, dembln);
    if (reads) m.release(m.emb_unit, Pass::backward);
    if (now) {
      m.embedding_weight(ctx, m.unit_grads(m.wte_unit)[0],
                         m.emb_unit >= 0 ? m.unit_grads(m.emb_unit) : std::vector<Tensor>{}, s, demb, dembln);
      m.grads_ready(m.wte_unit, slot);
      if (m.emb_unit >= 0) m.grads_ready(m.emb_unit, slot);
    }
  } else {
    TROUPE_CHECK(din.defined() && din.dtype() == m.dtype && din.shape() == boundary,
                 "GptChunk::backward: din must be (boundary_rows(), hidden_size) in the chunk's dtype");
    din.copy_from(m.dres);
  }
  s.state = now ? Impl::SlotState::free : Impl::SlotState::weight_pending;
}

void GptChunk::backward_weight(Context& ctx, int slot) {
  Impl& m = *impl_;
  TROUPE_CHECK(slot >= 0 && slot < static_cast<int>(m.slots.size()), "GptChunk::backward_weight: slot out of range");
  Impl::Slot& s = m.slots[slot];
  TROUPE_CHECK(s.state == Impl::SlotState::weight_pending,
               "GptChunk::backward_weight: no deferred backward(..., true) in this slot");
  m.key_now = &s.key;  // full recompute rebuilds the layers with the forward's masks
  for (auto& g : m.grad_cache) g.clear();
  if (m.spec.has_head) {
    // The logits are recomputed from the saved ln_f output: only the head's weight is read.
    const std::vector<Tensor> w = m.acquire(m.out_weight_unit, Pass::backward);
    const Tensor dwte = m.unit_grads(m.out_weight_unit)[0];
    const std::vector<Tensor>& hg = m.unit_grads(m.head_unit);
    m.head_backward(ctx, s, w[0], Tensor(), s.dlnf, false, dwte, hg[0], at(hg, 1));
    m.release(m.out_weight_unit, Pass::backward);
    m.grads_ready(m.head_unit, slot);
    if (!(m.spec.has_embedding && m.out_weight_unit == m.wte_unit)) m.grads_ready(m.out_weight_unit, slot);
  }
  for (int l = m.L - 1; l >= 0; --l) {
    // Only full recompute reads the parameters here (to rebuild the activations).
    const bool recompute = s.acts.empty();
    Impl::LayerActs a;
    if (recompute) {
      const Impl::Layer p = m.acquire_layer(l, Pass::backward);
      a = m.acts_for_backward(ctx, s, l, p);
    } else {
      a = s.acts[l];
    }
    m.layer_backward_weight(ctx, m.spec.first_layer + l, m.layer_grads(l), s.xs[l], a, s.stash[l]);
    if (recompute) m.release_layer(l, Pass::backward);
    m.layer_grads_ready(l, slot);
  }
  if (m.spec.has_embedding) {
    m.embedding_weight(ctx, m.unit_grads(m.wte_unit)[0],
                       m.emb_unit >= 0 ? m.unit_grads(m.emb_unit) : std::vector<Tensor>{}, s, s.demb, s.dembln);
    m.grads_ready(m.wte_unit, slot);
    if (m.emb_unit >= 0) m.grads_ready(m.emb_unit, slot);
  }
  s.state = Impl::SlotState::free;
}

double GptChunk::forward_eval(Context& ctx, const Tensor& tokens, const Tensor& input, const Tensor& out,
                              int64_t valid_sequences) {
  Impl& m = *impl_;
  TROUPE_CHECK(valid_sequences <= m.B, "GptChunk::forward_eval: more valid sequences than the micro-batch holds");
  TROUPE_CHECK(m.fused_slot < 0, "GptChunk::forward_eval: the backward of a fused head must come first");
  if (m.eval_slot.xs.empty()) m.alloc_slot(m.eval_slot, false);
  m.loss_rows = valid_sequences < 0 ? m.N : valid_sequences * m.T;
  const double loss = m.forward_impl(ctx, m.eval_slot, tokens, input, out, false);
  m.loss_rows = m.N;
  return loss;
}

std::vector<MoeLayerStats> GptChunk::take_moe_stats() {
  std::vector<MoeLayerStats> out;
  out.swap(impl_->moe_stats);
  return out;
}

int64_t GptChunk::param_bytes() const {
  return impl_->flat_params.defined() ? static_cast<int64_t>(impl_->flat_params.nbytes()) : 0;
}
int64_t GptChunk::grad_bytes() const {
  return impl_->flat_grads.defined() ? static_cast<int64_t>(impl_->flat_grads.nbytes()) : 0;
}
int64_t GptChunk::activation_bytes() const { return impl_->act_bytes; }

}  // namespace troupe
