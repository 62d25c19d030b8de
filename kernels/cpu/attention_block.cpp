// Blockwise causal attention on the CPU (kernels/ops.hpp, "blockwise causal attention"): a block of
// queries against one block of keys and values at a time, with flash attention's online softmax, for
// context parallelism's ring. Positions are global, so blocks met in any order give the whole
// sequence's attention up to rounding.
//
// The queries go in row tiles, each against only the keys causality lets it see (tile_keys).
// Forward, one task per (batch, query head, row tile): S = scale Q K^T for the tile (one GEMM), then
// per row the visible scores (kpos[j] <= qpos[i], plus ALiBi's slope * (kpos[j] - qpos[i])) update the running
// maximum m and sum l (both rescaled by exp(m_old - m_new)), the row's accumulator is rescaled alike,
// and acc += P~ V with P~ = exp(s - m) times the dropout factor (one GEMM).
// Backward, one task per (batch, key/value group), the group's query heads and their row tiles in
// order (they add into the same dK, dV rows, so the sum runs in a fixed order whatever the thread
// count): P = exp(s - lse) from
// the finished rows' log-sum-exp, Pd = P * factor, dV += Pd^T dO, dP = (dO V^T) * factor,
// dS = P (dP - delta) with delta = rowsum(dO * O), dQ += scale dS K, dK += scale dS^T Q.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/scratch.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/half.hpp"

namespace troupe::cpu {

namespace {

// f[j] = the dropout factor of key j for query row i of head hg (element (hg T + qpos) T + kpos[j] of
// the sample), runs of consecutive key positions drawn together.
template <class T>
void block_factors(const DropoutMask& mask, int64_t sample, int64_t hg, int64_t seq_len, int64_t qpos,
                   const int64_t* kpos, int64_t Tk, T keep_scale, T* f) {
  const int64_t base = (hg * seq_len + qpos) * seq_len;
  for (int64_t j0 = 0; j0 < Tk;) {
    int64_t j1 = j0 + 1;
    while (j1 < Tk && kpos[j1] == kpos[j1 - 1] + 1) ++j1;
    mask.factors(sample, base + kpos[j0], j1 - j0, keep_scale, f + j0);
    j0 = j1;
  }
}

// Row tiles. The queries are taken kRowTile rows at a time; a tile meets only the keys up to the last
// one some row of it can see (keys are in ascending position within a block: a rank's chunks in
// order). So the work follows the causal triangle as flash attention's tiles do: a block of another
// rank under Megatron's chunks costs half the diagonal one, the diagonal about half a full block, and
// the scratch per thread is a tile of scores, not a block.
constexpr int64_t kRowTile = 128;

// The keys rows [i0, i1) meet: [0, kt), kt one past the last key some row of the tile sees (0: none).
inline int64_t tile_keys(const int64_t* qpos, int64_t i0, int64_t i1, const int64_t* kpos, int64_t Tk) {
  int64_t qmax = std::numeric_limits<int64_t>::min();
  for (int64_t i = i0; i < i1; ++i) qmax = std::max(qmax, qpos[i]);
  int64_t kt = Tk;
  while (kt > 0 && kpos[kt - 1] > qmax) --kt;
  return kt;
}

// Row i of S (scaled scores) with ALiBi's bias added and the invisible keys set to -inf.
template <class T>
void visible_scores(T* row, const int64_t* kpos, int64_t Tk, int64_t qpos, const double* alibi, int64_t h) {
  for (int64_t j = 0; j < Tk; ++j) {
    if (kpos[j] > qpos) {
      row[j] = -std::numeric_limits<T>::infinity();
    } else if (alibi) {
      row[j] += static_cast<T>(alibi[h] * static_cast<double>(kpos[j] - qpos));
    }
  }
}

}  // namespace

template <class T>
void attention_block_forward(ThreadPool& pool, T* acc, T* m, T* l, const T* qkv, const T* kv, int64_t B, int64_t Tq,
                             int64_t Tk, int64_t H, int64_t G, int64_t hs, const int64_t* qpos, const int64_t* kpos,
                             int64_t seq_len, const double* alibi, const DropoutMask* mask, int64_t head0) {
  const int64_t C = H * hs, ldq = (H + 2 * G) * hs, ldkv = 2 * G * hs, R = H / G;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  const T keep_scale = mask ? static_cast<T>(1.0 / (1.0 - mask->p)) : T(1);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t tiles = (Tq + kRowTile - 1) / kRowTile;
  pool.parallel_for(B * H * tiles, [&](int64_t task0, int64_t task1) {
    T* S = thread_scratch<T>(static_cast<size_t>(kRowTile * Tk), 0);
    T* f = mask ? thread_scratch<T>(static_cast<size_t>(Tk), 1) : nullptr;
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t bh = task / tiles, b = bh / H, h = bh % H, g = h / R;
      const int64_t i0 = (task % tiles) * kRowTile, Tr = std::min(kRowTile, Tq - i0);
      const int64_t Kt = tile_keys(qpos, i0, i0 + Tr, kpos, Tk);
      if (Kt == 0) continue;  // no row of the tile sees a key of this block
      const T* q = qkv + (b * Tq + i0) * ldq + h * hs;
      const T* k = kv + b * Tk * ldkv + g * hs;
      const T* v = k + G * hs;
      T* a = acc + (b * Tq + i0) * C + h * hs;  // (Tr, hs), row stride C
      T* mr = m + bh * Tq + i0;
      T* lr = l + bh * Tq + i0;
      gemm_serial<T>(false, true, Tr, Kt, hs, scale, q, ldq, k, ldkv, T(0), S, Kt);
      for (int64_t i = 0; i < Tr; ++i) {
        T* row = S + i * Kt;
        visible_scores(row, kpos, Kt, qpos[i0 + i], alibi, h);
        T mx = mr[i];
        for (int64_t j = 0; j < Kt; ++j) mx = std::max(mx, row[j]);
        if (mx == neg_inf) {  // no visible key in this block yet: nothing to add
          std::fill(row, row + Kt, T(0));
          continue;
        }
        const T corr = mr[i] == neg_inf ? T(0) : fast_exp(mr[i] - mx);
        T sum = 0;
        for (int64_t j = 0; j < Kt; ++j) {
          row[j] = row[j] == neg_inf ? T(0) : fast_exp(row[j] - mx);
          sum += row[j];
        }
        lr[i] = lr[i] * corr + sum;
        mr[i] = mx;
        if (corr != T(1))
          for (int64_t c = 0; c < hs; ++c) a[i * C + c] *= corr;
        if (mask) {
          block_factors(*mask, mask->first_sample + b, head0 + h, seq_len, qpos[i0 + i], kpos, Kt, keep_scale, f);
          for (int64_t j = 0; j < Kt; ++j) row[j] *= f[j];
        }
      }
      gemm_serial<T>(false, false, Tr, hs, Kt, T(1), S, Kt, v, ldkv, T(1), a, C);
    }
  });
}

