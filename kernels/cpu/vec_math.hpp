// Branch-free exp and tanh that GCC vectorises (AVX2/AVX-512) inside simple loops. The float versions
// are accurate to about 2 ulp (Cephes' polynomial after range reduction); double uses libm, since
// double precision exists for the gradient checks, not for speed.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace troupe::cpu {

inline float fast_exp(float x) {
  x = std::min(88.3762626647949f, std::max(-87.3365447505531f, x));
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln 2 split hi/lo (Cephes)
  float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(e);
}
inline double fast_exp(double x) { return std::exp(x); }

// tanh(u) = 1 - 2 / (exp(2u) + 1): saturates cleanly to +-1, absolute error ~1e-7.
inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }
inline double fast_tanh(double u) { return std::tanh(u); }

// GPT-2's tanh GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its derivative, for GeGLU.
// elementwise.cpp's gelu loops keep their own copy of the formula: moved onto these functions, GCC
// compiled their loop tails otherwise (other bits at range edges, so results depended on the thread
// split), and the GPT-2 model's stored results depend on those bits.
template <class T> constexpr T kGluGeluC = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
template <class T> constexpr T kGluGeluA = static_cast<T>(0.044715);
template <class T>
inline T gelu_tanh(T x) {
  T u = kGluGeluC<T> * (x + kGluGeluA<T> * x * x * x);
  return T(0.5) * x * (T(1) + fast_tanh(u));
}
template <class T>
inline T gelu_tanh_grad(T x) {
  T u = kGluGeluC<T> * (x + kGluGeluA<T> * x * x * x);
  T th = fast_tanh(u);
  T du = kGluGeluC<T> * (T(1) + T(3) * kGluGeluA<T> * x * x);
  return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du;
}

// sigmoid(x) = 1 / (1 + exp(-x)) (fast_exp clamps, so large |x| saturates to 0 or 1 without NaN).
template <class T>
inline T sigmoid(T x) { return T(1) / (T(1) + fast_exp(-x)); }

}  // namespace troupe::cpu
