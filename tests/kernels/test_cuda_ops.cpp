// The CUDA backend's elementwise ops, linears and AdamW against the CPU backend on random odd
// sizes, in f32, bf16 and f16 (label gpu: skipped without a GPU). The bounds are those of
// tests/kernels/cuda_test_util.hpp: 1e-5 of the largest value for f32 results, two 16-bit rounding
// units for 16-bit ones.
#include "tests/kernels/cuda_test_util.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {
Tensor f32(CrossFixture& f, const Shape& s, double lo = -1, double hi = 1) {
  return random_tensor(s, f.rng, lo, hi, DType::f32);
}
}  // namespace

TEST_CASE("cuda ops: conversions, residual adds, scaling and reductions equal the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  for (DType h : kCrossTypes) {
    INFO(dtype_name(h));
    for (int64_t n : {1, 37, 4099, 1000003}) {
      INFO("n " << n);
      run_cross(f, h, {xin(f32(f, {n}, -3, 3)), xin(f32(f, {n})), xout(f32(f, {n}))},
                [](Context& c, const XArgs& a) { ops::residual_forward(c, a[2], a[0], a[1]); });
      run_cross(f, h, {xout(f32(f, {n})), xin(f32(f, {n}))},
                [](Context& c, const XArgs& a) { ops::add_inplace(c, a[0], a[1]); });
      run_cross(f, h, {xout(f32(f, {n}))}, [](Context& c, const XArgs& a) { ops::scale_inplace(c, a[0], -0.37); });
      // Every storage type into every other: the CPU's and the GPU's rounding are both nearest even.
      for (DType to : kCrossTypes) {
        Tensor src = f32(f, {n}, -70000, 70000).to(h), dst_cpu = Tensor::zeros({n}, to);
        Context& g = f.gpu->ctx();
        Tensor src_d = to_device(src), dst_d = to_device(dst_cpu);
        ops::convert(f.cpu, dst_cpu, src);
        ops::convert(g, dst_d, src_d);
        REQUIRE(f.gpu->synchronize().is_ok());
        const Tensor back = to_host(dst_d);
        CHECK(std::memcmp(back.raw(), dst_cpu.raw(), back.nbytes()) == 0);  // bitwise
      }
      Tensor t = f32(f, {n}, -2, 2).to(h);
      const double want = ops::sum_squares(f.cpu, t), got = ops::sum_squares(f.gpu->ctx(), to_device(t));
      CHECK(std::abs(got - want) <= 1e-12 * want);  // double sums of the same exactly widened squares
    }
    // The overflow count: Inf and NaN wherever they are.
    Tensor t = f32(f, {5003}).to(h);
    std::vector<int64_t> bad = {0, 17, 4096, 5002};
    Tensor t32 = t.to(DType::f32);
    for (size_t k = 0; k < bad.size(); ++k) t32.data<float>()[bad[k]] = k % 2 ? INFINITY : NAN;
    t = t32.to(h);
    CHECK(ops::count_nonfinite(f.gpu->ctx(), to_device(t)) == 4);
    CHECK(ops::count_nonfinite(f.cpu, t) == 4);
  }
}

TEST_CASE("cuda ops: GELU and the gated units, forward and backward, equal the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  for (DType h : kCrossTypes) {
    INFO(dtype_name(h));
    const int64_t N = 13, F = 37;
    run_cross(f, h, {xin(f32(f, {N, F}, -4, 4)), xout(f32(f, {N, F}))},
              [](Context& c, const XArgs& a) { ops::gelu_forward(c, a[1], a[0]); });
    run_cross(f, h, {xin(f32(f, {N, F}, -4, 4)), xin(f32(f, {N, F})), xout(f32(f, {N, F}))},
              [](Context& c, const XArgs& a) { ops::gelu_backward(c, a[2], a[1], a[0]); });
    for (ops::GluKind kind : {ops::GluKind::swiglu, ops::GluKind::geglu}) {
      run_cross(f, h, {xin(f32(f, {N, 2 * F}, -4, 4)), xout(f32(f, {N, F}))},
                [kind](Context& c, const XArgs& a) { ops::glu_forward(c, a[1], a[0], kind); });
      run_cross(f, h, {xin(f32(f, {N, 2 * F}, -4, 4)), xin(f32(f, {N, F})), xout(f32(f, {N, 2 * F}))},
                [kind](Context& c, const XArgs& a) { ops::glu_backward(c, a[2], a[1], a[0], kind); });
    }
  }
}

