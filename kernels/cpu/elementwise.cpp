// Embedding, LayerNorm, GELU and residual kernels: memory-bound loops, rows split over threads;
// parameter-gradient reductions split over columns so each sum runs over rows in order. The column
// blocks are fixed (kColumnBlock wide) and each is one task with a loop of its own, so the code that
// sums a column is the same loop over the same columns whatever the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "troupe/check.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::cpu {

namespace {
constexpr int64_t kColumnBlock = 32;  // columns per task of a parameter-gradient sum
constexpr int64_t kElemGrain = 16384; // elementwise loops: items per thread at least
}  // namespace

template <class T>
void embedding_forward(ThreadPool& pool, T* out, const int32_t* tokens, const T* wte, const T* wpe,
                       int64_t B, int64_t T_, int64_t C, int64_t vocab_begin, int64_t vocab_rows) {
  pool.parallel_for(B * T_, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t row = static_cast<int64_t>(tokens[n]) - vocab_begin;
      const bool held = row >= 0 && row < vocab_rows;
      T* o = out + n * C;
      const T* e = held ? wte + row * C : nullptr;      // (C)
      const T* p = wpe ? wpe + (n % T_) * C : nullptr;  // (C)
      if (held && p) {
        for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
      } else if (held) {
        std::copy(e, e + C, o);
      } else if (p) {
        std::copy(p, p + C, o);
      } else {
        std::fill(o, o + C, T(0));
      }
    }
  }, 64);
}

template <class T>
void embedding_backward(ThreadPool& pool, T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                        int64_t B, int64_t T_, int64_t C, int64_t vocab_begin, int64_t vocab_rows) {
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  pool.for_each_task(blocks, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    for (int64_t n = 0; n < B * T_; ++n) {
      const T* d = dout + n * C;
      const int64_t row = static_cast<int64_t>(tokens[n]) - vocab_begin;
      if (row >= 0 && row < vocab_rows) {
        T* e = dwte + row * C;
        for (int64_t c = c0; c < c1; ++c) e[c] += d[c];
      }
      if (dwpe) {
        T* p = dwpe + (n % T_) * C;
        for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
      }
    }
  });
}

template <class T>
void layernorm_forward(ThreadPool& pool, T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                       int64_t N, int64_t C, double eps) {
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* xr = x + n * C;
      T s = 0;
      for (int64_t c = 0; c < C; ++c) s += xr[c];
      T m = s / static_cast<T>(C);
      T v = 0;
      for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
      T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(v) / C + eps));
      T* o = out + n * C;
      for (int64_t c = 0; c < C; ++c) o[c] = (xr[c] - m) * r * w[c] + b[c];
      mean[n] = m;
      rstd[n] = r;
    }
  }, 16);
}

template <class T>
void layernorm_backward(ThreadPool& pool, T* dx, T* dw, T* db, const T* dout, const T* x, const T* w,
                        const T* mean, const T* rstd, int64_t N, int64_t C) {
  // dx: rows in parallel.
  if (dx) pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* xr = x + n * C;
      const T* dr = dout + n * C;
      T m = mean[n], r = rstd[n];
      T sum_dn = 0, sum_dn_xhat = 0;
      for (int64_t c = 0; c < C; ++c) {
        T dn = dr[c] * w[c];
        sum_dn += dn;
        sum_dn_xhat += dn * (xr[c] - m) * r;
      }
      T mean_dn = sum_dn / static_cast<T>(C), mean_dn_xhat = sum_dn_xhat / static_cast<T>(C);
      T* dxr = dx + n * C;
      for (int64_t c = 0; c < C; ++c) {
        T xhat = (xr[c] - m) * r;
        dxr[c] += r * (dr[c] * w[c] - mean_dn - xhat * mean_dn_xhat);
      }
    }
  }, 16);
  // dw, db: columns in parallel, rows in order.
  if (!dw) return;
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  pool.for_each_task(blocks, [&](int64_t block) {
    const int64_t c0 = block * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C;
      const T* dr = dout + n * C;
      T m = mean[n], r = rstd[n];
      for (int64_t c = c0; c < c1; ++c) {
        dw[c] += dr[c] * (xr[c] - m) * r;
        db[c] += dr[c];
      }
    }
  });
}

template <class T>
void column_sums_accumulate(ThreadPool& pool, T* db, const T* dout, int64_t N, int64_t O) {
  const int64_t blocks = (O + kColumnBlock - 1) / kColumnBlock;
  pool.for_each_task(blocks, [&](int64_t block) {
    const int64_t o0 = block * kColumnBlock, o1 = std::min(O, o0 + kColumnBlock);
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dout + n * O;
      for (int64_t o = o0; o < o1; ++o) db[o] += d[o];
    }
  });
}

namespace {
template <class T> constexpr T kGeluC = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
template <class T> constexpr T kGeluA = static_cast<T>(0.044715);
}  // namespace

template <class T>
void gelu_forward(ThreadPool& pool, T* out, const T* x, int64_t n) {
  pool.parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T xi = x[i];
      T u = kGeluC<T> * (xi + kGeluA<T> * xi * xi * xi);
      out[i] = T(0.5) * xi * (T(1) + fast_tanh(u));
    }
  }, kElemGrain);
}

template <class T>
void gelu_backward(ThreadPool& pool, T* dx, const T* dout, const T* x, int64_t n) {
  pool.parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T xi = x[i];
      T u = kGeluC<T> * (xi + kGeluA<T> * xi * xi * xi);
      T th = fast_tanh(u);
      T du = kGeluC<T> * (T(1) + T(3) * kGeluA<T> * xi * xi);
      T grad = T(0.5) * (T(1) + th) + T(0.5) * xi * (T(1) - th * th) * du;
      dx[i] = dout[i] * grad;
    }
  }, kElemGrain);
}

template <class T>
void add(ThreadPool& pool, T* out, const T* a, const T* b, int64_t n) {
  pool.parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  }, kElemGrain);
}

#define TROUPE_INSTANTIATE(T)                                                                       \
  template void embedding_forward<T>(ThreadPool&, T*, const int32_t*, const T*, const T*, int64_t,  \
                                     int64_t, int64_t, int64_t, int64_t);                           \
  template void embedding_backward<T>(ThreadPool&, T*, T*, const T*, const int32_t*, int64_t,       \
                                      int64_t, int64_t, int64_t, int64_t);                          \
  template void layernorm_forward<T>(ThreadPool&, T*, T*, T*, const T*, const T*, const T*, int64_t, \
                                     int64_t, double);                                              \
  template void layernorm_backward<T>(ThreadPool&, T*, T*, T*, const T*, const T*, const T*,        \
                                      const T*, const T*, int64_t, int64_t);                        \
  template void column_sums_accumulate<T>(ThreadPool&, T*, const T*, int64_t, int64_t);             \
  template void gelu_forward<T>(ThreadPool&, T*, const T*, int64_t);                                \
  template void gelu_backward<T>(ThreadPool&, T*, const T*, const T*, int64_t);                     \
  template void add<T>(ThreadPool&, T*, const T*, const T*, int64_t);
TROUPE_INSTANTIATE(float)
TROUPE_INSTANTIATE(double)
#undef TROUPE_INSTANTIATE

}  // namespace troupe::cpu
