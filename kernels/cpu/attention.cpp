// Causal self-attention on the CPU, grouped-query (query head h reads key/value group h / (H/G)),
// with optional ALiBi biases. One task per (batch, query head), tasks split over the pool; inside a
// task the products run as single-threaded GEMMs on row blocks so the masked upper triangle is
// mostly skipped: block [i0, i1) of queries only meets keys [0, i1).
// GQA backward: the first head of each group writes its dK, dV straight into dqkv (as MHA does);
// the group's other heads write theirs into a scratch of the call, and a second pass adds them to
// the first's in head order. Every task stays independent (full parallelism even for MQA), and each
// sum runs in a fixed order, so the result does not depend on the thread count. With G = H the
// scratch is empty and the code is the multi-head code as it was (bitwise).
// ALiBi adds slope * (j - i) to the scaled scores before the softmax; a constant bias changes
// nothing in the softmax's backward, so the backward does not see it.
// Attention dropout: the dropped probabilities Pd = P * factor are formed in a per-thread scratch
// (a block of rows in forward, the whole (T, T) in backward, where dV needs every row) and the
// products use them; P itself stays the softmax, which the softmax's backward needs. The backward
// regenerates each row's factors once and uses them for Pd and for dP = dPd * factor. Without
// dropout the code path is the one before dropout existed, unchanged.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::cpu {

namespace {
constexpr int64_t kBlock = 64;  // query rows per GEMM block

// ALiBi's biases fall by slope * (i - j) along a row, so distant keys get probabilities far below the
// type's resolution: exp(-80) ~ 2e-35 in float. Left as they are, they and their products (P V,
// dS = P (dP - dot)) are subnormal numbers, on which x86 arithmetic is many times slower (measured:
// the ALiBi forward and backward took twice MHA's time). Below the threshold they are set to 0: each is
// under 2e-35 (double: 1e-304) times the row's largest probability. (Without ALiBi such gaps do not
// arise in practice, and that path stays as it was.)
template <class T> constexpr T kAlibiFlush = static_cast<T>(-80);
template <> constexpr double kAlibiFlush<double> = -700;


// Pd row i (columns 0..i) = P row i * factors; f receives the factors (columns 0..i).
template <class T>
void drop_row(const DropoutMask& mask, int64_t sample, int64_t e0, int64_t i, T keep_scale, const T* p, T* pd, T* f) {
  mask.factors(sample, e0, i + 1, keep_scale, f);
  for (int64_t j = 0; j <= i; ++j) pd[j] = p[j] * f[j];
}

}  // namespace

