// Optimizer offload (engine/moment_store.hpp, actors/optimizer_actor.hpp): the Adam moments with
// the partition, in the host pool (cpu) or in a swap file stepped piece by piece (nvme) give
// bitwise the same parameters and moments as AdamW over whole tensors; save and load round-trip;
// the swap file leaves nothing behind and a bad --offload-path is a clear error.
#include <catch2/catch.hpp>
#include <filesystem>
#include <random>

#include "actors/optimizer_actor.hpp"
#include "kernels/ops.hpp"
#include "storage/swap_file.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

// Odd sizes, some spanning several pieces of 1000 elements (the last piece partial).
const std::vector<int64_t> kSizes = {1, 999, 1000, 1001, 4097, 23456};

Tensor random_vector(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  Tensor t = Tensor::empty({n}, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = dist(rng);
  return t;
}

StepRequest request(int step) {
  StepRequest r;
  r.step = step;
  r.lr = 1e-2 / step;
  r.weight_decay = 0.05;
  return r;
}

struct Weights {
  std::vector<Tensor> params, grads;
  std::vector<AdamSegment> segments() const {
    std::vector<AdamSegment> s;
    for (size_t i = 0; i < params.size(); ++i) s.push_back({params[i], grads[i], i % 2 == 0});
    return s;
  }
};

Weights make_model(uint32_t seed) {
  std::mt19937 rng(seed);
  Weights m;
  for (int64_t n : kSizes) {
    m.params.push_back(random_vector(n, rng, 1.0f));
    m.grads.push_back(Tensor::zeros({n}, DType::f32));
  }
  return m;
}

void new_gradients(Weights& m, int step) {
  std::mt19937 rng(1000 + step);
  for (Tensor& g : m.grads) g.copy_from(random_vector(g.numel(), rng, 0.1f));
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

template <class Reply, class... Ts>
Reply ask(caf::scoped_actor& self, const optimizer_actor& a, Ts&&... xs) {
  Reply out{};
  self->request(a, caf::infinite, std::forward<Ts>(xs)...)
      .receive([&](Reply& r) { out = std::move(r); },
               [&](caf::error& e) { FAIL(caf::to_string(e)); });
  return out;
}

}  // namespace

TEST_CASE("optimizer offload: cpu and nvme equal in-memory AdamW bitwise, save and load included",
          "[optimizer_offload]") {
  const int kStepsBefore = 3, kStepsAfter = 2;
  // Reference: AdamW over whole tensors.
  Weights ref = make_model(7);
  std::vector<Tensor> m_ref, v_ref;
  for (int64_t n : kSizes) {
    m_ref.push_back(Tensor::zeros({n}, DType::f32));
    v_ref.push_back(Tensor::zeros({n}, DType::f32));
  }
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (int s = 1; s <= kStepsBefore + kStepsAfter; ++s) {
    new_gradients(ref, s);
    adamw_step(ctx, ref.segments(), m_ref, v_ref, request(s));
  }

  test::TempDir swap;
  for (const char* device : {"none", "cpu", "nvme"}) {
    SECTION(device) {
      caf::actor_system_config cfg;
      caf::actor_system system{cfg};
      caf::scoped_actor self{system};
      OptimizerOffload off;
      off.device = device;
      off.path = swap.str();
      off.pool = std::make_shared<HostPool>();
      off.piece_elements = 1000;
      Weights m = make_model(7);
      auto first = spawn_optimizer(system, m.segments(), 2, off);
      REQUIRE(first.is_ok());
      // nvme: the swap file is unlinked as soon as it is open.
      CHECK(std::filesystem::is_empty(swap.path()));
      if (std::string(device) != "none") CHECK(off.pool->bytes_in_use() > 0);
      for (int s = 1; s <= kStepsBefore; ++s) {
        new_gradients(m, s);
        ask<ok_atom>(self, first.value(), step_atom::value, request(s));
      }
      // A checkpoint of the moments, loaded into a fresh partition that takes over.
      OptimizerMoments saved = ask<OptimizerMoments>(self, first.value(), save_atom::value);
      self->send_exit(first.value(), caf::exit_reason::user_shutdown);
      auto second = spawn_optimizer(system, m.segments(), 3, off);
      REQUIRE(second.is_ok());
      ask<ok_atom>(self, second.value(), load_atom::value, saved);
      for (int s = kStepsBefore + 1; s <= kStepsBefore + kStepsAfter; ++s) {
        new_gradients(m, s);
        ask<ok_atom>(self, second.value(), step_atom::value, request(s));
      }
      OptimizerMoments end = ask<OptimizerMoments>(self, second.value(), save_atom::value);
      self->send_exit(second.value(), caf::exit_reason::user_shutdown);
      for (size_t i = 0; i < kSizes.size(); ++i) {
        INFO("segment " << i << " of " << kSizes[i] << " elements");
        CHECK(bitwise_equal(m.params[i], ref.params[i]));
        CHECK(bitwise_equal(end.exp_avg[i], m_ref[i]));
        CHECK(bitwise_equal(end.exp_avg_sq[i], v_ref[i]));
      }
    }
  }
}

TEST_CASE("optimizer offload: the nvme store keeps only its buffers resident",
          "[optimizer_offload]") {
  test::TempDir swap;
  OptimizerOffload off;
  off.device = "nvme";
  off.path = swap.str();
  off.pool = std::make_shared<HostPool>();
  off.piece_elements = 1000;
  auto store = MomentStore::create(off, {100000, 5}, DType::f32);
  REQUIRE(store.is_ok());
  // 4 buffers of 2 x 4096 bytes (1000 floats padded to a page) against 2 x 100005 x 4 bytes of
  // moments.
  CHECK(store.value()->resident_bytes() == MomentStore::kBuffers * 2 * 4096);
  CHECK(store.value()->file_bytes() >= 2 * 100005 * 4);
  CHECK(off.pool->bytes_in_use() == MomentStore::kBuffers * 2 * 4096);
  // A write then a read returns what was written, piece by piece.
  int64_t seen = 0;
  REQUIRE(store.value()->visit(MomentAccess::write, [&](const MomentPiece& p) {
    for (int64_t k = 0; k < p.end - p.begin; ++k) {
      p.exp_avg.data<float>()[k] = static_cast<float>(p.segment * 1000000 + p.begin + k);
      p.exp_avg_sq.data<float>()[k] = -static_cast<float>(p.begin + k);
    }
  }));
  bool all_equal = true;
  REQUIRE(store.value()->visit(MomentAccess::read, [&](const MomentPiece& p) {
    for (int64_t k = 0; k < p.end - p.begin; ++k) {
      all_equal &=
          p.exp_avg.data<float>()[k] == static_cast<float>(p.segment * 1000000 + p.begin + k);
      all_equal &= p.exp_avg_sq.data<float>()[k] == -static_cast<float>(p.begin + k);
    }
    seen += p.end - p.begin;
  }));
  CHECK(all_equal);
  CHECK(seen == 100005);
}

TEST_CASE("optimizer offload: a bad swap directory is a clear error", "[optimizer_offload]") {
  auto missing = SwapFile::create("/no/such/dir", "x.swap", 4096);
  REQUIRE_FALSE(missing.is_ok());
  CHECK_THAT(missing.status().message(),
             Catch::Contains("/no/such/dir/x.swap") && Catch::Contains("--offload-path"));
  test::TempDir dir;
  // More than any disk has: the reservation fails up front, naming the size and the directory.
  auto huge = SwapFile::create(dir.str(), "big.swap", int64_t{1} << 60);
  REQUIRE_FALSE(huge.is_ok());
  CHECK_THAT(huge.status().message(),
             Catch::Contains("cannot reserve") && Catch::Contains(dir.str()));
  CHECK(std::filesystem::is_empty(dir.path()));
}

}  // namespace troupe
