#include "reference/gpt.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "kernels/ops.hpp"
#include "reference/dropout.hpp"

namespace troupe {

namespace {
// Logits chunk budget in elements: bounds the (rows x Vp) buffer of the fused head.
constexpr int64_t kLogitChunkElems = int64_t{16} << 20;
// A layer's parameter names in Layer's member order.
constexpr const char* kLayerNames[12] = {"ln_1.weight",       "ln_1.bias",        "attn.c_attn.weight",
                                         "attn.c_attn.bias",  "attn.c_proj.weight", "attn.c_proj.bias",
                                         "ln_2.weight",       "ln_2.bias",        "mlp.c_fc.weight",
                                         "mlp.c_fc.bias",     "mlp.c_proj.weight", "mlp.c_proj.bias"};
}  // namespace

GptModel::GptModel(const GptConfig& config, int max_micro_batch, DType dtype)
    : config_(config),
      max_micro_batch_(max_micro_batch),
      dtype_(dtype),
      padded_vocab_(config.padded_vocab_size(1)),
      specs_(gpt2_param_specs(config)) {
  TROUPE_CHECK(config.validate().is_ok(), "GptModel needs a validated GptConfig");
  TROUPE_CHECK(max_micro_batch > 0, "max_micro_batch must be positive");
  int64_t total = 0;
  for (const ParamSpec& s : specs_) total += s.local_shape.numel();
  flat_params_ = Tensor::zeros({total}, dtype);
  flat_grads_ = Tensor::zeros({total}, dtype);
  int64_t off = 0;
  for (const ParamSpec& s : specs_) {
    const int64_t n = s.local_shape.numel();
    params_.push_back(flat_params_.rows(off, off + n).view(s.local_shape));
    grads_.push_back(flat_grads_.rows(off, off + n).view(s.local_shape));
    off += n;
  }
  std::map<std::string, int> by_name;
  for (size_t i = 0; i < specs_.size(); ++i) by_name[specs_[i].name] = static_cast<int>(i);
  auto find = [&](const std::string& name) {
    auto it = by_name.find(name);
    return it == by_name.end() ? -1 : it->second;
  };
  index_.wte = find("transformer.wte.weight");
  index_.wpe = find("transformer.wpe.weight");
  index_.ln_embd_w = find("transformer.ln_embd.weight");
  index_.ln_embd_b = find("transformer.ln_embd.bias");
  index_.lnf_w = find("transformer.ln_f.weight");
  index_.lnf_b = find("transformer.ln_f.bias");
  index_.lm_head = find("lm_head.weight");
  for (int l = 0; l < config.num_layers; ++l) {
    std::array<int, 12> layer;
    for (int k = 0; k < 12; ++k) layer[k] = find("transformer.h." + std::to_string(l) + "." + kLayerNames[k]);
    index_.layers.push_back(layer);
  }
  // The specs must hold exactly what the config's architecture has (model/params.hpp).
  const bool layernorm = config.normalization == Normalization::layernorm, bias = config.add_bias_linear;
  TROUPE_CHECK(index_.wte >= 0 && index_.lnf_w >= 0 && (index_.lnf_b >= 0) == layernorm,
               "GptModel: the specs lack wte or ln_f, or ln_f's bias disagrees with the normalization");
  TROUPE_CHECK((index_.wpe >= 0) == (config.position_embedding == PositionEmbedding::learned_absolute),
               "GptModel: wpe must exist exactly with learned_absolute positions");
  TROUPE_CHECK((index_.ln_embd_w >= 0 && index_.ln_embd_b >= 0) == config.embed_layernorm,
               "GptModel: ln_embd must exist exactly with embed_layernorm");
  TROUPE_CHECK((index_.lm_head >= 0) == config.untie_embeddings_and_output_weights,
               "GptModel: lm_head.weight must exist exactly with untied embeddings");
  for (const std::array<int, 12>& layer : index_.layers)
    for (int k = 0; k < 12; ++k) {
      const bool is_bias = k % 2 == 1, is_norm = k == 0 || k == 1 || k == 6 || k == 7;
      const bool wanted = !is_bias || (is_norm ? layernorm : bias);
      TROUPE_CHECK((layer[k] >= 0) == wanted, "GptModel: a layer's parameters disagree with the config "
                                              "(norm biases, linear biases)");
    }

  const int64_t T = config.seq_length, C = config.hidden_size, F = config.ffn_hidden_size();
  const int64_t H = config.num_attention_heads, N = max_micro_batch * T;
  const int64_t QKV = config.qkv_size(), A = config.attention_size();
  const int64_t F1 = config.activation == MlpActivation::swiglu ? 2 * F : F;  // rows of c_fc
  inputs_ = Tensor::empty({N}, DType::i32);
  targets_ = Tensor::empty({N}, DType::i32);
  embed_ = Tensor::empty({N, C}, dtype);
  if (config.embed_layernorm) {
    embed_raw_ = Tensor::empty({N, C}, dtype);
    embed_mean_ = Tensor::empty({N}, dtype);
    embed_rstd_ = Tensor::empty({N}, dtype);
    dembed_raw_ = Tensor::empty({N, C}, dtype);
  }
  acts_.resize(config.num_layers);
  for (LayerActs& a : acts_) {
    a.ln1 = Tensor::empty({N, C}, dtype);
    a.ln1_mean = Tensor::empty({N}, dtype);
    a.ln1_rstd = Tensor::empty({N}, dtype);
    a.qkv = Tensor::empty({N, QKV}, dtype);
    a.probs = Tensor::empty({max_micro_batch * H * T, T}, dtype);
    a.att = Tensor::empty({N, A}, dtype);
    a.res1 = Tensor::empty({N, C}, dtype);
    a.ln2 = Tensor::empty({N, C}, dtype);
    a.ln2_mean = Tensor::empty({N}, dtype);
    a.ln2_rstd = Tensor::empty({N}, dtype);
    a.fc = Tensor::empty({N, F1}, dtype);
    a.fc_gelu = Tensor::empty({N, F}, dtype);
    a.res2 = Tensor::empty({N, C}, dtype);
  }
  lnf_ = Tensor::empty({N, C}, dtype);
  lnf_mean_ = Tensor::empty({N}, dtype);
  lnf_rstd_ = Tensor::empty({N}, dtype);
  int64_t chunk = std::max<int64_t>(1, kLogitChunkElems / padded_vocab_);
  if (chunk > 16) chunk = chunk / 16 * 16;
  chunk = std::min(chunk, N);
  logits_ = Tensor::empty({chunk, padded_vocab_}, dtype);
  losses_ = Tensor::empty({N}, dtype);
  dres_ = Tensor::empty({N, C}, dtype);
  dln_ = Tensor::empty({N, C}, dtype);
  datt_ = Tensor::empty({N, A}, dtype);
  dqkv_ = Tensor::empty({N, QKV}, dtype);
  dfc_ = Tensor::empty({N, F1}, dtype);
  dfc_gelu_ = Tensor::empty({N, F}, dtype);
  dlnf_ = Tensor::empty({N, C}, dtype);
  dbranch_ = Tensor::empty({N, C}, dtype);
}

void GptModel::drop_hidden(const Tensor& x, DropoutSite site, int layer) const {
  if (key_ == nullptr || config_.hidden_dropout == 0) return;
  const int64_t T = config_.seq_length, C = config_.hidden_size, N = x.numel() / C;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const double f = ref_dropout::dropout_factor(config_, *key_, site, layer, key_->first_sample + n / T, (n % T) * C + c);
      if (dtype_ == DType::f32) {
        float& v = x.data<float>()[n * C + c];
        v = static_cast<float>(static_cast<double>(v) * f);
      } else {
        x.data<double>()[n * C + c] *= f;
      }
    }
}

