// Gated linear units (Shazeer, "GLU Variants Improve Transformer"): each row of gate_up holds the two
// halves of the MLP's first projection, [gate (F) | up (F)] as Megatron's fc1 with --swiglu; the unit
// is act(gate) * up with act = SiLU (SwiGLU, LLaMA) or tanh GELU (GeGLU). Rows split over threads;
// every element is computed by itself, so any split gives the same bits.
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::cpu {

namespace {
constexpr int64_t kRowGrain = 8;  // rows per thread at least
}  // namespace

template <class T>
void glu_forward(ThreadPool& pool, T* out, const T* gate_up, int64_t N, int64_t F, bool silu) {
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* gate = gate_up + n * 2 * F;  // (F)
      const T* up = gate + F;               // (F)
      T* o = out + n * F;                   // (F)
      if (silu) {
        for (int64_t f = 0; f < F; ++f) o[f] = gate[f] * sigmoid(gate[f]) * up[f];
      } else {
        for (int64_t f = 0; f < F; ++f) o[f] = gelu_tanh(gate[f]) * up[f];
      }
    }
  }, kRowGrain);
}

// d gate = dout * up * act'(gate), d up = dout * act(gate);  silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
template <class T>
void glu_backward(ThreadPool& pool, T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t F, bool silu) {
  pool.parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* gate = gate_up + n * 2 * F;  // (F)
      const T* up = gate + F;               // (F)
      const T* d = dout + n * F;            // (F)
      T* dgate = dgate_up + n * 2 * F;      // (F)
      T* dup = dgate + F;                   // (F)
      if (silu) {
        for (int64_t f = 0; f < F; ++f) {
          const T g = gate[f], s = sigmoid(g);
          dgate[f] = d[f] * up[f] * (s * (T(1) + g * (T(1) - s)));
          dup[f] = d[f] * (g * s);
        }
      } else {
        for (int64_t f = 0; f < F; ++f) {
          const T g = gate[f];
          dgate[f] = d[f] * up[f] * gelu_tanh_grad(g);
          dup[f] = d[f] * gelu_tanh(g);
        }
      }
    }
  }, kRowGrain);
}

#define TROUPE_INSTANTIATE(T)                                                              \
  template void glu_forward<T>(ThreadPool&, T*, const T*, int64_t, int64_t, bool);         \
  template void glu_backward<T>(ThreadPool&, T*, const T*, const T*, int64_t, int64_t, bool);
TROUPE_INSTANTIATE(float)
TROUPE_INSTANTIATE(double)
#undef TROUPE_INSTANTIATE

}  // namespace troupe::cpu
