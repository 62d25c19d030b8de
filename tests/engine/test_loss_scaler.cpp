// LossScaler (engine/loss_scaler.hpp) against references written from the rules' text in another
// form: Megatron's hysteresis counted up ("overflows since the last growth") instead of down, and
// DeepSpeed's iteration arithmetic ((cur_iter - last_overflow_iter) % window) as a count of the
// clean steps since the last overflow. Long random overflow sequences, hand-traced tables, each
// documented behaviour, and a state round trip in the middle of a sequence.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "engine/loss_scaler.hpp"

namespace troupe {
namespace {

PrecisionConfig fp16(PrecisionRecipe recipe, double initial, double min, int64_t window, int64_t hysteresis,
                     bool consecutive = false) {
  PrecisionConfig p;
  p.dtype = PrecisionDType::fp16;
  p.recipe = recipe;
  p.initial_loss_scale = initial;
  p.min_loss_scale = min;
  p.loss_scale_window = window;
  p.hysteresis = hysteresis;
  p.consecutive_hysteresis = consecutive;
  return p;
}

// Megatron's DynamicGradScaler from its docstring: "Reduces loss scale by backoff_factor if
// hysteresis number of NaNs are seen [since the trackers were last reset]. Increases loss scale by
// growth_factor if NaNs are not seen for growth_interval iterations"; a growth resets both counts.
// The scale is a float32 tensor there.
struct MegatronReference {
  float scale, min;
  int64_t window, hysteresis;
  int64_t clean_run = 0;        // clean steps since the last overflow or growth
  int64_t overflows_since = 0;  // overflows since the last growth (or the start)
  bool step(bool overflow) {
    if (overflow) {
      clean_run = 0;
      ++overflows_since;
      if (overflows_since >= hysteresis) scale = std::max(scale / 2.0f, min);
      return true;
    }
    if (++clean_run == window) {
      clean_run = 0;
      overflows_since = 0;
      scale *= 2.0f;
    }
    return false;
  }
};

// DeepSpeed's DynamicLossScaler in words: the scale doubles whenever the clean steps since the last
// overflow (or the start) reach a multiple of the window; an overflow halves it (not below min)
// once hysteresis - 1 overflows have used the hysteresis up since it was last refilled, else uses
// one; a growth refills the hysteresis, and with consecutive_hysteresis every clean step does; an
// overflow that would halve a scale already at min raises (exhausted: nothing changes).
struct DeepSpeedReference {
  double scale, min;
  int64_t window, hysteresis;
  bool consecutive;
  int64_t clean_since_overflow = 0;
  int64_t used = 0;  // hysteresis used since the last refill
  bool exhausted = false;
  bool step(bool overflow) {
    if (exhausted) return true;
    if (overflow) {
      if (used >= hysteresis - 1) {
        if (scale == min) {
          exhausted = true;
          return true;
        }
        scale = std::max(scale / 2, min);
      } else {
        ++used;
      }
      clean_since_overflow = 0;
      return true;
    }
    ++clean_since_overflow;
    if (consecutive) used = 0;
    if (clean_since_overflow % window == 0) {
      used = 0;
      scale *= 2;
    }
    return false;
  }
};

// Overflow sequences with phases: calm stretches (rare overflows) and bursts.
std::vector<bool> random_overflows(std::mt19937& rng, size_t n) {
  std::vector<bool> out;
  std::uniform_real_distribution<double> u(0, 1);
  while (out.size() < n) {
    const double p = u(rng) < 0.3 ? 0.5 + 0.4 * u(rng) : 0.002 + 0.05 * u(rng);
    const size_t len = 1 + rng() % 200;
    for (size_t k = 0; k < len && out.size() < n; ++k) out.push_back(u(rng) < p);
  }
  return out;
}

TEST_CASE("loss scaler: Megatron's rule over long random sequences equals the reference", "[loss_scale]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()) + 11);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t window = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t hysteresis = 1 + static_cast<int64_t>(rng() % 5);
    const double initial = trial % 3 == 0 ? 3000.5 * std::ldexp(1.0, static_cast<int>(rng() % 20))
                                          : std::ldexp(1.0, static_cast<int>(rng() % 40));
    const double min = std::min(initial, trial % 2 ? 1.0 : std::ldexp(1.0, static_cast<int>(rng() % 12)) * 0.25);
    LossScaler s(fp16(PrecisionRecipe::megatron, initial, min, window, hysteresis));
    MegatronReference ref{static_cast<float>(initial), static_cast<float>(min), window, hysteresis};
    const std::vector<bool> seq = random_overflows(rng, 3000 + rng() % 2000);
    int64_t skipped = 0;
    for (size_t i = 0; i < seq.size(); ++i) {
      INFO("trial " << trial << " step " << i << " window " << window << " hysteresis " << hysteresis);
      REQUIRE(s.scale() == static_cast<double>(ref.scale));  // the scale this step's loss is multiplied by
      const bool skip = s.update(seq[i]);
      REQUIRE(skip == ref.step(seq[i]));
      skipped += skip;
    }
    CHECK(s.scale() == static_cast<double>(ref.scale));
    CHECK(s.skipped() == skipped);
    CHECK(s.steps() == static_cast<int64_t>(seq.size()));
    CHECK_FALSE(s.exhausted());  // Megatron never gives up
  }
}

TEST_CASE("loss scaler: DeepSpeed's rule over long random sequences equals the reference", "[loss_scale]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()) + 23);
  int exhausted_runs = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int64_t window = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t hysteresis = 1 + static_cast<int64_t>(rng() % 5);
    const bool consecutive = trial % 2 == 1;
    const double initial = std::ldexp(1.0, static_cast<int>(rng() % 24)) * (trial % 5 == 0 ? 1.5 : 1.0);
    const double min = trial % 3 == 0 ? 1.0 : std::ldexp(1.0, -40);
    LossScaler s(fp16(PrecisionRecipe::deepspeed, initial, min, window, hysteresis, consecutive));
    DeepSpeedReference ref{initial, min, window, hysteresis, consecutive};
    const std::vector<bool> seq = random_overflows(rng, 3000 + rng() % 2000);
    for (size_t i = 0; i < seq.size(); ++i) {
      INFO("trial " << trial << " step " << i << " window " << window << " hysteresis " << hysteresis
                    << " consecutive " << consecutive);
      REQUIRE(s.scale() == ref.scale);
      REQUIRE(s.update(seq[i]) == ref.step(seq[i]));
      REQUIRE(s.exhausted() == ref.exhausted);
      if (ref.exhausted) break;  // DeepSpeed raises: the run ends here
    }
    CHECK(s.scale() == ref.scale);
    exhausted_runs += ref.exhausted;
  }
  CHECK(exhausted_runs > 0);  // the sequences reach the minimum scale's refusal too
}

