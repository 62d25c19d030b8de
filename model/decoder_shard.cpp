// model/decoder_shard.hpp.
#include "model/decoder_shard.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "kernels/ops.hpp"
#include "model/gpt_chunk.hpp"
#include "model/moe_routing.hpp"

namespace troupe {

namespace {

// The transformer layer a parameter name belongs to ("transformer.h.<l>."), or -1.
int layer_of(const std::string& name) {
  const std::string prefix = "transformer.h.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  return std::stoi(name.substr(prefix.size()));
}

}  // namespace

DecoderShardSpec DecoderShardSpec::whole(const GptConfig& config) { return of(config, 1, 0, 1, 0); }

DecoderShardSpec DecoderShardSpec::of(const GptConfig& config, int tp_size, int tp_rank, int stages, int stage) {
  const ChunkSpec cs = chunk_layers(config, stages, 1, stage, 0);
  DecoderShardSpec s;
  s.tp_size = tp_size;
  s.tp_rank = tp_rank;
  s.first_layer = cs.first_layer;
  s.num_layers = cs.num_layers;
  s.embedding = cs.has_embedding;
  s.head = cs.has_head;
  return s;
}

std::string check_decoder_layout(const GptConfig& config, int tp_size, int stages, bool expert_parallel) {
  if (Status st = config.validate(); !st) return st.message();
  std::vector<std::string> problems;
  if (tp_size < 1) problems.push_back(fmt::format("the tensor-parallel size is {} -- give 1 or more", tp_size));
  if (stages < 1) problems.push_back(fmt::format("the pipeline-parallel size is {} -- give 1 or more", stages));
  if (tp_size > 1) {
    auto divides = [&](int64_t n, const char* what) {
      if (n % tp_size != 0)
        problems.push_back(fmt::format("--tensor-model-parallel-size {} does not divide the model's {} ({}) -- give a "
                                       "size that does",
                                       tp_size, what, n));
    };
    divides(config.num_attention_heads, "attention heads");
    divides(config.query_groups(), "query groups");
    divides(config.ffn_hidden_size(), "MLP hidden size");
    if (config.moe.enabled() && !expert_parallel) divides(config.expert_ffn_hidden_size(), "experts' hidden size");
    if (expert_parallel)
      for (int l = 0; l < config.num_layers; ++l)
        if (const int E = config.moe.experts_of(l, config.num_layers); E > 0 && E % tp_size != 0) {
          problems.push_back(fmt::format("--expert-model-parallel-size {} does not divide layer {}'s {} experts -- give a "
                                         "size that does, or leave the experts split like the MLP (1)",
                                         tp_size, l, E));
          break;
        }
    if (config.moe.shared_expert_ffn > 0) divides(config.moe.shared_expert_ffn, "shared expert's hidden size");
  }
  if (expert_parallel && !config.moe.enabled())
    problems.push_back("--expert-model-parallel-size is set, but the model has no experts -- leave it out");
  if (stages > config.num_layers)
    problems.push_back(fmt::format("--pipeline-model-parallel-size {} is more than the model's {} layers -- give at "
                                   "most {}",
                                   stages, config.num_layers, config.num_layers));
  if (problems.empty()) return {};
  std::string out = problems.size() == 1 ? "" : fmt::format("{} problems: ", problems.size());
  for (size_t i = 0; i < problems.size(); ++i) out += (i > 0 ? "; " : "") + problems[i];
  return out;
}

DecodeRows DecodeRows::part(size_t begin, size_t end) const {
  DecodeRows out;
  out.ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(begin), ids.begin() + static_cast<std::ptrdiff_t>(end));
  for (size_t i = begin; i <= end; ++i) out.row0.push_back(row0[i] - row0[begin]);
  return out;
}

