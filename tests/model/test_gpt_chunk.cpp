// GptChunk against GptModel (the 1x1x1 reference) for GPT-2: bitwise for t = 1 whatever the pipeline
// split, recompute mode, split backward, slot order or unit hooks; within rounding for tensor
// parallelism (threads on the local comm backend), with finite differences in double for TP + SP.
// The other families: test_gpt_chunk_family.cpp; the harness: chunk_harness.hpp.
#include "tests/model/chunk_harness.hpp"

using namespace troupe;
using namespace troupe::chunk_test;

TEST_CASE("chunk_layers: virtual stages cover the layers once, earlier ones get the remainder", "[chunk]") {
  const GptConfig cfg = tiny(3);
  struct Case {
    int p, v;
    std::vector<int> layers;
  };
  for (const Case& c : {Case{1, 1, {3}}, Case{2, 1, {2, 1}}, Case{3, 1, {1, 1, 1}}, Case{2, 2, {1, 1, 1, 0}}}) {
    int next = 0;
    for (int k = 0; k < c.p * c.v; ++k) {
      const ChunkSpec s = chunk_layers(cfg, c.p, c.v, k % c.p, k / c.p);
      REQUIRE(s.first_layer == next);
      REQUIRE(s.num_layers == c.layers[k]);
      REQUIRE(s.has_embedding == (k == 0));
      REQUIRE(s.has_head == (k == c.p * c.v - 1));
      next += s.num_layers;
    }
    REQUIRE(next == 3);
  }
}

TEST_CASE("units: contiguous, spec order; wte a unit of its own, also the head's copy", "[chunk]") {
  const GptConfig cfg = tiny(3);
  ChunkSpec first = chunk_layers(cfg, 2, 1, 0, 0), last = chunk_layers(cfg, 2, 1, 1, 0);
  first.tp_size = last.tp_size = 1;
  GptChunk a(first, nullptr), b(last, nullptr);
  REQUIRE(a.units().size() == 4);  // wte, wpe, h.0, h.1
  REQUIRE(b.units().size() == 3);  // wte (the head's copy), h.2, ln_f
  REQUIRE(a.specs()[a.units()[0].specs[0]].name == "transformer.wte.weight");
  REQUIRE(a.specs()[a.units()[1].specs[0]].name == "transformer.wpe.weight");
  REQUIRE(a.specs()[a.units()[2].specs[0]].name == "transformer.h.0.ln_1.weight");
  // The same unit layout for both copies of wte: the runtime sums their gradient partitions.
  REQUIRE(a.units()[0].numel == b.units()[0].numel);
  const UnitInfo& wte_copy = b.units()[0];
  const UnitInfo& lnf = b.units()[2];
  REQUIRE(wte_copy.specs.size() == 1);
  REQUIRE(b.specs()[wte_copy.specs[0]].name == "transformer.wte.weight");
  REQUIRE(b.specs()[lnf.specs[1]].name == "transformer.ln_f.bias");
  for (const GptChunk* c : {&a, &b}) {
    int64_t off = 0;
    int next_spec = 0;
    for (const UnitInfo& u : c->units()) {
      REQUIRE(u.param_offset == off);
      for (int s : u.specs) REQUIRE(s == next_spec++);
      off += u.numel;
    }
    REQUIRE(off == c->flat_params().numel());
  }
  REQUIRE(a.counts_in_norm(0));
  REQUIRE_FALSE(b.counts_in_norm(wte_copy.specs[0]));  // the copy of wte is counted on the first stage
  REQUIRE(b.counts_in_norm(lnf.specs[0]));
}

TEST_CASE("t=1, p=1: loss and gradients are bitwise GptModel's (two micro-batches)", "[chunk]") {
  const GptConfig cfg = tiny(4);
  const auto micro = micro_batches(cfg, 2, 11);
  for (auto [dt, fused] : {std::pair{DType::f32, false}, std::pair{DType::f64, false}, std::pair{DType::f32, true},
                           std::pair{DType::f64, true}}) {
    INFO(dtype_name(dt) << (fused ? ", the head's backward fused into the forward" : ""));
    Reference ref = reference(cfg, dt, micro);
    // Same pool size as the reference, in this thread.
    ThreadPool pool(2);
    Context ctx;
    ctx.pool = &pool;
    ChunkSpec s = whole_model(cfg);
    s.micro_batch = kB;
    s.dtype = dt;
    GptChunk chunk(s, nullptr);
    init_chunk(chunk);
    REQUIRE(bitwise(chunk.flat_params(), ref.model->flat_params()));  // same layout, same values
    chunk.zero_grad();
    for (size_t i = 0; i < micro.size(); ++i) {
      const double loss = chunk.forward(ctx, 0, micro[i].tokens, Tensor(), Tensor(), grad_scale(cfg), fused);
      chunk.backward(ctx, 0, Tensor(), Tensor());
      REQUIRE(loss == ref.loss[i]);
    }
    REQUIRE(bitwise(chunk.flat_grads(), ref.model->flat_grads()));
    // Evaluation gives the training forward's loss.
    REQUIRE(chunk.forward_eval(ctx, micro[0].tokens, Tensor(), Tensor()) ==
            ref.model->forward_loss(ctx, micro[0].tokens));
  }
}

