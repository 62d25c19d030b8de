// Shape checks and backend dispatch for kernels/ops.hpp. An op with a CUDA version hands a call on a
// CUDA Context to it first thing (TROUPE_ON_CUDA); the others stop at dispatch() with a message.
#include "kernels/ops.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/gemm_bf16.hpp"
#include "kernels/cpu/gemm_half_weight.hpp"
#include "kernels/cpu/gemm_packed.hpp"
#include "kernels/half.hpp"
#include "kernels/device_memory.hpp"
#ifdef TROUPE_WITH_CUDA
#include "kernels/cuda/cuda_ops.hpp"
// A call on a CUDA Context goes to the CUDA backend's version of the op (kernels/cuda/cuda_ops.hpp).
#define TROUPE_ON_CUDA(ctx, call)                        \
  do {                                                   \
    if ((ctx).device == Device::cuda) return cuda::call; \
  } while (0)
#else
#define TROUPE_ON_CUDA(ctx, call) \
  do {                            \
  } while (0)
#endif

namespace troupe::ops {

namespace {

// Calls fn(T{}) with T = float or double according to `dtype` on the CPU backend.
template <class Fn>
void dispatch(Context& ctx, DType dtype, Fn&& fn) {
  TROUPE_CHECK(ctx.device == Device::cpu,
               "this op has no CUDA version yet (kernels/cuda/cuda_ops.hpp lists those that have), or this binary "
               "was built without the CUDA backend");
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

bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

// Elementwise conversion of src into dst (same numel), split over the pool: each element is converted by
// itself, so the split cannot change a bit.
void convert_parallel(ThreadPool& pool, const Tensor& dst, const Tensor& src) {
  const size_t in = dtype_size(src.dtype()), out = dtype_size(dst.dtype());
  char* d = static_cast<char*>(dst.raw());
  const char* s = static_cast<const char*>(src.raw());
  pool.parallel_for(src.numel(), [&](int64_t b, int64_t e) {
    half::convert_array(dst.dtype(), d + b * out, src.dtype(), s + b * in, e - b);
  }, int64_t{1} << 15);
}

// The 16-bit layer at the top of each public op: "widen, compute in f32, narrow". The op names its
// floating arguments; when one of them is bf16 or f16 the layer is active and the op hands each
// argument through in() (read), inout() (read and written: +=, in place) or out() (written only),
// reading before writing. 16-bit arguments come back as f32 temporaries (widened exactly for in/inout),
// f32 ones as they are; the op runs again on those, then finish() rounds every written temporary back
// into its 16-bit tensor (RNE). Arguments with the same data pointer and numel (gelu_backward's dx and
// dout, residual_forward's out and a) share one temporary, so an alias stays an alias.
class Widen {
 public:
  Widen(Context& ctx, std::initializer_list<const Tensor*> floating) : ctx_(ctx) {
    for (const Tensor* t : floating) {
      if (!t->defined() || !is_half(t->dtype())) continue;
      TROUPE_CHECK(half_ == DType::f32 || half_ == t->dtype(),
                   "an op takes one 16-bit type per call (bf16 or f16, mixed with f32 only)");
      half_ = t->dtype();
    }
    if (!active()) return;
    for (const Tensor* t : floating)
      TROUPE_CHECK(!t->defined() || t->dtype() == half_ || t->dtype() == DType::f32,
                   "a 16-bit op's other floating arguments must be f32 (f64 stays all-f64)");
    TROUPE_CHECK(ctx.device == Device::cpu && ctx.pool != nullptr, "16-bit ops run on the CPU backend with a pool");
  }
  bool active() const { return half_ != DType::f32; }

  Tensor in(const Tensor& t) { return map(t, true, false); }
  Tensor inout(const Tensor& t) { return map(t, true, true); }
  Tensor out(const Tensor& t) { return map(t, false, true); }

  void finish() {
    for (const Entry& e : entries_)
      if (e.written) convert_parallel(*ctx_.pool, e.narrow, e.wide);
  }

 private:
  struct Entry {
    Tensor narrow, wide;
    bool widened = false, written = false;
  };
  Tensor map(const Tensor& t, bool read, bool written) {
    if (!t.defined() || !is_half(t.dtype())) return t;
    Entry* e = nullptr;
    for (Entry& x : entries_)
      if (x.narrow.raw() == t.raw() && x.narrow.numel() == t.numel()) e = &x;
    if (e == nullptr) {
      entries_.push_back({t, Tensor::empty(t.shape(), DType::f32)});
      e = &entries_.back();
    }
    if (read && !e->widened) {
      convert_parallel(*ctx_.pool, e->wide, t);
      e->widened = true;
    }
    e->written = e->written || written;
    return e->wide.view(t.shape());
  }
  Context& ctx_;
  DType half_ = DType::f32;
  std::vector<Entry> entries_;
};

}  // namespace

void convert(Context& ctx, const Tensor& dst, const Tensor& src) {
  TROUPE_ON_CUDA(ctx, convert(ctx, dst, src));
  TROUPE_CHECK(ctx.device == Device::cpu && ctx.pool != nullptr, "convert: a CPU Context needs a ThreadPool");
  TROUPE_CHECK(dst.numel() == src.numel(), "convert: dst and src hold the same number of elements");
  TROUPE_CHECK(half::is_float_dtype(dst.dtype()) && half::is_float_dtype(src.dtype()),
               "convert: f32, f64, bf16 or f16 tensors");
  convert_parallel(*ctx.pool, dst, src);
}

int64_t count_nonfinite(Context& ctx, const Tensor& t) {
  TROUPE_ON_CUDA(ctx, count_nonfinite(ctx, t));
  TROUPE_CHECK(ctx.device == Device::cpu && ctx.pool != nullptr, "count_nonfinite: a CPU Context needs a ThreadPool");
  TROUPE_CHECK(half::is_float_dtype(t.dtype()), "count_nonfinite: f32, f64, bf16 or f16 tensors");
  // Inf or NaN: the exponent field all ones. Counting is exact, so the split does not matter.
  std::atomic<int64_t> total{0};
  const DType dt = t.dtype();
  const void* base = t.raw();
  ctx.pool->parallel_for(t.numel(), [&](int64_t b, int64_t e) {
    int64_t c = 0;
    if (dt == DType::f64) {
      const auto* p = static_cast<const uint64_t*>(base);
      for (int64_t i = b; i < e; ++i) c += (p[i] & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
    } else if (dt == DType::f32) {
      const auto* p = static_cast<const uint32_t*>(base);
      for (int64_t i = b; i < e; ++i) c += (p[i] & 0x7f800000u) == 0x7f800000u;
    } else {
      const uint16_t mask = dt == DType::bf16 ? 0x7f80 : 0x7c00;
      const auto* p = static_cast<const uint16_t*>(base);
      for (int64_t i = b; i < e; ++i) c += (p[i] & mask) == mask;
    }
    total += c;
  }, int64_t{1} << 15);
  return total.load();
}

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe) {
  TROUPE_ON_CUDA(ctx, embedding_forward(ctx, out, tokens, wte, wpe));
  if (Widen w(ctx, {&wte, &wpe, &out}); w.active()) {
    const Tensor wte_w = w.in(wte), wpe_w = w.in(wpe), out_w = w.out(out);
    embedding_forward(ctx, out_w, tokens, wte_w, wpe_w);
    return w.finish();
  }
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
    cpu::embedding_forward<T>(*ctx.pool, out.data<T>(), tok, wte.data<T>(), wpe.data<T>(), B, T_, C, 0, wte.dim(0));
  });
}

void embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens) {
  TROUPE_ON_CUDA(ctx, embedding_backward(ctx, dwte, dwpe, dout, tokens));
  if (Widen w(ctx, {&dout, &dwte, &dwpe}); w.active()) {
    const Tensor dout_w = w.in(dout), dwte_w = w.inout(dwte), dwpe_w = w.inout(dwpe);
    embedding_backward(ctx, dwte_w, dwpe_w, dout_w, tokens);
    return w.finish();
  }
  const int64_t B = dout.dim(0), T_ = dout.dim(1), C = dout.dim(2);
  TROUPE_CHECK(dwte.dim(1) == C && dwpe.dim(1) == C && dwpe.dim(0) >= T_, "embedding: table shapes");
  same_dtype(dout, dwte);
  dispatch(ctx, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_backward<T>(*ctx.pool, dwte.data<T>(), dwpe.data<T>(), dout.data<T>(),
                               tokens.data<int32_t>(), B, T_, C, 0, dwte.dim(0));
  });
}

void vocab_embedding_forward(Context& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                             int64_t vocab_begin, const Tensor& wpe) {
  TROUPE_ON_CUDA(ctx, vocab_embedding_forward(ctx, out, tokens, wte, vocab_begin, wpe));
  if (Widen w(ctx, {&wte, &wpe, &out}); w.active()) {
    const Tensor wte_w = w.in(wte), wpe_w = w.in(wpe), out_w = w.out(out);
    vocab_embedding_forward(ctx, out_w, tokens, wte_w, vocab_begin, wpe_w);
    return w.finish();
  }
  TROUPE_CHECK(out.rank() == 3 && tokens.rank() == 2, "vocab embedding: out (B,T,C), tokens (B,T)");
  const int64_t B = out.dim(0), T_ = out.dim(1), C = out.dim(2);
  TROUPE_CHECK(tokens.dim(0) == B && tokens.dim(1) == T_, "vocab embedding: tokens must be (B,T)");
  TROUPE_CHECK(wte.rank() == 2 && wte.dim(1) == C && vocab_begin >= 0, "vocab embedding: wte is (Vl,C)");
  TROUPE_CHECK(!wpe.defined() || (wpe.dim(1) == C && wpe.dim(0) >= T_), "vocab embedding: wpe is (P,C), P >= T");
  same_dtype(out, wte);
  if (wpe.defined()) same_dtype(out, wpe);
  const int32_t* tok = tokens.data<int32_t>();
  for (int64_t i = 0; i < B * T_; ++i) TROUPE_CHECK(tok[i] >= 0, "token id must not be negative");
  dispatch(ctx, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_forward<T>(*ctx.pool, out.data<T>(), tok, wte.data<T>(), ptr_or_null<T>(wpe), B, T_, C,
                              vocab_begin, wte.dim(0));
  });
}

void vocab_embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                              const Tensor& tokens, int64_t vocab_begin) {
  TROUPE_ON_CUDA(ctx, vocab_embedding_backward(ctx, dwte, dwpe, dout, tokens, vocab_begin));
  if (Widen w(ctx, {&dout, &dwte, &dwpe}); w.active()) {
    const Tensor dout_w = w.in(dout), dwte_w = w.inout(dwte), dwpe_w = w.inout(dwpe);
    vocab_embedding_backward(ctx, dwte_w, dwpe_w, dout_w, tokens, vocab_begin);
    return w.finish();
  }
  TROUPE_CHECK(dout.rank() == 3 && tokens.rank() == 2, "vocab embedding backward: dout (B,T,C), tokens (B,T)");
  const int64_t B = dout.dim(0), T_ = dout.dim(1), C = dout.dim(2);
  TROUPE_CHECK(tokens.dim(0) == B && tokens.dim(1) == T_, "vocab embedding backward: tokens must be (B,T)");
  TROUPE_CHECK(dwte.rank() == 2 && dwte.dim(1) == C, "vocab embedding backward: dwte is (Vl,C)");
  TROUPE_CHECK(!dwpe.defined() || (dwpe.dim(1) == C && dwpe.dim(0) >= T_), "vocab embedding backward: dwpe");
  same_dtype(dout, dwte);
  dispatch(ctx, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_backward<T>(*ctx.pool, dwte.data<T>(), ptr_or_null<T>(dwpe), dout.data<T>(),
                               tokens.data<int32_t>(), B, T_, C, vocab_begin, dwte.dim(0));
  });
}

void layernorm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  TROUPE_ON_CUDA(ctx, layernorm_forward(ctx, out, mean, rstd, x, weight, bias, eps));
  if (Widen w(ctx, {&x, &weight, &bias, &out, &mean, &rstd}); w.active()) {
    const Tensor x_w = w.in(x), weight_w = w.in(weight), bias_w = w.in(bias), out_w = w.out(out),
                 mean_w = w.out(mean), rstd_w = w.out(rstd);
    layernorm_forward(ctx, out_w, mean_w, rstd_w, x_w, weight_w, bias_w, eps);
    return w.finish();
  }
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
  TROUPE_ON_CUDA(ctx, layernorm_backward(ctx, dx, dweight, dbias, dout, x, weight, mean, rstd));
  if (Widen w(ctx, {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias}); w.active()) {
    const Tensor dout_w = w.in(dout), x_w = w.in(x), weight_w = w.in(weight), mean_w = w.in(mean),
                 rstd_w = w.in(rstd), dx_w = w.inout(dx), dweight_w = w.inout(dweight),
                 dbias_w = w.inout(dbias);
    layernorm_backward(ctx, dx_w, dweight_w, dbias_w, dout_w, x_w, weight_w, mean_w, rstd_w);
    return w.finish();
  }
  const int64_t C = x.dim(-1), N = x.numel() / C;
  TROUPE_CHECK(dout.numel() == x.numel(), "layernorm backward shapes");
  TROUPE_CHECK(!dx.defined() || (dx.numel() == x.numel() && weight.numel() == C), "layernorm backward: dx, weight");
  TROUPE_CHECK(dweight.defined() == dbias.defined(), "layernorm backward: dweight and dbias come together");
  TROUPE_CHECK(!dweight.defined() || (dweight.numel() == C && dbias.numel() == C),
               "layernorm: dweight and dbias are (C)");
  TROUPE_CHECK(mean.numel() == N && rstd.numel() == N, "layernorm backward: mean and rstd are (N)");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_backward<T>(*ctx.pool, ptr_or_null<T>(dx), ptr_or_null<T>(dweight), ptr_or_null<T>(dbias),
                               dout.data<T>(), x.data<T>(), ptr_or_null<T>(weight), mean.data<T>(),
                               rstd.data<T>(), N, C);
  });
}

void rmsnorm_forward(Context& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                     double eps) {
  TROUPE_ON_CUDA(ctx, rmsnorm_forward(ctx, out, rstd, x, weight, eps));
  if (Widen w(ctx, {&x, &weight, &out, &rstd}); w.active()) {
    const Tensor x_w = w.in(x), weight_w = w.in(weight), out_w = w.out(out), rstd_w = w.out(rstd);
    rmsnorm_forward(ctx, out_w, rstd_w, x_w, weight_w, eps);
    return w.finish();
  }
  const int64_t C = x.dim(-1), N = x.numel() / C;
  TROUPE_CHECK(out.numel() == x.numel() && rstd.numel() == N, "rmsnorm: out is x's shape (N,C), rstd (N)");
  TROUPE_CHECK(weight.numel() == C, "rmsnorm: weight is (C)");
  same_dtype(out, x);
  same_dtype(x, weight);
  same_dtype(x, rstd);
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_forward<T>(*ctx.pool, out.data<T>(), rstd.data<T>(), x.data<T>(), weight.data<T>(), N, C, eps);
  });
}

void rmsnorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd) {
  TROUPE_ON_CUDA(ctx, rmsnorm_backward(ctx, dx, dweight, dout, x, weight, rstd));
  if (Widen w(ctx, {&dout, &x, &weight, &rstd, &dx, &dweight}); w.active()) {
    const Tensor dout_w = w.in(dout), x_w = w.in(x), weight_w = w.in(weight), rstd_w = w.in(rstd),
                 dx_w = w.inout(dx), dweight_w = w.inout(dweight);
    rmsnorm_backward(ctx, dx_w, dweight_w, dout_w, x_w, weight_w, rstd_w);
    return w.finish();
  }
  const int64_t C = x.dim(-1), N = x.numel() / C;
  TROUPE_CHECK(dout.numel() == x.numel() && rstd.numel() == N, "rmsnorm backward: dout is x's shape, rstd (N)");
  TROUPE_CHECK(!dx.defined() || (dx.numel() == x.numel() && weight.numel() == C),
               "rmsnorm backward: dx is x's shape and needs the weight (C)");
  TROUPE_CHECK(!dweight.defined() || dweight.numel() == C, "rmsnorm backward: dweight is (C)");
  same_dtype(dout, x);
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_backward<T>(*ctx.pool, ptr_or_null<T>(dx), ptr_or_null<T>(dweight), dout.data<T>(), x.data<T>(),
                             ptr_or_null<T>(weight), rstd.data<T>(), N, C);
  });
}

namespace {

// bf16 operands on a CPU with AVX512-BF16 (cpu::bf16_gemm_kernel(); TROUPE_CPU_FEATURES=generic turns
// it off): linear's GEMMs read them as they are (cpu::gemm_bf16, fp32 accumulation) and only the
// rest (the bias, the output's rounding, the gradients' accumulation) goes through the 16-bit layer.
bool native_bf16(std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands)
    if (t->defined() && t->dtype() != DType::bf16) return false;
  return cpu::bf16_gemm_kernel() == cpu::Bf16Kernel::avx512_bf16;
}

const uint16_t* bf16_data(const Tensor& t) { return t.defined() ? static_cast<const uint16_t*>(t.raw()) : nullptr; }

// out (N, O) f32 = the bias in every row (nothing when it is undefined): the GEMM then adds onto it.
void fill_rows_with_bias(ThreadPool& pool, float* out, const Tensor& bias, int64_t N, int64_t O) {
  if (!bias.defined()) return;
  const float* b = bias.data<float>();
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) std::copy(b, b + O, out + n * O);
  }, 64);
}

// The native bf16 GEMM packs all of the weight on every call; for a few rows of x (a decoding step at
// batch 1 to 8) that packing is the call's time, and linear's forward widens the weight a block at a
// time instead (gemm_f32_half_bt: 1 x 768 -> 50257 in 10 ms against 17 packed; from 16 rows on the
// packed kernel is faster: build/bench/bench_mixed_linear).
constexpr int64_t kNativeBf16MinRows = 8;

}  // namespace

void linear_forward_packed(Context& ctx, const Tensor& out, const Tensor& x, const cpu::PackedWeight& weight,
                           const Tensor& bias) {
  const int64_t O = weight.rows(), I = weight.depth(), N = x.numel() / std::max<int64_t>(1, I);
  TROUPE_CHECK(ctx.device == Device::cpu && ctx.pool != nullptr, "linear_forward_packed: a CPU op");
  TROUPE_CHECK(x.dtype() == DType::f32 && out.dtype() == DType::f32 && (!bias.defined() || bias.dtype() == DType::f32),
               "linear_forward_packed: f32 tensors");
  TROUPE_CHECK(x.dim(-1) == I && out.dim(-1) == O && out.numel() == N * O, "linear_forward_packed: shapes");
  TROUPE_CHECK(!bias.defined() || bias.numel() == O, "linear_forward_packed: bias is (O)");
  cpu::linear_packed(*ctx.pool, N, x.data<float>(), std::max<int64_t>(1, I), weight,
                     bias.defined() ? bias.data<float>() : nullptr, out.data<float>(), std::max<int64_t>(1, O));
}