Result<DecodeRows> plan_feed(const GptConfig& m, const std::vector<int>& ids, const std::vector<std::vector<int32_t>>& tokens,
                             const std::function<bool(int)>& is_open, const std::function<int64_t(int)>& length) {
  if (ids.size() != tokens.size() || ids.empty())
    return Status::bad_input("Decoder::feed: one token list per sequence, at least one sequence");
  DecodeRows rows;
  rows.ids = ids;
  rows.row0.assign(ids.size() + 1, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    if (!is_open(id)) return Status::bad_input("Decoder::feed: no open sequence " + std::to_string(id));
    for (size_t j = 0; j < i; ++j)
      if (ids[j] == id) return Status::bad_input("Decoder::feed: sequence " + std::to_string(id) + " given twice");
    if (tokens[i].empty()) return Status::bad_input("Decoder::feed: no tokens for sequence " + std::to_string(id));
    const int64_t end = length(id) + static_cast<int64_t>(tokens[i].size());
    if (end > m.max_position_embeddings)
      return Status::bad_input("the sequence would be " + std::to_string(end) + " tokens, over the model's " +
                               std::to_string(m.max_position_embeddings) +
                               " positions (--max-position-embeddings) -- shorten the prompt or generate fewer tokens");
    for (int32_t t : tokens[i])
      if (t < 0 || t >= m.vocab_size)
        return Status::bad_input("token " + std::to_string(t) + " is outside the model's vocabulary of " +
                                 std::to_string(m.vocab_size) + " -- tokenize with the checkpoint's tokenizer");
    rows.row0[i + 1] = rows.row0[i] + static_cast<int64_t>(tokens[i].size());
  }
  return rows;
}

DecoderShard::DecoderShard(const GptConfig& config, const DecoderShardSpec& spec, comm::Communicator* tp)
    : config_(config), spec_(spec), tp_(spec.tp_size > 1 ? tp : nullptr) {
  const std::string why = check_decoder_layout(config, spec.tp_size, 1, spec.expert_parallel && spec.tp_size > 1);
  TROUPE_CHECK(why.empty(), "DecoderShard: " + why);
  TROUPE_CHECK(spec.tp_size == 1 || (tp != nullptr && tp->size() == spec.tp_size && tp->rank() == spec.tp_rank),
               "DecoderShard: the tensor-parallel communicator does not match the shard");
  heads_ = config.num_attention_heads / spec.tp_size;
  groups_ = config.query_groups() / spec.tp_size;
  const bool tied = !config.untie_embeddings_and_output_weights;
  const bool ep = spec.expert_parallel && spec.tp_size > 1;
  const ExpertShard experts{ep ? spec.tp_size : 1, ep ? spec.tp_rank : 0, !ep};
  for (ParamSpec& s : gpt2_shard_specs(config, spec.tp_size, spec.tp_rank, experts)) {
    const int layer = layer_of(s.name);
    bool keep = false;
    if (layer >= 0) keep = layer >= spec.first_layer && layer < spec.first_layer + spec.num_layers;
    else if (s.name == "transformer.wte.weight") keep = spec.embedding || (spec.head && tied);
    else if (s.name.rfind("transformer.wpe.", 0) == 0 || s.name.rfind("transformer.ln_embd.", 0) == 0) keep = spec.embedding;
    else keep = spec.head;  // ln_f, lm_head
    if (!keep) continue;
    params_.push_back(Tensor::zeros(s.local_shape, spec.dtype));
    specs_.push_back(std::move(s));
  }
  std::map<std::string, Tensor> by_name;
  for (size_t i = 0; i < specs_.size(); ++i) by_name[specs_[i].name] = params_[i];
  auto find = [&](const std::string& name) {
    auto it = by_name.find(name);
    return it == by_name.end() ? Tensor() : it->second;
  };
  wte_ = find("transformer.wte.weight");
  wpe_ = find("transformer.wpe.weight");
  ln_embd_w_ = find("transformer.ln_embd.weight");
  ln_embd_b_ = find("transformer.ln_embd.bias");
  lnf_w_ = find("transformer.ln_f.weight");
  lnf_b_ = find("transformer.ln_f.bias");
  head_ = spec.head ? (tied ? wte_ : find("lm_head.weight")) : Tensor();
  vocab_begin_ = config.padded_vocab_size(spec.tp_size) / spec.tp_size * spec.tp_rank;
  for (int l = spec.first_layer; l < spec.first_layer + spec.num_layers; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    auto mlp_at = [&](const std::string& prefix) {
      return Mlp{find(prefix + "c_fc.weight"), find(prefix + "c_fc.bias"), find(prefix + "c_proj.weight"),
                 find(prefix + "c_proj.bias")};
    };
    Layer y;
    y.ln1_w = find(h + "ln_1.weight");
    y.ln1_b = find(h + "ln_1.bias");
    y.attn_w = find(h + "attn.c_attn.weight");
    y.attn_b = find(h + "attn.c_attn.bias");
    y.proj_w = find(h + "attn.c_proj.weight");
    y.proj_b = find(h + "attn.c_proj.bias");
    y.ln2_w = find(h + "ln_2.weight");
    y.ln2_b = find(h + "ln_2.bias");
    y.mlp = mlp_at(h + "mlp.");
    const int E = config.moe.experts_of(l, config.num_layers);
    if (E > 0) {
      y.moe = true;
      y.router_w = find(h + "mlp.router.weight");
      y.router_b = find(h + "mlp.router.bias");
      y.coef_w = find(h + "mlp.coefficient.weight");
      y.coef_b = find(h + "mlp.coefficient.bias");
      y.shared = mlp_at(h + "mlp.shared_expert.");
      const int count = E / experts.ep_size;
      y.expert0 = static_cast<int64_t>(count) * experts.ep_rank;
      for (int e = 0; e < count; ++e)
        y.experts.push_back(mlp_at(h + "mlp.experts." + std::to_string(y.expert0 + e) + "."));
    }
    layers_.push_back(std::move(y));
  }
  if (config.position_embedding == PositionEmbedding::alibi) {
    const std::vector<double> all = ops::alibi_slopes(config.num_attention_heads);
    alibi_.assign(all.begin() + heads_ * spec.tp_rank, all.begin() + heads_ * (spec.tp_rank + 1));
  }
}

