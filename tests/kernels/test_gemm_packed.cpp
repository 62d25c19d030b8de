// linear_packed (kernels/cpu/gemm_packed.hpp) on each kernel this CPU runs: bitwise a plain loop of
// std::fma in k order (the header's numerics) for odd sizes, padded leading dimensions, with and
// without a bias, on pools of 1, 2 and 3 threads; that loop within the fp32 bound of a
// double-precision product; nothing written outside C's columns. On a CPU without AVX2 or AVX-512F
// the missing kernel's cases are skipped with a warning.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/cpu/gemm_packed.hpp"
#include "kernels/ops.hpp"

using namespace troupe;
using cpu::PackedKernel;

namespace {

std::vector<PackedKernel> kernels_here() {
  std::vector<PackedKernel> k;
  for (PackedKernel kernel : {PackedKernel::avx2, PackedKernel::avx512}) {
    if (cpu::packed_kernel_supported(kernel))
      k.push_back(kernel);
    else
      WARN("this CPU does not run the " << cpu::packed_kernel_name(kernel) << " packed kernel: not tested");
  }
  return k;
}

std::vector<float> random_floats(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// The reference: C (M,N) = A (M,K) W^T (+ bias), one std::fma per k in k order, then + bias.
std::vector<float> reference(int64_t M, int64_t N, int64_t K, const std::vector<float>& A, int64_t lda,
                             const std::vector<float>& W, int64_t ldw, const float* bias) {
  std::vector<float> C(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s = std::fma(A[static_cast<size_t>(m * lda + k)], W[static_cast<size_t>(n * ldw + k)], s);
      C[static_cast<size_t>(m * N + n)] = bias ? s + bias[n] : s;
    }
  return C;
}

struct Case {
  int64_t M, N, K;
};

}  // namespace

TEST_CASE("linear_packed: bitwise the fma loop on every kernel, pool and size", "[gemm_packed]") {
  const std::vector<PackedKernel> kernels = kernels_here();
  if (kernels.empty()) return;
  std::mt19937_64 rng(20261207);
  // Edges of every block: rows 1..7 around the 6-row block and past the 96-row task, columns around
  // the 16-lane strips and 64-column panels, depths around the 96-value pass; K = 0 gives the bias.
  const std::vector<Case> cases{{1, 1, 1},    {1, 65, 97},   {5, 17, 96},   {6, 64, 192}, {7, 130, 7},
                                {13, 33, 200}, {97, 257, 95}, {200, 71, 385}, {3, 5, 0},    {101, 300, 64}};
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (const Case& c : cases) {
    for (bool with_bias : {false, true}) {
      INFO("M " << c.M << " N " << c.N << " K " << c.K << " bias " << with_bias);
      const int64_t lda = c.K + 3, ldw = c.K + 5, ldc = c.N + 2;
      const std::vector<float> A = random_floats(rng, c.M * lda), W = random_floats(rng, c.N * ldw);
      const std::vector<float> bias = random_floats(rng, c.N);
      const float* b = with_bias ? bias.data() : nullptr;
      const std::vector<float> want = reference(c.M, c.N, c.K, A, lda, W, ldw, b);
      const cpu::PackedWeight packed = cpu::PackedWeight::pack(pool2, W.data(), c.N, c.K, ldw);
      CHECK(packed.rows() == c.N);
      CHECK(packed.depth() == c.K);
      for (PackedKernel kernel : kernels) {
        for (ThreadPool* pool : {&pool1, &pool2, &pool3}) {
          INFO(cpu::packed_kernel_name(kernel) << " on " << pool->size() << " threads");
          const float sentinel = 12345.0f;
          std::vector<float> C(static_cast<size_t>(c.M * ldc), sentinel);
          cpu::linear_packed(kernel, *pool, c.M, A.data(), lda, packed, b, C.data(), ldc);
          int64_t differ = 0, outside = 0;
          for (int64_t m = 0; m < c.M; ++m) {
            for (int64_t n = 0; n < c.N; ++n) {
              const float got = C[static_cast<size_t>(m * ldc + n)], ref = want[static_cast<size_t>(m * c.N + n)];
              differ += std::memcmp(&got, &ref, sizeof got) != 0;
            }
            for (int64_t n = c.N; n < ldc; ++n) outside += C[static_cast<size_t>(m * ldc + n)] != sentinel;
          }
          CHECK(differ == 0);
          CHECK(outside == 0);
        }
      }
    }
  }
}

TEST_CASE("linear_packed: the fma loop is within the fp32 bound of the exact product", "[gemm_packed]") {
  // What the bitwise test compares with is itself checked: against a double-precision product,
  // |error| <= (K + 1) 2^-24 (sum_k |a_k w_k| + |bias|) for K sequential roundings and the bias's.
  std::mt19937_64 rng(7);
  const int64_t M = 9, N = 70, K = 517;
  const std::vector<float> A = random_floats(rng, M * K), W = random_floats(rng, N * K), bias = random_floats(rng, N);
  const std::vector<float> C = reference(M, N, K, A, K, W, K, bias.data());
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double exact = bias[static_cast<size_t>(n)], mag = std::abs(bias[static_cast<size_t>(n)]);
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(A[static_cast<size_t>(m * K + k)]) * W[static_cast<size_t>(n * K + k)];
        exact += p;
        mag += std::abs(p);
      }
      const double bound = static_cast<double>(K + 1) * std::ldexp(1.0, -24) * mag;
      worst = std::max(worst, std::abs(C[static_cast<size_t>(m * N + n)] - exact) / bound);
    }
  CHECK(worst <= 1.0);
  CHECK(worst > 0.0);  // the sums do round: the bound is not checked on exact values
}