void linear_forward(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& weight,
                    const Tensor& bias) {
  TROUPE_ON_CUDA(ctx, linear_forward(ctx, out, x, weight, bias));
  // A 16-bit weight on the CPU is never widened into one f32 copy per call. bf16 operands on a CPU with
  // AVX512-BF16 and more than kNativeBf16MinRows rows: the native bf16 GEMM reads them as they are.
  // Otherwise (fp16; bf16 without AVX512-BF16; bf16 on a few rows) the weight is widened a block at a
  // time in cache (cpu::gemm_f32_half_bt): decoding's few rows made the whole copy the call's time
  // (fp16 decoding ran 2.5-4x slower than f32), and at training's rows it costs as much or less than
  // the copy (build/bench/bench_mixed_linear). The bias, x where it is widened, and the output's
  // rounding go through the 16-bit layer.
  if (ctx.device == Device::cpu && ctx.pool != nullptr && is_half(weight.dtype()) && weight.rank() == 2) {
    const int64_t O = weight.dim(0), I = weight.dim(1), N = x.numel() / std::max<int64_t>(1, I);
    TROUPE_CHECK(x.dim(-1) == I && out.dim(-1) == O && out.numel() == N * O, "linear: shapes");
    TROUPE_CHECK(!bias.defined() || bias.numel() == O, "linear: bias is (O)");
    const bool native = native_bf16({&x, &weight}) && N > kNativeBf16MinRows;
    Widen w(ctx, {&x, &weight, &bias, &out});
    const Tensor x_w = native ? Tensor() : w.in(x), bias_w = w.in(bias), out_w = w.out(out);
    float* o = out_w.data<float>();
    fill_rows_with_bias(*ctx.pool, o, bias_w, N, O);
    const float beta = bias_w.defined() ? 1.0f : 0.0f;
    // out (N,O) = x (N,I) @ W^T (I,O) [+ out]
    if (native)
      cpu::gemm_bf16(*ctx.pool, false, true, N, O, I, 1.0f, bf16_data(x), I, bf16_data(weight), I, beta, o, O);
    else
      cpu::gemm_f32_half_bt(*ctx.pool, N, O, I, x_w.data<float>(), I, weight.dtype(), weight.raw(), I, beta, o, O);
    return w.finish();
  }
  if (Widen w(ctx, {&x, &weight, &bias, &out}); w.active()) {
    const Tensor x_w = w.in(x), weight_w = w.in(weight), bias_w = w.in(bias), out_w = w.out(out);
    linear_forward(ctx, out_w, x_w, weight_w, bias_w);
    return w.finish();
  }
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
  TROUPE_ON_CUDA(ctx, linear_backward(ctx, dx, dweight, dbias, dout, x, weight));
  if (ctx.device == Device::cpu && ctx.pool != nullptr && dout.dtype() == DType::bf16 &&
      native_bf16({&dout, &x, &weight})) {
    TROUPE_CHECK(weight.defined() || (!dx.defined() && dweight.defined()), "linear backward: dx needs the weight");
    const Tensor& wt = weight.defined() ? weight : dweight;
    TROUPE_CHECK(wt.rank() == 2, "linear backward: weight is (O,I)");
    const int64_t O = wt.dim(0), I = wt.dim(1), N = dout.numel() / O;
    TROUPE_CHECK(dout.dim(-1) == O, "linear backward: dout is (N,O)");
    TROUPE_CHECK(!dweight.defined() || (dweight.numel() == O * I && x.defined() && x.numel() == N * I),
                 "linear backward: dweight is (O,I) and needs x (N,I)");
    TROUPE_CHECK(!dx.defined() || dx.numel() == N * I, "linear backward: dx is (N,I)");
    TROUPE_CHECK(!dbias.defined() || dbias.numel() == O, "linear backward: dbias is (O)");
    Widen w(ctx, {&dout, &dx, &dweight, &dbias});
    const Tensor dx_w = w.out(dx), dweight_w = w.inout(dweight), dbias_w = w.inout(dbias);
    // dx (N,I) = dout (N,O) @ W (O,I)
    if (dx_w.defined())
      cpu::gemm_bf16(*ctx.pool, false, false, N, I, O, 1.0f, bf16_data(dout), O, bf16_data(weight), I, 0.0f,
                     dx_w.data<float>(), I);
    // dW (O,I) += dout^T (O,N) @ x (N,I)
    if (dweight_w.defined())
      cpu::gemm_bf16(*ctx.pool, true, false, O, I, N, 1.0f, bf16_data(dout), O, bf16_data(x), I, 1.0f,
                     dweight_w.data<float>(), I);
    // db (O) += sum over rows of dout (widened: exact)
    if (dbias_w.defined()) cpu::column_sums_accumulate<float>(*ctx.pool, dbias_w.data<float>(), w.in(dout).data<float>(), N, O);
    return w.finish();
  }
  if (Widen w(ctx, {&dout, &x, &weight, &dx, &dweight, &dbias}); w.active()) {
    const Tensor dout_w = w.in(dout), x_w = w.in(x), weight_w = w.in(weight), dx_w = w.out(dx),
                 dweight_w = w.inout(dweight), dbias_w = w.inout(dbias);
    linear_backward(ctx, dx_w, dweight_w, dbias_w, dout_w, x_w, weight_w);
    return w.finish();
  }
  // The weight only matters for dx; the weight pass may run without it (ZeRO-3 need not gather it).
  TROUPE_CHECK(weight.defined() || (!dx.defined() && dweight.defined()), "linear backward: dx needs the weight");
  const Tensor& w = weight.defined() ? weight : dweight;
  TROUPE_CHECK(w.rank() == 2, "linear backward: weight is (O,I)");
  const int64_t O = w.dim(0), I = w.dim(1), N = dout.numel() / O;
  TROUPE_CHECK(dout.dim(-1) == O, "linear backward: dout is (N,O)");
  TROUPE_CHECK(!dweight.defined() || (dweight.numel() == O * I && x.defined() && x.numel() == N * I),
               "linear backward: dweight is (O,I) and needs x (N,I)");
  TROUPE_CHECK(!dx.defined() || dx.numel() == N * I, "linear backward: dx is (N,I)");
  TROUPE_CHECK(!dbias.defined() || dbias.numel() == O, "linear backward: dbias is (O)");
  dispatch(ctx, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::linear_backward<T>(*ctx.pool, ptr_or_null<T>(dx), ptr_or_null<T>(dweight), ptr_or_null<T>(dbias),
                            dout.data<T>(), ptr_or_null<T>(x), ptr_or_null<T>(weight), N, I, O);
  });
}

void gelu_forward(Context& ctx, const Tensor& out, const Tensor& x) {
  TROUPE_ON_CUDA(ctx, gelu_forward(ctx, out, x));
  if (Widen w(ctx, {&x, &out}); w.active()) {
    const Tensor x_w = w.in(x), out_w = w.out(out);
    gelu_forward(ctx, out_w, x_w);
    return w.finish();
  }
  TROUPE_CHECK(out.numel() == x.numel(), "gelu: shapes");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_forward<T>(*ctx.pool, out.data<T>(), x.data<T>(), x.numel());
  });
}

void gelu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  TROUPE_ON_CUDA(ctx, gelu_backward(ctx, dx, dout, x));
  if (Widen w(ctx, {&dout, &x, &dx}); w.active()) {
    const Tensor dout_w = w.in(dout), x_w = w.in(x), dx_w = w.out(dx);
    gelu_backward(ctx, dx_w, dout_w, x_w);
    return w.finish();
  }
  TROUPE_CHECK(dx.numel() == x.numel() && dout.numel() == x.numel(), "gelu backward: shapes");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_backward<T>(*ctx.pool, dx.data<T>(), dout.data<T>(), x.data<T>(), x.numel());
  });
}

void glu_forward(Context& ctx, const Tensor& out, const Tensor& gate_up, GluKind kind) {
  TROUPE_ON_CUDA(ctx, glu_forward(ctx, out, gate_up, kind));
  if (Widen w(ctx, {&gate_up, &out}); w.active()) {
    const Tensor gate_up_w = w.in(gate_up), out_w = w.out(out);
    glu_forward(ctx, out_w, gate_up_w, kind);
    return w.finish();
  }
  const int64_t F2 = gate_up.dim(-1), N = gate_up.numel() / F2, F = F2 / 2;
  TROUPE_CHECK(F2 % 2 == 0, "glu: gate_up's last dim holds [gate | up], an even width 2F");
  TROUPE_CHECK(out.dim(-1) == F && out.numel() == N * F, "glu: out is (N,F) for gate_up (N,2F)");
  same_dtype(out, gate_up);
  dispatch(ctx, gate_up.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::glu_forward<T>(*ctx.pool, out.data<T>(), gate_up.data<T>(), N, F, kind == GluKind::swiglu);
  });
}

void glu_backward(Context& ctx, const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up, GluKind kind) {
  TROUPE_ON_CUDA(ctx, glu_backward(ctx, dgate_up, dout, gate_up, kind));
  if (Widen w(ctx, {&dout, &gate_up, &dgate_up}); w.active()) {
    const Tensor dout_w = w.in(dout), gate_up_w = w.in(gate_up), dgate_up_w = w.out(dgate_up);
    glu_backward(ctx, dgate_up_w, dout_w, gate_up_w, kind);
    return w.finish();
  }
  const int64_t F2 = gate_up.dim(-1), N = gate_up.numel() / F2, F = F2 / 2;
  TROUPE_CHECK(F2 % 2 == 0, "glu backward: gate_up's last dim holds [gate | up], an even width 2F");
  TROUPE_CHECK(dgate_up.numel() == gate_up.numel() && dout.dim(-1) == F && dout.numel() == N * F,
               "glu backward: dgate_up is gate_up's shape (N,2F), dout (N,F)");
  same_dtype(dgate_up, gate_up);
  same_dtype(dout, gate_up);
  dispatch(ctx, gate_up.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::glu_backward<T>(*ctx.pool, dgate_up.data<T>(), dout.data<T>(), gate_up.data<T>(), N, F,
                         kind == GluKind::swiglu);
  });
}

