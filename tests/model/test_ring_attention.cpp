// Ring attention (model/ring_attention.hpp; p2p and all_gather) on cp ranks that are threads of the local backend: every
// rank's rows of the output and of the gradient of qkv equal attention over the whole sequence
// (attention_forward / attention_backward on one rank): f64 to 1e-12, f32 to 1e-5, with grouped-query
// attention, ALiBi, attention dropout, and chunks of odd length.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/local/local_world.hpp"
#include "kernels/ops.hpp"
#include "kernels/thread_pool.hpp"
#include "model/ring_attention.hpp"
#include "tests/kernels/grad_check.hpp"

namespace troupe {
namespace {

using test::random_tensor;

// Rows `pos` of a (B, T, W) tensor.
Tensor rows_of(const Tensor& t, const std::vector<int64_t>& pos) {
  const int64_t B = t.dim(0), T = t.dim(1), W = t.dim(2), n = static_cast<int64_t>(pos.size());
  const int64_t esz = static_cast<int64_t>(dtype_size(t.dtype()));
  Tensor out = Tensor::empty({B, n, W}, t.dtype());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(out.raw()) + (b * n + i) * W * esz,
                  static_cast<const char*>(t.raw()) + (b * T + pos[static_cast<size_t>(i)]) * W * esz, W * esz);
  return out;
}

// The largest difference between `part` (rows `pos` of the whole) and the same rows of `whole`,
// relative to whole's largest element.
double rel_diff(const Tensor& part, const Tensor& whole, const std::vector<int64_t>& pos) {
  const Tensor want = rows_of(whole, pos).to(DType::f64), got = part.to(DType::f64), all = whole.to(DType::f64);
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    diff = std::max(diff, std::abs(got.data<double>()[i] - want.data<double>()[i]));
  for (int64_t i = 0; i < all.numel(); ++i) scale = std::max(scale, std::abs(all.data<double>()[i]));
  return diff / scale;
}

}  // namespace

TEST_CASE("ring attention over cp ranks equals attention over the whole sequence, forward and backward",
          "[model][ring_attention]") {
  std::mt19937_64 rng(20261205);
  const int64_t B = 2, T = 26;
  const int H = 4, hs = 6;
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (DType dt : {DType::f64, DType::f32})
    for (int G : {4, 2})
      for (bool alibi : {false, true})
        for (bool dropout : {false, true})
          for (int cp : {2, 4})
          for (CpComm comm : {CpComm::p2p, CpComm::all_gather}) {
            INFO(dtype_name(dt) << " G " << G << " alibi " << alibi << " dropout " << dropout << " cp " << cp
                                << (comm == CpComm::p2p ? " p2p" : " all_gather"));
            RingAttentionSpec spec;
            spec.comm = comm;
            spec.layout.n_head = H;
            spec.layout.n_group = G;
            spec.layout.head_dim = hs;
            if (alibi) spec.layout.alibi_slopes = ops::alibi_slopes(H);
            spec.seq_len = T;
            if (dropout) {
              spec.mask.p = 0.2;
              spec.mask.seed = 77;
              spec.mask.stream = 3;
              spec.mask.iteration = 2;
              spec.mask.first_sample = 5;
            }
            for (int r = 0; r < cp; ++r) spec.positions.push_back(context_parallel_positions(T, cp, r));
            // The all-gather takes equal blocks (what the engine's cp runs have: 2 cp divides the
            // sequence); at T 26 cp 2's are (13 rows each), cp 4's are not.
            bool equal = true;
            for (const auto& p : spec.positions) equal = equal && p.size() == spec.positions.front().size();
            if (comm == CpComm::all_gather && !equal) continue;
            const int64_t W = (H + 2 * G) * hs, C = int64_t{H} * hs;
            const Tensor qkv = random_tensor({B, T, W}, rng, -2, 2, dt), dout = random_tensor({B, T, C}, rng, -1, 1, dt);
            Tensor out = Tensor::empty({B, T, C}, dt), probs = Tensor::empty({B, H, T, T}, dt);
            ops::attention_forward(ctx, out, probs, qkv, spec.layout, spec.mask);
            Tensor dqkv = Tensor::zeros({B, T, W}, dt);
            ops::attention_backward(ctx, dqkv, dout, qkv, probs, spec.layout, spec.mask);

            comm::LocalFabricOptions options;
            options.timeout = std::chrono::seconds(60);
            auto fabric = comm::LocalFabric::create(cp, options);
            REQUIRE(fabric.is_ok());
            std::vector<Tensor> outs(static_cast<size_t>(cp)), grads(static_cast<size_t>(cp));
            std::vector<std::string> errors(static_cast<size_t>(cp));
            std::vector<std::thread> threads;
            for (int r = 0; r < cp; ++r)
              threads.emplace_back([&, r] {
                try {
                  ThreadPool mine(1);
                  Context c;
                  c.pool = &mine;
                  auto group = fabric.value().world(r)->everyone();
                  if (!group.is_ok()) throw std::runtime_error(group.status().message());
                  const std::vector<int64_t>& pos = spec.positions[static_cast<size_t>(r)];
                  const int64_t n = static_cast<int64_t>(pos.size());
                  const Tensor q = rows_of(qkv, pos), go = rows_of(dout, pos);
                  Tensor o = Tensor::empty({B, n, C}, dt), lse = Tensor::empty({B, H, n}, dt),
                         d = Tensor::empty({B, n, W}, dt);
                  ring_attention_forward(c, *group.value(), spec, q, o, lse);
                  ring_attention_backward(c, *group.value(), spec, q, o, lse, go, d);
                  outs[static_cast<size_t>(r)] = o;
                  grads[static_cast<size_t>(r)] = d;
                } catch (const std::exception& e) {
                  errors[static_cast<size_t>(r)] = e.what();
                }
              });
            for (auto& t : threads) t.join();
            for (int r = 0; r < cp; ++r) {
              INFO("rank " << r);
              REQUIRE(errors[static_cast<size_t>(r)] == "");
              const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
              const double e_out = rel_diff(outs[r], out, spec.positions[r]);
              const double e_grad = rel_diff(grads[r], dqkv, spec.positions[r]);
              if (std::getenv("TROUPE_TEST_VERBOSE"))
                std::printf("%s G %d alibi %d dropout %d cp %d rank %d: out %.3g grad %.3g\n", dtype_name(dt), G,
                            alibi, dropout, cp, r, e_out, e_grad);
              CHECK(e_out <= tol);
              CHECK(e_grad <= tol);
            }
          }
}

TEST_CASE("context-parallel positions: Megatron's load-balanced chunks cover the sequence once",
          "[model][ring_attention]") {
  for (int cp : {1, 2, 3, 4})
    for (int64_t T : {int64_t{2} * cp, int64_t{26}, int64_t{31}}) {
      std::vector<int> seen(static_cast<size_t>(T), 0);
      for (int r = 0; r < cp; ++r) {
        const auto pos = context_parallel_positions(T, cp, r);
        // Rank r's first chunk is chunk r, its second chunk 2cp-1-r: earliest and latest positions.
        CHECK(pos.front() == r * T / (2 * cp));
        CHECK(pos.back() == (2 * cp - r) * T / (2 * cp) - 1);
        for (int64_t p : pos) ++seen[static_cast<size_t>(p)];
      }
      for (int s : seen) CHECK(s == 1);
    }
}

}  // namespace troupe
