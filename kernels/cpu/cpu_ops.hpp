// CPU kernels on raw pointers, templated on the element type (float for training, double for the
// gradient checks). kernels/ops.cpp checks shapes and dispatches here; see kernels/ops.hpp for the
// meaning of each op. Every kernel parallelises over the given pool with a static split that keeps
// results independent of the pool's size.
#pragma once
#include <cstdint>

#include "kernels/dropout.hpp"
#include "kernels/tensor.hpp"
#include "kernels/thread_pool.hpp"

namespace troupe::cpu {

// The table holds rows [vocab_begin, vocab_begin + vocab_rows); other tokens give / take nothing.
// wpe / dwpe may be null (no positions on this shard).
template <class T>
void embedding_forward(ThreadPool& pool, T* out, const int32_t* tokens, const T* wte, const T* wpe,
                       int64_t B, int64_t T_, int64_t C, int64_t vocab_begin, int64_t vocab_rows);
template <class T>
void embedding_backward(ThreadPool& pool, T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                        int64_t B, int64_t T_, int64_t C, int64_t vocab_begin, int64_t vocab_rows);

template <class T>
void layernorm_forward(ThreadPool& pool, T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                       int64_t N, int64_t C, double eps);
// dx null: no input gradient; dw and db null: no parameter gradients.
template <class T>
void layernorm_backward(ThreadPool& pool, T* dx, T* dw, T* db, const T* dout, const T* x, const T* w,
                        const T* mean, const T* rstd, int64_t N, int64_t C);

template <class T>
void linear_forward(ThreadPool& pool, T* out, const T* x, const T* w, const T* bias, int64_t N,
                    int64_t I, int64_t O);
// dx, dw, dbias may each be null (skipped).
template <class T>
void linear_backward(ThreadPool& pool, T* dx, T* dw, T* dbias, const T* dout, const T* x, const T* w,
                     int64_t N, int64_t I, int64_t O);
// db[o] += sum_n dout[n, o], columns split over threads, rows summed in order.
template <class T>
void column_sums_accumulate(ThreadPool& pool, T* db, const T* dout, int64_t N, int64_t O);

template <class T>
void gelu_forward(ThreadPool& pool, T* out, const T* x, int64_t n);
template <class T>
void gelu_backward(ThreadPool& pool, T* dx, const T* dout, const T* x, int64_t n);

template <class T>
void add(ThreadPool& pool, T* out, const T* a, const T* b, int64_t n);

template <class T>
void dropout_rows(ThreadPool& pool, T* x, const DropoutMask& mask, int64_t row0, int64_t rows, int64_t C,
                  int64_t seq_len, const int64_t* positions = nullptr);

// RMSNorm; dx null: no input gradient (then w may be null), dw null: no parameter gradient.
template <class T>
void rmsnorm_forward(ThreadPool& pool, T* out, T* rstd, const T* x, const T* w, int64_t N, int64_t C, double eps);
template <class T>
void rmsnorm_backward(ThreadPool& pool, T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                      int64_t N, int64_t C);

// Gated linear units on rows [gate (F) | up (F)]; swiglu when `silu`, else geglu (tanh GELU).
template <class T>
void glu_forward(ThreadPool& pool, T* out, const T* gate_up, int64_t N, int64_t F, bool silu);
template <class T>
void glu_backward(ThreadPool& pool, T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t F, bool silu);

// Rotary on x (B*T rows of W columns), heads [col0 + h*head_dim, ...) for h < n_heads; inverse: the
// backward's rotation by -angle.
template <class T>
void rotary(ThreadPool& pool, T* x, int64_t B, int64_t T_, int64_t W, int64_t col0, int64_t n_heads, int64_t head_dim,
            int64_t rotary_dim, double base, bool interleaved, int64_t pos0, bool inverse,
            const int64_t* positions = nullptr);

// Grouped-query causal attention: qkv rows [q (H*hs) | k (G*hs) | v (G*hs)], out rows (H*hs).
// alibi null: no ALiBi (else H slopes); mask null: no attention dropout.
template <class T>
void attention_forward(ThreadPool& pool, T* out, T* probs, const T* qkv, int64_t B, int64_t T_, int64_t H,
                       int64_t G, int64_t hs, const double* alibi, const DropoutMask* mask, int64_t head0);
template <class T>
void attention_backward(ThreadPool& pool, T* dqkv, const T* dout, const T* qkv, const T* probs, int64_t B,
                        int64_t T_, int64_t H, int64_t G, int64_t hs, const DropoutMask* mask, int64_t head0);

// Blockwise causal attention (kernels/ops.hpp, "blockwise causal attention"): queries (q of qkv rows,
// Tq) against one key/value block (kv rows [k (G*hs) | v (G*hs)], Tk) at global positions.
template <class T>
void attention_block_forward(ThreadPool& pool, T* acc, T* m, T* l, const T* qkv, const T* kv, int64_t B, int64_t Tq,
                             int64_t Tk, int64_t H, int64_t G, int64_t hs, const int64_t* qpos, const int64_t* kpos,
                             int64_t seq_len, const double* alibi, const DropoutMask* mask, int64_t head0);
template <class T>
void attention_block_backward(ThreadPool& pool, T* dq, T* dkv, const T* dout, const T* delta, const T* lse,
                              const T* qkv, const T* kv, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t G,
                              int64_t hs, const int64_t* qpos, const int64_t* kpos, int64_t seq_len,
                              const double* alibi, const DropoutMask* mask, int64_t head0);
template <class T>
void attention_block_finish(T* out, T* lse, const T* acc, const T* m, const T* l, int64_t B, int64_t Tq, int64_t H,
                            int64_t hs);
template <class T>
void attention_block_delta(T* delta, const T* dout, const T* out, int64_t B, int64_t Tq, int64_t H, int64_t hs);
// Several sequences' new rows over their key/value caches (ops::attention_cached_forward).
template <class T>
void attention_cached_forward(ThreadPool& pool, T* out, int64_t ldo, const T* qkv, int64_t ldq, int64_t n_seq,
                              const int64_t* row0, const T* const* kv, const int64_t* Tk, int64_t H, int64_t G,
                              int64_t hs, const double* alibi);
// The same over 16-bit caches (kv_type bf16 or f16: each task widens its group's keys and values,
// exactly, into scratch of its own), f32 queries and output.
void attention_cached_forward_half(ThreadPool& pool, float* out, int64_t ldo, const float* qkv, int64_t ldq,
                                   int64_t n_seq, const int64_t* row0, const uint16_t* const* kv, DType kv_type,
                                   const int64_t* Tk, int64_t H, int64_t G, int64_t hs, const double* alibi);

template <class T>
void softmax_cross_entropy(ThreadPool& pool, T* losses, T* logits, const int32_t* targets, int64_t N,
                           int64_t Vp, int64_t valid, double grad_scale);

// Vocabulary-parallel cross-entropy pieces (kernels/ops.hpp); row statistics in double.
template <class T>
void xent_local_stats(ThreadPool& pool, double* row_max, double* target_logit, const T* logits,
                      const int32_t* targets, int64_t N, int64_t Vl, int64_t vocab_begin, int64_t valid);
template <class T>
void xent_exp_sum(ThreadPool& pool, double* sum_exp, T* logits, const double* row_max, int64_t N, int64_t Vl,
                  int64_t valid);
template <class T>
void xent_loss(ThreadPool& pool, T* losses, const double* row_max, const double* sum_exp,
               const double* target_logit, int64_t N);
template <class T>
void xent_backward(ThreadPool& pool, T* logits, const double* row_max, const double* sum_exp,
                   const int32_t* targets, int64_t N, int64_t Vl, int64_t vocab_begin, int64_t valid,
                   double grad_scale);

template <class T>
void adamw_update(ThreadPool& pool, T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step);
template <class T>
double sum_squares(ThreadPool& pool, const T* x, int64_t n);
template <class T>
void scale(ThreadPool& pool, T* x, int64_t n, double factor);

}  // namespace troupe::cpu
