// Shape checks and backend dispatch for kernels/ops.hpp. The CUDA backend plugs in at dispatch():
// when ctx.device is cuda the call goes to kernels/cuda (not built yet: a clear abort until then).
#include "kernels/ops.hpp"

#include <cmath>

#include "kernels/cpu/cpu_ops.hpp"

namespace troupe::ops {

namespace {

// Calls fn(T{}) with T = float or double according to `dtype` on the CPU backend.
template <class Fn>
void dispatch(Context& ctx, DType dtype, Fn&& fn) {
  TROUPE_CHECK(ctx.device == Device::cpu, "the CUDA backend's ops are not built in this binary");
  TROUPE_CHECK(ctx.pool != nullptr, "a CPU Context needs a ThreadPool");
  if (dtype == DType::f32) {
    fn(float{});
  } else if (dtype == DType::f64) {
    fn(double{});
  } else {
    TROUPE_CHECK(false, "CPU ops compute in f32 or f64");
  }
}

void same_dtype(const Tensor& a, const Tensor& b) {
  TROUPE_CHECK(a.dtype() == b.dtype(), "all floating tensors of an op must share one dtype");
}

template <class T> T* ptr_or_null(const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }

}  // namespace

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe) {
  TROUPE_CHECK(out.rank() == 3 && tokens.rank() == 2, "embedding: out (B,T,C), tokens (B,T)");
  const int64_t B = out.dim(0), T_ = out.dim(1), C = out.dim(2);
  TROUPE_CHECK(tokens.dim(0) == B && tokens.dim(1) == T_, "embedding: tokens must be (B,T)");
  TROUPE_CHECK(wte.dim(1) == C && wpe.dim(1) == C && wpe.dim(0) >= T_, "embedding: table shapes");
  same_dtype(out, wte);
  same_dtype(out, wpe);
  const int32_t* tok = tokens.data<int32_t>();
  for (int64_t i = 0; i < B * T_; ++i)
    TROUPE_CHECK(tok[i] >= 0 && tok[i] < wte.dim(0), "token id outside the embedding table");
  dispatch(ctx, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_forward<T>(*ctx.pool, out.data<T>(), tok, wte.data<T>(), wpe.data<T>(), B, T_, C);
  });
}

void embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens) {
  const int64_t B = dout.dim(0), T_ = dout.dim(1), C = dout.dim(2);
  TROUPE_CHECK(dwte.dim(1) == C && dwpe.dim(1) == C && dwpe.dim(0) >= T_, "embedding: table shapes");
  same_dtype(dout, dwte);
  dispatch(ctx, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_backward<T>(*ctx.pool, dwte.data<T>(), dwpe.data<T>(), dout.data<T>(),
                               tokens.data<int32_t>(), B, T_, C);
  });
}

void layernorm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  TROUPE_CHECK(out.numel() == x.numel() && mean.numel() == N && rstd.numel() == N, "layernorm shapes");
  TROUPE_CHECK(weight.numel() == C && bias.numel() == C, "layernorm: weight and bias are (C)");
  same_dtype(out, x);
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_forward<T>(*ctx.pool, out.data<T>(), mean.data<T>(), rstd.data<T>(), x.data<T>(),
                              weight.data<T>(), bias.data<T>(), N, C, eps);
  });
}

void layernorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  TROUPE_CHECK(dx.numel() == x.numel() && dout.numel() == x.numel(), "layernorm backward shapes");
  TROUPE_CHECK(dweight.numel() == C && dbias.numel() == C, "layernorm: dweight and dbias are (C)");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_backward<T>(*ctx.pool, dx.data<T>(), dweight.data<T>(), dbias.data<T>(), dout.data<T>(),
                               x.data<T>(), weight.data<T>(), mean.data<T>(), rstd.data<T>(), N, C);
  });
}

void linear_forward(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& weight,
                    const Tensor& bias) {
  const int64_t O = weight.dim(0), I = weight.dim(1), N = x.numel() / I;
  TROUPE_CHECK(x.dim(-1) == I && out.dim(-1) == O && out.numel() == N * O, "linear: shapes");
  TROUPE_CHECK(!bias.defined() || bias.numel() == O, "linear: bias is (O)");
  same_dtype(out, x);
  same_dtype(x, weight);
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::linear_forward<T>(*ctx.pool, out.data<T>(), x.data<T>(), weight.data<T>(), ptr_or_null<T>(bias),
                           N, I, O);
  });
}

