// The thread pool: every index and every task is run exactly once. (That results do not depend on
// the number of threads is tests/kernels/test_determinism.cpp.)
#include <atomic>
#include <catch2/catch.hpp>
#include <vector>

#include "kernels/thread_pool.hpp"

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

TEST_CASE("for_each_task runs every task exactly once", "[kernels][pool]") {
  for (int threads : {1, 2, 3, 7}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.for_each_task(n, [&](int64_t t) { hits[static_cast<size_t>(t)]++; });
      for (auto& h : hits) REQUIRE(h.load() == 1);
    }
  }
}