void DecoderShard::load_from_whole(const std::function<Tensor(const std::string&)>& whole) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& spec = specs_[i];
    const Tensor src = whole(spec.name);
    TROUPE_CHECK(src.defined() && src.dtype() == DType::f32 && src.numel() >= spec.global_shape.numel(),
                 "DecoderShard::load_from_whole: no whole tensor " + spec.name);
    const float* s = src.data<float>();
    const Tensor local = spec_.dtype == DType::f32 ? params_[i] : Tensor::empty(spec.local_shape, DType::f32);
    float* d = local.data<float>();
    const int64_t n = local.numel();
    if (spec.slice.dim < 0) {
      std::copy_n(s, n, d);
    } else {
      for (int64_t k = 0; k < n; ++k) {
        const int64_t g = slice_global_index(spec, k);
        d[k] = g < 0 ? 0.0f : s[g];
      }
    }
    if (spec_.dtype != DType::f32) params_[i].copy_from(local.to(spec_.dtype));
  }
  pack_weights();
}

void DecoderShard::pack_weights() {
  packed_.clear();
  if (spec_.dtype != DType::f32 || cpu::packed_gemm_kernel() == cpu::PackedKernel::none) return;
  ThreadPool pool(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  auto pack = [&](const Tensor& w) {
    if (w.defined() && w.rank() == 2)
      packed_[w.raw()] = cpu::PackedWeight::pack(pool, w.data<float>(), w.dim(0), w.dim(1), std::max<int64_t>(1, w.dim(1)));
  };
  pack(head_);
  for (const Layer& y : layers_) {
    if (y.moe) continue;  // an MoE layer's experts see a few rows each: OpenBLAS's path
    pack(y.attn_w);
    pack(y.proj_w);
    pack(y.mlp.fc_w);
    pack(y.mlp.proj_w);
  }
}

DecoderShard::Sequence& DecoderShard::sequence(int id) {
  TROUPE_CHECK(id >= 0 && id < static_cast<int>(sequences_.size()) && sequences_[static_cast<size_t>(id)].open,
               "DecoderShard: no sequence " + std::to_string(id));
  return sequences_[static_cast<size_t>(id)];
}
const DecoderShard::Sequence& DecoderShard::sequence(int id) const {
  return const_cast<DecoderShard*>(this)->sequence(id);
}

void DecoderShard::open(int id) {
  TROUPE_CHECK(id >= 0, "DecoderShard: sequence ids are non-negative");
  if (static_cast<size_t>(id) >= sequences_.size()) sequences_.resize(static_cast<size_t>(id) + 1);
  Sequence& s = sequences_[static_cast<size_t>(id)];
  TROUPE_CHECK(!s.open, "DecoderShard: sequence " + std::to_string(id) + " is already open");
  s.open = true;
  s.length = 0;
  if (s.kv.empty()) {  // kept from a closed sequence of the same slot otherwise
    const int64_t width = 2 * groups_ * config_.head_size();
    for (int l = 0; l < spec_.num_layers; ++l)
      s.kv.push_back(Tensor::empty({config_.max_position_embeddings, width}, spec_.dtype));
  }
}

void DecoderShard::close(int id) { sequence(id).open = false; }

void DecoderShard::copy(int from, int to) {
  const int64_t n = sequence(from).length;
  open(to);
  const Sequence& src = sequence(from);  // open() may have grown sequences_
  Sequence& dst = sequence(to);
  if (n > 0)
    for (size_t l = 0; l < src.kv.size(); ++l) dst.kv[l].rows(0, n).copy_from(src.kv[l].rows(0, n));
  dst.length = n;
}

int64_t DecoderShard::length(int id) const { return sequence(id).length; }

void DecoderShard::norm(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b) const {
  const int64_t n = x.dim(0);
  Tensor rstd = Tensor::empty({n}, DType::f32);
  if (config_.normalization == Normalization::rmsnorm) {
    ops::rmsnorm_forward(ctx, out, rstd, x, w, config_.layernorm_epsilon);
  } else {
    Tensor mean = Tensor::empty({n}, DType::f32);
    ops::layernorm_forward(ctx, out, mean, rstd, x, w, b, config_.layernorm_epsilon);
  }
}

void DecoderShard::all_reduce(const Tensor& t, const char* what) const {
  comm::wait_or_throw(tp_->all_reduce(t.raw(), static_cast<size_t>(t.numel()), t.dtype(), comm::ReduceOp::sum), what,
                      comm::WaitGroup::tp);
}

void DecoderShard::add_bias(const Tensor& out, const Tensor& bias) const {
  const Tensor o32 = out.dtype() == DType::f32 ? out : out.to(DType::f32);
  const Tensor b32 = bias.dtype() == DType::f32 ? bias : bias.to(DType::f32);
  const int64_t n = o32.dim(0), o = o32.dim(1);
  float* d = o32.data<float>();
  const float* b = b32.data<float>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < o; ++c) d[r * o + c] += b[c];
  if (out.dtype() != DType::f32) out.copy_from(o32.to(out.dtype()));
}

