// Hidden-state dropout on the CPU: rows split over the pool; each row's factors come from the mask
// rule (kernels/dropout.hpp) in pieces of kPiece elements on the stack, then one multiply loop. The
// factor depends only on the element's global coordinates, so the result is the same for any split.
#include <algorithm>

#include "kernels/cpu/cpu_ops.hpp"

namespace troupe::cpu {

namespace {
constexpr int64_t kPiece = 256;  // factors computed at a time (stack buffer)
}

template <class T>
void dropout_rows(ThreadPool& pool, T* x, const DropoutMask& mask, int64_t row0, int64_t rows, int64_t C,
                  int64_t seq_len, const int64_t* positions) {
  const T scale = static_cast<T>(1.0 / (1.0 - mask.p));
  pool.parallel_for(rows, [&](int64_t n0, int64_t n1) {
    T f[kPiece];
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t g = row0 + n;  // row of the whole micro-batch: (sample, position)
      const int64_t t = g % seq_len, pos = positions != nullptr ? positions[t] : t;
      const int64_t sample = mask.first_sample + g / seq_len, e0 = pos * C;
      T* xr = x + n * C;
      for (int64_t c0 = 0; c0 < C; c0 += kPiece) {
        const int64_t len = std::min(kPiece, C - c0);
        mask.factors(sample, e0 + c0, len, scale, f);
        // A multiply, not a select: a NaN stays a NaN where it is dropped, as in torch.
        for (int64_t c = 0; c < len; ++c) xr[c0 + c] *= f[c];
      }
    }
  }, 16);
}

template void dropout_rows<float>(ThreadPool&, float*, const DropoutMask&, int64_t, int64_t, int64_t, int64_t,
                                   const int64_t*);
template void dropout_rows<double>(ThreadPool&, double*, const DropoutMask&, int64_t, int64_t, int64_t, int64_t,
                                   const int64_t*);

}  // namespace troupe::cpu