namespace {
void rotary_apply(Context& ctx, const Tensor& x, int64_t col0, int n_heads, int head_dim, const RotaryParams& p,
                  bool inverse) {
  if (Widen w(ctx, {&x}); w.active()) {
    const Tensor x_w = w.inout(x);
    rotary_apply(ctx, x_w, col0, n_heads, head_dim, p, inverse);
    return w.finish();
  }
  TROUPE_CHECK(x.rank() == 3, "rotary: x is (B,T,W)");
  const int64_t B = x.dim(0), T_ = x.dim(1), W = x.dim(2);
  TROUPE_CHECK(n_heads > 0 && head_dim > 0 && col0 >= 0 && col0 + int64_t{n_heads} * head_dim <= W,
               "rotary: the heads [col0, col0 + n_heads*head_dim) must lie within x's last dim");
  TROUPE_CHECK(p.rotary_dim > 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= head_dim,
               "rotary: rotary_dim must be even, in (0, head_dim]");
  TROUPE_CHECK(p.base > 0 && p.pos0 >= 0, "rotary: base > 0 and pos0 >= 0");
  TROUPE_CHECK(p.positions.empty() || static_cast<int64_t>(p.positions.size()) == T_,
               "rotary: positions name one position per t");
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::rotary<T>(*ctx.pool, x.data<T>(), B, T_, W, col0, n_heads, head_dim, p.rotary_dim, p.base, p.interleaved,
                   p.pos0, inverse, p.positions.empty() ? nullptr : p.positions.data());
  });
}
}  // namespace

namespace {
void cpu_only_positions(const Context& ctx, bool any, const char* what) {
  TROUPE_CHECK(!any || ctx.device == Device::cpu,
               std::string(what) + ": positions other than 0..T-1 (context parallelism) run on the CPU only");
}
}  // namespace

void rotary_forward(Context& ctx, const Tensor& x, int64_t col0, int n_heads, int head_dim, const RotaryParams& p) {
  cpu_only_positions(ctx, !p.positions.empty(), "rotary");
  TROUPE_ON_CUDA(ctx, rotary_forward(ctx, x, col0, n_heads, head_dim, p));
  rotary_apply(ctx, x, col0, n_heads, head_dim, p, false);
}

void rotary_backward(Context& ctx, const Tensor& dx, int64_t col0, int n_heads, int head_dim, const RotaryParams& p) {
  cpu_only_positions(ctx, !p.positions.empty(), "rotary");
  TROUPE_ON_CUDA(ctx, rotary_backward(ctx, dx, col0, n_heads, head_dim, p));
  rotary_apply(ctx, dx, col0, n_heads, head_dim, p, true);
}

void residual_forward(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  TROUPE_ON_CUDA(ctx, residual_forward(ctx, out, a, b));
  if (Widen w(ctx, {&a, &b, &out}); w.active()) {
    const Tensor a_w = w.in(a), b_w = w.in(b), out_w = w.out(out);
    residual_forward(ctx, out_w, a_w, b_w);
    return w.finish();
  }
  TROUPE_CHECK(out.numel() == a.numel() && a.numel() == b.numel(), "residual: shapes");
  dispatch(ctx, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::add<T>(*ctx.pool, out.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
}

void add_inplace(Context& ctx, const Tensor& dst, const Tensor& src) { residual_forward(ctx, dst, dst, src); }

namespace {
// The mask rule's limits (kernels/dropout.hpp): every counter word fits 32 bits.
void check_mask(const DropoutMask& m, int64_t samples, int64_t elements_per_sample) {
  TROUPE_CHECK(m.p > 0 && m.p < 1, "dropout: the probability must be in (0, 1) (callers skip p = 0)");
  TROUPE_CHECK(m.first_sample >= 0 && m.first_sample + samples <= (int64_t{1} << 32),
               "dropout: global sample indices must stay below 2^32");
  TROUPE_CHECK((elements_per_sample + 3) / 4 <= (int64_t{1} << 32),
               "dropout: a sample's elements / 4 must stay below 2^32");
}
}  // namespace

void dropout_rows(Context& ctx, const Tensor& x, const DropoutMask& mask, int64_t row0, int64_t seq_len,
                  const std::vector<int64_t>& positions) {
  cpu_only_positions(ctx, !positions.empty(), "dropout_rows");
  TROUPE_ON_CUDA(ctx, dropout_rows(ctx, x, mask, row0, seq_len));
  if (Widen w(ctx, {&x}); w.active()) {
    const Tensor x_w = w.inout(x);
    dropout_rows(ctx, x_w, mask, row0, seq_len, positions);
    return w.finish();
  }
  TROUPE_CHECK(x.rank() == 2 && row0 >= 0 && seq_len > 0, "dropout_rows: x is (rows, C), row0 >= 0");
  TROUPE_CHECK(positions.empty() || static_cast<int64_t>(positions.size()) == seq_len,
               "dropout_rows: positions name one position per row of a sequence");
  int64_t span = seq_len;  // the elements a sample's mask covers: up to the last position's row
  for (int64_t p : positions) {
    TROUPE_CHECK(p >= 0, "dropout_rows: positions must not be negative");
    span = std::max(span, p + 1);
  }
  const int64_t rows = x.dim(0), C = x.dim(1);
  check_mask(mask, (row0 + rows + seq_len - 1) / seq_len, span * C);
  dispatch(ctx, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::dropout_rows<T>(*ctx.pool, x.data<T>(), mask, row0, rows, C, seq_len,
                         positions.empty() ? nullptr : positions.data());
  });
}

namespace {
// The general form's sizes, checked against the tensors: (H, G, hs) with G dividing H.
struct AttentionSizes {
  int64_t B, T, H, G, hs;
};
AttentionSizes attention_sizes(const Tensor& qkv, const Tensor& out, const Tensor& probs,
                               const AttentionLayout& layout, const DropoutMask& mask, int64_t head0) {
  TROUPE_CHECK(qkv.rank() == 3, "attention: qkv is (B,T,(H+2G)*hs)");
  const int64_t B = qkv.dim(0), T_ = qkv.dim(1), H = layout.n_head;
  const int64_t G = layout.n_group > 0 ? layout.n_group : H;
  TROUPE_CHECK(H > 0 && G > 0 && H % G == 0, "attention: n_head > 0 and n_group divides n_head");
  const int64_t hs = layout.head_dim > 0 ? layout.head_dim : out.dim(-1) / H;
  TROUPE_CHECK(hs > 0 && qkv.dim(2) == (H + 2 * G) * hs, "attention: qkv's last dim must be (H + 2G) * head_dim");
  TROUPE_CHECK(out.numel() == B * T_ * H * hs, "attention: out is (B,T,H*head_dim)");
  TROUPE_CHECK(probs.numel() == B * H * T_ * T_, "attention: probs is (B,H,T,T)");
  TROUPE_CHECK(layout.alibi_slopes.empty() || static_cast<int64_t>(layout.alibi_slopes.size()) == H,
               "attention: alibi_slopes holds one slope per held query head, or none");
  TROUPE_CHECK(head0 >= 0, "attention: head0 must not be negative");
  if (mask.active()) check_mask(mask, B, (head0 + H) * T_ * T_);
  same_dtype(qkv, out);
  same_dtype(qkv, probs);
  return {B, T_, H, G, hs};
}

AttentionLayout multi_head(int n_head, const Tensor& qkv) {
  TROUPE_CHECK(n_head > 0 && qkv.rank() == 3 && qkv.dim(2) % (3 * int64_t{n_head}) == 0,
               "attention: qkv is (B,T,3C), H divides C");
  AttentionLayout layout;
  layout.n_head = n_head;
  layout.n_group = n_head;
  layout.head_dim = static_cast<int>(qkv.dim(2) / 3 / n_head);
  return layout;
}
}  // namespace

void attention_forward(Context& ctx, const Tensor& out, const Tensor& probs, const Tensor& qkv, int n_head,
                       const DropoutMask& mask, int64_t head0) {
  attention_forward(ctx, out, probs, qkv, multi_head(n_head, qkv), mask, head0);
}

void attention_backward(Context& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                        const Tensor& probs, int n_head, const DropoutMask& mask, int64_t head0) {
  attention_backward(ctx, dqkv, dout, qkv, probs, multi_head(n_head, qkv), mask, head0);
}

void attention_forward(Context& ctx, const Tensor& out, const Tensor& probs, const Tensor& qkv,
                       const AttentionLayout& layout, const DropoutMask& mask, int64_t head0) {
  TROUPE_ON_CUDA(ctx, attention_forward(ctx, out, probs, qkv, layout, mask, head0));
  if (Widen w(ctx, {&qkv, &out, &probs}); w.active()) {
    const Tensor qkv_w = w.in(qkv), out_w = w.out(out), probs_w = w.out(probs);
    attention_forward(ctx, out_w, probs_w, qkv_w, layout, mask, head0);
    return w.finish();
  }
  const AttentionSizes z = attention_sizes(qkv, out, probs, layout, mask, head0);
  const double* alibi = layout.alibi_slopes.empty() ? nullptr : layout.alibi_slopes.data();
  dispatch(ctx, qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_forward<T>(*ctx.pool, out.data<T>(), probs.data<T>(), qkv.data<T>(), z.B, z.T, z.H, z.G, z.hs,
                              alibi, mask.active() ? &mask : nullptr, head0);
  });
}