void DecoderShard::linear(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b,
                          bool row_parallel) const {
  const auto packed = packed_.find(w.raw());
  auto forward = [&](const Tensor& bias) {
    if (packed != packed_.end()) ops::linear_forward_packed(ctx, out, x, packed->second, bias);
    else ops::linear_forward(ctx, out, x, w, bias);
  };
  if (!row_parallel || tp_ == nullptr) {
    forward(b);
    return;
  }
  forward(Tensor());
  all_reduce(out, "decode: a row-parallel linear's all-reduce");
  if (b.defined()) add_bias(out, b);
}

Tensor DecoderShard::embed(Context& ctx, const DecodeRows& rows, const std::vector<std::vector<int32_t>>& tokens) const {
  TROUPE_CHECK(spec_.embedding, "DecoderShard::embed: the shard holds no embedding");
  const int64_t C = config_.hidden_size, R = rows.rows(), vocab_rows = wte_.dim(0);
  // In fp32: the token's row (+ its position's), rounded once to the shard's type.
  const bool f32 = spec_.dtype == DType::f32;
  Tensor x = Tensor::empty({R, C}, DType::f32);
  float* xd = x.data<float>();
  for (size_t i = 0; i < rows.ids.size(); ++i)
    for (size_t j = 0; j < tokens[i].size(); ++j) {
      float* row = xd + (rows.row0[i] + static_cast<int64_t>(j)) * C;
      const int64_t v = tokens[i][j] - vocab_begin_;
      if (v < 0 || v >= vocab_rows) std::fill_n(row, C, 0.0f);
      else if (f32) std::copy_n(wte_.data<float>() + v * C, C, row);
      else std::copy_n(wte_.rows(v, v + 1).to(DType::f32).data<float>(), C, row);
    }
  if (tp_ != nullptr) all_reduce(x, "decode: the vocabulary-parallel embedding's all-reduce");
  if (wpe_.defined()) {
    for (size_t i = 0; i < rows.ids.size(); ++i) {
      const int64_t pos0 = length(rows.ids[i]), n = static_cast<int64_t>(tokens[i].size());
      const Tensor pe = f32 ? wpe_.rows(pos0, pos0 + n) : wpe_.rows(pos0, pos0 + n).to(DType::f32);
      const float* p = pe.data<float>();
      float* row = xd + rows.row0[i] * C;
      for (int64_t e = 0; e < n * C; ++e) row[e] += p[e];
    }
  }
  if (!f32) x = x.to(spec_.dtype);
  if (config_.embed_layernorm) {
    Tensor normed = Tensor::empty({R, C}, spec_.dtype);
    Tensor mean = Tensor::empty({R}, DType::f32), rstd = Tensor::empty({R}, DType::f32);
    ops::layernorm_forward(ctx, normed, mean, rstd, x, ln_embd_w_, ln_embd_b_, config_.layernorm_epsilon);
    x = normed;
  }
  return x;
}

