#include "reference/gpt.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/ops.hpp"
#include "reference/dropout.hpp"

namespace troupe {

namespace {
constexpr int kParamsPerLayer = 12;
constexpr int kFirstLayerParam = 2;  // after wte, wpe
// Logits chunk budget in elements: bounds the (rows x Vp) buffer of the fused head.
constexpr int64_t kLogitChunkElems = int64_t{16} << 20;
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

  const int64_t T = config.seq_length, C = config.hidden_size, F = config.ffn_hidden_size();
  const int64_t H = config.num_attention_heads, N = max_micro_batch * T;
  inputs_ = Tensor::empty({N}, DType::i32);
  targets_ = Tensor::empty({N}, DType::i32);
  embed_ = Tensor::empty({N, C}, dtype);
  acts_.resize(config.num_layers);
  for (LayerActs& a : acts_) {
    a.ln1 = Tensor::empty({N, C}, dtype);
    a.ln1_mean = Tensor::empty({N}, dtype);
    a.ln1_rstd = Tensor::empty({N}, dtype);
    a.qkv = Tensor::empty({N, 3 * C}, dtype);
    a.probs = Tensor::empty({max_micro_batch * H * T, T}, dtype);
    a.att = Tensor::empty({N, C}, dtype);
    a.res1 = Tensor::empty({N, C}, dtype);
    a.ln2 = Tensor::empty({N, C}, dtype);
    a.ln2_mean = Tensor::empty({N}, dtype);
    a.ln2_rstd = Tensor::empty({N}, dtype);
    a.fc = Tensor::empty({N, F}, dtype);
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
  datt_ = Tensor::empty({N, C}, dtype);
  dqkv_ = Tensor::empty({N, 3 * C}, dtype);
  dfc_ = Tensor::empty({N, F}, dtype);
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
  const Tensor* p = &from[kFirstLayerParam + kParamsPerLayer * layer];
  return Layer{p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]};
}

GptModel::LayerActs GptModel::acts_view(int layer, int B) const {
  const LayerActs& a = acts_[layer];
  const int64_t T = config_.seq_length, N = B * T, H = config_.num_attention_heads;
  LayerActs v;
  v.ln1 = a.ln1.rows(0, N);
  v.ln1_mean = a.ln1_mean.rows(0, N);
  v.ln1_rstd = a.ln1_rstd.rows(0, N);
  v.qkv = a.qkv.rows(0, N).view({B, T, 3 * config_.hidden_size});
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
  const int H = config_.num_attention_heads;
  const double eps = config_.layernorm_epsilon;
  Tensor x = embed_.rows(0, N);  // (N,C)
  ops::embedding_forward(ctx, x.view({B, T, C}), inputs_.rows(0, N).view({B, T}), params_[0], params_[1]);
  drop_hidden(x, DropoutSite::embedding, 0);
  for (int l = 0; l < config_.num_layers; ++l) {
    const Layer p = layer_params(params_, l);
    const LayerActs a = acts_view(l, B);
    // Attention branch: res1 = x + c_proj(attn(c_attn(ln_1(x))))
    ops::layernorm_forward(ctx, a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, eps);
    ops::linear_forward(ctx, a.qkv, a.ln1, p.attn_w, p.attn_b);  // (B,T,3C)
    if (drops_attention()) {
      if (dtype_ == DType::f32)
        ref_dropout::attention_forward(config_, *key_, l, a.att.data<float>(), a.probs.data<float>(), a.qkv.data<float>(), B);
      else
        ref_dropout::attention_forward(config_, *key_, l, a.att.data<double>(), a.probs.data<double>(), a.qkv.data<double>(), B);
    } else {
      ops::attention_forward(ctx, a.att, a.probs, a.qkv, H);     // (N,C)
    }
    ops::linear_forward(ctx, a.res1, a.att, p.proj_w, p.proj_b);
    drop_hidden(a.res1, DropoutSite::attention_output, l);
    ops::add_inplace(ctx, a.res1, x);
    // MLP branch: res2 = res1 + c_proj(gelu(c_fc(ln_2(res1))))
    ops::layernorm_forward(ctx, a.ln2, a.ln2_mean, a.ln2_rstd, a.res1, p.ln2_w, p.ln2_b, eps);
    ops::linear_forward(ctx, a.fc, a.ln2, p.fc_w, p.fc_b);  // (N,4C)
    ops::gelu_forward(ctx, a.fc_gelu, a.fc);
    ops::linear_forward(ctx, a.res2, a.fc_gelu, p.fcproj_w, p.fcproj_b);
    drop_hidden(a.res2, DropoutSite::mlp_output, l);
    ops::add_inplace(ctx, a.res2, a.res1);
    x = a.res2;
  }
  const size_t lnf = params_.size() - 2;
  ops::layernorm_forward(ctx, lnf_.rows(0, N), lnf_mean_.rows(0, N), lnf_rstd_.rows(0, N), x, params_[lnf],
                         params_[lnf + 1], eps);
}

double GptModel::head(Context& ctx, int B, double grad_scale) {
  const int64_t N = B * static_cast<int64_t>(config_.seq_length);
  const int64_t chunk = logits_.dim(0);
  const Tensor& wte = params_[0];  // (Vp,C), tied output head
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t r1 = std::min(N, r0 + chunk);
    Tensor logits = logits_.rows(0, r1 - r0);  // (rows,Vp)
    Tensor x = lnf_.rows(r0, r1);              // (rows,C)
    ops::linear_forward(ctx, logits, x, wte, Tensor());
    ops::softmax_cross_entropy(ctx, losses_.rows(r0, r1), logits, targets_.rows(r0, r1), config_.vocab_size,
                               grad_scale);
    if (grad_scale != 0.0) {
      // logits now hold d loss / d logits: dx = dlogits wte, dwte += dlogits^T x
      ops::linear_backward(ctx, dlnf_.rows(r0, r1), grads_[0], Tensor(), logits, x, wte);
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
  const int H = config_.num_attention_heads;
  Tensor dres = dres_.rows(0, N);  // gradient of the residual stream, (N,C)
  dres.zero_();
  const size_t lnf = params_.size() - 2;
  const Tensor x_last = config_.num_layers > 0 ? acts_view(config_.num_layers - 1, B).res2 : embed_.rows(0, N);
  ops::layernorm_backward(ctx, dres, grads_[lnf], grads_[lnf + 1], dlnf_.rows(0, N), x_last, params_[lnf],
                          lnf_mean_.rows(0, N), lnf_rstd_.rows(0, N));
  Tensor dln = dln_.rows(0, N), datt = datt_.rows(0, N);
  Tensor dqkv = dqkv_.rows(0, N).view({B, T, 3 * C});
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
    ops::gelu_backward(ctx, dfc, dfc_gelu, a.fc);
    ops::linear_backward(ctx, dln, g.fc_w, g.fc_b, dfc, a.ln2, p.fc_w);
    ops::layernorm_backward(ctx, dres, g.ln2_w, g.ln2_b, dln, a.res1, p.ln2_w, a.ln2_mean, a.ln2_rstd);
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
    } else {
      ops::attention_backward(ctx, dqkv, datt.view({B, T, C}), a.qkv, a.probs, H);
    }
    ops::linear_backward(ctx, dln, g.attn_w, g.attn_b, dqkv, a.ln1, p.attn_w);
    ops::layernorm_backward(ctx, dres, g.ln1_w, g.ln1_b, dln, x, p.ln1_w, a.ln1_mean, a.ln1_rstd);
  }
  drop_hidden(dres, DropoutSite::embedding, 0);
  ops::embedding_backward(ctx, grads_[0], grads_[1], dres.view({B, T, C}), inputs_.rows(0, N).view({B, T}));
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