template <class T>
void attention_block_backward(ThreadPool& pool, T* dq, T* dkv, const T* dout, const T* delta, const T* lse,
                              const T* qkv, const T* kv, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t G,
                              int64_t hs, const int64_t* qpos, const int64_t* kpos, int64_t seq_len,
                              const double* alibi, const DropoutMask* mask, int64_t head0) {
  const int64_t C = H * hs, ldq = (H + 2 * G) * hs, ldkv = 2 * G * hs, R = H / G;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  const T keep_scale = mask ? static_cast<T>(1.0 / (1.0 - mask->p)) : T(1);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const size_t tile = static_cast<size_t>(kRowTile * Tk);
  pool.parallel_for(B * G, [&](int64_t task0, int64_t task1) {
    T* P = thread_scratch<T>(tile, 0);   // P, then dS
    T* D = thread_scratch<T>(tile, 1);   // dO V^T, then dP
    T* Pd = mask ? thread_scratch<T>(tile, 2) : nullptr;
    T* F = mask ? thread_scratch<T>(tile, 3) : nullptr;
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t b = task / G, g = task % G;
      const T* k = kv + b * Tk * ldkv + g * hs;
      const T* v = k + G * hs;
      T* dk = dkv + b * Tk * ldkv + g * hs;
      T* dv = dk + G * hs;
      // The group's heads in order, each head's row tiles in order: dK, dV sum in a fixed order.
      for (int64_t h = g * R; h < (g + 1) * R; ++h)
        for (int64_t i0 = 0; i0 < Tq; i0 += kRowTile) {
          const int64_t Tr = std::min(kRowTile, Tq - i0);
          const int64_t Kt = tile_keys(qpos, i0, i0 + Tr, kpos, Tk);
          if (Kt == 0) continue;
          const T* q = qkv + (b * Tq + i0) * ldq + h * hs;
          const T* go = dout + (b * Tq + i0) * C + h * hs;
          T* gq = dq + (b * Tq + i0) * C + h * hs;
          const T* ls = lse + (b * H + h) * Tq + i0;
          const T* dl = delta + (b * H + h) * Tq + i0;
          gemm_serial<T>(false, true, Tr, Kt, hs, scale, q, ldq, k, ldkv, T(0), P, Kt);
          for (int64_t i = 0; i < Tr; ++i) {
            T* row = P + i * Kt;
            visible_scores(row, kpos, Kt, qpos[i0 + i], alibi, h);
            for (int64_t j = 0; j < Kt; ++j) row[j] = row[j] == neg_inf ? T(0) : fast_exp(row[j] - ls[i]);
            if (mask) {
              T* fr = F + i * Kt;
              block_factors(*mask, mask->first_sample + b, head0 + h, seq_len, qpos[i0 + i], kpos, Kt, keep_scale,
                            fr);
              for (int64_t j = 0; j < Kt; ++j) Pd[i * Kt + j] = row[j] * fr[j];
            }
          }
          // dV += Pd^T dO
          gemm_serial<T>(true, false, Kt, hs, Tr, T(1), mask ? Pd : P, Kt, go, C, T(1), dv, ldkv);
          // dP = (dO V^T) * factor; dS = P (dP - delta)
          gemm_serial<T>(false, true, Tr, Kt, hs, T(1), go, C, v, ldkv, T(0), D, Kt);
          for (int64_t i = 0; i < Tr; ++i) {
            T* row = P + i * Kt;
            const T* dp = D + i * Kt;
            const T* fr = mask ? F + i * Kt : nullptr;
            for (int64_t j = 0; j < Kt; ++j) row[j] *= (fr ? dp[j] * fr[j] : dp[j]) - dl[i];
          }
          // dQ += scale dS K; dK += scale dS^T Q
          gemm_serial<T>(false, false, Tr, hs, Kt, scale, P, Kt, k, ldkv, T(1), gq, C);
          gemm_serial<T>(true, false, Kt, hs, Tr, scale, P, Kt, q, ldq, T(1), dk, ldkv);
        }
    }
  });
}