void DecoderShard::layers(Context& ctx, const DecodeRows& rows, const Tensor& x) {
  const GptConfig& m = config_;
  const int64_t R = rows.rows(), C = m.hidden_size, H = heads_, G = groups_, hs = m.head_size();
  const int64_t qkv_width = (H + 2 * G) * hs, kv_width = 2 * G * hs;
  ops::RotaryParams rotary_base;
  rotary_base.rotary_dim = m.rotary_dim();
  rotary_base.base = m.rotary_base;
  rotary_base.interleaved = m.rotary_interleaved;
  ops::AttentionLayout layout;
  layout.n_head = static_cast<int>(H);
  layout.n_group = static_cast<int>(G);
  layout.head_dim = static_cast<int>(hs);
  layout.alibi_slopes = alibi_;
  const DType dt = spec_.dtype;
  const size_t es = dtype_size(dt);
  Tensor a = Tensor::empty({R, C}, dt), qkv = Tensor::empty({R, qkv_width}, dt);
  Tensor att = Tensor::empty({R, H * hs}, dt), branch = Tensor::empty({R, C}, dt);
  const bool f32 = dt == DType::f32;
  std::vector<Tensor> caches(rows.ids.size());
  std::vector<int64_t> kv_len(rows.ids.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& p = layers_[l];
    norm(ctx, a, x, p.ln1_w, p.ln1_b);
    linear(ctx, qkv, a, p.attn_w, p.attn_b, false);
    // Per sequence: rotary at its positions, its new keys and values into its cache ([k | v] of each
    // new row); then every sequence's rows over its cache at once.
    for (size_t i = 0; i < rows.ids.size(); ++i) {
      Sequence& s = sequence(rows.ids[i]);
      const int64_t r0 = rows.row0[i], Tq = rows.row0[i + 1] - r0;
      if (m.position_embedding == PositionEmbedding::rope) {
        const Tensor q = qkv.rows(r0, r0 + Tq).view({1, Tq, qkv_width});
        ops::RotaryParams rotary = rotary_base;
        rotary.pos0 = s.length;
        ops::rotary_forward(ctx, q, 0, static_cast<int>(H), static_cast<int>(hs), rotary);
        ops::rotary_forward(ctx, q, H * hs, static_cast<int>(G), static_cast<int>(hs), rotary);
      }
      const char* src = static_cast<const char*>(qkv.raw());
      char* dst = static_cast<char*>(s.kv[l].raw());
      for (int64_t r = 0; r < Tq; ++r)
        std::memcpy(dst + (s.length + r) * kv_width * es, src + ((r0 + r) * qkv_width + H * hs) * es, kv_width * es);
      kv_len[i] = s.length + Tq;
      caches[i] = s.kv[l];
    }
    // The attention kernel is fp32: a 16-bit shard's queries widened and its caches read widened
    // (exactly, a task's group at a time), the result rounded once.
    if (f32) {
      ops::attention_cached_forward(ctx, att, qkv, rows.row0, caches, kv_len, layout);
    } else {
      const Tensor att32 = Tensor::empty({R, H * hs}, DType::f32);
      ops::attention_cached_forward(ctx, att32, qkv.to(DType::f32), rows.row0, caches, kv_len, layout);
      att.copy_from(att32.to(dt));
    }
    linear(ctx, branch, att, p.proj_w, p.proj_b, true);
    ops::add_inplace(ctx, x, branch);
    norm(ctx, a, x, p.ln2_w, p.ln2_b);
    if (p.moe) moe_mlp(ctx, p, a, branch);
    else mlp(ctx, p.mlp, a, branch);
    ops::add_inplace(ctx, x, branch);
  }
}