void GptModel::init(uint64_t seed) {
  for (size_t i = 0; i < specs_.size(); ++i) init_parameter(specs_[i], seed, params_[i]);
}

void GptModel::zero_grad() { flat_grads_.zero_(); }

GptModel::Layer GptModel::layer_params(const std::vector<Tensor>& from, int layer) const {
  const std::array<int, 12>& i = index_.layers[layer];
  return Layer{at(from, i[0]), at(from, i[1]), at(from, i[2]),  at(from, i[3]),
               at(from, i[4]), at(from, i[5]), at(from, i[6]),  at(from, i[7]),
               at(from, i[8]), at(from, i[9]), at(from, i[10]), at(from, i[11])};
}

void GptModel::norm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                            const Tensor& w, const Tensor& b) const {
  if (config_.normalization == Normalization::rmsnorm)
    ops::rmsnorm_forward(ctx, out, rstd, x, w, config_.layernorm_epsilon);
  else
    ops::layernorm_forward(ctx, out, mean, rstd, x, w, b, config_.layernorm_epsilon);
}

void GptModel::norm_backward(Context& ctx, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                             const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) const {
  if (config_.normalization == Normalization::rmsnorm)
    ops::rmsnorm_backward(ctx, dx, dw, dout, x, w, rstd);
  else
    ops::layernorm_backward(ctx, dx, dw, db, dout, x, w, mean, rstd);
}