void linear_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                     const Tensor& dout, const Tensor& x, const Tensor& weight) {
  const int64_t O = weight.dim(0), I = weight.dim(1), N = x.numel() / I;
  TROUPE_CHECK(dout.numel() == N * O && dweight.numel() == O * I, "linear backward: shapes");
  TROUPE_CHECK(!dx.defined() || dx.numel() == N * I, "linear backward: dx is (N,I)");
  TROUPE_CHECK(!dbias.defined() || dbias.numel() == O, "linear backward: dbias is (O)");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::linear_backward<T>(*ctx.pool, ptr_or_null<T>(dx), dweight.data<T>(), ptr_or_null<T>(dbias),
                            dout.data<T>(), x.data<T>(), weight.data<T>(), N, I, O);
  });
}

void gelu_forward(Context& ctx, const Tensor& out, const Tensor& x) {
  TROUPE_CHECK(out.numel() == x.numel(), "gelu: shapes");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_forward<T>(*ctx.pool, out.data<T>(), x.data<T>(), x.numel());
  });
}

void gelu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  TROUPE_CHECK(dx.numel() == x.numel() && dout.numel() == x.numel(), "gelu backward: shapes");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_backward<T>(*ctx.pool, dx.data<T>(), dout.data<T>(), x.data<T>(), x.numel());
  });
}

void residual_forward(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  TROUPE_CHECK(out.numel() == a.numel() && a.numel() == b.numel(), "residual: shapes");
  dispatch(ctx, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::add<T>(*ctx.pool, out.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
}

void add_inplace(Context& ctx, const Tensor& dst, const Tensor& src) { residual_forward(ctx, dst, dst, src); }

void attention_forward(Context& ctx, const Tensor& out, const Tensor& probs, const Tensor& qkv, int n_head) {
  const int64_t B = qkv.dim(0), T_ = qkv.dim(1), C = qkv.dim(2) / 3;
  TROUPE_CHECK(qkv.dim(2) == 3 * C && C % n_head == 0, "attention: qkv is (B,T,3C), H divides C");
  TROUPE_CHECK(out.numel() == B * T_ * C && probs.numel() == B * n_head * T_ * T_, "attention: shapes");
  dispatch(ctx, qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_forward<T>(*ctx.pool, out.data<T>(), probs.data<T>(), qkv.data<T>(), B, T_, C, n_head);
  });
}

void attention_backward(Context& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                        const Tensor& probs, int n_head) {
  const int64_t B = qkv.dim(0), T_ = qkv.dim(1), C = qkv.dim(2) / 3;
  TROUPE_CHECK(dqkv.numel() == qkv.numel() && dout.numel() == B * T_ * C, "attention backward: shapes");
  dispatch(ctx, qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_backward<T>(*ctx.pool, dqkv.data<T>(), dout.data<T>(), qkv.data<T>(), probs.data<T>(),
                               B, T_, C, n_head);
  });
}

void softmax_cross_entropy(Context& ctx, const Tensor& losses, const Tensor& logits, const Tensor& targets,
                           int64_t valid, double grad_scale) {
  const int64_t Vp = logits.dim(-1), N = logits.numel() / Vp;
  TROUPE_CHECK(losses.numel() == N && targets.numel() == N, "softmax_cross_entropy: shapes");
  TROUPE_CHECK(valid > 0 && valid <= Vp, "softmax_cross_entropy: 0 < valid <= Vp");
  dispatch(ctx, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::softmax_cross_entropy<T>(*ctx.pool, losses.data<T>(), logits.data<T>(), targets.data<int32_t>(), N,
                                  Vp, valid, grad_scale);
  });
}

void adamw_update(Context& ctx, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const AdamWParams& p) {
  const int64_t n = param.numel();
  TROUPE_CHECK(grad.numel() == n && exp_avg.numel() == n && exp_avg_sq.numel() == n, "adamw: shapes");
  TROUPE_CHECK(p.step >= 1, "adamw: step is 1-based");
  dispatch(ctx, param.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::adamw_update<T>(*ctx.pool, param.data<T>(), grad.data<T>(), exp_avg.data<T>(), exp_avg_sq.data<T>(),
                         n, p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step);
  });
}

double sum_squares(Context& ctx, const Tensor& t) {
  double s = 0;
  dispatch(ctx, t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    s = cpu::sum_squares<T>(*ctx.pool, t.data<T>(), t.numel());
  });
  return s;
}

void scale_inplace(Context& ctx, const Tensor& t, double factor) {
  dispatch(ctx, t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::scale<T>(*ctx.pool, t.data<T>(), t.numel(), factor);
  });
}

double clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm) {
  double total = 0;
  for (const Tensor& g : grads) total += sum_squares(ctx, g);
  const double norm = std::sqrt(total);
  if (max_norm > 0 && norm > max_norm) {
    const double coef = max_norm / (norm + 1e-6);
    for (const Tensor& g : grads) scale_inplace(ctx, g, coef);
  }
  return norm;
}

}  // namespace troupe::ops
