// Token + position embeddings on the device, forward and backward (kernels/cuda/cuda_ops.hpp); the
// vocabulary-parallel form too (a shard holds rows [vocab_begin, vocab_begin + Vl) of the table;
// other tokens give zero rows). Token ids are not read back to the host: an id outside the shard's
// rows embeds as zeros (the data loader has checked the ids against the vocabulary already).
// The table gradient is a scatter-add: one thread per column walks the tokens in order, so a row's
// sum has a fixed order and no atomics (16-bit tables accumulate in an f32 copy, rounded once).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/device_memory.hpp"

namespace troupe::cuda {

namespace {

template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t N,
                                         int64_t T_, int64_t C, int64_t vocab_begin, int64_t Vl) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * C; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / C, c = i % C, local = int64_t{tokens[n]} - vocab_begin;
    float v = local >= 0 && local < Vl ? ld(wte, local * C + c) : 0.0f;
    if (wpe != nullptr) v += ld(wpe, (n % T_) * C + c);
    st(out, i, v);
  }
}

// dwte (f32) [tokens[n] - vocab_begin, c] += dout[n, c], n in order; one thread per column.
template <class T>
__global__ void embedding_table_grad_kernel(float* dwte, const T* dout, const int32_t* tokens, int64_t N, int64_t C,
                                            int64_t vocab_begin, int64_t Vl) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t local = int64_t{tokens[n]} - vocab_begin;
    if (local >= 0 && local < Vl) dwte[local * C + c] += ld(dout, n * C + c);
  }
}

// dwpe[t, c] += sum_b dout[b, t, c], b in order.
template <class T, class G>
__global__ void embedding_position_grad_kernel(G* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < T_ * C; i += int64_t{gridDim.x} * blockDim.x) {
    float s = 0;
    for (int64_t b = 0; b < B; ++b) s += ld(dout, b * T_ * C + i);
    st(dwpe, i, ld(dwpe, i) + s);
  }
}

void forward(Context& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin,
             const Tensor& wpe) {
  check_device(ctx, {&out, &tokens, &wte, &wpe}, "embedding: device tensors on a CUDA context");
  TROUPE_CHECK(out.rank() == 3 && tokens.dtype() == DType::i32 && tokens.numel() == out.dim(0) * out.dim(1),
               "embedding: out (B,T,C), tokens (B,T) i32");
  const int64_t T_ = out.dim(1), C = out.dim(2), N = out.dim(0) * T_;
  TROUPE_CHECK(wte.rank() == 2 && wte.dim(1) == C && (!wpe.defined() || (wpe.dim(1) == C && wpe.dim(0) >= T_)),
               "embedding: wte (V,C), wpe (P,C) with P >= T");
  TROUPE_CHECK(wte.dtype() == out.dtype() && (!wpe.defined() || wpe.dtype() == out.dtype()), "embedding: one dtype");
  with_type(out.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    embedding_forward_kernel<T><<<blocks_for(N * C), kThreads, 0, stream_of(ctx)>>>(
        dptr<T>(out), dptr<int32_t>(tokens), dptr<T>(wte), dptr<T>(wpe), N, T_, C, vocab_begin, wte.dim(0));
  });
  TROUPE_CUDA_LAUNCHED("embedding");
}

void backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
              int64_t vocab_begin) {
  check_device(ctx, {&dwte, &dwpe, &dout, &tokens}, "embedding backward: device tensors on a CUDA context");
  TROUPE_CHECK(dout.rank() == 3 && tokens.dtype() == DType::i32 && tokens.numel() == dout.dim(0) * dout.dim(1),
               "embedding backward: dout (B,T,C), tokens (B,T) i32");
  const int64_t B = dout.dim(0), T_ = dout.dim(1), C = dout.dim(2), N = B * T_;
  TROUPE_CHECK(dwte.rank() == 2 && dwte.dim(1) == C, "embedding backward: dwte is (V,C)");
  TROUPE_CHECK(!dwpe.defined() || (dwpe.dim(1) == C && dwpe.dim(0) >= T_), "embedding backward: dwpe is (P,C)");
  // The table gradient in f32 (a 16-bit one widened into a copy and rounded back once, as the CPU).
  Tensor acc = dwte;
  if (dwte.dtype() != DType::f32) {
    acc = scratch(ctx, dwte.shape(), DType::f32, "embedding backward: the f32 table gradient");
    convert(ctx, acc, dwte);
  }
  with_type(dout.dtype(), "embedding backward", [&](auto tag) {
    using T = decltype(tag);
    embedding_table_grad_kernel<T><<<blocks_for(C), kThreads, 0, stream_of(ctx)>>>(
        dptr<float>(acc), dptr<T>(dout), dptr<int32_t>(tokens), N, C, vocab_begin, dwte.dim(0));
    if (dwpe.defined())
      with_type(dwpe.dtype(), "embedding backward", [&](auto g) {
        using G = decltype(g);
        embedding_position_grad_kernel<T, G><<<blocks_for(T_ * C), kThreads, 0, stream_of(ctx)>>>(
            dptr<G>(dwpe), dptr<T>(dout), B, T_, C);
      });
  });
  TROUPE_CUDA_LAUNCHED("embedding backward");
  if (!acc.shares_storage(dwte)) convert(ctx, dwte, acc);
}

}  // namespace

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  TROUPE_CHECK(wpe.defined(), "embedding: wpe is (P,C)");
  forward(ctx, out, tokens, wte, 0, wpe);
}

void embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  backward(ctx, dwte, dwpe, dout, tokens, 0);
}

void vocab_embedding_forward(Context& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                             int64_t vocab_begin, const Tensor& wpe) {
  forward(ctx, out, tokens, wte, vocab_begin, wpe);
}

void vocab_embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                              const Tensor& tokens, int64_t vocab_begin) {
  backward(ctx, dwte, dwpe, dout, tokens, vocab_begin);
}

}  // namespace troupe::cuda