template <class T>
void attention_forward(ThreadPool& pool, T* out, T* probs, const T* qkv, int64_t B, int64_t T_, int64_t H,
                       int64_t G, int64_t hs, const double* alibi, const DropoutMask* mask, int64_t head0) {
  const int64_t C = H * hs, ld = (H + 2 * G) * hs, R = H / G;  // R query heads per group
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  const T keep_scale = mask ? static_cast<T>(1.0 / (1.0 - mask->p)) : T(1);
  pool.parallel_for(B * H, [&](int64_t task0, int64_t task1) {
    T* pd = mask ? thread_scratch<T>(static_cast<size_t>(kBlock * T_), 0) : nullptr;  // (kBlock, T) dropped rows
    T* f = mask ? thread_scratch<T>(static_cast<size_t>(T_), 1) : nullptr;            // (T) one row's factors
    // (T) ALiBi biases of the head, bias[m] = slope * (m - (T - 1)): row i adds bias[j - i + T - 1] at j <= i.
    T* bias = alibi ? thread_scratch<T>(static_cast<size_t>(T_), 2) : nullptr;
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t b = task / H, h = task % H, g = h / R;
      if (alibi)
        for (int64_t m = 0; m < T_; ++m) bias[m] = static_cast<T>(alibi[h] * static_cast<double>(m - (T_ - 1)));
      const T* q = qkv + b * T_ * ld + h * hs;            // (T, hs), row stride ld
      const T* k = qkv + b * T_ * ld + C + g * hs;        // (T, hs), row stride ld
      const T* v = k + G * hs;                            // (T, hs), row stride ld
      T* P = probs + task * T_ * T_;  // (T, T)
      T* o = out + b * T_ * C + h * hs;  // (T, hs), row stride C
      // S[i0:i1, 0:i1] = scale * Q[i0:i1] K[0:i1]^T
      for (int64_t i0 = 0; i0 < T_; i0 += kBlock) {
        int64_t i1 = std::min(T_, i0 + kBlock);
        gemm_serial<T>(false, true, i1 - i0, i1, hs, scale, q + i0 * ld, ld, k, ld, T(0), P + i0 * T_, T_);
      }
      // Row softmax over j <= i (after the ALiBi bias); zeros above the diagonal.
      for (int64_t i = 0; i < T_; ++i) {
        T* row = P + i * T_;
        if (alibi) {
          const T* bi = bias + (T_ - 1 - i);  // bi[j] = slope * (j - i)
          for (int64_t j = 0; j <= i; ++j) row[j] += bi[j];
        }
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
        T sum = 0;
        if (alibi) {
          for (int64_t j = 0; j <= i; ++j) {
            const T e = row[j] - mx;
            row[j] = e < kAlibiFlush<T> ? T(0) : fast_exp(e);
            sum += row[j];
          }
        } else {
          for (int64_t j = 0; j <= i; ++j) {
            row[j] = fast_exp(row[j] - mx);
            sum += row[j];
          }
        }
        T inv = T(1) / sum;
        for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
        std::fill(row + i + 1, row + T_, T(0));
      }
      // O[i0:i1] = P[i0:i1, 0:i1] V[0:i1]  (P dropped into pd block by block with dropout)
      for (int64_t i0 = 0; i0 < T_; i0 += kBlock) {
        int64_t i1 = std::min(T_, i0 + kBlock);
        if (!mask) {
          gemm_serial<T>(false, false, i1 - i0, hs, i1, T(1), P + i0 * T_, T_, v, ld, T(0), o + i0 * C, C);
          continue;
        }
        const int64_t sample = mask->first_sample + b, hg = head0 + h;
        for (int64_t i = i0; i < i1; ++i) {
          T* row = pd + (i - i0) * T_;
          drop_row(*mask, sample, (hg * T_ + i) * T_, i, keep_scale, P + i * T_, row, f);
          std::fill(row + i + 1, row + i1, T(0));
        }
        gemm_serial<T>(false, false, i1 - i0, hs, i1, T(1), pd, T_, v, ld, T(0), o + i0 * C, C);
      }
    }
  });
}