void attention_backward(Context& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs,
                        const AttentionLayout& layout, const DropoutMask& mask, int64_t head0) {
  TROUPE_ON_CUDA(ctx, attention_backward(ctx, dqkv, dout, qkv, probs, layout, mask, head0));
  if (Widen w(ctx, {&dout, &qkv, &probs, &dqkv}); w.active()) {
    const Tensor dout_w = w.in(dout), qkv_w = w.in(qkv), probs_w = w.in(probs), dqkv_w = w.out(dqkv);
    attention_backward(ctx, dqkv_w, dout_w, qkv_w, probs_w, layout, mask, head0);
    return w.finish();
  }
  // The slopes are constants of the scores: the backward only needs the probabilities.
  const AttentionSizes z = attention_sizes(qkv, dout, probs, layout, mask, head0);
  TROUPE_CHECK(dqkv.numel() == qkv.numel(), "attention backward: dqkv is qkv's shape");
  same_dtype(qkv, dqkv);
  dispatch(ctx, qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_backward<T>(*ctx.pool, dqkv.data<T>(), dout.data<T>(), qkv.data<T>(), probs.data<T>(), z.B, z.T,
                               z.H, z.G, z.hs, mask.active() ? &mask : nullptr, head0);
  });
}

namespace {
// A block call's sizes, checked against its tensors.
struct BlockSizes {
  int64_t B, Tq, Tk, H, G, hs;
};
BlockSizes block_sizes(const Tensor& qkv, const Tensor& kv, const AttentionBlock& block, const DropoutMask& mask,
                       int64_t head0) {
  const AttentionLayout& layout = block.layout;
  const int64_t H = layout.n_head, G = layout.n_group > 0 ? layout.n_group : H, hs = layout.head_dim;
  TROUPE_CHECK(H > 0 && G > 0 && H % G == 0 && hs > 0,
               "attention block: n_head > 0, n_group divides it, head_dim given");
  TROUPE_CHECK(qkv.rank() == 3 && qkv.dim(2) == (H + 2 * G) * hs, "attention block: qkv is (B,Tq,(H+2G)*hs)");
  TROUPE_CHECK(kv.rank() == 3 && kv.dim(0) == qkv.dim(0) && kv.dim(2) == 2 * G * hs,
               "attention block: kv is (B,Tk,2G*hs)");
  const int64_t B = qkv.dim(0), Tq = qkv.dim(1), Tk = kv.dim(1);
  TROUPE_CHECK(static_cast<int64_t>(block.qpos.size()) == Tq && static_cast<int64_t>(block.kpos.size()) == Tk,
               "attention block: one position per query row and per key row");
  for (int64_t p : block.qpos) TROUPE_CHECK(p >= 0 && p < block.seq_len, "attention block: positions in [0, seq_len)");
  for (int64_t p : block.kpos) TROUPE_CHECK(p >= 0 && p < block.seq_len, "attention block: positions in [0, seq_len)");
  TROUPE_CHECK(layout.alibi_slopes.empty() || static_cast<int64_t>(layout.alibi_slopes.size()) == H,
               "attention block: alibi_slopes holds one slope per held query head, or none");
  TROUPE_CHECK(head0 >= 0, "attention block: head0 must not be negative");
  if (mask.active()) check_mask(mask, B, (head0 + H) * block.seq_len * block.seq_len);
  same_dtype(qkv, kv);
  return {B, Tq, Tk, H, G, hs};
}
void check_state(const Tensor& t, int64_t n, DType dtype, const char* what) {
  TROUPE_CHECK(t.numel() == n && t.dtype() == dtype, what);
}
}  // namespace

void attention_block_begin(Context& ctx, const Tensor& acc, const Tensor& m, const Tensor& l) {
  TROUPE_CHECK(ctx.device == Device::cpu, "attention blocks run on the CPU only so far");
  acc.zero_();
  l.zero_();
  dispatch(ctx, m.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::fill(m.data<T>(), m.data<T>() + m.numel(), -std::numeric_limits<T>::infinity());
  });
}

void attention_block_forward(Context& ctx, const Tensor& acc, const Tensor& m, const Tensor& l, const Tensor& qkv,
                             const Tensor& kv, const AttentionBlock& block, const DropoutMask& mask, int64_t head0) {
  const BlockSizes z = block_sizes(qkv, kv, block, mask, head0);
  check_state(acc, z.B * z.Tq * z.H * z.hs, qkv.dtype(), "attention block: acc is (B,Tq,H*hs) of qkv's dtype");
  check_state(m, z.B * z.H * z.Tq, qkv.dtype(), "attention block: m is (B,H,Tq) of qkv's dtype");
  check_state(l, z.B * z.H * z.Tq, qkv.dtype(), "attention block: l is (B,H,Tq) of qkv's dtype");
  const double* alibi = block.layout.alibi_slopes.empty() ? nullptr : block.layout.alibi_slopes.data();
  dispatch(ctx, qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_block_forward<T>(*ctx.pool, acc.data<T>(), m.data<T>(), l.data<T>(), qkv.data<T>(), kv.data<T>(),
                                    z.B, z.Tq, z.Tk, z.H, z.G, z.hs, block.qpos.data(), block.kpos.data(),
                                    block.seq_len, alibi, mask.active() ? &mask : nullptr, head0);
  });
}

