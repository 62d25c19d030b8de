// The CUDA backend's ops: the contracts of kernels/ops.hpp on device tensors, one .cu file per op
// family beside the CPU's (kernels/cpu/), forward and backward side by side. kernels/ops.cpp routes
// a call here when ctx.device is cuda, before its own shape checks (each CUDA op checks its own); an
// op without a CUDA version yet stops with a message naming it. Every call is queued on ctx.stream
// (no host synchronisation) except those that return a value to the host (count_nonfinite,
// sum_squares), which wait for their result.
//
// Types: f32, and bf16 / f16 storage with f32 compute in registers (widened exactly, rounded to
// nearest even once, as the CPU's 16-bit layer: __float2bfloat16_rn / __float2half_rn); f64 stays
// on the CPU (the finite-difference tests). Reductions run in a fixed order (no atomics), so results
// do not change from run to run.
//
// Not verified on a GPU yet (no session of issue 15 was lent one): tests/kernels/test_cuda_ops.cpp
// compares every op here with the CPU backend and runs under the label gpu (scripts/gpu_check.sh).
#pragma once
#include <cstdint>
#include <memory>

#include "kernels/ops.hpp"
#include "troupe/status.hpp"

namespace troupe::cuda {

// A Context for GPU `device`: its own non-blocking stream, a cuBLASLt handle and workspace. Freed
// with the returned object.
class DeviceContext {
 public:
  static Result<std::unique_ptr<DeviceContext>> create(int device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  Context& ctx() { return ctx_; }
  Status synchronize();  // waits for everything queued on the stream; reports a kernel's failure

 private:
  DeviceContext() = default;
  Context ctx_;
};

void convert(Context& ctx, const Tensor& dst, const Tensor& src);
int64_t count_nonfinite(Context& ctx, const Tensor& t);
void residual_forward(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);
void scale_inplace(Context& ctx, const Tensor& t, double factor);
double sum_squares(Context& ctx, const Tensor& t);
void gelu_forward(Context& ctx, const Tensor& out, const Tensor& x);
void gelu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x);
void glu_forward(Context& ctx, const Tensor& out, const Tensor& gate_up, ops::GluKind kind);
void glu_backward(Context& ctx, const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up, ops::GluKind kind);

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);
void embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens);
void vocab_embedding_forward(Context& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                             int64_t vocab_begin, const Tensor& wpe);
void vocab_embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                              const Tensor& tokens, int64_t vocab_begin);
void rotary_forward(Context& ctx, const Tensor& x, int64_t col0, int n_heads, int head_dim, const ops::RotaryParams& p);
void rotary_backward(Context& ctx, const Tensor& dx, int64_t col0, int n_heads, int head_dim,
                     const ops::RotaryParams& p);
void dropout_rows(Context& ctx, const Tensor& x, const DropoutMask& mask, int64_t row0, int64_t seq_len);

void layernorm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, double eps);
void layernorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd);
void rmsnorm_forward(Context& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                     double eps);
void rmsnorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd);

void linear_forward(Context& ctx, const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias);
void linear_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& x, const Tensor& weight);

// probs is the (B,H,T) f32 row log-sum-exp (ops::attention_saved_tensor), not the CPU's (B,H,T,T).
void attention_forward(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const ops::AttentionLayout& layout, const DropoutMask& mask, int64_t head0);
void attention_backward(Context& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& lse,
                        const ops::AttentionLayout& layout, const DropoutMask& mask, int64_t head0);

void softmax_cross_entropy(Context& ctx, const Tensor& losses, const Tensor& logits, const Tensor& targets,
                           int64_t valid, double grad_scale);

void xent_local_stats(Context& ctx, const Tensor& row_max, const Tensor& target_logit, const Tensor& logits,
                      const Tensor& targets, int64_t vocab_begin, int64_t valid);
void xent_exp_sum(Context& ctx, const Tensor& sum_exp, const Tensor& logits, const Tensor& row_max, int64_t valid);
void xent_loss(Context& ctx, const Tensor& losses, const Tensor& row_max, const Tensor& sum_exp,
               const Tensor& target_logit);
void xent_backward(Context& ctx, const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                   const Tensor& targets, int64_t vocab_begin, int64_t valid, double grad_scale);

void adamw_update(Context& ctx, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const ops::AdamWParams& p);

}  // namespace troupe::cuda
