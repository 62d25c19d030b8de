// The 16-bit conversions (kernels/half.hpp): every bf16 and fp16 bit pattern round-trips; narrowing
// against a reference written in double arithmetic (the two neighbouring representable values and the
// tie rule) on random values of every exponent and on the edges; every fast path against the generic
// one, bitwise, on millions of random bit patterns (through half::convert_fns, the test hook that
// names a path; TROUPE_CPU_FEATURES=generic forces the generic path for the whole process).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/half.hpp"
#include "kernels/ops.hpp"

using namespace troupe;

namespace {

// A 16-bit format: p significant bits (the implicit one included), exponents [emin, emax].
struct Format {
  int p, emin, emax, exp_bits;
};
constexpr Format kBf16{8, -126, 127, 8};
constexpr Format kF16{11, -14, 15, 5};

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// The reference: x (finite or Inf, not NaN) rounded to nearest, ties to even, in `f`, encoded. The
// candidates are the two multiples of the binade's spacing around |x|; all arithmetic is exact in
// double (powers of two, integers below 2^53).
uint16_t reference_narrow(double x, const Format& f) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const int mant_bits = f.p - 1, bias = (1 << (f.exp_bits - 1)) - 1;
  const uint16_t inf = static_cast<uint16_t>(((1 << f.exp_bits) - 1) << mant_bits);
  const double a = std::fabs(x);
  const double largest = std::ldexp(2.0 - std::ldexp(1.0, 1 - f.p), f.emax);
  if (std::isinf(a)) return sign | inf;
  if (a == 0) return sign;
  int e = std::ilogb(a);
  if (e < f.emin) e = f.emin;                     // subnormals share the smallest binade's spacing
  const double spacing = std::ldexp(1.0, e - mant_bits);
  const double k = std::floor(a / spacing);       // a / spacing is exact (a power-of-two scaling)
  const double below = k * spacing, above = (k + 1) * spacing;
  double r;
  if (a - below < above - a) r = below;
  else if (a - below > above - a) r = above;
  else r = std::fmod(k, 2.0) == 0 ? below : above;  // the tie goes to the even significand
  if (r > largest) return sign | inf;
  // Encode r: subnormal below 2^emin, else exponent and fraction.
  if (r < std::ldexp(1.0, f.emin))
    return sign | static_cast<uint16_t>(r / std::ldexp(1.0, f.emin - mant_bits));
  const int re = std::ilogb(r);
  const double frac = r / std::ldexp(1.0, re - mant_bits) - std::ldexp(1.0, mant_bits);
  return sign | static_cast<uint16_t>(((re + bias) << mant_bits) | static_cast<int>(frac));
}

bool is_nan16(uint16_t h, const Format& f) {
  const int mant_bits = f.p - 1;
  const uint16_t exp_mask = static_cast<uint16_t>(((1 << f.exp_bits) - 1) << mant_bits);
  return (h & exp_mask) == exp_mask && (h & ((1 << mant_bits) - 1)) != 0;
}
bool is_quiet_nan16(uint16_t h, const Format& f) { return is_nan16(h, f) && (h & (1 << (f.p - 2))); }

// Random f32 values, uniform over bit patterns (so over all exponents), NaNs left out.
std::vector<float> random_finite_floats(std::mt19937_64& rng, int64_t n) {
  std::vector<float> v;
  v.reserve(static_cast<size_t>(n));
  while (static_cast<int64_t>(v.size()) < n) {
    const float x = from_bits(static_cast<uint32_t>(rng()));
    if (!std::isnan(x)) v.push_back(x);
  }
  return v;
}