Tensor DecoderShard::scratch(size_t slot, const Shape& shape, DType dtype) const {
  if (scratch_.size() <= slot) scratch_.resize(slot + 1);
  const int64_t bytes = shape.numel() * static_cast<int64_t>(dtype_size(dtype));
  Tensor& buf = scratch_[slot];
  if (!buf.defined() || buf.numel() < bytes) buf = Tensor::empty({bytes}, DType::u8);
  return Tensor::wrap(buf.raw(), shape, dtype, std::make_shared<Tensor>(buf));  // keeps the buffer alive
}

void DecoderShard::mlp(Context& ctx, const Mlp& m, const Tensor& a, const Tensor& out) const {
  const int64_t R = a.dim(0), FC = m.fc_w.dim(0);
  const bool swiglu = config_.activation == MlpActivation::swiglu;
  const Tensor fc = scratch(0, {R, FC}, spec_.dtype);
  linear(ctx, fc, a, m.fc_w, m.fc_b, false);
  if (swiglu) {
    const Tensor act = scratch(1, {R, FC / 2}, spec_.dtype);
    ops::glu_forward(ctx, act, fc, ops::GluKind::swiglu);
    linear(ctx, out, act, m.proj_w, m.proj_b, true);
  } else {
    ops::gelu_forward(ctx, fc, fc);  // elementwise: in place
    linear(ctx, out, fc, m.proj_w, m.proj_b, true);
  }
}