void attention_cached_forward(Context& ctx, const Tensor& out, const Tensor& qkv, const std::vector<int64_t>& row0,
                              const std::vector<Tensor>& kv, const std::vector<int64_t>& kv_len,
                              const AttentionLayout& layout) {
  TROUPE_CHECK(ctx.device == Device::cpu, "cached attention runs on the CPU only so far");
  const int64_t H = layout.n_head, G = layout.n_group > 0 ? layout.n_group : H, n = static_cast<int64_t>(kv.size());
  TROUPE_CHECK(H > 0 && H % G == 0 && qkv.rank() == 2 && out.rank() == 2 && out.dim(0) == qkv.dim(0) &&
                   out.dim(1) % H == 0,
               "cached attention: qkv is (R,(H+2G)*hs), out (R,H*hs), G divides H");
  const int64_t hs = layout.head_dim > 0 ? layout.head_dim : out.dim(1) / H;
  TROUPE_CHECK(out.dim(1) == H * hs && qkv.dim(1) == (H + 2 * G) * hs && qkv.dtype() == DType::f32 &&
                   out.dtype() == DType::f32,
               "cached attention: f32 qkv (R,(H+2G)*hs) and out (R,H*hs)");
  TROUPE_CHECK(static_cast<int64_t>(row0.size()) == n + 1 && static_cast<int64_t>(kv_len.size()) == n &&
                   row0.front() == 0 && row0.back() == qkv.dim(0),
               "cached attention: row0 holds one start per sequence and the rows' end; one kv_len per sequence");
  TROUPE_CHECK(layout.alibi_slopes.empty() || static_cast<int64_t>(layout.alibi_slopes.size()) == H,
               "cached attention: alibi_slopes holds one slope per held query head, or none");
  const DType kv_type = kv.empty() ? DType::f32 : kv.front().dtype();
  TROUPE_CHECK(kv_type == DType::f32 || is_half(kv_type), "cached attention: f32, bf16 or f16 caches");
  std::vector<const void*> caches(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& c = kv[static_cast<size_t>(i)];
    const int64_t Tq = row0[i + 1] - row0[i];
    TROUPE_CHECK(Tq >= 1 && kv_len[i] >= Tq && c.dtype() == kv_type && c.rank() == 2 && c.dim(1) == 2 * G * hs &&
                     c.dim(0) >= kv_len[i],
                 "cached attention: each sequence has rows, and a cache (rows, 2G*hs) of one type holding them and what "
                 "came before");
    caches[static_cast<size_t>(i)] = c.raw();
  }
  const double* alibi = layout.alibi_slopes.empty() ? nullptr : layout.alibi_slopes.data();
  if (kv_type == DType::f32)
    cpu::attention_cached_forward<float>(*ctx.pool, out.data<float>(), H * hs, qkv.data<float>(), (H + 2 * G) * hs, n,
                                         row0.data(), reinterpret_cast<const float* const*>(caches.data()),
                                         kv_len.data(), H, G, hs, alibi);
  else
    cpu::attention_cached_forward_half(*ctx.pool, out.data<float>(), H * hs, qkv.data<float>(), (H + 2 * G) * hs, n,
                                       row0.data(), reinterpret_cast<const uint16_t* const*>(caches.data()), kv_type,
                                       kv_len.data(), H, G, hs, alibi);
}

void attention_block_finish(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& acc, const Tensor& m,
                            const Tensor& l) {
  TROUPE_CHECK(out.rank() == 3 && m.rank() == 3 && m.dim(0) == out.dim(0) && m.dim(2) == out.dim(1),
               "attention block finish: out is (B,Tq,H*hs), m (B,H,Tq)");
  const int64_t B = out.dim(0), Tq = out.dim(1), H = m.dim(1), hs = out.dim(2) / H;
  TROUPE_CHECK(hs * H == out.dim(2), "attention block finish: H divides out's last dim");
  check_state(acc, out.numel(), out.dtype(), "attention block finish: acc is out's shape and dtype");
  check_state(lse, m.numel(), out.dtype(), "attention block finish: lse is (B,H,Tq)");
  check_state(l, m.numel(), out.dtype(), "attention block finish: l is (B,H,Tq)");
  same_dtype(m, out);
  dispatch(ctx, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_block_finish<T>(out.data<T>(), lse.data<T>(), acc.data<T>(), m.data<T>(), l.data<T>(), B, Tq, H,
                                   hs);
  });
}

void attention_block_delta(Context& ctx, const Tensor& delta, const Tensor& dout, const Tensor& out) {
  TROUPE_CHECK(delta.rank() == 3 && out.rank() == 3 && delta.dim(0) == out.dim(0) && delta.dim(2) == out.dim(1) &&
                   out.dim(2) % delta.dim(1) == 0 && dout.numel() == out.numel(),
               "attention block delta: delta (B,H,Tq), dout and out (B,Tq,H*hs)");
  same_dtype(dout, out);
  same_dtype(delta, out);
  const int64_t B = out.dim(0), Tq = out.dim(1), H = delta.dim(1), hs = out.dim(2) / H;
  dispatch(ctx, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_block_delta<T>(delta.data<T>(), dout.data<T>(), out.data<T>(), B, Tq, H, hs);
  });
}

void attention_block_backward(Context& ctx, const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                              const Tensor& delta, const Tensor& lse, const Tensor& qkv, const Tensor& kv,
                              const AttentionBlock& block, const DropoutMask& mask, int64_t head0) {
  const BlockSizes z = block_sizes(qkv, kv, block, mask, head0);
  check_state(dq, z.B * z.Tq * z.H * z.hs, qkv.dtype(), "attention block backward: dq is (B,Tq,H*hs)");
  check_state(dout, z.B * z.Tq * z.H * z.hs, qkv.dtype(), "attention block backward: dout is (B,Tq,H*hs)");
  check_state(dkv, kv.numel(), qkv.dtype(), "attention block backward: dkv is kv's shape");
  check_state(delta, z.B * z.H * z.Tq, qkv.dtype(), "attention block backward: delta is (B,H,Tq)");
  check_state(lse, z.B * z.H * z.Tq, qkv.dtype(), "attention block backward: lse is (B,H,Tq)");
  const double* alibi = block.layout.alibi_slopes.empty() ? nullptr : block.layout.alibi_slopes.data();
  dispatch(ctx, qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::attention_block_backward<T>(*ctx.pool, dq.data<T>(), dkv.data<T>(), dout.data<T>(), delta.data<T>(),
                                     lse.data<T>(), qkv.data<T>(), kv.data<T>(), z.B, z.Tq, z.Tk, z.H, z.G, z.hs,
                                     block.qpos.data(), block.kpos.data(), block.seq_len, alibi,
                                     mask.active() ? &mask : nullptr, head0);
  });
}

Tensor attention_saved_tensor(Context& ctx, int64_t B, int64_t H, int64_t T, DType activations) {
  if (ctx.device == Device::cuda) {
    auto t = device_empty(Shape{B, H, T}, DType::f32, ctx.cuda_device, reinterpret_cast<uint64_t>(ctx.stream));
    TROUPE_CHECK(t.is_ok(), t.is_ok() ? "" : t.status().message().c_str());
    return t.value();
  }
  return Tensor::zeros(Shape{B, H, T, T}, activations);
}

std::vector<double> alibi_slopes(int n_heads) {
  TROUPE_CHECK(n_heads > 0, "alibi_slopes: n_heads must be positive");
  // BLOOM's build_alibi_tensor: cp2 = the largest power of 2 <= n; slopes base^1..base^cp2 with
  // base = 2^(-8/cp2); the remaining n - cp2 heads take extra_base^1, ^3, ^5, ... with extra_base =
  // 2^(-4/cp2) (= every other slope of 2*cp2 heads). Exponents as exact multiples of 2^(-8/cp2)'s
  // log: 2^(-8k/cp2) is computed as exp2 of the exact exponent, not as a repeated product.
  int cp2 = 1;
  while (cp2 * 2 <= n_heads) cp2 *= 2;
  std::vector<double> slopes;
  slopes.reserve(static_cast<size_t>(n_heads));
  for (int k = 1; k <= cp2; ++k) slopes.push_back(std::exp2(-8.0 * k / cp2));
  for (int k = 1; static_cast<int>(slopes.size()) < n_heads; k += 2) slopes.push_back(std::exp2(-4.0 * k / cp2));
  return slopes;
}