template <class T>
void attention_backward(ThreadPool& pool, T* dqkv, const T* dout, const T* qkv, const T* probs, int64_t B,
                        int64_t T_, int64_t H, int64_t G, int64_t hs, const DropoutMask* mask, int64_t head0) {
  const int64_t C = H * hs, ld = (H + 2 * G) * hs, R = H / G;  // R query heads per group
  // dK and dV of the heads that are not their group's first: (B, G, R-1, T, hs) each.
  const int64_t part_len = B * G * (R - 1) * T_ * hs;
  // Every element is written by its head's task before the sum reads it: no zero fill.
  const std::unique_ptr<T[]> parts(new T[static_cast<size_t>(2 * part_len)]);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  const T keep_scale = mask ? static_cast<T>(1.0 / (1.0 - mask->p)) : T(1);
  pool.parallel_for(B * H, [&](int64_t task0, int64_t task1) {
    // (T, T) dP, then dS in place; with dropout also (T, T) Pd and (T) one row's factors, in the
    // thread's scratch (no allocation per call); without, a buffer of the call as before dropout.
    std::vector<T> plain_buf(mask ? 0 : static_cast<size_t>(T_ * T_));
    T* dP = mask ? thread_scratch<T>(static_cast<size_t>(2 * T_ * T_ + T_), 0) : plain_buf.data();
    T* pd = dP + T_ * T_;
    T* f = pd + T_ * T_;
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t b = task / H, h = task % H, g = h / R, r = h % R;
      const T* q = qkv + b * T_ * ld + h * hs;      // (T, hs), stride ld
      const T* k = qkv + b * T_ * ld + C + g * hs;  // (T, hs), stride ld
      const T* v = k + G * hs;
      const T* P = probs + task * T_ * T_;
      const T* dO = dout + b * T_ * C + h * hs;  // (T, hs), stride C
      T* dq = dqkv + b * T_ * ld + h * hs;       // (T, hs), stride ld
      // The group's first head: dK, dV in place (stride ld); the others: their slot of parts (stride hs).
      const int64_t ldkv = r == 0 ? ld : hs;
      T* dk = r == 0 ? dqkv + b * T_ * ld + C + g * hs : parts.get() + (((b * G + g) * (R - 1) + r - 1) * T_) * hs;
      T* dv = r == 0 ? dk + G * hs : dk + part_len;
      // dP[i0:i1, 0:i1] = dO[i0:i1] V[0:i1]^T  (with dropout: the gradient of the dropped Pd)
      for (int64_t i0 = 0; i0 < T_; i0 += kBlock) {
        int64_t i1 = std::min(T_, i0 + kBlock);
        gemm_serial<T>(false, true, i1 - i0, i1, hs, T(1), dO + i0 * C, C, v, ld, T(0), dP + i0 * T_, T_);
      }
      // Dropout, per row: Pd = P * factor, and dP = dPd * factor, the factors made once.
      if (mask) {
        const int64_t sample = mask->first_sample + b, hg = head0 + h;
        for (int64_t i = 0; i < T_; ++i) {
          T* pdr = pd + i * T_;
          T* dr = dP + i * T_;
          drop_row(*mask, sample, (hg * T_ + i) * T_, i, keep_scale, P + i * T_, pdr, f);
          std::fill(pdr + i + 1, pdr + T_, T(0));
          for (int64_t j = 0; j <= i; ++j) dr[j] *= f[j];
        }
      }
      // dV[j0:j1] = P[j0:T, j0:j1]^T dO[j0:T]   (P, or Pd with dropout, is zero above the diagonal)
      const T* weights = mask ? pd : P;
      for (int64_t j0 = 0; j0 < T_; j0 += kBlock) {
        int64_t j1 = std::min(T_, j0 + kBlock);
        gemm_serial<T>(true, false, j1 - j0, hs, T_ - j0, T(1), weights + j0 * T_ + j0, T_, dO + j0 * C, C, T(0),
                       dv + j0 * ldkv, ldkv);
      }
      // dS = scale * P * (dP - rowsum(P * dP)), zero above the diagonal
      for (int64_t i = 0; i < T_; ++i) {
        const T* pr = P + i * T_;
        T* dr = dP + i * T_;
        T dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
        for (int64_t j = 0; j <= i; ++j) dr[j] = scale * pr[j] * (dr[j] - dot);
        std::fill(dr + i + 1, dr + T_, T(0));
      }
      // dQ[i0:i1] = dS[i0:i1, 0:i1] K[0:i1]
      for (int64_t i0 = 0; i0 < T_; i0 += kBlock) {
        int64_t i1 = std::min(T_, i0 + kBlock);
        gemm_serial<T>(false, false, i1 - i0, hs, i1, T(1), dP + i0 * T_, T_, k, ld, T(0), dq + i0 * ld, ld);
      }
      // dK[j0:j1] = dS[j0:T, j0:j1]^T Q[j0:T]
      for (int64_t j0 = 0; j0 < T_; j0 += kBlock) {
        int64_t j1 = std::min(T_, j0 + kBlock);
        gemm_serial<T>(true, false, j1 - j0, hs, T_ - j0, T(1), dP + j0 * T_ + j0, T_, q + j0 * ld, ld, T(0),
                       dk + j0 * ldkv, ldkv);
      }
    }
  });
  if (R == 1) return;
  // dK, dV of each group += its other heads' parts, in head order; rows (b, t) split over the pool.
  pool.parallel_for(B * T_, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t b = n / T_, t = n % T_;
      for (int64_t g = 0; g < G; ++g) {
        T* dk = dqkv + n * ld + C + g * hs;  // (hs)
        T* dv = dk + G * hs;                 // (hs)
        for (int64_t r = 1; r < R; ++r) {
          const T* pk = parts.get() + (((b * G + g) * (R - 1) + r - 1) * T_ + t) * hs;
          const T* pv = pk + part_len;
          for (int64_t e = 0; e < hs; ++e) dk[e] += pk[e];
          for (int64_t e = 0; e < hs; ++e) dv[e] += pv[e];
        }
      }
    }
  }, 16);
}

#define TROUPE_INSTANTIATE(T)                                                                               \
  template void attention_forward<T>(ThreadPool&, T*, T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                     const double*, const DropoutMask*, int64_t);                           \
  template void attention_backward<T>(ThreadPool&, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                      int64_t, int64_t, const DropoutMask*, int64_t);
TROUPE_INSTANTIATE(float)
TROUPE_INSTANTIATE(double)
#undef TROUPE_INSTANTIATE

}  // namespace troupe::cpu