template <class T>
void attention_block_finish(T* out, T* lse, const T* acc, const T* m, const T* l, int64_t B, int64_t Tq, int64_t H,
                            int64_t hs) {
  const int64_t C = H * hs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t s = (b * H + h) * Tq + i;
        const T inv = l[s] > T(0) ? T(1) / l[s] : T(0);
        lse[s] = l[s] > T(0) ? m[s] + std::log(l[s]) : -std::numeric_limits<T>::infinity();
        const T* a = acc + (b * Tq + i) * C + h * hs;
        T* o = out + (b * Tq + i) * C + h * hs;
        for (int64_t c = 0; c < hs; ++c) o[c] = a[c] * inv;
      }
}

template <class T>
void attention_block_delta(T* delta, const T* dout, const T* out, int64_t B, int64_t Tq, int64_t H, int64_t hs) {
  const int64_t C = H * hs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const T* o = out + (b * Tq + i) * C + h * hs;
        const T* go = dout + (b * Tq + i) * C + h * hs;
        double s = 0;
        for (int64_t c = 0; c < hs; ++c) s += static_cast<double>(o[c]) * go[c];
        delta[(b * H + h) * Tq + i] = static_cast<T>(s);
      }
}

namespace {

// A task's keys and values: k and v (Kt rows each, leading dimension ld) of query group g.
template <class T>
struct CachedKv {
  const T* k;
  const T* v;
  int64_t ld;
};

// The tasks of attention_cached_forward; kv_at(i, g, Kt) gives sequence i's keys and values of group g.
template <class T, class KvAt>
void cached_attention_tasks(ThreadPool& pool, T* out, int64_t ldo, const T* qkv, int64_t ldq, int64_t n_seq,
                            const int64_t* row0, const int64_t* Tk, int64_t H, int64_t G, int64_t hs,
                            const double* alibi, const KvAt& kv_at) {
  const int64_t R = H / G;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  // Task t: sequence i, head h, row tile; first[i] is sequence i's first task.
  std::vector<int64_t> first(static_cast<size_t>(n_seq) + 1, 0);
  for (int64_t i = 0; i < n_seq; ++i) {
    const int64_t tiles = (row0[i + 1] - row0[i] + kRowTile - 1) / kRowTile;
    first[static_cast<size_t>(i) + 1] = first[static_cast<size_t>(i)] + H * tiles;
  }
  pool.for_each_task(first.back(), [&](int64_t task) {
    const int64_t i = std::upper_bound(first.begin(), first.end(), task) - first.begin() - 1;
    const int64_t local = task - first[static_cast<size_t>(i)];
    const int64_t Tq = row0[i + 1] - row0[i], tiles = (Tq + kRowTile - 1) / kRowTile;
    const int64_t h = local / tiles, g = h / R, r0 = (local % tiles) * kRowTile, Tr = std::min(kRowTile, Tq - r0);
    const int64_t pos0 = Tk[i] - Tq + r0;  // the tile's first row's position
    const int64_t Kt = pos0 + Tr;          // the keys its last row sees
    const CachedKv<T> kv = kv_at(i, g, Kt);
    T* S = thread_scratch<T>(static_cast<size_t>(kRowTile * Kt), 0);
    const T* q = qkv + (row0[i] + r0) * ldq + h * hs;
    T* o = out + (row0[i] + r0) * ldo + h * hs;
    gemm_serial<T>(false, true, Tr, Kt, hs, scale, q, ldq, kv.k, kv.ld, T(0), S, Kt);
    T* inv = thread_scratch<T>(static_cast<size_t>(kRowTile), 1);  // 1 / each row's sum
    for (int64_t r = 0; r < Tr; ++r) {
      T* row = S + r * Kt;
      const int64_t pos = pos0 + r;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j <= pos; ++j) {
        if (alibi) row[j] += static_cast<T>(alibi[h] * static_cast<double>(j - pos));
        mx = std::max(mx, row[j]);
      }
      T sum = 0;
      for (int64_t j = 0; j <= pos; ++j) {
        row[j] = fast_exp(row[j] - mx);
        sum += row[j];
      }
      std::fill(row + pos + 1, row + Kt, T(0));
      inv[r] = T(1) / sum;
    }
    gemm_serial<T>(false, false, Tr, hs, Kt, T(1), S, Kt, kv.v, kv.ld, T(0), o, ldo);
    for (int64_t r = 0; r < Tr; ++r)
      for (int64_t c = 0; c < hs; ++c) o[r * ldo + c] *= inv[r];
  });
}

}  // namespace

