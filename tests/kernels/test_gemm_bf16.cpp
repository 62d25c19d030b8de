// gemm_bf16 (kernels/cpu/gemm_bf16.hpp) on both kernels, against a double-precision product of the
// same bf16 inputs: the fp32 error bound, VDPBF16PS's documented summation order and denormal
// handling, and bitwise results on 1..7 threads. On a CPU without AVX512-BF16 the fast kernel's
// cases are skipped with a warning.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/context.hpp"
#include "kernels/cpu/gemm_bf16.hpp"

using namespace troupe;
using cpu::Bf16Kernel;

namespace {

std::vector<Bf16Kernel> kernels_here() {
  std::vector<Bf16Kernel> k{Bf16Kernel::widen_sgemm};
  if (cpu::bf16_kernel_supported(Bf16Kernel::avx512_bf16))
    k.push_back(Bf16Kernel::avx512_bf16);
  else
    WARN("this CPU lacks AVX512-BF16: only the widen_sgemm kernel is tested");
  return k;
}

// Random bf16 values in [-1, 1], none near zero (|v| >= 2^-10 after rounding).
std::vector<uint16_t> random_bf16(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) {
    float f = u(rng);
    if (std::abs(f) < 1e-3f) f = 0.25f;
    x = cpu::float_to_bf16(f);
  }
  return v;
}

struct Shape3 {
  int64_t M, N, K;
};

// Operands stored with leading dimensions wider than the matrices (A, B padded by 3 and 5, C by 2).
struct Operands {
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  std::vector<uint16_t> A, B, C16;  // A (M,K) or (K,M); B (K,N) or (N,K); C16 (M, ldc) bf16
  std::vector<float> C;             // (M, ldc)
  // The exact sums on the same inputs: dot (M,N) = op(A) op(B), mag (M,N) = |op(A)| |op(B)|.
  std::vector<double> dot, mag;
};

Operands make_operands(std::mt19937_64& rng, bool ta, bool tb, Shape3 s) {
  Operands o{ta, tb, s.M, s.N, s.K, (ta ? s.M : s.K) + 3, (tb ? s.K : s.N) + 5, s.N + 2,
             {}, {}, {}, {}, {}, {}};
  o.A = random_bf16(rng, (ta ? s.K : s.M) * o.lda);
  o.B = random_bf16(rng, (tb ? s.N : s.K) * o.ldb);
  o.C16 = random_bf16(rng, s.M * o.ldc);
  o.C.resize(o.C16.size());
  for (size_t i = 0; i < o.C.size(); ++i) o.C[i] = cpu::bf16_to_float(o.C16[i]);
  // op(A) (M,K) and op(B)^T (N,K) in double, then plain dot products.
  std::vector<double> a(static_cast<size_t>(s.M * s.K)), bt(static_cast<size_t>(s.N * s.K));
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t k = 0; k < s.K; ++k)
      a[m * s.K + k] = cpu::bf16_to_float(ta ? o.A[k * o.lda + m] : o.A[m * o.lda + k]);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      bt[n * s.K + k] = cpu::bf16_to_float(tb ? o.B[n * o.ldb + k] : o.B[k * o.ldb + n]);
  o.dot.resize(static_cast<size_t>(s.M * s.N));
  o.mag.resize(o.dot.size());
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t n = 0; n < s.N; ++n) {
      double d = 0, g = 0;
      for (int64_t k = 0; k < s.K; ++k) {
        const double p = a[m * s.K + k] * bt[n * s.K + k];
        d += p;
        g += std::abs(p);
      }
      o.dot[m * s.N + n] = d;
      o.mag[m * s.N + n] = g;
    }
  return o;
}