void DecoderShard::moe_mlp(Context& ctx, const Layer& p, const Tensor& a, const Tensor& out) const {
  const int64_t R = a.dim(0), C = config_.hidden_size, E = p.router_w.dim(0);
  const DType dt = spec_.dtype;
  const bool f32 = dt == DType::f32;
  MoeConfig dropless = config_.moe;
  dropless.drop_tokens = false;
  const int64_t k = dropless.topk;
  Tensor logits = Tensor::empty({R, E}, dt);
  ops::linear_forward(ctx, logits, a, p.router_w, p.router_b);
  const Tensor logits32 = f32 ? logits : logits.to(DType::f32);
  std::vector<double> z(static_cast<size_t>(R * E));
  std::copy_n(logits32.data<float>(), R * E, z.data());
  const MoeRouting rt = moe_route(dropless, z.data(), 1, R, E, /*training=*/false, {});
  // routed = sum_j w_nj expert_(n,j)(a_n), in fp32: each expert over its rows at once; partial sums
  // over the group, reduced once: slices of every expert (c_proj's bias on rank 0 only, inside the
  // sum), or whole experts of the shard's own (each with its bias).
  const bool whole_experts = spec_.expert_parallel || spec_.tp_size == 1;
  const Tensor routed = Tensor::zeros({R, C}, DType::f32);
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
  for (int64_t i = 0; i < R * k; ++i)
    if (rt.kept[static_cast<size_t>(i)]) by_expert[static_cast<size_t>(rt.expert[static_cast<size_t>(i)])].push_back(i);
  const bool swiglu = config_.activation == MlpActivation::swiglu;
  for (int64_t e = 0; e < static_cast<int64_t>(p.experts.size()); ++e) {
    const std::vector<int64_t>& assigned = by_expert[static_cast<size_t>(p.expert0 + e)];
    if (assigned.empty()) continue;
    const Mlp& w = p.experts[static_cast<size_t>(e)];
    const int64_t n = static_cast<int64_t>(assigned.size()), FC = w.fc_w.dim(0);
    Tensor xe = Tensor::empty({n, C}, dt), fc = Tensor::empty({n, FC}, dt);
    Tensor act = Tensor::empty({n, swiglu ? FC / 2 : FC}, dt), ye = Tensor::empty({n, C}, dt);
    for (int64_t i = 0; i < n; ++i) xe.rows(i, i + 1).copy_from(a.rows(assigned[i] / k, assigned[i] / k + 1));
    ops::linear_forward(ctx, fc, xe, w.fc_w, w.fc_b);
    if (swiglu) ops::glu_forward(ctx, act, fc, ops::GluKind::swiglu);
    else ops::gelu_forward(ctx, act, fc);
    ops::linear_forward(ctx, ye, act, w.proj_w, whole_experts || spec_.tp_rank == 0 ? w.proj_b : Tensor());
    const Tensor ye32 = f32 ? ye : ye.to(DType::f32);
    float* o = routed.data<float>();
    const float* y = ye32.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const float wt = static_cast<float>(rt.weight[static_cast<size_t>(assigned[i])]);
      float* row = o + (assigned[i] / k) * C;
      for (int64_t c = 0; c < C; ++c) row[c] += wt * y[i * C + c];
    }
  }
  if (tp_ != nullptr) all_reduce(routed, "decode: the experts' all-reduce");
  if (p.coef_w.defined()) {  // PR-MoE: routed * c0 + mlp * c1, c = softmax(a W_coef^T + b_coef)
    Tensor dense = Tensor::empty({R, C}, dt), cl = Tensor::empty({R, 2}, dt);
    mlp(ctx, p.mlp, a, dense);
    ops::linear_forward(ctx, cl, a, p.coef_w, p.coef_b);
    const Tensor dense32 = f32 ? dense : dense.to(DType::f32), cl32 = f32 ? cl : cl.to(DType::f32);
    float* o = routed.data<float>();
    const float* d = dense32.data<float>();
    const float* zc = cl32.data<float>();
    for (int64_t r = 0; r < R; ++r) {
      const double mx = std::max<double>(zc[r * 2], zc[r * 2 + 1]);
      const double e0 = std::exp(zc[r * 2] - mx), e1 = std::exp(zc[r * 2 + 1] - mx);
      const float c0 = static_cast<float>(e0 / (e0 + e1)), c1 = static_cast<float>(e1 / (e0 + e1));
      for (int64_t c = 0; c < C; ++c) o[r * C + c] = o[r * C + c] * c0 + d[r * C + c] * c1;
    }
  }
  out.copy_from(f32 ? routed : routed.to(dt));
  if (p.shared.defined()) {
    Tensor sh = Tensor::empty({R, C}, dt);
    mlp(ctx, p.shared, a, sh);
    ops::add_inplace(ctx, out, sh);
  }
}

