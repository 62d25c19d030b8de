// model/decoder.hpp.
#include "model/decoder.hpp"

#include <algorithm>
#include <map>

#include "kernels/ops.hpp"

namespace troupe {

namespace {

const char* const kLayerNames[12] = {"ln_1.weight",      "ln_1.bias",     "attn.c_attn.weight", "attn.c_attn.bias",
                                     "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",     "ln_2.bias",
                                     "mlp.c_fc.weight",  "mlp.c_fc.bias", "mlp.c_proj.weight",  "mlp.c_proj.bias"};

}  // namespace

std::string Decoder::check(const GptConfig& config) {
  if (Status st = config.validate(); !st) return st.message();
  if (config.moe.enabled())
    return "the model has mixture-of-experts layers, which generation does not run yet -- generate from a dense "
           "model";
  return {};
}

Decoder::Decoder(const GptConfig& config) : config_(config), specs_(gpt2_param_specs(config)) {
  const std::string why = check(config);
  TROUPE_CHECK(why.empty(), "Decoder: " + why);
  std::map<std::string, Tensor> by_name;
  for (const ParamSpec& s : specs_) {
    params_.push_back(Tensor::zeros(s.local_shape, DType::f32));
    by_name[s.name] = params_.back();
  }
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
  head_ = config.untie_embeddings_and_output_weights ? find("lm_head.weight") : wte_;
  for (int l = 0; l < config.num_layers; ++l) {
    Tensor t[12];
    for (int k = 0; k < 12; ++k) t[k] = find("transformer.h." + std::to_string(l) + "." + kLayerNames[k]);
    layers_.push_back({t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11]});
  }
  if (config.position_embedding == PositionEmbedding::alibi) alibi_ = ops::alibi_slopes(config.num_attention_heads);
}

int Decoder::open_sequence() {
  size_t id = 0;
  while (id < sequences_.size() && sequences_[id].open) ++id;
  if (id == sequences_.size()) sequences_.emplace_back();
  Sequence& s = sequences_[id];
  s.open = true;
  s.length = 0;
  if (s.kv.empty()) {
    const int64_t width = 2LL * config_.query_groups() * config_.head_size();
    for (int l = 0; l < config_.num_layers; ++l)
      s.kv.push_back(Tensor::empty({config_.max_position_embeddings, width}, DType::f32));
  }
  return static_cast<int>(id);
}

int Decoder::copy_sequence(int from) {
  TROUPE_CHECK(from >= 0 && from < static_cast<int>(sequences_.size()) && sequences_[from].open,
               "Decoder: no sequence " + std::to_string(from));
  const int id = open_sequence();  // may grow sequences_: index afresh below
  const Sequence& src = sequences_[static_cast<size_t>(from)];
  Sequence& dst = sequences_[static_cast<size_t>(id)];
  for (size_t l = 0; l < src.kv.size(); ++l)
    if (src.length > 0) dst.kv[l].rows(0, src.length).copy_from(src.kv[l].rows(0, src.length));
  dst.length = src.length;
  return id;
}

void Decoder::close_sequence(int id) {
  TROUPE_CHECK(id >= 0 && id < static_cast<int>(sequences_.size()) && sequences_[id].open, "Decoder: no sequence " +
                                                                                                   std::to_string(id));
  sequences_[id].open = false;  // its cache is kept for the next sequence opened
}

int64_t Decoder::length(int id) const {
  TROUPE_CHECK(id >= 0 && id < static_cast<int>(sequences_.size()) && sequences_[id].open, "Decoder: no sequence " +
                                                                                                   std::to_string(id));
  return sequences_[id].length;
}

void Decoder::norm(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b) const {
  const int64_t n = x.dim(0);
  Tensor rstd = Tensor::empty({n}, DType::f32);
  if (config_.normalization == Normalization::rmsnorm) {
    ops::rmsnorm_forward(ctx, out, rstd, x, w, config_.layernorm_epsilon);
  } else {
    Tensor mean = Tensor::empty({n}, DType::f32);
    ops::layernorm_forward(ctx, out, mean, rstd, x, w, b, config_.layernorm_epsilon);
  }
}

