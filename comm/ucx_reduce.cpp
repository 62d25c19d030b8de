#include "comm/ucx_reduce.hpp"

#include <cstdint>

#include "kernels/check.hpp"

namespace troupe::comm::ucx {

namespace {

// Integer sums go through the unsigned type so overflow wraps instead of being undefined.
template <class T, class Acc>
void sum_loop(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<T>(static_cast<Acc>(a[i]) + static_cast<Acc>(b[i]));
}

template <class T>
void max_loop(T* out, const T* a, const T* b, size_t n) {
  // `a > b ? a : b` is exactly x86's max instruction (b when unordered), so it vectorises.
  for (size_t i = 0; i < n; ++i) out[i] = a[i] > b[i] ? a[i] : b[i];
}

template <class T, class Acc>
void apply(void* out, const void* a, const void* b, size_t n, ReduceOp op) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  if (op == ReduceOp::sum) {
    sum_loop<T, Acc>(o, x, y, n);
  } else {
    max_loop<T>(o, x, y, n);
  }
}

}  // namespace

bool reducible(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::i32 || dtype == DType::i64;
}

void reduce(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  if (n == 0) return;
  switch (dtype) {
    case DType::f32:
      return apply<float, float>(out, a, b, n, op);
    case DType::f64:
      return apply<double, double>(out, a, b, n, op);
    case DType::i32:
      return apply<int32_t, uint32_t>(out, a, b, n, op);
    case DType::i64:
      return apply<int64_t, uint64_t>(out, a, b, n, op);
    default:
      break;
  }
  TROUPE_CHECK(false,
               "ucx reduce called with a dtype that cannot be reduced; callers check reducible()");
}

}  // namespace troupe::comm::ucx