TEST_CASE("pipeline split, t=1: chained chunks are bitwise GptModel (tied wte within rounding)", "[chunk]") {
  for (int layers : {3, 4}) {
    const GptConfig cfg = tiny(layers);
    const auto micro = micro_batches(cfg, 2, 12);
    Reference ref = reference(cfg, DType::f32, micro);
    for (auto [p, v] : {std::pair{2, 1}, std::pair{3, 1}, std::pair{2, 2}}) {
      INFO("L=" << layers << " p=" << p << " v=" << v);
      ThreadPool pool(2);
      Context ctx;
      ctx.pool = &pool;
      const int K = p * v;
      std::vector<std::unique_ptr<GptChunk>> chunks;
      for (int k = 0; k < K; ++k) {
        ChunkSpec s = chunk_layers(cfg, p, v, k % p, k / p);
        s.micro_batch = kB;
        chunks.push_back(std::make_unique<GptChunk>(s, nullptr));
        init_chunk(*chunks.back());
        chunks.back()->zero_grad();
      }
      const int64_t N = kB * cfg.seq_length, C = cfg.hidden_size;
      for (size_t i = 0; i < micro.size(); ++i) {
        std::vector<Tensor> acts(K + 1);
        double loss = 0;
        for (int k = 0; k < K; ++k) {
          if (k < K - 1) acts[k + 1] = Tensor::empty({N, C});
          loss = chunks[k]->forward(ctx, 0, micro[i].tokens, acts[k], acts[k + 1], grad_scale(cfg));
        }
        REQUIRE(loss == ref.loss[i]);
        Tensor grad;  // d(output of chunk k) going down
        for (int k = K - 1; k >= 0; --k) {
          Tensor din = k > 0 ? Tensor::empty({N, C}) : Tensor();
          chunks[k]->backward(ctx, 0, grad, din);
          grad = din;
        }
      }
      // Every parameter's gradient, found by name.
      Tensor wte_sum = Tensor::zeros(ref.grad("transformer.wte.weight").shape());
      for (const auto& c : chunks) {
        const auto gs = c->grads();
        for (size_t k = 0; k < c->specs().size(); ++k) {
          const std::string& name = c->specs()[k].name;
          INFO(name);
          if (name == "transformer.wte.weight") {
            for (int64_t e = 0; e < wte_sum.numel(); ++e) wte_sum.data<float>()[e] += gs[k].data<float>()[e];
          } else {
            REQUIRE(bitwise(gs[k], ref.grad(name)));
          }
        }
      }
      // The two copies' sum adds the same terms as GptModel's single buffer in another order.
      const double err = test::max_rel_diff(wte_sum, ref.grad("transformer.wte.weight"));
      if (verbose()) std::printf("pipeline L=%d p=%d v=%d: wte sum max rel diff %.3g\n", layers, p, v, err);
      CHECK(err < 1e-6);
    }
  }
}


TEST_CASE("tensor parallel t=2,3 (SP on and off): loss and gradient slices match GptModel", "[chunk][tp]") {
  const GptConfig cfg = tiny(3);
  for (int t : {2, 3}) {
    for (bool sp : {false, true}) {
      for (DType dt : {DType::f32, DType::f64}) {
        INFO("t=" << t << " sp=" << sp << " " << dtype_name(dt));
        // head_chunk_rows 8: several logit row chunks (21 rows), each with its reductions.
        const auto [loss_err, grad_err] = check_tp_against_reference(cfg, t, sp, dt, sp ? 8 : 0);
        if (verbose())
          std::printf("TP t=%d sp=%d %s: loss rel err %.3g, grad max rel err %.3g\n", t, sp, dtype_name(dt), loss_err,
                      grad_err);
        if (dt == DType::f32) {
          CHECK(loss_err < 1e-5);
          CHECK(grad_err < 1e-5);
        } else {
          CHECK(loss_err < 1e-11);
          CHECK(grad_err < 1e-10);
        }
      }
    }
  }
}

