// gemm_f32_half_bt (kernels/cpu/gemm_half_weight.hpp), the linear forward with a 16-bit weight read a
// block at a time: against a double-precision product of the same (widened, exact) values within the
// fp32 bound, bitwise the same on 1..4 threads, leading dimensions wider than the matrices, beta 0
// reading no C, and ops::linear_forward taking it for few rows of fp16 and bf16.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/gemm_half_weight.hpp"
#include "kernels/half.hpp"
#include "kernels/ops.hpp"

using namespace troupe;

namespace {

uint16_t narrow(DType t, float v) {
  return t == DType::bf16 ? half::f32_to_bf16(v) : half::f32_to_f16(v);
}
float widen(DType t, uint16_t h) {
  return t == DType::bf16 ? half::bf16_to_f32(h) : half::f16_to_f32(h);
}

struct Case {
  int64_t M, N, K;
  float beta;
};

// Runs one case on pools of 1..4 threads: every pool gives the same bits, and each element is within
// (K + 2) 2^-24 (sum_k |a_mk b_nk| + |beta c_mn|) of the exact result.
void check_case(DType t, const Case& c, std::mt19937_64& rng) {
  INFO(dtype_name(t) << " M " << c.M << " N " << c.N << " K " << c.K << " beta " << c.beta);
  const int64_t lda = c.K + 3, ldb = c.K + 5, ldc = c.N + 2;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> A(static_cast<size_t>(std::max<int64_t>(1, c.M * lda)));
  std::vector<uint16_t> B(static_cast<size_t>(std::max<int64_t>(1, c.N * ldb)));
  std::vector<float> C0(static_cast<size_t>(c.M * ldc));
  for (float& a : A) a = u(rng);
  for (uint16_t& b : B) b = narrow(t, u(rng));
  for (float& x : C0) x = c.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : u(rng);
  std::vector<float> first;
  for (int threads = 1; threads <= 4; ++threads) {
    ThreadPool pool(threads);
    std::vector<float> C = C0;
    cpu::gemm_f32_half_bt(pool, c.M, c.N, c.K, A.data(), lda, t, B.data(), ldb, c.beta, C.data(), ldc);
    if (first.empty()) {
      first = C;
      for (int64_t m = 0; m < c.M; ++m)
        for (int64_t n = 0; n < c.N; ++n) {
          double dot = 0, mag = 0;
          for (int64_t k = 0; k < c.K; ++k) {
            const double p = static_cast<double>(A[m * lda + k]) * widen(t, B[n * ldb + k]);
            dot += p;
            mag += std::abs(p);
          }
          const double cin = c.beta == 0.0f ? 0.0 : C0[m * ldc + n];
          const double want = dot + c.beta * cin;
          const double bound = (c.K + 2) * 0x1p-24 * (mag + std::abs(c.beta * cin));
          INFO("element " << m << "," << n);
          REQUIRE(std::isfinite(C[m * ldc + n]));
          REQUIRE(std::abs(C[m * ldc + n] - want) <= bound);
        }
      // The padding between rows of C is not written.
      for (int64_t m = 0; m < c.M; ++m)
        for (int64_t n = c.N; n < ldc; ++n)
          REQUIRE(std::memcmp(&C[m * ldc + n], &C0[m * ldc + n], sizeof(float)) == 0);
    } else {
      INFO(threads << " threads against 1");
      REQUIRE(std::memcmp(C.data(), first.data(), C.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("gemm_f32_half_bt: the fp32 bound, bitwise on every pool size", "[kernels][mixed]") {
  std::mt19937_64 rng(0x16b7);
  // Block rows: K = 700 -> 80 rows, so N = 333 is five blocks, the last one short; K = 37 -> 1760 rows;
  // 200 rows of A and K = 64: 1024 rows.
  const Case cases[] = {{1, 1, 1, 0.0f}, {1, 333, 700, 0.0f}, {7, 333, 700, 1.0f}, {17, 45, 37, 0.5f},
                        {3, 9, 0, 1.0f}, {2, 1, 129, 0.0f}, {200, 2100, 64, 1.0f}};
  for (DType t : {DType::bf16, DType::f16})
    for (const Case& c : cases) check_case(t, c, rng);
  CHECK(cpu::half_weight_block_rows(700, 7) == 80);
  CHECK(cpu::half_weight_block_rows(700, 800) == 368);  // M / 2 = 400 rows would pass 1 MiB: 374 -> 368
  CHECK(cpu::half_weight_block_rows(768, 416) == 208);
  CHECK(cpu::half_weight_block_rows(1 << 20, 1) == 16);
  CHECK(cpu::half_weight_block_rows(0, 0) % 16 == 0);
}

TEST_CASE("16-bit linear_forward on few rows reads the weight a block at a time", "[kernels][mixed]") {
  // One decoding step's shape (3 tokens, odd widths, five weight blocks), fp16 and bf16 (which takes
  // this path below 9 rows even where the native bf16 GEMM runs): the 16-bit op equals the product of
  // the widened operands within the fp32 bound, rounded once to 16 bits.
  std::mt19937_64 rng(0x1f16);
  ThreadPool pool(3);
  Context ctx;
  ctx.pool = &pool;
  const int64_t N = 3, I = 700, O = 333;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor x = Tensor::empty({N, I}), w = Tensor::empty({O, I}), b = Tensor::empty({O});
  for (Tensor* t : {&x, &w, &b})
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = u(rng);
  for (DType h : {DType::f16, DType::bf16}) {
    INFO(dtype_name(h));
    const Tensor x16 = x.to(h), w16 = w.to(h), b16 = b.to(h);
    const Tensor out16 = Tensor::empty({N, O}, h), out32 = Tensor::empty({N, O});
    ops::linear_forward(ctx, out16, x16, w16, b16);
    ops::linear_forward(ctx, out32, x16, w16, b16);  // f32 output: the value before the 16-bit rounding
    const Tensor xw = x16.to(DType::f32), ww = w16.to(DType::f32), bw = b16.to(DType::f32);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double dot = bw.data<float>()[o], mag = std::abs(dot);
        for (int64_t i = 0; i < I; ++i) {
          const double p = static_cast<double>(xw.data<float>()[n * I + i]) * ww.data<float>()[o * I + i];
          dot += p;
          mag += std::abs(p);
        }
        const float got32 = out32.data<float>()[n * O + o];
        INFO("row " << n << " output " << o);
        REQUIRE(std::abs(got32 - dot) <= (I + 2) * 0x1p-24 * mag);
        const uint16_t got16 = static_cast<const uint16_t*>(out16.raw())[n * O + o];
        REQUIRE(got16 == narrow(h, got32));
      }
  }
}