TEST_CASE("cuda ops: linear forward and backward (cuBLASLt) equal the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  struct Dims {
    int64_t N, I, O;
  };
  for (DType h : kCrossTypes) {
    for (Dims d : {Dims{7, 12, 5}, Dims{33, 65, 129}, Dims{257, 768, 2304}}) {
      INFO(dtype_name(h) << " N " << d.N << " I " << d.I << " O " << d.O);
      const double k = 1;  // bound factor: the GEMM's sums in another order
      // Forward with the bias fused (same type as out) and with an f32 bias beside 16-bit out.
      run_cross(f, h, {xin(f32(f, {d.N, d.I})), xin(f32(f, {d.O, d.I})), xin(f32(f, {d.O})), xout(f32(f, {d.N, d.O}))},
                [](Context& c, const XArgs& a) { ops::linear_forward(c, a[3], a[0], a[1], a[2]); }, k);
      run_cross(f, h,
                {xin(f32(f, {d.N, d.I})), xin(f32(f, {d.O, d.I})), xin(f32(f, {d.O}), false), xout(f32(f, {d.N, d.O}))},
                [](Context& c, const XArgs& a) { ops::linear_forward(c, a[3], a[0], a[1], a[2]); }, k);
      run_cross(f, h, {xin(f32(f, {d.N, d.I})), xin(f32(f, {d.O, d.I})), xout(f32(f, {d.N, d.O}))},
                [](Context& c, const XArgs& a) { ops::linear_forward(c, a[2], a[0], a[1], Tensor()); }, k);
      // Backward: dx overwritten; dW, db accumulated (random start), in the call's type and in f32
      // (mixed precision's fp32 gradients beside 16-bit activations).
      for (bool f32_grads : {false, true}) {
        run_cross(f, h,
                  {xin(f32(f, {d.N, d.O})), xin(f32(f, {d.N, d.I})), xin(f32(f, {d.O, d.I})),
                   xout(f32(f, {d.N, d.I})), xout(f32(f, {d.O, d.I}), !f32_grads), xout(f32(f, {d.O}), !f32_grads)},
                  [](Context& c, const XArgs& a) { ops::linear_backward(c, a[3], a[4], a[5], a[0], a[1], a[2]); }, k);
      }
      // The split halves.
      run_cross(f, h, {xin(f32(f, {d.N, d.O})), xin(f32(f, {d.O, d.I})), xout(f32(f, {d.N, d.I}))},
                [](Context& c, const XArgs& a) { ops::linear_backward(c, a[2], Tensor(), Tensor(), a[0], Tensor(), a[1]); },
                k);
      run_cross(f, h, {xin(f32(f, {d.N, d.O})), xin(f32(f, {d.N, d.I})), xout(f32(f, {d.O, d.I})), xout(f32(f, {d.O}))},
                [](Context& c, const XArgs& a) { ops::linear_backward(c, Tensor(), a[2], a[3], a[0], a[1], Tensor()); },
                k);
    }
  }
}

TEST_CASE("cuda ops: AdamW over a partition equals the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  ops::AdamWParams hp;
  hp.lr = 3e-3;
  hp.weight_decay = 0.1;
  hp.step = 7;
  for (DType h : kCrossTypes) {
    INFO(dtype_name(h));
    const int64_t n = 100003;
    // All in the call's type, and f32 master weights and moments beside a 16-bit gradient.
    for (bool master : {false, true}) {
      run_cross(f, h,
                {xout(f32(f, {n}), !master), xin(f32(f, {n})), xout(f32(f, {n}, -0.1, 0.1), !master),
                 xout(f32(f, {n}, 1e-4, 1e-2), !master)},
                [&](Context& c, const XArgs& a) { ops::adamw_update(c, a[0], a[1], a[2], a[3], hp); });
    }
  }
}