// Hand-traced from the rules (hysteresis 2, window 3, initial 8, min 1): the trackers after each
// step, Megatron's (growth, hysteresis tracker) and DeepSpeed's (cur_iter, last_overflow_iter,
// cur_hysteresis):
//   step  in  Megatron            DeepSpeed                 scale
//   1     O   g0 h1               it1 last0 h1              8   (hysteresis used, no halving)
//   2     C   g1 h1               it2 (1-0)%3=1             8
//   3     C   g2 h1               it3 (2-0)%3=2             8
//   4     C   g3=W: g0 h2 x2      it4 (3-0)%3=0: h2 x2      16
//   5     O   g0 h1               it5 last4 h1              16
//   6     O   h0 <= 0: /2         it6 last5 h==1: /2        8
//   7     O   h-1: /2             it7 last6 /2              4
//   8..9  C   g1, g2              (7-6)=1, 2                4
//   10    C   g3: x2, h2          (9-6)%3=0: x2, h2         8
//   11    O   h1                  h1                        8
//   12    O   h0: /2              /2                        4
//   13    O   /2                  /2                        2
//   14    O   /2                  /2                        1
//   15    O   max(0.5, 1) = 1     scale == min: raises      1
TEST_CASE("loss scaler: a hand-traced sequence, both recipes", "[loss_scale]") {
  const std::vector<bool> seq = {true, false, false, false, true, true, true, false, false, false,
                                 true, true,  true,  true,  true};
  const std::vector<double> after = {8, 8, 8, 16, 16, 8, 4, 4, 4, 8, 8, 4, 2, 1, 1};
  LossScaler m(fp16(PrecisionRecipe::megatron, 8, 1, 3, 2));
  LossScaler d(fp16(PrecisionRecipe::deepspeed, 8, 1, 3, 2));
  for (size_t i = 0; i < seq.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(m.update(seq[i]) == seq[i]);
    CHECK(d.update(seq[i]) == seq[i]);
    CHECK(m.scale() == after[i]);
    CHECK(d.scale() == after[i]);
    CHECK(d.exhausted() == (i + 1 == seq.size()));
  }
  CHECK_FALSE(m.exhausted());
  CHECK(m.skipped() == 9);
  CHECK(d.skipped() == 9);
  CHECK_THAT(d.describe(), Catch::Contains("minimum loss scale"));
}