std::vector<float> run(Bf16Kernel kernel, ThreadPool& pool, const Operands& o, float alpha,
                       float beta) {
  std::vector<float> C = o.C;
  cpu::gemm_bf16(kernel, pool, o.ta, o.tb, o.M, o.N, o.K, alpha, o.A.data(), o.lda, o.B.data(),
                 o.ldb, beta, C.data(), o.ldc);
  return C;
}
std::vector<uint16_t> run_out(Bf16Kernel kernel, ThreadPool& pool, const Operands& o, float alpha,
                              float beta) {
  std::vector<uint16_t> C = o.C16;
  cpu::gemm_bf16_out(kernel, pool, o.ta, o.tb, o.M, o.N, o.K, alpha, o.A.data(), o.lda,
                     o.B.data(), o.ldb, beta, C.data(), o.ldc);
  return C;
}

// The header's bound: K sequential fp32 roundings of the products plus those of alpha and beta,
//   (K + 2) u (|alpha| sum |a||b| + |beta c|),  u = 2^-24,
// with 1% for the second-order terms (gamma_n = n u / (1 - n u)). Inputs >= 2^-10 in magnitude
// keep every product and partial sum far above the denormals, so flushing drops nothing here.
double bound(int64_t K, double alpha, double beta, double mag, double c) {
  return 1.01 * static_cast<double>(K + 2) * 0x1p-24 * (std::abs(alpha) * mag + std::abs(beta * c));
}

const Shape3 kShapes[] = {{1, 1, 1},     {7, 33, 257},    {33, 7, 1000},  {257, 70, 33},
                          {1000, 65, 7}, {1, 1000, 257},  {130, 300, 2},  {5, 9, 0},
                          {257, 300, 1000}, {97, 129, 385}};
struct AlphaBeta {
  float alpha, beta;
};
const AlphaBeta kAlphaBeta[] = {{1.0f, 0.0f}, {0.75f, -1.25f}, {-2.0f, 1.0f}};

}  // namespace

TEST_CASE("gemm_bf16's kernel is avx512_bf16 where supported, widen_sgemm when forced generic",
          "[kernels][bf16gemm]") {
  const bool fast = cpu::bf16_kernel_supported(Bf16Kernel::avx512_bf16);
  CHECK(cpu::bf16_kernel_supported(Bf16Kernel::widen_sgemm));
  CHECK(cpu::choose_bf16_kernel("generic") == Bf16Kernel::widen_sgemm);
  CHECK(cpu::choose_bf16_kernel(nullptr) ==
        (fast ? Bf16Kernel::avx512_bf16 : Bf16Kernel::widen_sgemm));
  CHECK(cpu::choose_bf16_kernel("") == cpu::choose_bf16_kernel(nullptr));
  CHECK(cpu::bf16_gemm_kernel() == cpu::choose_bf16_kernel(std::getenv("TROUPE_CPU_FEATURES")));
}