void DecoderShard::advance(const DecodeRows& rows) {
  for (size_t i = 0; i < rows.ids.size(); ++i) sequence(rows.ids[i]).length += rows.row0[i + 1] - rows.row0[i];
}

std::vector<std::vector<float>> DecoderShard::head(Context& ctx, const DecodeRows& rows, const Tensor& x,
                                                   const std::vector<uint8_t>& every) const {
  TROUPE_CHECK(spec_.head, "DecoderShard::head: the shard holds no head");
  TROUPE_CHECK(every.size() == rows.ids.size(), "DecoderShard::head: one every-token flag per sequence");
  const int64_t C = config_.hidden_size, S = static_cast<int64_t>(rows.ids.size());
  // The rows the head runs on: each sequence's last, or all of its rows; hrow0[i] is where
  // sequence i's start among them.
  std::vector<int64_t> hrow0(static_cast<size_t>(S) + 1, 0);
  bool all = true;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t own = every[static_cast<size_t>(i)] ? rows.row0[i + 1] - rows.row0[i] : 1;
    all = all && own == rows.row0[i + 1] - rows.row0[i];
    hrow0[static_cast<size_t>(i) + 1] = hrow0[static_cast<size_t>(i)] + own;
  }
  const int64_t n = hrow0.back();
  Tensor last = all ? x : Tensor::empty({n, C}, spec_.dtype);
  if (!all)
    for (int64_t i = 0; i < S; ++i) {
      const int64_t h0 = hrow0[static_cast<size_t>(i)], h1 = hrow0[static_cast<size_t>(i) + 1];
      last.rows(h0, h1).copy_from(x.rows(rows.row0[i + 1] - (h1 - h0), rows.row0[i + 1]));
    }
  Tensor normed = Tensor::empty({n, C}, spec_.dtype);
  norm(ctx, normed, last, lnf_w_, lnf_b_);
  const int64_t Vt = head_.dim(0), V = config_.vocab_size, t = spec_.tp_size;
  // The logits as the model holds them (a 16-bit model's rounded, as its training loss reads them).
  Tensor logits = Tensor::empty({n, Vt}, spec_.dtype);
  linear(ctx, logits, normed, head_, Tensor(), false);
  if (spec_.dtype != DType::f32) logits = logits.to(DType::f32);
  // gathered: the shards' (n, Vt) blocks one after the other; vocabulary row v is in block v / Vt.
  Tensor gathered = logits;
  if (tp_ != nullptr) {
    gathered = Tensor::empty({t * n, Vt}, DType::f32);
    comm::wait_or_throw(tp_->all_gather(logits.data<float>(), gathered.data<float>(), static_cast<size_t>(n * Vt),
                                        DType::f32),
                        "decode: the vocabulary-parallel head's all-gather", comm::WaitGroup::tp);
  }
  std::vector<std::vector<float>> out(static_cast<size_t>(S));
  const float* g = gathered.data<float>();
  for (int64_t i = 0; i < S; ++i) {
    std::vector<float>& o = out[static_cast<size_t>(i)];
    const int64_t r0 = hrow0[static_cast<size_t>(i)], r1 = hrow0[static_cast<size_t>(i) + 1];
    o.reserve(static_cast<size_t>((r1 - r0) * V));
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b * Vt < V; ++b) {
        const float* src = g + (b * n + r) * Vt;
        o.insert(o.end(), src, src + std::min(Vt, V - b * Vt));
      }
  }
  return out;
}

}  // namespace troupe