// The edges of a format, as f32 values: ties, neighbours of ties, the largest finite value, the
// overflow boundary, subnormals and underflow, signed zeros, infinities.
std::vector<double> edges(const Format& f) {
  std::vector<double> v = {0.0, -0.0, INFINITY, -INFINITY, 1.0, -1.0};
  const int m = f.p - 1;
  for (double base : {1.0, 1.5, 1.75, -1.25}) {
    const double ulp = std::ldexp(1.0, -m);
    for (double k : {0.5, 1.5, 2.5, 0.5 + 1.0 / 1024, 0.5 - 1.0 / 1024}) v.push_back(base + k * ulp);
  }
  const double largest = std::ldexp(2.0 - std::ldexp(1.0, -m), f.emax);
  const double midpoint = std::ldexp(2.0 - std::ldexp(1.0, -m - 1), f.emax);  // between largest and 2^(emax+1)
  for (double s : {1.0, -1.0}) {
    v.push_back(s * largest);
    v.push_back(s * midpoint);
    v.push_back(s * std::nextafter(static_cast<float>(midpoint), 0.0f));
    v.push_back(s * std::nextafter(static_cast<float>(midpoint), INFINITY));
    v.push_back(s * std::ldexp(1.0, f.emax + 1));
    const double tiny = std::ldexp(1.0, f.emin - m);  // the smallest subnormal
    for (double k : {0.25, 0.5, 0.5000001, 0.75, 1.0, 1.5, 2.5, 3.0, 1023.5, 1024.0})
      v.push_back(s * k * tiny);
    v.push_back(s * std::ldexp(1.0, f.emin));
    v.push_back(s * std::ldexp(1.0, f.emin) * (1 - std::ldexp(1.0, -f.p - 1)));
  }
  v.push_back(from_bits(0x00000001));  // f32 subnormals
  v.push_back(from_bits(0x807fffff));
  v.push_back(from_bits(0x00400000));
  return v;
}

}  // namespace