bool GptModel::plain_attention() const {
  return config_.query_groups() == config_.num_attention_heads &&
         config_.attention_size() == config_.hidden_size && config_.position_embedding != PositionEmbedding::alibi;
}

ops::AttentionLayout GptModel::attention_layout() const {
  ops::AttentionLayout layout;
  layout.n_head = config_.num_attention_heads;
  layout.n_group = config_.query_groups();
  layout.head_dim = config_.head_size();
  if (config_.position_embedding == PositionEmbedding::alibi) layout.alibi_slopes = ops::alibi_slopes(layout.n_head);
  return layout;
}

GptModel::LayerActs GptModel::acts_view(int layer, int B) const {
  const LayerActs& a = acts_[layer];
  const int64_t T = config_.seq_length, N = B * T, H = config_.num_attention_heads;
  LayerActs v;
  v.ln1 = a.ln1.rows(0, N);
  v.ln1_mean = a.ln1_mean.rows(0, N);
  v.ln1_rstd = a.ln1_rstd.rows(0, N);
  v.qkv = a.qkv.rows(0, N).view({B, T, config_.qkv_size()});
  v.probs = a.probs.rows(0, B * H * T).view({B, H, T, T});
  v.att = a.att.rows(0, N);
  v.res1 = a.res1.rows(0, N);
  v.ln2 = a.ln2.rows(0, N);
  v.ln2_mean = a.ln2_mean.rows(0, N);
  v.ln2_rstd = a.ln2_rstd.rows(0, N);
  v.fc = a.fc.rows(0, N);
  v.fc_gelu = a.fc_gelu.rows(0, N);
  v.res2 = a.res2.rows(0, N);
  return v;
}

void GptModel::split_tokens(const Tensor& tokens, int B) {
  const int64_t T = config_.seq_length;
  TROUPE_CHECK(tokens.dtype() == DType::i32 && tokens.rank() == 2 && tokens.dim(1) == T + 1,
               "tokens must be (B, seq_length + 1) i32 windows");
  TROUPE_CHECK(B >= 1 && B <= max_micro_batch_, "micro-batch larger than the model was built for");
  const int32_t* src = tokens.data<int32_t>();
  int32_t* in = inputs_.data<int32_t>();
  int32_t* tg = targets_.data<int32_t>();
  for (int b = 0; b < B; ++b) {
    std::memcpy(in + b * T, src + b * (T + 1), T * sizeof(int32_t));
    std::memcpy(tg + b * T, src + b * (T + 1) + 1, T * sizeof(int32_t));
  }
}