TEST_CASE("gemm_bf16 is within the fp32 bound of a double product of the same bf16 inputs, "
          "both kernels, every transpose, alpha and beta",
          "[kernels][bf16gemm]") {
  const std::vector<Bf16Kernel> kernels = kernels_here();
  std::mt19937_64 rng(15);
  ThreadPool pool(3);
  std::vector<double> worst(2, 0.0), worst_out(2, 0.0);  // observed error / bound, per kernel
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Shape3& s : kShapes) {
        const Operands o = make_operands(rng, ta, tb, s);
        for (const AlphaBeta& ab : kAlphaBeta) {
          std::vector<std::vector<float>> results;
          for (Bf16Kernel kernel : kernels) {
            INFO(cpu::bf16_kernel_name(kernel) << " trans_a " << ta << " trans_b " << tb << " M "
                 << s.M << " N " << s.N << " K " << s.K << " alpha " << ab.alpha << " beta "
                 << ab.beta);
            // beta == 0: C is not read, so what it held (here NaN) must not show through.
            Operands in_c = o;
            if (ab.beta == 0.0f) {
              std::fill(in_c.C.begin(), in_c.C.end(), std::numeric_limits<float>::quiet_NaN());
              std::fill(in_c.C16.begin(), in_c.C16.end(), uint16_t{0x7fc0});
            }
            const std::vector<float> C = run(kernel, pool, in_c, ab.alpha, ab.beta);
            const std::vector<uint16_t> C16 = run_out(kernel, pool, in_c, ab.alpha, ab.beta);
            int64_t bad = 0, bad_out = 0, touched = 0;
            double& w = worst[static_cast<size_t>(kernel)];
            double& w_out = worst_out[static_cast<size_t>(kernel)];
            for (int64_t m = 0; m < s.M; ++m) {
              for (int64_t n = 0; n < s.N; ++n) {
                const int64_t i = m * o.ldc + n;
                const double c = ab.beta == 0.0f ? 0.0 : o.C[i];
                const double exact = ab.alpha * o.dot[m * s.N + n] + ab.beta * c;
                const double b = bound(s.K, ab.alpha, ab.beta, o.mag[m * s.N + n], c);
                const double err = std::abs(C[i] - exact);
                if (!(err <= b)) ++bad;
                if (b > 0) w = std::max(w, err / b);
                // Rounding the fp32 value to bf16 (8 significant bits) adds at most 2^-8 of it.
                const double b_out = b + 0x1p-8 * (std::abs(exact) + b);
                const double err_out = std::abs(cpu::bf16_to_float(C16[i]) - exact);
                if (!(err_out <= b_out)) ++bad_out;
                if (b_out > 0) w_out = std::max(w_out, err_out / b_out);
              }
              // Columns past N (ldc's padding) are left alone.
              for (int64_t n = s.N; n < o.ldc; ++n) {
                const int64_t i = m * o.ldc + n;
                touched += std::memcmp(&C[i], &in_c.C[i], 4) != 0 || C16[i] != in_c.C16[i];
              }
            }
            CHECK(bad == 0);
            CHECK(bad_out == 0);
            CHECK(touched == 0);
            results.push_back(C);
          }
          // The kernels agree within twice the bound (each is within it of the exact value).
          if (results.size() == 2) {
            int64_t apart = 0;
            for (int64_t m = 0; m < s.M; ++m)
              for (int64_t n = 0; n < s.N; ++n) {
                const int64_t i = m * o.ldc + n;
                const double c = ab.beta == 0.0f ? 0.0 : o.C[i];
                const double b = bound(s.K, ab.alpha, ab.beta, o.mag[m * s.N + n], c);
                if (!(std::abs(static_cast<double>(results[0][i]) - results[1][i]) <= 2 * b)) ++apart;
              }
            CHECK(apart == 0);
          }
        }
      }
  // The worst error seen as a share of the bound (shown with -s).
  for (Bf16Kernel kernel : kernels) {
    INFO(cpu::bf16_kernel_name(kernel));
    CHECK(worst[static_cast<size_t>(kernel)] <= 1.0);
    CHECK(worst_out[static_cast<size_t>(kernel)] <= 1.0);
  }
}