template <class T>
void attention_cached_forward(ThreadPool& pool, T* out, int64_t ldo, const T* qkv, int64_t ldq, int64_t n_seq,
                              const int64_t* row0, const T* const* kv, const int64_t* Tk, int64_t H, int64_t G,
                              int64_t hs, const double* alibi) {
  const int64_t ldkv = 2 * G * hs;
  cached_attention_tasks<T>(pool, out, ldo, qkv, ldq, n_seq, row0, Tk, H, G, hs, alibi, [&](int64_t i, int64_t g, int64_t) {
    return CachedKv<T>{kv[i] + g * hs, kv[i] + G * hs + g * hs, ldkv};
  });
}

void attention_cached_forward_half(ThreadPool& pool, float* out, int64_t ldo, const float* qkv, int64_t ldq,
                                   int64_t n_seq, const int64_t* row0, const uint16_t* const* kv, DType kv_type,
                                   const int64_t* Tk, int64_t H, int64_t G, int64_t hs, const double* alibi) {
  const int64_t ldkv = 2 * G * hs;
  cached_attention_tasks<float>(pool, out, ldo, qkv, ldq, n_seq, row0, Tk, H, G, hs, alibi,
                                [&](int64_t i, int64_t g, int64_t Kt) {
                                  // The task's group widened (exactly) into compact rows of its own scratch.
                                  float* k = thread_scratch<float>(static_cast<size_t>(Kt * hs), 2);
                                  float* v = thread_scratch<float>(static_cast<size_t>(Kt * hs), 3);
                                  const uint16_t* src = kv[i];
                                  for (int64_t j = 0; j < Kt; ++j) {
                                    half::convert_array(DType::f32, k + j * hs, kv_type, src + j * ldkv + g * hs, hs);
                                    half::convert_array(DType::f32, v + j * hs, kv_type, src + j * ldkv + (G + g) * hs, hs);
                                  }
                                  return CachedKv<float>{k, v, hs};
                                });
}

#define TROUPE_ATTENTION_BLOCK(T)                                                                                  \
  template void attention_block_forward<T>(ThreadPool&, T*, T*, T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                           int64_t, int64_t, int64_t, const int64_t*, const int64_t*, int64_t,     \
                                           const double*, const DropoutMask*, int64_t);                          \
  template void attention_block_backward<T>(ThreadPool&, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                            int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const int64_t*, \
                                            const int64_t*, int64_t, const double*, const DropoutMask*, int64_t); \
  template void attention_block_finish<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t); \
  template void attention_block_delta<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);            \
  template void attention_cached_forward<T>(ThreadPool&, T*, int64_t, const T*, int64_t, int64_t, const int64_t*,  \
                                            const T* const*, const int64_t*, int64_t, int64_t, int64_t, const double*);
TROUPE_ATTENTION_BLOCK(float)
TROUPE_ATTENTION_BLOCK(double)
#undef TROUPE_ATTENTION_BLOCK

}  // namespace troupe::cpu
