// troupe inspect's tensor (engine/tensor_stats.hpp): statistics against a plain float64 reference on
// random values with NaN and Inf among them; pieces split at random over ranks and runs assemble to
// the original tensor, survive their JSON form bit for bit, and are refused when they lie outside
// the tensor; base64 round trips and refuses what is not base64.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include <catch2/catch.hpp>

#include "engine/tensor_stats.hpp"

using namespace troupe;

TEST_CASE("tensor_stats equals a float64 reference, non-finite values counted apart", "[tensor_stats]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.3f, 2.0f);
  for (int n : {1, 7, 1001}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(rng);
    if (n > 1) {
      v[1] = std::numeric_limits<float>::quiet_NaN();
      v[static_cast<size_t>(n - 1)] = -std::numeric_limits<float>::infinity();
    }
    const TensorStats s = tensor_stats(v.data(), n, 9);
    double sum = 0, sq = 0, lo = 1e300, hi = -1e300;
    int64_t finite = 0, nan = 0, inf = 0;
    for (float x : v) {
      if (std::isnan(x)) ++nan;
      else if (std::isinf(x)) ++inf;
      else {
        ++finite, sum += x, sq += double(x) * x, lo = std::min(lo, double(x)), hi = std::max(hi, double(x));
      }
    }
    const double mean = sum / finite;
    double var = 0;
    for (float x : v)
      if (std::isfinite(x)) var += (x - mean) * (x - mean);
    CHECK(s.count == n);
    CHECK(s.nan == nan);
    CHECK(s.inf == inf);
    CHECK(s.min == lo);
    CHECK(s.max == hi);
    CHECK(s.mean == Approx(mean).epsilon(1e-12));
    CHECK(s.norm == Approx(std::sqrt(sq)).epsilon(1e-12));
    CHECK(s.std == Approx(std::sqrt(var / finite)).epsilon(1e-12).margin(1e-300));
    int64_t in_bins = 0;
    for (int64_t c : s.histogram) in_bins += c;
    CHECK(in_bins == finite);
    CHECK(s.histogram.size() == 9);
  }
  const float nans[2] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
  const TensorStats none = tensor_stats(nans, 2, 4);
  CHECK((none.nan == 1 && none.inf == 1 && none.norm == 0 && none.histogram.empty()));
}

TEST_CASE("pieces over ranks and runs assemble to the tensor and survive JSON", "[tensor_stats]") {
  std::mt19937 rng(5);
  const Shape shape{7, 13};
  const int64_t n = shape.numel();
  std::vector<float> truth(static_cast<size_t>(n));
  for (float& x : truth) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (int trial = 0; trial < 20; ++trial) {
    // Cut [0, n) into runs, each run to a random rank (of 3), each rank's runs in one piece.
    std::vector<RankPieces> parts(3);
    for (int r = 0; r < 3; ++r) parts[static_cast<size_t>(r)].rank = r;
    std::vector<std::vector<GlobalRun>> runs(3);
    for (int64_t at = 0; at < n;) {
      const int64_t len = std::min<int64_t>(n - at, 1 + static_cast<int64_t>(rng() % 17));
      runs[rng() % 3].push_back({at, len});
      at += len;
    }
    for (int r = 0; r < 3; ++r) {
      if (runs[r].empty()) continue;
      TensorPiece p;
      p.name = "w";
      p.global_shape = shape;
      p.runs = runs[r];
      int64_t total = 0;
      for (const auto& run : p.runs) total += run.length;
      p.values = Tensor::empty({total});
      float* dst = p.values.data<float>();
      for (const auto& run : p.runs) dst = std::copy(truth.begin() + run.start, truth.begin() + run.start + run.length, dst);
      parts[static_cast<size_t>(r)].pieces.push_back(std::move(p));
    }
    auto back = pieces_from_json(pieces_to_json(parts));
    REQUIRE(back.is_ok());
    auto whole = assemble_pieces(back.value());
    REQUIRE(whole.is_ok());
    CHECK(whole->covered == n);
    CHECK(whole->values == truth);
    CHECK(whole->shape == shape);
    auto one = assemble_pieces(parts, 1);
    if (!runs[1].empty()) {
      REQUIRE(one.is_ok());
      int64_t held = 0;
      for (const auto& run : runs[1]) held += run.length;
      CHECK(one->covered == held);
    }
  }
  // Overlapping pieces, and a run outside the tensor, are refused.
  TensorPiece p;
  p.name = "w";
  p.global_shape = Shape{4};
  p.runs = {{0, 3}};
  p.values = Tensor::empty({3});
  std::vector<RankPieces> overlap{{0, {p}}, {1, {p}}};
  CHECK_FALSE(assemble_pieces(overlap).is_ok());
  p.runs = {{2, 3}};
  CHECK_FALSE(assemble_pieces({{0, {p}}}).is_ok());
  CHECK_FALSE(pieces_from_json("{\"pieces\": [{\"rank\": 0, \"name\": \"w\", \"shape\": [4], \"runs\": [[2, 3]], "
                               "\"values\": \"AAAAAAAAAAAAAAAA\"}]}")
                  .is_ok());
  CHECK_FALSE(pieces_from_json("{\"pieces\": [{\"rank\": 0, \"name\": \"w\", \"shape\": [4], \"runs\": [[0, 2]], "
                               "\"values\": \"AAAAAAAAAAAAAAAA\"}]}")
                  .is_ok());  // 3 floats for 2
}

TEST_CASE("base64 round trips every length and refuses what is not base64", "[tensor_stats]") {
  std::mt19937 rng(3);
  for (size_t len = 0; len < 40; ++len) {
    std::string bytes(len, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const std::string text = base64_encode(bytes.data(), bytes.size());
    CHECK(text.size() == (len + 2) / 3 * 4);
    auto back = base64_decode(text);
    REQUIRE(back.is_ok());
    CHECK(back.value() == bytes);
  }
  CHECK(base64_encode("Man", 3) == "TWFu");
  CHECK(base64_encode("Ma", 2) == "TWE=");
  for (const char* bad : {"TWF", "TW=u", "T!Fu", "TWFu====", "=AAA"}) CHECK_FALSE(base64_decode(bad).is_ok());
}
