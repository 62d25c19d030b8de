// Rotary position embedding (Su et al., RoFormer), in place. The angles p * base^(-2i/r) and their
// cos / sin are computed in double once per call into a (T, r/2) table, rounded to the tensor's
// dtype, then every (row, head) pair is rotated in that dtype: (a, b) -> (a cos - b sin, b cos + a sin).
// Pairs: rotate-half (x[i], x[i + r/2]) is Hugging Face's apply_rotary_pos_emb / Megatron's
// _rotate_half; interleaved (x[2i], x[2i+1]) is Meta's original complex product (Megatron's
// --rotary-interleaved). The backward is the same loop with sin negated (rotation by -angle, the
// transpose of the forward's orthogonal map). Rows split over threads; each element is computed by
// itself, so any split gives the same bits.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.hpp"

namespace troupe::cpu {

namespace {
constexpr int64_t kRowGrain = 4;  // rows (b, t) per thread at least

// x_a' = x_a c - x_b s, x_b' = x_b c + x_a s for the n pairs (a[i*Stride], b[i*Stride]); the stride is a
// constant so the compiler vectorises both layouts.
template <int64_t Stride, class T>
inline void rotate_pairs(T* a, T* b, const T* c, const T* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T xa = a[i * Stride], xb = b[i * Stride];
    a[i * Stride] = xa * c[i] - xb * s[i];
    b[i * Stride] = xb * c[i] + xa * s[i];
  }
}
}  // namespace

template <class T>
void rotary(ThreadPool& pool, T* x, int64_t B, int64_t T_, int64_t W, int64_t col0, int64_t n_heads, int64_t head_dim,
            int64_t rotary_dim, double base, bool interleaved, int64_t pos0, bool inverse, const int64_t* positions) {
  const int64_t half = rotary_dim / 2;
  // cos_sin[t] = (cos (half) | sin (half)) of position pos0 + t (or positions[t]); sin negated for the inverse.
  std::vector<T> cos_sin(static_cast<size_t>(T_ * 2 * half));
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
  pool.parallel_for(T_, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const double p = static_cast<double>(positions != nullptr ? positions[t] : pos0 + t);
      T* row = cos_sin.data() + t * 2 * half;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = p * inv_freq[i];
        row[i] = static_cast<T>(std::cos(angle));
        row[half + i] = static_cast<T>(inverse ? -std::sin(angle) : std::sin(angle));
      }
    }
  }, 16);
  pool.parallel_for(B * T_, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* c = cos_sin.data() + (n % T_) * 2 * half;  // (half)
      const T* s = c + half;                              // (half)
      for (int64_t h = 0; h < n_heads; ++h) {
        T* head = x + n * W + col0 + h * head_dim;  // (head_dim); [rotary_dim, head_dim) passes through
        if (interleaved) {
          rotate_pairs<2>(head, head + 1, c, s, half);
        } else {
          rotate_pairs<1>(head, head + half, c, s, half);
        }
      }
    }
  }, kRowGrain);
}

template void rotary<float>(ThreadPool&, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                            bool, int64_t, bool, const int64_t*);
template void rotary<double>(ThreadPool&, double*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                             double, bool, int64_t, bool, const int64_t*);

}  // namespace troupe::cpu