TEST_CASE("tensor parallel with Megatron's default padding: a rank holding only padding rows", "[chunk][tp]") {
  GptConfig cfg = tiny(2);
  cfg.make_vocab_size_divisible_by = 128;  // Vp = 256: rank 1's 128 vocabulary rows are all padding
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    const auto [loss_err, grad_err] = check_tp_against_reference(cfg, 2, true, dt, 0);
    CHECK(loss_err < (dt == DType::f32 ? 1e-5 : 1e-11));
    CHECK(grad_err < (dt == DType::f32 ? 1e-5 : 1e-10));
  }
}

TEST_CASE("pipeline p=2 with t=2 (4 threads, SP): matches GptModel", "[chunk][tp]") {
  const GptConfig cfg = tiny(3);
  const auto micro = micro_batches(cfg, 2, 14);
  for (auto [dt, fused] : {std::pair{DType::f32, false}, std::pair{DType::f64, false}, std::pair{DType::f32, true},
                           std::pair{DType::f64, true}}) {
    INFO(dtype_name(dt) << (fused ? ", the head's backward fused into the forward" : ""));
    Reference ref = reference(cfg, dt, micro);
    const int t = 2, p = 2;
    Ranks ranks(p * t, [&](int r) { return tp_group(r, t); });  // world rank = stage * t + tp rank
    std::vector<std::unique_ptr<GptChunk>> chunks;
    for (int w = 0; w < p * t; ++w) {
      ChunkSpec s = chunk_layers(cfg, p, 1, w / t, 0);
      s.tp_size = t;
      s.tp_rank = w % t;
      s.sequence_parallel = true;
      s.micro_batch = kB;
      s.dtype = dt;
      chunks.push_back(std::make_unique<GptChunk>(s, ranks.tp(w)));
      init_chunk(*chunks.back());
      chunks.back()->zero_grad();
    }
    // Boundary tensors between stage 0 rank q and stage 1 rank q.
    std::vector<std::vector<std::promise<Tensor>>> act(micro.size()), grad(micro.size());
    for (size_t i = 0; i < micro.size(); ++i) {
      act[i] = std::vector<std::promise<Tensor>>(t);
      grad[i] = std::vector<std::promise<Tensor>>(t);
    }
    std::vector<std::vector<double>> loss(p * t, std::vector<double>(micro.size()));
    ranks.run([&](int w) {
      GptChunk& c = *chunks[w];
      Context& ctx = ranks.ctx(w);
      const int stage = w / t, q = w % t;
      const Shape shape{c.boundary_rows(), cfg.hidden_size};
      for (size_t i = 0; i < micro.size(); ++i) {
        if (stage == 0) {
          Tensor out = Tensor::empty(shape, dt);
          c.forward(ctx, 0, micro[i].tokens, Tensor(), out, grad_scale(cfg));
          act[i][q].set_value(out);
          Tensor dout = grad[i][q].get_future().get();
          c.backward(ctx, 0, dout, Tensor());
        } else {
          Tensor in = act[i][q].get_future().get();
          loss[w][i] = c.forward(ctx, 0, micro[i].tokens, in, Tensor(), grad_scale(cfg));
          Tensor din = Tensor::empty(shape, dt);
          c.backward(ctx, 0, Tensor(), din);
          grad[i][q].set_value(din);
        }
      }
    });
    double loss_err = 0, grad_err = 0;
    for (int q = 0; q < t; ++q) {
      for (size_t i = 0; i < micro.size(); ++i)
        loss_err = std::max(loss_err, std::abs(loss[t + q][i] - ref.loss[i]) / std::abs(ref.loss[i]));
      // Stage 0 and stage 1 of TP rank q; the tied wte's two copies are summed.
      GptChunk& first = *chunks[q];
      GptChunk& last = *chunks[t + q];
      for (GptChunk* c : {&first, &last}) {
        const auto gs = c->grads();
        for (size_t k = 0; k < c->specs().size(); ++k) {
          const ParamSpec& ps = c->specs()[k];
          if (ps.name == "transformer.wte.weight") continue;
          INFO(ps.name);
          grad_err = std::max(grad_err, test::max_rel_diff(gs[k], slice_of(ref.grad(ps.name), ps)));
        }
      }
      Tensor wte = first.grads()[0].to(DType::f64);
      const Tensor other = last.grads()[last.units().front().specs[0]];  // grads() returns a vector by value
      REQUIRE(last.specs()[last.units().front().specs[0]].name == "transformer.wte.weight");
      for (int64_t e = 0; e < wte.numel(); ++e) wte.data<double>()[e] += get(other, e);
      grad_err = std::max(grad_err, test::max_rel_diff(wte, slice_of(ref.grad("transformer.wte.weight"),
                                                                        first.specs()[0])));
    }
    if (verbose())
      std::printf("p=2 t=2 sp %s: loss rel err %.3g, grad max rel err %.3g\n", dtype_name(dt), loss_err, grad_err);
    CHECK(loss_err < (dt == DType::f32 ? 1e-5 : 1e-11));
    CHECK(grad_err < (dt == DType::f32 ? 1e-5 : 1e-10));
  }
}