void GptModel::forward_trunk(Context& ctx, int B) {
  const int64_t T = config_.seq_length, C = config_.hidden_size, N = B * T;
  const int H = config_.num_attention_heads, G = config_.query_groups(), hs = config_.head_size();
  const bool rope = config_.position_embedding == PositionEmbedding::rope;
  const ops::RotaryParams rotary{config_.rotary_dim(), config_.rotary_base, config_.rotary_interleaved, 0, {}};
  const ops::AttentionLayout layout = attention_layout();
  const Tensor tokens = inputs_.rows(0, N).view({B, T});
  Tensor x = embed_.rows(0, N);  // (N,C)
  // BLOOM normalises the embeddings: wte lands in embed_raw_ and ln_embd writes the block input.
  const Tensor e = config_.embed_layernorm ? embed_raw_.rows(0, N) : x;
  if (index_.wpe >= 0)
    ops::embedding_forward(ctx, e.view({B, T, C}), tokens, params_[index_.wte], params_[index_.wpe]);
  else
    ops::vocab_embedding_forward(ctx, e.view({B, T, C}), tokens, params_[index_.wte], 0, Tensor());
  if (config_.embed_layernorm)
    ops::layernorm_forward(ctx, x, embed_mean_.rows(0, N), embed_rstd_.rows(0, N), e, params_[index_.ln_embd_w],
                           params_[index_.ln_embd_b], config_.layernorm_epsilon);
  drop_hidden(x, DropoutSite::embedding, 0);
  for (int l = 0; l < config_.num_layers; ++l) {
    const Layer p = layer_params(params_, l);
    const LayerActs a = acts_view(l, B);
    // Attention branch: res1 = x + c_proj(attn(rope(c_attn(norm_1(x)))))
    norm_forward(ctx, a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b);
    ops::linear_forward(ctx, a.qkv, a.ln1, p.attn_w, p.attn_b);  // (B,T,(H+2G)hs)
    if (rope) {
      ops::rotary_forward(ctx, a.qkv, 0, H, hs, rotary);                          // q
      ops::rotary_forward(ctx, a.qkv, static_cast<int64_t>(H) * hs, G, hs, rotary);  // k
    }
    if (drops_attention()) {
      if (dtype_ == DType::f32)
        ref_dropout::attention_forward(config_, *key_, l, a.att.data<float>(), a.probs.data<float>(), a.qkv.data<float>(), B);
      else
        ref_dropout::attention_forward(config_, *key_, l, a.att.data<double>(), a.probs.data<double>(), a.qkv.data<double>(), B);
    } else if (plain_attention()) {
      ops::attention_forward(ctx, a.att, a.probs, a.qkv, H);  // (N,C)
    } else {
      ops::attention_forward(ctx, a.att.view({B, T, config_.attention_size()}), a.probs, a.qkv, layout);  // (N,H hs)
    }
    ops::linear_forward(ctx, a.res1, a.att, p.proj_w, p.proj_b);
    drop_hidden(a.res1, DropoutSite::attention_output, l);
    ops::add_inplace(ctx, a.res1, x);
    // MLP branch: res2 = res1 + c_proj(act(c_fc(norm_2(res1)))), act GELU or SwiGLU
    norm_forward(ctx, a.ln2, a.ln2_mean, a.ln2_rstd, a.res1, p.ln2_w, p.ln2_b);
    ops::linear_forward(ctx, a.fc, a.ln2, p.fc_w, p.fc_b);  // (N,F) or (N,2F)
    if (config_.activation == MlpActivation::swiglu)
      ops::glu_forward(ctx, a.fc_gelu, a.fc, ops::GluKind::swiglu);
    else
      ops::gelu_forward(ctx, a.fc_gelu, a.fc);
    ops::linear_forward(ctx, a.res2, a.fc_gelu, p.fcproj_w, p.fcproj_b);
    drop_hidden(a.res2, DropoutSite::mlp_output, l);
    ops::add_inplace(ctx, a.res2, a.res1);
    x = a.res2;
  }
  norm_forward(ctx, lnf_.rows(0, N), lnf_mean_.rows(0, N), lnf_rstd_.rows(0, N), x, params_[index_.lnf_w],
               at(params_, index_.lnf_b));
}

