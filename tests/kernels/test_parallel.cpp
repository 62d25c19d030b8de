// The CPU backend's parallel split: results do not depend on the number of threads.
#include <cstring>

#include <catch2/catch.hpp>

#include "kernels/cpu/gemm.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;

TEST_CASE("thread pool covers every index exactly once", "[kernels][pool]") {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 7, 1000, 12345}) {
      std::vector<int> hits(n, 0);
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int h : hits) REQUIRE(h == 1);
    }
  }
}

TEST_CASE("split GEMM equals single-threaded GEMM bitwise for all transposes", "[kernels][gemm]") {
  std::mt19937_64 rng(3);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{301, 53, 97}, {37, 411, 129}, {517, 515, 63}}) {
        Tensor A = test::random_tensor({M * K}, rng, -1, 1, DType::f32);
        Tensor Bm = test::random_tensor({K * N}, rng, -1, 1, DType::f32);
        Tensor C1 = test::random_tensor({M * N}, rng, -1, 1, DType::f32), C2 = C1.clone();
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        cpu::gemm_serial<float>(ta, tb, M, N, K, 1.5f, A.data<float>(), lda, Bm.data<float>(), ldb, 0.5f,
                                C1.data<float>(), N);
        ThreadPool pool(3);
        cpu::gemm<float>(pool, ta, tb, M, N, K, 1.5f, A.data<float>(), lda, Bm.data<float>(), ldb, 0.5f,
                         C2.data<float>(), N);
        REQUIRE(std::memcmp(C1.raw(), C2.raw(), C1.nbytes()) == 0);
      }
}

TEST_CASE("parameter-gradient reductions are independent of the thread count", "[kernels][pool]") {
  std::mt19937_64 rng(5);
  const int64_t N = 333, C = 77;
  Tensor x = test::random_tensor({N, C}, rng, -1, 1, DType::f32), dout = test::random_tensor({N, C}, rng, -1, 1, DType::f32);
  Tensor w = test::random_tensor({C}, rng, -1, 1, DType::f32), b = test::random_tensor({C}, rng, -1, 1, DType::f32);
  Tensor weight = test::random_tensor({C, C}, rng, -1, 1, DType::f32);
  std::vector<Tensor> results;
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    Context ctx;
    ctx.pool = &pool;
    Tensor out = Tensor::empty({N, C}), mean = Tensor::empty({N}), rstd = Tensor::empty({N});
    ops::layernorm_forward(ctx, out, mean, rstd, x, w, b, 1e-5);
    Tensor dx = Tensor::zeros({N, C}), dw = Tensor::zeros({C}), db = Tensor::zeros({C});
    ops::layernorm_backward(ctx, dx, dw, db, dout, x, w, mean, rstd);
    Tensor dbias = Tensor::zeros({C});
    Tensor dW = Tensor::zeros({C, C}), dxl = Tensor::empty({N, C});
    ops::linear_backward(ctx, dxl, dW, dbias, dout, x, weight);
    results.push_back(dw);
    results.push_back(db);
    results.push_back(dbias);
    results.push_back(dxl);
  }
  for (size_t i = 4; i < results.size(); ++i)
    REQUIRE(std::memcmp(results[i].raw(), results[i % 4].raw(), results[i].nbytes()) == 0);
  double s1, s3;
  {
    ThreadPool p(1);
    Context c;
    c.pool = &p;
    s1 = ops::sum_squares(c, x);
  }
  {
    ThreadPool p(3);
    Context c;
    c.pool = &p;
    s3 = ops::sum_squares(c, x);
  }
  REQUIRE(s1 == s3);
}