TEST_CASE("the avx512_bf16 kernel sums as VDPBF16PS is documented: pairs in order, the odd "
          "element's product first, each accumulation rounded in fp32",
          "[kernels][bf16gemm]") {
  if (!cpu::bf16_kernel_supported(Bf16Kernel::avx512_bf16)) {
    WARN("this CPU lacks AVX512-BF16: skipped");
    return;
  }
  std::mt19937_64 rng(16);
  ThreadPool pool(2);
  // K odd and over two passes of the kernel's K blocks; M, N past one task.
  const float alpha = 0.75f, beta = -1.25f;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Operands o = make_operands(rng, ta, tb, {103, 300, 385});
      INFO("trans_a " << ta << " trans_b " << tb);
      const std::vector<float> C = run(Bf16Kernel::avx512_bf16, pool, o, alpha, beta);
      const std::vector<uint16_t> C16 = run_out(Bf16Kernel::avx512_bf16, pool, o, alpha, beta);
      int64_t differ = 0, differ_out = 0;
      for (int64_t m = 0; m < o.M; ++m)
        for (int64_t n = 0; n < o.N; ++n) {
          auto a = [&](int64_t k) {
            return k < o.K ? cpu::bf16_to_float(ta ? o.A[k * o.lda + m] : o.A[m * o.lda + k]) : 0.0f;
          };
          auto b = [&](int64_t k) {
            return k < o.K ? cpu::bf16_to_float(tb ? o.B[n * o.ldb + k] : o.B[k * o.ldb + n]) : 0.0f;
          };
          // A bf16 product is exact in fp32, so a * b + s rounds once, contracted or not.
          float s = 0.0f;
          for (int64_t p = 0; 2 * p < o.K; ++p) {
            s = s + a(2 * p + 1) * b(2 * p + 1);
            s = s + a(2 * p) * b(2 * p);
          }
          const int64_t i = m * o.ldc + n;
          const float expect = std::fmaf(beta, o.C[i], alpha * s);
          differ += std::memcmp(&C[i], &expect, 4) != 0;
          differ_out += C16[i] != cpu::float_to_bf16(std::fmaf(beta, o.C[i], alpha * s));
        }
      CHECK(differ == 0);
      CHECK(differ_out == 0);
    }
}

TEST_CASE("the avx512_bf16 kernel reads denormal bf16 inputs as zero; widen_sgemm keeps them",
          "[kernels][bf16gemm]") {
  ThreadPool pool(1);
  // A (1,2) = [2^-133 (the least bf16 denormal), 1], B (2,1) = [2^100, 2^-40]: exact 2^-33 + 2^-40.
  const uint16_t A[2] = {0x0001, cpu::float_to_bf16(1.0f)};
  const uint16_t B[2] = {cpu::float_to_bf16(0x1p100f), cpu::float_to_bf16(0x1p-40f)};
  float C = 0;
  cpu::gemm_bf16(Bf16Kernel::widen_sgemm, pool, false, false, 1, 1, 2, 1.0f, A, 2, B, 1, 0.0f, &C, 1);
  CHECK(C == 0x1p-33f + 0x1p-40f);
  if (!cpu::bf16_kernel_supported(Bf16Kernel::avx512_bf16)) {
    WARN("this CPU lacks AVX512-BF16: skipped");
    return;
  }
  cpu::gemm_bf16(Bf16Kernel::avx512_bf16, pool, false, false, 1, 1, 2, 1.0f, A, 2, B, 1, 0.0f, &C, 1);
  CHECK(C == 0x1p-40f);
}

TEST_CASE("gemm_bf16 is bitwise the same on 1 to 7 threads, both kernels, every transpose",
          "[kernels][bf16gemm][determinism]") {
  configure_blas_threads();
  const std::vector<Bf16Kernel> kernels = kernels_here();
  std::mt19937_64 rng(17);
  const Shape3 shapes[] = {{257, 300, 1000}, {1000, 65, 257}, {300, 1000, 97}};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Shape3& s : shapes) {
        const Operands o = make_operands(rng, ta, tb, s);
        for (Bf16Kernel kernel : kernels) {
          INFO(cpu::bf16_kernel_name(kernel) << " trans_a " << ta << " trans_b " << tb << " M "
               << s.M << " N " << s.N << " K " << s.K);
          ThreadPool one(1);
          const std::vector<float> ref = run(kernel, one, o, 1.5f, -0.75f);
          const std::vector<uint16_t> ref16 = run_out(kernel, one, o, 1.5f, -0.75f);
          for (int threads = 2; threads <= 7; ++threads) {
            INFO("threads " << threads);
            ThreadPool pool(threads);
            const std::vector<float> C = run(kernel, pool, o, 1.5f, -0.75f);
            CHECK(std::memcmp(C.data(), ref.data(), C.size() * sizeof(float)) == 0);
            const bool same_out = run_out(kernel, pool, o, 1.5f, -0.75f) == ref16;
            CHECK(same_out);
          }
        }
      }
}