Result<std::vector<std::vector<float>>> Decoder::feed(Context& ctx, const std::vector<int>& ids,
                                                      const std::vector<std::vector<int32_t>>& tokens,
                                                      bool every_token) {
  if (ids.size() != tokens.size() || ids.empty())
    return Status::bad_input("Decoder::feed: one token list per sequence, at least one sequence");
  const GptConfig& m = config_;
  const int64_t C = m.hidden_size, H = m.num_attention_heads, G = m.query_groups(), hs = m.head_size();
  const int64_t qkv_width = (H + 2 * G) * hs, kv_width = 2 * G * hs;
  // Rows: the sequences' new tokens one after the other.
  std::vector<int64_t> row0(ids.size() + 1, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    if (id < 0 || id >= static_cast<int>(sequences_.size()) || !sequences_[id].open)
      return Status::bad_input("Decoder::feed: no open sequence " + std::to_string(id));
    for (size_t j = 0; j < i; ++j)
      if (ids[j] == id) return Status::bad_input("Decoder::feed: sequence " + std::to_string(id) + " given twice");
    if (tokens[i].empty()) return Status::bad_input("Decoder::feed: no tokens for sequence " + std::to_string(id));
    const int64_t end = sequences_[id].length + static_cast<int64_t>(tokens[i].size());
    if (end > m.max_position_embeddings)
      return Status::bad_input("the sequence would be " + std::to_string(end) + " tokens, over the model's " +
                               std::to_string(m.max_position_embeddings) +
                               " positions (--max-position-embeddings) -- shorten the prompt or generate fewer tokens");
    for (int32_t t : tokens[i])
      if (t < 0 || t >= m.vocab_size)
        return Status::bad_input("token " + std::to_string(t) + " is outside the model's vocabulary of " +
                                 std::to_string(m.vocab_size) + " -- tokenize with the checkpoint's tokenizer");
    row0[i + 1] = row0[i] + static_cast<int64_t>(tokens[i].size());
  }
  const int64_t R = row0.back();

  // Embedding: wte's row (+ wpe's at the token's position), BLOOM's LayerNorm after.
  Tensor x = Tensor::empty({R, C}, DType::f32);
  {
    float* xd = x.data<float>();
    const float* te = wte_.data<float>();
    const float* pe = wpe_.defined() ? wpe_.data<float>() : nullptr;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t pos0 = sequences_[ids[i]].length;
      for (size_t j = 0; j < tokens[i].size(); ++j) {
        float* row = xd + (row0[i] + static_cast<int64_t>(j)) * C;
        const float* e = te + static_cast<int64_t>(tokens[i][j]) * C;
        const float* p = pe != nullptr ? pe + (pos0 + static_cast<int64_t>(j)) * C : nullptr;
        for (int64_t c = 0; c < C; ++c) row[c] = p != nullptr ? e[c] + p[c] : e[c];
      }
    }
  }
  if (m.embed_layernorm) {
    Tensor normed = Tensor::empty({R, C}, DType::f32);
    Tensor mean = Tensor::empty({R}, DType::f32), rstd = Tensor::empty({R}, DType::f32);
    ops::layernorm_forward(ctx, normed, mean, rstd, x, ln_embd_w_, ln_embd_b_, m.layernorm_epsilon);
    x = normed;
  }

  const ops::RotaryParams rotary_base{m.rotary_dim(), m.rotary_base, m.rotary_interleaved, 0};
  ops::AttentionLayout layout;
  layout.n_head = static_cast<int>(H);
  layout.n_group = static_cast<int>(G);
  layout.head_dim = static_cast<int>(hs);
  layout.alibi_slopes = alibi_;
  const int64_t F = m.ffn_hidden_size(), FC = m.activation == MlpActivation::swiglu ? 2 * F : F;
  Tensor a = Tensor::empty({R, C}, DType::f32), qkv = Tensor::empty({R, qkv_width}, DType::f32);
  Tensor att = Tensor::empty({R, H * hs}, DType::f32), branch = Tensor::empty({R, C}, DType::f32);
  Tensor fc = Tensor::empty({R, FC}, DType::f32), act = Tensor::empty({R, F}, DType::f32);
  for (int l = 0; l < m.num_layers; ++l) {
    const Layer& p = layers_[static_cast<size_t>(l)];
    norm(ctx, a, x, p.ln1_w, p.ln1_b);
    ops::linear_forward(ctx, qkv, a, p.attn_w, p.attn_b);
    for (size_t i = 0; i < ids.size(); ++i) {
      Sequence& s = sequences_[ids[i]];
      const int64_t Tq = row0[i + 1] - row0[i], Tk = s.length + Tq;
      const Tensor q = qkv.rows(row0[i], row0[i + 1]).view({1, Tq, qkv_width});
      if (m.position_embedding == PositionEmbedding::rope) {
        ops::RotaryParams rotary = rotary_base;
        rotary.pos0 = s.length;
        ops::rotary_forward(ctx, q, 0, static_cast<int>(H), static_cast<int>(hs), rotary);
        ops::rotary_forward(ctx, q, H * hs, static_cast<int>(G), static_cast<int>(hs), rotary);
      }
      // The new keys and values join the cache: [k | v] of each new row.
      const Tensor& cache = s.kv[static_cast<size_t>(l)];
      {
        const float* src = qkv.data<float>();
        float* dst = cache.data<float>();
        for (int64_t r = 0; r < Tq; ++r)
          std::copy_n(src + (row0[i] + r) * qkv_width + H * hs, kv_width, dst + (s.length + r) * kv_width);
      }
      ops::AttentionBlock block;
      block.layout = layout;
      block.seq_len = Tk;
      for (int64_t r = 0; r < Tq; ++r) block.qpos.push_back(s.length + r);
      for (int64_t r = 0; r < Tk; ++r) block.kpos.push_back(r);
      Tensor acc = Tensor::empty({1, Tq, H * hs}, DType::f32);
      Tensor mx = Tensor::empty({1, H, Tq}, DType::f32), sum = Tensor::empty({1, H, Tq}, DType::f32);
      Tensor lse = Tensor::empty({1, H, Tq}, DType::f32);
      ops::attention_block_begin(ctx, acc, mx, sum);
      ops::attention_block_forward(ctx, acc, mx, sum, q, cache.rows(0, Tk).view({1, Tk, kv_width}), block);
      ops::attention_block_finish(ctx, att.rows(row0[i], row0[i + 1]).view({1, Tq, H * hs}), lse, acc, mx, sum);
    }
    ops::linear_forward(ctx, branch, att, p.proj_w, p.proj_b);
    ops::add_inplace(ctx, x, branch);
    norm(ctx, a, x, p.ln2_w, p.ln2_b);
    ops::linear_forward(ctx, fc, a, p.fc_w, p.fc_b);
    if (m.activation == MlpActivation::swiglu) ops::glu_forward(ctx, act, fc, ops::GluKind::swiglu);
    else ops::gelu_forward(ctx, act, fc);
    ops::linear_forward(ctx, branch, act, p.fcproj_w, p.fcproj_b);
    ops::add_inplace(ctx, x, branch);
  }
  for (size_t i = 0; i < ids.size(); ++i) sequences_[ids[i]].length += row0[i + 1] - row0[i];

  // The head on each sequence's last row (or on every row).
  const int64_t S = static_cast<int64_t>(ids.size());
  const int64_t heads = every_token ? R : S;
  Tensor last = every_token ? x : Tensor::empty({S, C}, DType::f32);
  if (!every_token)
    for (int64_t i = 0; i < S; ++i) last.rows(i, i + 1).copy_from(x.rows(row0[i + 1] - 1, row0[i + 1]));
  Tensor normed = Tensor::empty({heads, C}, DType::f32);
  norm(ctx, normed, last, lnf_w_, lnf_b_);
  const int64_t Vp = head_.dim(0), V = m.vocab_size;
  Tensor logits = Tensor::empty({heads, Vp}, DType::f32);
  ops::linear_forward(ctx, logits, normed, head_, Tensor());
  std::vector<std::vector<float>> out(static_cast<size_t>(S));
  const float* lg = logits.data<float>();
  for (int64_t i = 0; i < S; ++i) {
    std::vector<float>& o = out[static_cast<size_t>(i)];
    const int64_t r0 = every_token ? row0[i] : i, r1 = every_token ? row0[i + 1] : i + 1;
    o.reserve(static_cast<size_t>((r1 - r0) * V));
    for (int64_t r = r0; r < r1; ++r) o.insert(o.end(), lg + r * Vp, lg + r * Vp + V);
  }
  return out;
}

}  // namespace troupe