double GptModel::head(Context& ctx, int B, double grad_scale) {
  const int64_t N = B * static_cast<int64_t>(config_.seq_length);
  const int64_t chunk = logits_.dim(0);
  // (Vp,C): wte tied, or the untied lm_head.
  const int out = index_.lm_head >= 0 ? index_.lm_head : index_.wte;
  const Tensor& w = params_[out];
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t r1 = std::min(N, r0 + chunk);
    Tensor logits = logits_.rows(0, r1 - r0);  // (rows,Vp)
    Tensor x = lnf_.rows(r0, r1);              // (rows,C)
    ops::linear_forward(ctx, logits, x, w, Tensor());
    ops::softmax_cross_entropy(ctx, losses_.rows(r0, r1), logits, targets_.rows(r0, r1), config_.vocab_size,
                               grad_scale);
    if (grad_scale != 0.0) {
      // logits now hold d loss / d logits: dx = dlogits w, dw += dlogits^T x
      ops::linear_backward(ctx, dlnf_.rows(r0, r1), grads_[out], Tensor(), logits, x, w);
    }
  }
  // Sum in a fixed order.
  double total = 0;
  if (dtype_ == DType::f32) {
    const float* l = losses_.data<float>();
    for (int64_t i = 0; i < N; ++i) total += l[i];
  } else {
    const double* l = losses_.data<double>();
    for (int64_t i = 0; i < N; ++i) total += l[i];
  }
  return total;
}

