#include "storage/hf_names.hpp"

#include <algorithm>

namespace troupe {

bool is_conv1d_weight(const std::string& name) {
  for (const std::string suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  return false;
}

std::vector<HfTensor> gpt2_hf_tensors(int64_t layers, int64_t V, int64_t P, int64_t C) {
  std::vector<HfTensor> out;
  auto add = [&](const std::string& name, const Shape& troupe_shape) {
    const Shape hf = is_conv1d_weight(name) ? Shape{troupe_shape[1], troupe_shape[0]} : troupe_shape;
    HfTensor t;
    t.name = name;
    t.troupe_shape = troupe_shape;
    t.hf_shape = hf;
    t.rows = is_conv1d_weight(name) ? HfRows::transpose : HfRows::copy;
    out.push_back(std::move(t));
  };
  add("transformer.wte.weight", {V, C});
  add("transformer.wpe.weight", {P, C});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {3 * C, C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {4 * C, C});
    add(h + "mlp.c_fc.bias", {4 * C});
    add(h + "mlp.c_proj.weight", {C, 4 * C});
    add(h + "mlp.c_proj.bias", {C});
  }
  add("transformer.ln_f.weight", {C});
  add("transformer.ln_f.bias", {C});
  return out;
}

const char* hf_architecture(HfFamily f) {
  switch (f) {
    case HfFamily::gpt2: return "GPT2LMHeadModel";
    case HfFamily::llama: return "LlamaForCausalLM";
    case HfFamily::bloom: return "BloomForCausalLM";
    case HfFamily::mixtral: return "MixtralForCausalLM";
  }
  return "?";
}

std::vector<HfTensor> hf_family_tensors(const HfArch& a) {
  const int64_t C = a.hidden, H = a.heads, G = a.groups, hd = a.head_dim, F = a.ffn, V = a.vocab;
  const int64_t QKV = (H + 2 * G) * hd;
  std::vector<HfTensor> out;
  // HF tensor `name` of shape `hf` = rows [row0, ...) of troupe's `source` of shape `troupe`.
  auto add = [&](std::string name, Shape hf, std::string source, Shape troupe, HfRows rows = HfRows::copy,
                 int64_t row0 = 0) {
    HfTensor t;
    t.name = std::move(name);
    t.hf_shape = hf;
    t.troupe_name = std::move(source);
    t.troupe_shape = troupe;
    t.rows = rows;
    t.row0 = row0;
    t.head_dim = hd;
    t.heads = H;
    out.push_back(std::move(t));
  };
  if (a.family == HfFamily::llama || a.family == HfFamily::mixtral) {
    // q and k rows in HF's rotate-half order: permuted per head when troupe's pairs are interleaved.
    const HfRows qk = a.rotary_interleaved ? HfRows::rotary : HfRows::copy;
    add("model.embed_tokens.weight", {V, C}, "transformer.wte.weight", {V, C});
    for (int64_t i = 0; i < a.layers; ++i) {
      const std::string hf = "model.layers." + std::to_string(i) + ".";
      const std::string t = "transformer.h." + std::to_string(i) + ".";
      add(hf + "input_layernorm.weight", {C}, t + "ln_1.weight", {C});
      add(hf + "self_attn.q_proj.weight", {H * hd, C}, t + "attn.c_attn.weight", {QKV, C}, qk, 0);
      if (a.bias) add(hf + "self_attn.q_proj.bias", {H * hd}, t + "attn.c_attn.bias", {QKV}, qk, 0);
      add(hf + "self_attn.k_proj.weight", {G * hd, C}, t + "attn.c_attn.weight", {QKV, C}, qk, H * hd);
      if (a.bias) add(hf + "self_attn.k_proj.bias", {G * hd}, t + "attn.c_attn.bias", {QKV}, qk, H * hd);
      add(hf + "self_attn.v_proj.weight", {G * hd, C}, t + "attn.c_attn.weight", {QKV, C}, HfRows::copy, (H + G) * hd);
      if (a.bias)
        add(hf + "self_attn.v_proj.bias", {G * hd}, t + "attn.c_attn.bias", {QKV}, HfRows::copy, (H + G) * hd);
      add(hf + "self_attn.o_proj.weight", {C, H * hd}, t + "attn.c_proj.weight", {C, H * hd});
      if (a.bias) add(hf + "self_attn.o_proj.bias", {C}, t + "attn.c_proj.bias", {C});
      add(hf + "post_attention_layernorm.weight", {C}, t + "ln_2.weight", {C});
      if (a.family == HfFamily::mixtral) {  // the sparse MoE block (no biases in Mixtral)
        const int64_t E = a.experts;
        add(hf + "block_sparse_moe.gate.weight", {E, C}, t + "mlp.router.weight", {E, C});
        for (int64_t e = 0; e < E; ++e) {
          const std::string x = hf + "block_sparse_moe.experts." + std::to_string(e) + ".";
          const std::string y = t + "mlp.experts." + std::to_string(e) + ".";
          add(x + "w1.weight", {F, C}, y + "c_fc.weight", {2 * F, C}, HfRows::copy, 0);
          add(x + "w2.weight", {C, F}, y + "c_proj.weight", {C, F});
          add(x + "w3.weight", {F, C}, y + "c_fc.weight", {2 * F, C}, HfRows::copy, F);
        }
        continue;
      }
      add(hf + "mlp.gate_proj.weight", {F, C}, t + "mlp.c_fc.weight", {2 * F, C}, HfRows::copy, 0);
      if (a.bias) add(hf + "mlp.gate_proj.bias", {F}, t + "mlp.c_fc.bias", {2 * F}, HfRows::copy, 0);
      add(hf + "mlp.up_proj.weight", {F, C}, t + "mlp.c_fc.weight", {2 * F, C}, HfRows::copy, F);
      if (a.bias) add(hf + "mlp.up_proj.bias", {F}, t + "mlp.c_fc.bias", {2 * F}, HfRows::copy, F);
      add(hf + "mlp.down_proj.weight", {C, F}, t + "mlp.c_proj.weight", {C, F});
      if (a.bias) add(hf + "mlp.down_proj.bias", {C}, t + "mlp.c_proj.bias", {C});
    }
    add("model.norm.weight", {C}, "transformer.ln_f.weight", {C});
  } else {
    add("transformer.word_embeddings.weight", {V, C}, "transformer.wte.weight", {V, C});
    add("transformer.word_embeddings_layernorm.weight", {C}, "transformer.ln_embd.weight", {C});
    add("transformer.word_embeddings_layernorm.bias", {C}, "transformer.ln_embd.bias", {C});
    for (int64_t i = 0; i < a.layers; ++i) {
      const std::string h = "transformer.h." + std::to_string(i) + ".";
      for (const char* w : {"weight", "bias"}) add(h + "input_layernorm." + w, {C}, h + "ln_1." + w, {C});
      add(h + "self_attention.query_key_value.weight", {3 * C, C}, h + "attn.c_attn.weight", {3 * C, C},
          HfRows::bloom_qkv);
      add(h + "self_attention.query_key_value.bias", {3 * C}, h + "attn.c_attn.bias", {3 * C}, HfRows::bloom_qkv);
      add(h + "self_attention.dense.weight", {C, C}, h + "attn.c_proj.weight", {C, C});
      add(h + "self_attention.dense.bias", {C}, h + "attn.c_proj.bias", {C});
      for (const char* w : {"weight", "bias"}) add(h + "post_attention_layernorm." + w, {C}, h + "ln_2." + w, {C});
      add(h + "mlp.dense_h_to_4h.weight", {F, C}, h + "mlp.c_fc.weight", {F, C});
      add(h + "mlp.dense_h_to_4h.bias", {F}, h + "mlp.c_fc.bias", {F});
      add(h + "mlp.dense_4h_to_h.weight", {C, F}, h + "mlp.c_proj.weight", {C, F});
      add(h + "mlp.dense_4h_to_h.bias", {C}, h + "mlp.c_proj.bias", {C});
    }
    for (const char* w : {"weight", "bias"}) add(std::string("transformer.ln_f.") + w, {C}, std::string("transformer.ln_f.") + w, {C});
  }
  if (!a.tied) add("lm_head.weight", {V, C}, "lm_head.weight", {V, C});
  return out;
}

int64_t hf_troupe_row(const HfTensor& t, int64_t r) {
  switch (t.rows) {
    case HfRows::copy:
    case HfRows::transpose: return t.row0 + r;
    case HfRows::rotary: {  // HF's rotate-half row d of a head <- troupe's interleaved row
      const int64_t head = r / t.head_dim, d = r % t.head_dim, half = t.head_dim / 2;
      return t.row0 + head * t.head_dim + (d < half ? 2 * d : 2 * (d - half) + 1);
    }
    case HfRows::bloom_qkv: {  // HF row (h*3 + j)*hs + d <- troupe row j*C + h*hs + d
      const int64_t hs = t.head_dim, h = r / (3 * hs), j = r / hs % 3, d = r % hs;
      return j * t.heads * hs + h * hs + d;
    }
  }
  return r;
}

namespace {
int64_t row_elems(const Shape& s) {
  int64_t n = 1;
  for (int i = 1; i < s.rank(); ++i) n *= s[i];
  return n;
}
}  // namespace

void rows_to_hf(const HfTensor& t, const float* troupe, float* hf) {
  if (t.rows == HfRows::transpose) return transpose(troupe, t.troupe_shape[0], t.troupe_shape[1], hf);
  const int64_t inner = row_elems(t.hf_shape);
  for (int64_t r = 0; r < t.hf_shape[0]; ++r)
    std::copy_n(troupe + hf_troupe_row(t, r) * inner, inner, hf + r * inner);
}

void rows_from_hf(const HfTensor& t, const float* hf, float* troupe) {
  if (t.rows == HfRows::transpose) return transpose(hf, t.hf_shape[0], t.hf_shape[1], troupe);
  const int64_t inner = row_elems(t.hf_shape);
  for (int64_t r = 0; r < t.hf_shape[0]; ++r)
    std::copy_n(hf + r * inner, inner, troupe + hf_troupe_row(t, r) * inner);
}

void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(r0 + kTile, rows); ++r)
        for (int64_t c = c0; c < std::min(c0 + kTile, cols); ++c) dst[c * rows + r] = src[r * cols + c];
}

}  // namespace troupe