void softmax_cross_entropy(Context& ctx, const Tensor& losses, const Tensor& logits, const Tensor& targets,
                           int64_t valid, double grad_scale) {
  TROUPE_ON_CUDA(ctx, softmax_cross_entropy(ctx, losses, logits, targets, valid, grad_scale));
  if (Widen w(ctx, {&logits, &losses}); w.active()) {
    const Tensor logits_w = w.inout(logits), losses_w = w.out(losses);
    softmax_cross_entropy(ctx, losses_w, logits_w, targets, valid, grad_scale);
    return w.finish();
  }
  const int64_t Vp = logits.dim(-1), N = logits.numel() / Vp;
  TROUPE_CHECK(losses.numel() == N && targets.numel() == N, "softmax_cross_entropy: shapes");
  TROUPE_CHECK(valid > 0 && valid <= Vp, "softmax_cross_entropy: 0 < valid <= Vp");
  dispatch(ctx, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::softmax_cross_entropy<T>(*ctx.pool, losses.data<T>(), logits.data<T>(), targets.data<int32_t>(), N,
                                  Vp, valid, grad_scale);
  });
}

namespace {
void check_row_stats(const Tensor& t, int64_t N, const char* what) {
  TROUPE_CHECK(t.dtype() == DType::f64 && t.numel() == N, what);
}
}  // namespace

void xent_local_stats(Context& ctx, const Tensor& row_max, const Tensor& target_logit, const Tensor& logits,
                      const Tensor& targets, int64_t vocab_begin, int64_t valid) {
  TROUPE_ON_CUDA(ctx, xent_local_stats(ctx, row_max, target_logit, logits, targets, vocab_begin, valid));
  if (Widen w(ctx, {&logits}); w.active()) {
    const Tensor logits_w = w.in(logits);
    xent_local_stats(ctx, row_max, target_logit, logits_w, targets, vocab_begin, valid);
    return w.finish();
  }
  const int64_t Vl = logits.dim(-1), N = logits.numel() / Vl;
  check_row_stats(row_max, N, "xent_local_stats: row_max is (N) f64");
  check_row_stats(target_logit, N, "xent_local_stats: target_logit is (N) f64");
  TROUPE_CHECK(targets.numel() == N && targets.dtype() == DType::i32, "xent_local_stats: targets are (N) i32");
  TROUPE_CHECK(valid >= 0 && valid <= Vl && vocab_begin >= 0, "xent_local_stats: 0 <= valid <= Vl");
  dispatch(ctx, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::xent_local_stats<T>(*ctx.pool, row_max.data<double>(), target_logit.data<double>(), logits.data<T>(),
                             targets.data<int32_t>(), N, Vl, vocab_begin, valid);
  });
}

void xent_exp_sum(Context& ctx, const Tensor& sum_exp, const Tensor& logits, const Tensor& row_max, int64_t valid) {
  TROUPE_ON_CUDA(ctx, xent_exp_sum(ctx, sum_exp, logits, row_max, valid));
  if (Widen w(ctx, {&logits}); w.active()) {
    const Tensor logits_w = w.inout(logits);
    xent_exp_sum(ctx, sum_exp, logits_w, row_max, valid);
    return w.finish();
  }
  const int64_t Vl = logits.dim(-1), N = logits.numel() / Vl;
  check_row_stats(sum_exp, N, "xent_exp_sum: sum_exp is (N) f64");
  check_row_stats(row_max, N, "xent_exp_sum: row_max is (N) f64");
  TROUPE_CHECK(valid >= 0 && valid <= Vl, "xent_exp_sum: 0 <= valid <= Vl");
  dispatch(ctx, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::xent_exp_sum<T>(*ctx.pool, sum_exp.data<double>(), logits.data<T>(), row_max.data<double>(), N, Vl, valid);
  });
}

void xent_loss(Context& ctx, const Tensor& losses, const Tensor& row_max, const Tensor& sum_exp,
               const Tensor& target_logit) {
  TROUPE_ON_CUDA(ctx, xent_loss(ctx, losses, row_max, sum_exp, target_logit));
  if (Widen w(ctx, {&losses}); w.active()) {
    const Tensor losses_w = w.out(losses);
    xent_loss(ctx, losses_w, row_max, sum_exp, target_logit);
    return w.finish();
  }
  const int64_t N = losses.numel();
  check_row_stats(row_max, N, "xent_loss: row_max is (N) f64");
  check_row_stats(sum_exp, N, "xent_loss: sum_exp is (N) f64");
  check_row_stats(target_logit, N, "xent_loss: target_logit is (N) f64");
  dispatch(ctx, losses.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::xent_loss<T>(*ctx.pool, losses.data<T>(), row_max.data<double>(), sum_exp.data<double>(),
                      target_logit.data<double>(), N);
  });
}

void xent_backward(Context& ctx, const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                   const Tensor& targets, int64_t vocab_begin, int64_t valid, double grad_scale) {
  TROUPE_ON_CUDA(ctx, xent_backward(ctx, logits, row_max, sum_exp, targets, vocab_begin, valid, grad_scale));
  if (Widen w(ctx, {&logits}); w.active()) {
    const Tensor logits_w = w.inout(logits);
    xent_backward(ctx, logits_w, row_max, sum_exp, targets, vocab_begin, valid, grad_scale);
    return w.finish();
  }
  const int64_t Vl = logits.dim(-1), N = logits.numel() / Vl;
  check_row_stats(row_max, N, "xent_backward: row_max is (N) f64");
  check_row_stats(sum_exp, N, "xent_backward: sum_exp is (N) f64");
  TROUPE_CHECK(targets.numel() == N && targets.dtype() == DType::i32, "xent_backward: targets are (N) i32");
  TROUPE_CHECK(valid >= 0 && valid <= Vl && vocab_begin >= 0, "xent_backward: 0 <= valid <= Vl");
  dispatch(ctx, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::xent_backward<T>(*ctx.pool, logits.data<T>(), row_max.data<double>(), sum_exp.data<double>(),
                          targets.data<int32_t>(), N, Vl, vocab_begin, valid, grad_scale);
  });
}

void adamw_update(Context& ctx, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const AdamWParams& p) {
  TROUPE_ON_CUDA(ctx, adamw_update(ctx, param, grad, exp_avg, exp_avg_sq, p));
  if (Widen w(ctx, {&grad, &param, &exp_avg, &exp_avg_sq}); w.active()) {
    const Tensor grad_w = w.in(grad), param_w = w.inout(param), exp_avg_w = w.inout(exp_avg),
                 exp_avg_sq_w = w.inout(exp_avg_sq);
    adamw_update(ctx, param_w, grad_w, exp_avg_w, exp_avg_sq_w, p);
    return w.finish();
  }
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
  TROUPE_ON_CUDA(ctx, sum_squares(ctx, t));
  if (Widen w(ctx, {&t}); w.active()) {
    const Tensor t_w = w.in(t);
    const double s = sum_squares(ctx, t_w);
    w.finish();
    return s;
  }
  double s = 0;
  dispatch(ctx, t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    s = cpu::sum_squares<T>(*ctx.pool, t.data<T>(), t.numel());
  });
  return s;
}

void scale_inplace(Context& ctx, const Tensor& t, double factor) {
  TROUPE_ON_CUDA(ctx, scale_inplace(ctx, t, factor));
  if (Widen w(ctx, {&t}); w.active()) {
    const Tensor t_w = w.inout(t);
    scale_inplace(ctx, t_w, factor);
    return w.finish();
  }
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