TEST_CASE("every bf16 and fp16 bit pattern survives the trip through f32", "[mixed][convert]") {
  for (const half::CpuPath path : {half::CpuPath::generic, half::CpuPath::avx2, half::CpuPath::avx512}) {
    if (!half::cpu_path_supported(path)) continue;
    INFO("path " << half::cpu_path_name(path));
    const half::ConvertFns& fns = half::convert_fns(path);
    std::vector<uint16_t> all(65536), back(65536);
    std::vector<float> wide(65536);
    for (int i = 0; i < 65536; ++i) all[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
    for (const bool bf : {true, false}) {
      const Format& f = bf ? kBf16 : kF16;
      (bf ? fns.f32_from_bf16 : fns.f32_from_f16)(wide.data(), all.data(), 65536);
      (bf ? fns.bf16_from_f32 : fns.f16_from_f32)(back.data(), wide.data(), 65536);
      int64_t bad = 0;
      for (int i = 0; i < 65536; ++i) {
        const uint16_t h = all[static_cast<size_t>(i)], r = back[static_cast<size_t>(i)];
        const float w = wide[static_cast<size_t>(i)];
        // The scalar functions agree with the bulk ones.
        bad += bits(bf ? half::bf16_to_f32(h) : half::f16_to_f32(h)) != bits(w);
        if (is_nan16(h, f)) {
          bad += !std::isnan(w) || !is_quiet_nan16(r, f) || (r & 0x8000) != (h & 0x8000);
        } else {
          bad += r != h;
          // Widening is exact: the f32 value is the reference's encoding read back.
          bad += reference_narrow(w, f) != h;
        }
      }
      INFO((bf ? "bf16" : "fp16"));
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("f32 -> 16 bits rounds to nearest even, as the double-arithmetic reference", "[mixed][convert]") {
  std::mt19937_64 rng(0x16b175);
  for (const bool bf : {true, false}) {
    INFO((bf ? "bf16" : "fp16"));
    const Format& f = bf ? kBf16 : kF16;
    std::vector<float> xs = random_finite_floats(rng, 1 << 20);
    // Values inside the format's own range too (uniform bits put most fp16 inputs out of range).
    std::uniform_real_distribution<double> expo(f.emin - f.p - 2, f.emax + 2), frac(1, 2);
    for (int i = 0; i < (1 << 18); ++i)
      xs.push_back(static_cast<float>((rng() & 1 ? -1 : 1) * std::ldexp(frac(rng), static_cast<int>(expo(rng)))));
    for (double e : edges(f)) xs.push_back(static_cast<float>(e));
    int64_t bad = 0;
    for (float x : xs) {
      const uint16_t got = bf ? half::f32_to_bf16(x) : half::f32_to_f16(x);
      if (got != reference_narrow(x, f) && bad++ < 5)
        UNSCOPED_INFO("x = " << x << " (0x" << std::hex << bits(x) << "): got 0x" << got << ", reference 0x"
                             << reference_narrow(x, f) << std::dec);
    }
    CHECK(bad == 0);
    // NaN: a quiet NaN of the same sign.
    for (uint32_t nan_bits : {0x7f800001u, 0xff812345u, 0x7fc00000u, 0xffffffffu, 0x7fa00000u}) {
      const uint16_t h = bf ? half::f32_to_bf16(from_bits(nan_bits)) : half::f32_to_f16(from_bits(nan_bits));
      CHECK(is_quiet_nan16(h, f));
      CHECK((h & 0x8000) == ((nan_bits >> 16) & 0x8000));
    }
  }
}

TEST_CASE("f64 -> 16 bits rounds once (not through a rounded f32)", "[mixed][convert]") {
  std::mt19937_64 rng(0xd0b1e);
  for (const bool bf : {true, false}) {
    INFO((bf ? "bf16" : "fp16"));
    const Format& f = bf ? kBf16 : kF16;
    std::vector<double> xs;
    std::uniform_real_distribution<double> expo(f.emin - f.p - 2, f.emax + 2), frac(1, 2);
    for (int i = 0; i < (1 << 18); ++i)
      xs.push_back((rng() & 1 ? -1 : 1) * std::ldexp(frac(rng), static_cast<int>(expo(rng))));
    for (double e : edges(f)) xs.push_back(e);
    // Just off a 16-bit tie by less than f32 can hold: rounding to f32 first would make it a tie.
    const double ulp = std::ldexp(1.0, 1 - f.p), tiny = std::ldexp(1.0, f.emin - f.p + 1);
    for (double tie : {1 + 0.5 * ulp, -(1.5 + 1.5 * ulp), 2.5 * tiny, -0.5 * tiny, 1023.5 * tiny})
      for (double off : {std::ldexp(1.0, -40), -std::ldexp(1.0, -40)}) xs.push_back(tie * (1 + off));
    int64_t bad = 0;
    std::vector<uint16_t> bulk(xs.size());
    (bf ? half::bf16_from_f64 : half::f16_from_f64)(bulk.data(), xs.data(), static_cast<int64_t>(xs.size()));
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint16_t got = bf ? half::f64_to_bf16(xs[i]) : half::f64_to_f16(xs[i]);
      bad += got != reference_narrow(xs[i], f) || bulk[i] != got;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("every fast conversion path equals the generic one bitwise", "[mixed][convert]") {
  std::mt19937_64 rng(0xfa57);
  const int64_t n = 4'000'037;  // odd: every vector body's tail runs
  std::vector<float> xs(static_cast<size_t>(n));
  std::vector<uint16_t> hs(static_cast<size_t>(n));
  for (auto& x : xs) x = from_bits(static_cast<uint32_t>(rng()));  // NaNs, subnormals, Infs included
  for (auto& h : hs) h = static_cast<uint16_t>(rng());
  const half::ConvertFns& g = half::convert_fns(half::CpuPath::generic);
  int tested = 0;
  for (const half::CpuPath path : {half::CpuPath::avx2, half::CpuPath::avx512}) {
    if (!half::cpu_path_supported(path)) continue;
    ++tested;
    INFO("path " << half::cpu_path_name(path));
    const half::ConvertFns& p = half::convert_fns(path);
    std::vector<uint16_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    std::vector<float> c(static_cast<size_t>(n)), d(static_cast<size_t>(n));
    for (const bool bf : {true, false}) {
      INFO((bf ? "bf16" : "fp16"));
      (bf ? g.bf16_from_f32 : g.f16_from_f32)(a.data(), xs.data(), n);
      (bf ? p.bf16_from_f32 : p.f16_from_f32)(b.data(), xs.data(), n);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * 2) == 0);
      (bf ? g.f32_from_bf16 : g.f32_from_f16)(c.data(), hs.data(), n);
      (bf ? p.f32_from_bf16 : p.f32_from_f16)(d.data(), hs.data(), n);
      CHECK(std::memcmp(c.data(), d.data(), c.size() * 4) == 0);
      // Unaligned starts and short lengths (only tails, one vector, a vector and a tail).
      for (int64_t off : {1, 3, 7})
        for (int64_t len : {0, 5, 16, 33, 100}) {
          (bf ? p.bf16_from_f32 : p.f16_from_f32)(b.data() + off, xs.data() + off, len);
          CHECK(std::memcmp(a.data() + off, b.data() + off, static_cast<size_t>(len) * 2) == 0);
        }
    }
  }
  // The path the process uses is the best one this CPU has, unless TROUPE_CPU_FEATURES=generic.
  const char* forced = std::getenv("TROUPE_CPU_FEATURES");
  const half::CpuPath best = half::cpu_path_supported(half::CpuPath::avx512) ? half::CpuPath::avx512
                             : half::cpu_path_supported(half::CpuPath::avx2) ? half::CpuPath::avx2
                                                                              : half::CpuPath::generic;
  CHECK(half::active_cpu_path() == (forced && std::strcmp(forced, "generic") == 0 ? half::CpuPath::generic : best));
  if (tested == 0) WARN("no fast conversion path on this CPU: only the generic one was tested");
}

TEST_CASE("Tensor::to and ops::convert between f32, f64, bf16, f16, and count_nonfinite", "[mixed][convert]") {
  ThreadPool pool(3);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937_64 rng(0xc0);
  const int64_t n = 100'003;
  Tensor src64 = Tensor::empty({n}, DType::f64);
  std::uniform_real_distribution<double> expo(-30, 30), frac(1, 2);
  for (int64_t i = 0; i < n; ++i)
    src64.data<double>()[i] = (rng() & 1 ? -1 : 1) * std::ldexp(frac(rng), static_cast<int>(expo(rng)));
  const DType types[] = {DType::f64, DType::f32, DType::bf16, DType::f16};
  for (DType from : types) {
    const Tensor s = src64.to(from);
    for (DType to : types) {
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      const Tensor a = s.to(to), b = Tensor::empty({n}, to);
      ops::convert(ctx, b, s);
      CHECK(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
      // The rule element by element: through exact f64 values, then one rounding into `to`.
      int64_t bad = 0;
      for (int64_t i = 0; i < n; i += 7) {
        double v;
        if (from == DType::f64) v = s.data<double>()[i];
        else if (from == DType::f32) v = s.data<float>()[i];
        else if (from == DType::bf16) v = half::bf16_to_f32(static_cast<const uint16_t*>(s.raw())[i]);
        else v = half::f16_to_f32(static_cast<const uint16_t*>(s.raw())[i]);
        const void* p = a.raw();
        if (to == DType::f64) bad += static_cast<const double*>(p)[i] != v;
        else if (to == DType::f32) bad += bits(static_cast<const float*>(p)[i]) != bits(static_cast<float>(v));
        else bad += static_cast<const uint16_t*>(p)[i] != reference_narrow(v, to == DType::bf16 ? kBf16 : kF16);
      }
      CHECK(bad == 0);
    }
  }
  // count_nonfinite: overflowing values (past fp16's 65504, not bf16's), Infs, NaNs.
  Tensor big = Tensor::empty({n}, DType::f64);
  int64_t expect16 = 0, expect_wide = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = std::ldexp(frac(rng), static_cast<int>(rng() % 28) - 10);  // up to 2^18: some past 65504
    if (i % 1001 == 0) v = INFINITY;
    if (i % 1003 == 0) v = NAN;
    big.data<double>()[i] = v;
    expect_wide += !std::isfinite(v);
    expect16 += !std::isfinite(v) || std::fabs(v) >= 65520;
  }
  CHECK(expect16 > expect_wide);
  CHECK(ops::count_nonfinite(ctx, big) == expect_wide);
  CHECK(ops::count_nonfinite(ctx, big.to(DType::f32)) == expect_wide);
  CHECK(ops::count_nonfinite(ctx, big.to(DType::bf16)) == expect_wide);
  CHECK(ops::count_nonfinite(ctx, big.to(DType::f16)) == expect16);
}