TEST_CASE("loss scaler: an injected overflow skips the step; the scale halves after `hysteresis` of them",
          "[loss_scale]") {
  for (PrecisionRecipe r : {PrecisionRecipe::megatron, PrecisionRecipe::deepspeed}) {
    for (int64_t h = 1; h <= 4; ++h) {
      LossScaler s(fp16(r, 1024, 1, 1000, h));
      for (int64_t k = 1; k < h; ++k) {
        CHECK(s.update(true));
        CHECK(s.scale() == 1024);
      }
      CHECK(s.update(true));
      CHECK(s.scale() == 512);
      CHECK(s.update(true));  // exhausted hysteresis: each further overflow halves
      CHECK(s.scale() == 256);
      CHECK_FALSE(s.update(false));
      CHECK(s.scale() == 256);
      CHECK(s.skipped() == h + 1);
    }
  }
}

TEST_CASE("loss scaler: the scale doubles after `window` clean steps, and again each window", "[loss_scale]") {
  for (PrecisionRecipe r : {PrecisionRecipe::megatron, PrecisionRecipe::deepspeed}) {
    for (int64_t w : {1, 2, 7, 1000}) {
      LossScaler s(fp16(r, 64, 1, w, 2));
      for (int64_t k = 1; k <= 3 * w; ++k) {
        CHECK_FALSE(s.update(false));
        CHECK(s.scale() == 64.0 * std::ldexp(1.0, static_cast<int>(k / w)));
      }
      // An overflow restarts the count (hysteresis 2: no halving yet).
      s.update(true);
      const double before = s.scale();
      for (int64_t k = 1; k < w; ++k) s.update(false);
      CHECK(s.scale() == before);
      s.update(false);
      CHECK(s.scale() == 2 * before);
    }
  }
}

TEST_CASE("loss scaler: the minimum clamps the halving", "[loss_scale]") {
  LossScaler m(fp16(PrecisionRecipe::megatron, 8, 3, 1000, 1));
  m.update(true);
  CHECK(m.scale() == 4);
  m.update(true);
  CHECK(m.scale() == 3);  // max(2, 3)
  m.update(true);
  CHECK(m.scale() == 3);
  CHECK_FALSE(m.exhausted());
  LossScaler d(fp16(PrecisionRecipe::deepspeed, 8, 3, 1000, 1));
  d.update(true);
  d.update(true);
  CHECK(d.scale() == 3);
  CHECK_FALSE(d.exhausted());
  CHECK(d.update(true));  // at the minimum: DeepSpeed raises
  CHECK(d.exhausted());
  CHECK(d.scale() == 3);
}

TEST_CASE("loss scaler: DeepSpeed's consecutive_hysteresis refills on every clean step", "[loss_scale]") {
  // O C O: without it the second overflow halves (the hysteresis was used); with it, not.
  LossScaler plain(fp16(PrecisionRecipe::deepspeed, 256, 1, 1000, 2, false));
  LossScaler cons(fp16(PrecisionRecipe::deepspeed, 256, 1, 1000, 2, true));
  for (bool o : {true, false, true}) {
    plain.update(o);
    cons.update(o);
  }
  CHECK(plain.scale() == 128);
  CHECK(cons.scale() == 256);
  cons.update(true);  // two in a row still halve
  CHECK(cons.scale() == 128);
  // Megatron's hysteresis is refilled only by a growth: O C O halves there too.
  LossScaler meg(fp16(PrecisionRecipe::megatron, 256, 1, 1000, 2));
  for (bool o : {true, false, true}) meg.update(o);
  CHECK(meg.scale() == 128);
}

TEST_CASE("loss scaler: Megatron's float32 scale saturates to inf, DeepSpeed's double does not", "[loss_scale]") {
  LossScaler m(fp16(PrecisionRecipe::megatron, std::ldexp(1.0, 120), 1, 1, 2));
  LossScaler d(fp16(PrecisionRecipe::deepspeed, std::ldexp(1.0, 120), 1, 1, 2));
  for (int k = 0; k < 10; ++k) {
    m.update(false);
    d.update(false);
  }
  CHECK(std::isinf(m.scale()));
  CHECK(d.scale() == std::ldexp(1.0, 130));
  m.update(true);
  m.update(true);
  CHECK(std::isinf(m.scale()));  // inf / 2 is inf: the scale never comes back
}