TEST_CASE("cuda ops: embeddings, rotary and dropout, forward and backward, equal the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  const int64_t B = 3, T = 11, C = 37, V = 53, P = 16;
  for (DType h : kCrossTypes) {
    INFO(dtype_name(h));
    const Tensor tokens = random_tokens(f.rng, B * T, V).view({B, T});
    run_cross(f, h, {xin(tokens, false), xin(f32(f, {V, C})), xin(f32(f, {P, C})), xout(f32(f, {B, T, C}))},
              [](Context& c, const XArgs& a) { ops::embedding_forward(c, a[3], a[0], a[1], a[2]); });
    // Gradients accumulate into random starts; ids repeat (33 tokens over 53 rows do).
    for (bool f32_grads : {false, true})
      run_cross(f, h,
                {xin(tokens, false), xin(f32(f, {B, T, C})), xout(f32(f, {V, C}), !f32_grads),
                 xout(f32(f, {P, C}), !f32_grads)},
                [](Context& c, const XArgs& a) { ops::embedding_backward(c, a[2], a[3], a[1], a[0]); });
    // A vocabulary shard: rows [20, 40) of the table; the position table on this shard or not.
    for (bool with_wpe : {true, false}) {
      run_cross(f, h,
                {xin(tokens, false), xin(f32(f, {20, C})), xin(with_wpe ? f32(f, {P, C}) : Tensor()),
                 xout(f32(f, {B, T, C}))},
                [](Context& c, const XArgs& a) { ops::vocab_embedding_forward(c, a[3], a[0], a[1], 20, a[2]); });
      run_cross(f, h,
                {xin(tokens, false), xin(f32(f, {B, T, C})), xout(f32(f, {20, C})),
                 with_wpe ? xout(f32(f, {P, C})) : xin(Tensor())},
                [](Context& c, const XArgs& a) { ops::vocab_embedding_backward(c, a[2], a[3], a[1], a[0], 20); });
    }
    // Rotary on the q and k heads of a fused qkv (H = 4, G = 2, hs = 12), both conventions, a
    // partial rotary dimension and a position offset.
    for (bool interleaved : {false, true}) {
      ops::RotaryParams rp;
      rp.rotary_dim = 8;
      rp.base = 500000;
      rp.interleaved = interleaved;
      rp.pos0 = 5;
      const int64_t hs = 12, W = (4 + 2 * 2) * hs;
      run_cross(f, h, {xout(f32(f, {B, T, W}))}, [&](Context& c, const XArgs& a) {
        ops::rotary_forward(c, a[0], 0, 4, hs, rp);
        ops::rotary_forward(c, a[0], 4 * hs, 2, hs, rp);
      });
      run_cross(f, h, {xout(f32(f, {B, T, W}))},
                [&](Context& c, const XArgs& a) { ops::rotary_backward(c, a[0], 4 * hs, 2, hs, rp); });
    }
    // Dropout of rows [7, 7 + 19) of a micro-batch of sequence 11: the same mask on both backends.
    DropoutMask mask;
    mask.p = 0.3;
    mask.seed = 77;
    mask.stream = 2;
    mask.iteration = 9;
    mask.first_sample = 4;
    run_cross(f, h, {xout(f32(f, {19, C}))}, [&](Context& c, const XArgs& a) { ops::dropout_rows(c, a[0], mask, 7, T); });
  }
}

TEST_CASE("cuda ops: the vocabulary-parallel cross-entropy's pieces equal the CPU's", "[gpu][cuda]") {
  TROUPE_NEED_GPU();
  CrossFixture f;
  struct Shard {
    int64_t N, Vl, vocab_begin, valid, vocab;
  };
  // One whole shard; a middle shard (targets inside and outside it); the last shard with padding.
  for (Shard s : {Shard{9, 53, 0, 53, 53}, Shard{17, 40, 40, 40, 150}, Shard{5, 47, 100, 43, 143}}) {
    for (DType h : kCrossTypes) {
      INFO(dtype_name(h) << " N " << s.N << " Vl " << s.Vl << " begin " << s.vocab_begin << " valid " << s.valid);
      const Tensor targets = random_tokens(f.rng, s.N, s.vocab);
      auto f64 = [&](int64_t n) { return Tensor::zeros({n}, DType::f64); };
      // The four pieces in a row on one shard (no other shard to all-reduce with): statistics, the
      // exp-sum (which overwrites the logits), the loss; then the backward from fresh raw logits.
      const Tensor logits = random_tensor({s.N, s.Vl}, f.rng, -4, 4, DType::f32);
      run_cross(f, h,
                {xin(targets, false), xout(logits), xout(f64(s.N), false), xout(f64(s.N), false), xout(f64(s.N), false),
                 xout(Tensor::zeros({s.N}), false)},
                [&](Context& c, const XArgs& a) {
                  ops::xent_local_stats(c, a[2], a[3], a[1], a[0], s.vocab_begin, s.valid);
                  ops::xent_exp_sum(c, a[4], a[1], a[2], s.valid);
                  ops::xent_loss(c, a[5], a[2], a[4], a[3]);
                });
      Tensor max_cpu = f64(s.N), tgt_cpu = f64(s.N), sum_cpu = f64(s.N);
      Tensor raw = logits.to(h == DType::f32 ? DType::f32 : h);
      Tensor scratch = raw.clone();
      ops::xent_local_stats(f.cpu, max_cpu, tgt_cpu, scratch, targets, s.vocab_begin, s.valid);
      ops::xent_exp_sum(f.cpu, sum_cpu, scratch, max_cpu, s.valid);
      run_cross(f, h, {xin(targets, false), xout(logits), xin(max_cpu, false), xin(sum_cpu, false)},
                [&](Context& c, const XArgs& a) {
                  ops::xent_backward(c, a[1], a[2], a[3], a[0], s.vocab_begin, s.valid, 0.37);
                });
    }
  }
}