TEST_CASE("recompute full and selective are bitwise recompute none", "[chunk]") {
  const GptConfig cfg = tiny(4);
  const auto micro = micro_batches(cfg, 2, 15);
  for (auto [t, sp] : {std::pair{1, false}, std::pair{2, true}}) {
    for (ChunkSpec s : stages_of(cfg)) {
      INFO("t=" << t << " embedding=" << s.has_embedding << " head=" << s.has_head);
      s.sequence_parallel = sp;
      const auto none = run_chunk(s, t, DType::f32, micro, "F0 B0 F1 B1");
      for (Recompute rc : {Recompute::full, Recompute::selective}) {
        s.recompute = rc;
        require_same(run_chunk(s, t, DType::f32, micro, "F0 B0 F1 B1"), none);
      }
    }
  }
}

TEST_CASE("split backward and slots in flight: bitwise the sequential unsplit run", "[chunk]") {
  const GptConfig cfg = tiny(3);
  const auto micro = micro_batches(cfg, 3, 16);
  for (auto [t, sp] : {std::pair{1, false}, std::pair{2, true}}) {
    for (ChunkSpec s : stages_of(cfg)) {
      for (Recompute rc : {Recompute::none, Recompute::full, Recompute::selective}) {
        INFO("t=" << t << " embedding=" << s.has_embedding << " head=" << s.has_head << " recompute "
                  << static_cast<int>(rc));
        s.sequence_parallel = sp;
        s.recompute = rc;
        const auto base = run_chunk(s, t, DType::f32, micro, "F0 B0 F1 B1 F2 B2");
        require_same(run_chunk(s, t, DType::f32, micro, "F0 B0 W0 F1 B1 W1 F2 B2 W2"), base);
        require_same(run_chunk(s, t, DType::f32, micro, "F0 F1 B0 F2 B1 B2", 3), base);
        require_same(run_chunk(s, t, DType::f32, micro, "F0 F1 B0 F2 B1 W0 B2 W1 W2", 3), base);
      }
    }
  }
}

TEST_CASE("fused head: the head's backward inside the forward is bitwise the unfused calls", "[chunk]") {
  const GptConfig cfg = tiny(3);
  const auto micro = micro_batches(cfg, 3, 18);
  // t = 2 ignores the request (the head needs the reduced statistics first): the same results too.
  for (auto [t, sp] : {std::pair{1, false}, std::pair{2, true}, std::pair{2, false}}) {
    for (ChunkSpec s : stages_of(cfg)) {
      for (Recompute rc : {Recompute::none, Recompute::full, Recompute::selective}) {
        INFO("t=" << t << " sp=" << sp << " embedding=" << s.has_embedding << " head=" << s.has_head
                  << " recompute " << static_cast<int>(rc));
        s.sequence_parallel = sp;
        s.recompute = rc;
        const auto base = run_chunk(s, t, DType::f32, micro, "F0 B0 F1 B1 F2 B2");
        require_same(run_chunk(s, t, DType::f32, micro, "H0 B0 H1 B1 H2 B2"), base);
        // Beside a micro-batch in flight in another slot (the same backward order unfused).
        require_same(run_chunk(s, t, DType::f32, micro, "F0 H1 B1 B0 H2 B2", 2),
                     run_chunk(s, t, DType::f32, micro, "F0 F1 B1 B0 F2 B2", 2));
      }
    }
  }
}

TEST_CASE("unit hooks: acquired parameters and external gradient buffers give the resident results", "[chunk]") {
  check_unit_hooks(tiny(3));
}

TEST_CASE("TP + SP in double: gradients match finite differences of the chunk's loss", "[chunk][tp][grad]") {
  check_fd(tiny(2), 2, true, {2, 1});
}

// ---- dropout (model/dropout.hpp) -------------------------------------------------------------------
// The reference (GptModel) draws its masks with its own transcription of the rule and runs its own
// attention with dropout (reference/dropout.hpp), so agreement checks the chunk's masks, their
// placement and their backward on every split.