TEST_CASE("linear_packed: the kernel a process chooses", "[gemm_packed]") {
  CHECK(cpu::choose_packed_kernel("generic") == PackedKernel::none);
  const PackedKernel capped = cpu::choose_packed_kernel("avx2");
  CHECK((capped == PackedKernel::avx2 || (capped == PackedKernel::none && !cpu::packed_kernel_supported(PackedKernel::avx2))));
  const PackedKernel best = cpu::choose_packed_kernel(nullptr);
  if (cpu::packed_kernel_supported(PackedKernel::avx512))
    CHECK(best == PackedKernel::avx512);
  else if (cpu::packed_kernel_supported(PackedKernel::avx2))
    CHECK(best == PackedKernel::avx2);
  else
    CHECK(best == PackedKernel::none);
  CHECK(cpu::packed_gemm_kernel() == cpu::choose_packed_kernel(std::getenv("TROUPE_CPU_FEATURES")));
}

TEST_CASE("linear_forward_packed: the op gives linear_forward's values", "[gemm_packed]") {
  if (cpu::packed_gemm_kernel() == PackedKernel::none) {
    WARN("no packed kernel in this process (TROUPE_CPU_FEATURES or the CPU): not tested");
    return;
  }
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(3);
  const int64_t N = 23, I = 77, O = 131;
  Tensor x = Tensor::empty({N, I}), w = Tensor::empty({O, I}), b = Tensor::empty({O});
  for (Tensor* t : {&x, &w, &b}) {
    const std::vector<float> v = random_floats(rng, t->numel());
    std::copy(v.begin(), v.end(), t->data<float>());
  }
  const cpu::PackedWeight packed = cpu::PackedWeight::pack(pool, w.data<float>(), O, I, I);
  Tensor plain = Tensor::empty({N, O}), fast = Tensor::empty({N, O});
  ops::linear_forward(ctx, plain, x, w, b);
  ops::linear_forward_packed(ctx, fast, x, packed, b);
  for (int64_t i = 0; i < N * O; ++i) CHECK(fast.data<float>()[i] == Approx(plain.data<float>()[i]).margin(1e-5));
}