void GptModel::backward_trunk(Context& ctx, int B) {
  const int64_t T = config_.seq_length, C = config_.hidden_size, N = B * T;
  const int H = config_.num_attention_heads, G = config_.query_groups(), hs = config_.head_size();
  const bool rope = config_.position_embedding == PositionEmbedding::rope;
  const ops::RotaryParams rotary{config_.rotary_dim(), config_.rotary_base, config_.rotary_interleaved, 0, {}};
  const ops::AttentionLayout layout = attention_layout();
  const int64_t A = config_.attention_size();
  Tensor dres = dres_.rows(0, N);  // gradient of the residual stream, (N,C)
  dres.zero_();
  const Tensor x_last = config_.num_layers > 0 ? acts_view(config_.num_layers - 1, B).res2 : embed_.rows(0, N);
  norm_backward(ctx, dres, grads_[index_.lnf_w], at(grads_, index_.lnf_b), dlnf_.rows(0, N), x_last,
                params_[index_.lnf_w], lnf_mean_.rows(0, N), lnf_rstd_.rows(0, N));
  Tensor dln = dln_.rows(0, N), datt = datt_.rows(0, N);
  Tensor dqkv = dqkv_.rows(0, N).view({B, T, config_.qkv_size()});
  Tensor dfc = dfc_.rows(0, N), dfc_gelu = dfc_gelu_.rows(0, N);
  // A branch's output gradient: dres itself, or with hidden dropout dres times the forward's mask.
  const bool drops = key_ != nullptr && config_.hidden_dropout > 0;
  const Tensor dbranch = drops ? dbranch_.rows(0, N) : dres;
  auto branch_grad = [&](DropoutSite site, int layer) {
    if (!drops) return;
    dbranch.copy_from(dres);
    drop_hidden(dbranch, site, layer);
  };
  for (int l = config_.num_layers - 1; l >= 0; --l) {
    const Layer p = layer_params(params_, l);
    const Layer g = layer_params(grads_, l);
    const LayerActs a = acts_view(l, B);
    const Tensor x = l > 0 ? acts_view(l - 1, B).res2 : embed_.rows(0, N);
    // MLP branch; dres holds d res2 and becomes d res1 (the residual passes it through).
    branch_grad(DropoutSite::mlp_output, l);
    ops::linear_backward(ctx, dfc_gelu, g.fcproj_w, g.fcproj_b, dbranch, a.fc_gelu, p.fcproj_w);
    if (config_.activation == MlpActivation::swiglu)
      ops::glu_backward(ctx, dfc, dfc_gelu, a.fc, ops::GluKind::swiglu);
    else
      ops::gelu_backward(ctx, dfc, dfc_gelu, a.fc);
    ops::linear_backward(ctx, dln, g.fc_w, g.fc_b, dfc, a.ln2, p.fc_w);
    norm_backward(ctx, dres, g.ln2_w, g.ln2_b, dln, a.res1, p.ln2_w, a.ln2_mean, a.ln2_rstd);
    // Attention branch; dres becomes d x.
    branch_grad(DropoutSite::attention_output, l);
    ops::linear_backward(ctx, datt, g.proj_w, g.proj_b, dbranch, a.att, p.proj_w);
    if (drops_attention()) {
      if (dtype_ == DType::f32)
        ref_dropout::attention_backward(config_, *key_, l, dqkv.data<float>(), datt.data<float>(), a.qkv.data<float>(),
                                      a.probs.data<float>(), B);
      else
        ref_dropout::attention_backward(config_, *key_, l, dqkv.data<double>(), datt.data<double>(), a.qkv.data<double>(),
                                      a.probs.data<double>(), B);
    } else if (plain_attention()) {
      ops::attention_backward(ctx, dqkv, datt.view({B, T, C}), a.qkv, a.probs, H);
    } else {
      ops::attention_backward(ctx, dqkv, datt.view({B, T, A}), a.qkv, a.probs, layout);
    }
    if (rope) {  // the inverse rotation takes d(rotated q, k) to d(q, k) of c_attn's output
      ops::rotary_backward(ctx, dqkv, 0, H, hs, rotary);
      ops::rotary_backward(ctx, dqkv, static_cast<int64_t>(H) * hs, G, hs, rotary);
    }
    ops::linear_backward(ctx, dln, g.attn_w, g.attn_b, dqkv, a.ln1, p.attn_w);
    norm_backward(ctx, dres, g.ln1_w, g.ln1_b, dln, x, p.ln1_w, a.ln1_mean, a.ln1_rstd);
  }
  drop_hidden(dres, DropoutSite::embedding, 0);
  const Tensor tokens = inputs_.rows(0, N).view({B, T});
  Tensor de = dres;  // d(embedding output)
  if (config_.embed_layernorm) {
    de = dembed_raw_.rows(0, N);
    de.zero_();  // layernorm_backward accumulates
    ops::layernorm_backward(ctx, de, grads_[index_.ln_embd_w], grads_[index_.ln_embd_b], dres, embed_raw_.rows(0, N),
                            params_[index_.ln_embd_w], embed_mean_.rows(0, N), embed_rstd_.rows(0, N));
  }
  if (index_.wpe >= 0)
    ops::embedding_backward(ctx, grads_[index_.wte], grads_[index_.wpe], de.view({B, T, C}), tokens);
  else
    ops::vocab_embedding_backward(ctx, grads_[index_.wte], Tensor(), de.view({B, T, C}), tokens, 0);
}

double GptModel::forward_backward(Context& ctx, const Tensor& tokens, double grad_scale, const MicroBatchKey& key) {
  const int B = static_cast<int>(tokens.dim(0));
  split_tokens(tokens, B);
  key_ = &key;
  forward_trunk(ctx, B);
  const double loss_sum = head(ctx, B, grad_scale);
  backward_trunk(ctx, B);
  key_ = nullptr;
  return loss_sum;
}

double GptModel::forward_loss(Context& ctx, const Tensor& tokens) {
  const int B = static_cast<int>(tokens.dim(0));
  split_tokens(tokens, B);
  forward_trunk(ctx, B);
  return head(ctx, B, 0.0);
}

}  // namespace troupe