TEST_CASE("loss scaler: static scales, bf16 and fp32", "[loss_scale]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()) + 5);
  const std::vector<bool> seq = random_overflows(rng, 500);
  auto run = [&](const PrecisionConfig& p, double scale, bool skips) {
    LossScaler s(p);
    CHECK_FALSE(s.dynamic());
    int64_t skipped = 0;
    for (bool o : seq) {
      CHECK(s.update(o) == (skips && o));
      skipped += skips && o;
      CHECK(s.scale() == scale);
    }
    CHECK(s.skipped() == skipped);
  };
  for (PrecisionRecipe r : {PrecisionRecipe::megatron, PrecisionRecipe::deepspeed}) {
    PrecisionConfig p = fp16(r, 1 << 20, 1, 3, 1);
    p.loss_scale = 4096;  // static: never changes, an overflow still skips (both projects)
    run(p, 4096, true);
    p.dtype = PrecisionDType::fp32;  // fp32: nothing scaled, nothing skipped
    run(p, 1, false);
    p.dtype = PrecisionDType::bf16;  // Megatron: ConstantGradScaler with --loss-scale; DeepSpeed: 1
    run(p, r == PrecisionRecipe::megatron ? 4096 : 1, r == PrecisionRecipe::megatron);
    p.loss_scale = 0;  // bf16 without a static scale: no scaler
    run(p, 1, false);
    p.bf16_check_grad_overflow = true;  // DeepSpeed's bf16 overflow check
    run(p, 1, r == PrecisionRecipe::deepspeed);
  }
  CHECK_THAT(LossScaler(PrecisionConfig{}).describe(), Catch::Contains("no loss scaling"));
}

TEST_CASE("loss scaler: a state saved mid-sequence continues as the uninterrupted run", "[loss_scale]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()) + 41);
  for (int trial = 0; trial < 40; ++trial) {
    const PrecisionRecipe r = trial % 2 ? PrecisionRecipe::deepspeed : PrecisionRecipe::megatron;
    const PrecisionConfig p = fp16(r, std::ldexp(1.0, 16 + static_cast<int>(rng() % 10)), 0.5,
                                   1 + static_cast<int64_t>(rng() % 20), 1 + static_cast<int64_t>(rng() % 4),
                                   trial % 4 == 1);
    const std::vector<bool> seq = random_overflows(rng, 2000);
    const size_t cut = 1 + rng() % (seq.size() - 1);
    LossScaler whole(p), first(p);
    for (size_t i = 0; i < cut; ++i) {
      whole.update(seq[i]);
      first.update(seq[i]);
    }
    auto restored = LossScalerState::from_vector(first.state().to_vector());
    REQUIRE(restored.is_ok());
    CHECK(restored.value() == first.state());
    LossScaler second(p);
    second.restore(restored.value());
    for (size_t i = cut; i < seq.size(); ++i) {
      INFO("trial " << trial << " cut " << cut << " step " << i);
      REQUIRE(second.update(seq[i]) == whole.update(seq[i]));
      REQUIRE(second.state() == whole.state());
    }
    CHECK(second.describe() == whole.describe());
  }
}

TEST_CASE("loss scaler: a damaged state vector is refused, naming the entry", "[loss_scale]") {
  LossScaler s(fp16(PrecisionRecipe::megatron, 1024, 1, 10, 2));
  s.update(true);
  const std::vector<double> good = s.state().to_vector();
  REQUIRE(good.size() == LossScalerState::kSize);
  CHECK_THAT(LossScalerState::from_vector({1, 2}).status().message(), Catch::Contains("2 values"));
  auto with = [&](size_t i, double v) {
    std::vector<double> bad = good;
    bad[i] = v;
    auto r = LossScalerState::from_vector(bad);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().is_bad_input());
    return r.status().message();
  };
  CHECK_THAT(with(0, 0), Catch::Contains("scale"));
  CHECK_THAT(with(0, std::nan("")), Catch::Contains("scale"));
  CHECK_THAT(with(1, 1.5), Catch::Contains("growth_tracker"));
  CHECK_THAT(with(4, -2), Catch::Contains("last_overflow_iter"));
  CHECK_THAT(with(6, -1), Catch::Contains("skipped"));
  CHECK_THAT(with(7, 2), Catch::Contains("exhausted"));
}

}  // namespace
}  // namespace troupe