namespace {
GptConfig with_dropout(GptConfig c, double hidden = 0.1, double attention = 0.15) {
  c.hidden_dropout = hidden;
  c.attention_dropout = attention;
  return c;
}
}  // namespace

TEST_CASE("dropout: t=1,2,3 (SP on and off) match GptModel with the reference's own masks", "[chunk][tp][dropout]") {
  const GptConfig cfg = with_dropout(tiny(3));
  for (int t : {1, 2, 3}) {
    for (bool sp : {false, true}) {
      if (t == 1 && sp) continue;
      for (DType dt : {DType::f32, DType::f64}) {
        INFO("t=" << t << " sp=" << sp << " " << dtype_name(dt));
        const auto [loss_err, grad_err] = check_tp_against_reference(cfg, t, sp, dt, sp ? 8 : 0);
        if (verbose())
          std::printf("dropout t=%d sp=%d %s: loss rel err %.3g, grad max rel err %.3g\n", t, sp, dtype_name(dt),
                      loss_err, grad_err);
        CHECK(loss_err < (dt == DType::f32 ? 1e-5 : 1e-11));
        CHECK(grad_err < (dt == DType::f32 ? 1e-5 : 1e-10));
      }
    }
  }
  // The masks matter: the same micro-batches without dropout give other losses.
  const auto micro = micro_batches(cfg, 2, 13);
  const Reference with = reference(cfg, DType::f64, micro), without = reference(tiny(3), DType::f64, micro);
  CHECK(std::abs(with.loss[0] - without.loss[0]) > 1e-5 * std::abs(without.loss[0]));  // f64 rounding: 1e-15
}

TEST_CASE("dropout: each site alone matches GptModel (hidden only, attention only)", "[chunk][dropout]") {
  for (auto [hidden, attention] : {std::pair{0.3, 0.0}, std::pair{0.0, 0.3}}) {
    INFO("hidden " << hidden << " attention " << attention);
    const auto [loss_err, grad_err] = check_tp_against_reference(with_dropout(tiny(2), hidden, attention), 2, true,
                                                                 DType::f64, 0);
    CHECK(loss_err < 1e-11);
    CHECK(grad_err < 1e-10);
  }
}

TEST_CASE("dropout: recompute, split backward and slot order are bitwise the plain run", "[chunk][dropout]") {
  const GptConfig cfg = with_dropout(tiny(3));
  const auto micro = micro_batches(cfg, 3, 16);
  for (auto [t, sp] : {std::pair{1, false}, std::pair{2, true}}) {
    for (ChunkSpec s : stages_of(cfg)) {
      INFO("t=" << t << " embedding=" << s.has_embedding << " head=" << s.has_head);
      s.sequence_parallel = sp;
      const auto base = run_chunk(s, t, DType::f32, micro, "F0 B0 F1 B1 F2 B2");
      for (Recompute rc : {Recompute::none, Recompute::full, Recompute::selective}) {
        INFO("recompute " << static_cast<int>(rc));
        s.recompute = rc;
        require_same(run_chunk(s, t, DType::f32, micro, "F0 B0 F1 B1 F2 B2"), base);
        require_same(run_chunk(s, t, DType::f32, micro, "F0 F1 B0 F2 B1 W0 B2 W1 W2", 3), base);
      }
      s.recompute = Recompute::none;
      if (s.has_head && t == 1) require_same(run_chunk(s, t, DType::f32, micro, "H0 B0 H1 B1 H2 B2"), base);
    }
  }
}

TEST_CASE("dropout: evaluation drops nothing (the dropout-free model's loss on the same weights)", "[chunk][dropout]") {
  const GptConfig plain = tiny(3), dropped = with_dropout(plain, 0.5, 0.5);
  std::mt19937_64 rng(21);
  const Tensor tokens = random_windows(rng, plain);
  ThreadPool pool(1);
  Context ctx;
  ctx.pool = &pool;
  double eval[2], train = 0;
  for (int i = 0; i < 2; ++i) {
    ChunkSpec s = whole_model(i == 0 ? plain : dropped);
    s.micro_batch = kB;
    GptChunk c(s, nullptr);
    init_chunk(c);
    eval[i] = c.forward_eval(ctx, tokens, Tensor(), Tensor());
    if (i == 1) train = c.forward(ctx, 0, tokens, Tensor(), Tensor(), grad_scale(s.model), false, MicroBatchKey{5, 1, 0});
  }
  CHECK(eval[0] == eval[1]);
  CHECK(std::abs(train - eval[1]) > 1e-4 * std::abs(eval[1]));  // while training the masks do apply
}
