// GptChunk for the families beside GPT-2 (LLaMA: RMSNorm, rotary in both conventions and partial,
// grouped-query and multi-query attention, head size != C/H, SwiGLU, no biases, untied head; BLOOM:
// ALiBi with power-of-2 and other head counts, embedding LayerNorm, biases, tied head):
//   - t = 1, p = 1 is bitwise GptModel (reference/, helper famref's family reference); every TP layout
//     (SP on and off, dropout on and off) matches it within rounding;
//   - gradients of the chunk's own loss against central finite differences in double, t = 1 and
//     t > 1 with sequence parallelism (the TP paths: replicated RMSNorm / ln_embd gradients, split
//     heads and groups, ALiBi slopes of the rank's heads, vocabulary-parallel lm_head);
//   - every TP layout (t = 2, 3, 4 as the sizes allow, SP on and off) equals the t = 1 chunk;
//   - recompute, split backward, slots in flight and the fused head are bitwise the plain run;
//   - a pipeline split chained equals the whole-model chunk; units and hooks.
// Tagged [family] so they run alone: build/tests/test_model "[family]".
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "kernels/ops.hpp"
#include "model/op_probe.hpp"
#include "tests/model/chunk_harness.hpp"

using namespace troupe;
using namespace troupe::chunk_test;

namespace {

// LLaMA-like: C = 12, H = 4 heads over G = 2 groups of head size 5, rotate-half rope on every dim,
// SwiGLU of 10, no biases, RMSNorm, untied lm_head.
GptConfig llama(int layers = 2) {
  GptConfig c = tiny(layers, 4);
  c.set_llama_family();
  c.num_query_groups = 2;
  c.kv_channels = 5;
  c.ffn_hidden = 10;
  return c;
}
// Meta's interleaved pairs on half of each head's 8 dims, a small base so the angles turn far.
GptConfig llama_partial(int layers = 2) {
  GptConfig c = llama(layers);
  c.kv_channels = 8;
  c.rotary_percent = 0.5;
  c.rotary_interleaved = true;
  c.rotary_base = 50;
  return c;
}
// Multi-query: one key/value group (t = 1 only).
GptConfig mqa(int layers = 2) {
  GptConfig c = llama(layers);
  c.num_query_groups = 1;
  return c;
}
// Wide enough for t = 4: C = 16, H = 8 over G = 4 groups of head size 3, SwiGLU of 12.
GptConfig llama_wide(int layers = 2) {
  GptConfig c = llama(layers);
  c.hidden_size = 16;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;
  c.kv_channels = 3;
  c.ffn_hidden = 12;
  return c;
}
// BLOOM-like: ALiBi (4 heads: slopes of a power of 2; 6 heads: BLOOM's rule for the others),
// embedding LayerNorm, GELU, biases, LayerNorm, tied.
GptConfig bloom(int layers = 2, int heads = 4) {
  GptConfig c = tiny(layers, heads);
  c.set_bloom_family();
  return c;
}

struct Family {
  const char* name;
  GptConfig cfg;
};
std::vector<Family> families(int layers = 2) {
  return {{"llama", llama(layers)},     {"llama interleaved partial", llama_partial(layers)},
          {"mqa", mqa(layers)},         {"llama wide", llama_wide(layers)},
          {"bloom 4 heads", bloom(layers, 4)}, {"bloom 6 heads", bloom(layers, 6)}};
}
// The TP sizes a config's heads, groups and ffn allow among 2, 3, 4.
std::vector<int> tp_sizes(const GptConfig& c) {
  std::vector<int> out;
  for (int t : {2, 3, 4})
    if (c.num_attention_heads % t == 0 && c.query_groups() % t == 0 && c.ffn_hidden_size() % t == 0) out.push_back(t);
  return out;
}

GptConfig with_dropout(GptConfig c) {
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.15;
  return c;
}

}  // namespace

TEST_CASE("families: specs as the chunk holds them (no wpe, ln_embd, lm_head, unequal qkv parts)", "[chunk][family]") {
  {
    const GptConfig cfg = llama(3);
    ChunkSpec first = chunk_layers(cfg, 2, 1, 0, 0), last = chunk_layers(cfg, 2, 1, 1, 0);
    GptChunk a(first, nullptr), b(last, nullptr);
    REQUIRE(a.units().size() == 3);  // wte, h.0, h.1 (no wpe, no ln_embd)
    REQUIRE(b.units().size() == 3);  // h.2, ln_f, lm_head: no copy of wte
    REQUIRE(a.specs()[a.units()[1].specs[0]].name == "transformer.h.0.ln_1.weight");
    REQUIRE(a.units()[1].specs.size() == 6);  // weights only
    REQUIRE(b.specs()[b.units()[1].specs[0]].name == "transformer.ln_f.weight");
    REQUIRE(b.units()[1].specs.size() == 1);
    const int lm = b.units()[2].specs[0];
    REQUIRE(b.specs()[lm].name == "lm_head.weight");
    REQUIRE(b.counts_in_norm(lm));  // its own parameter, not a copy
    for (int s = 0; s < static_cast<int>(b.specs().size()); ++s) REQUIRE(b.specs()[s].name != "transformer.wte.weight");
  }
  {
    const GptConfig cfg = bloom(3);
    ChunkSpec first = chunk_layers(cfg, 2, 1, 0, 0), last = chunk_layers(cfg, 2, 1, 1, 0);
    GptChunk a(first, nullptr), b(last, nullptr);
    REQUIRE(a.units().size() == 4);  // wte, ln_embd (weight, bias), h.0, h.1
    REQUIRE(a.units()[1].specs.size() == 2);
    REQUIRE(a.specs()[a.units()[1].specs[0]].name == "transformer.ln_embd.weight");
    REQUIRE(b.units().size() == 3);  // wte (the tied head's copy), h.2, ln_f
    REQUIRE(b.specs()[b.units()[0].specs[0]].name == "transformer.wte.weight");
    REQUIRE_FALSE(b.counts_in_norm(b.units()[0].specs[0]));
  }
}

TEST_CASE("families, t=1, p=1: loss and gradients are bitwise GptModel's", "[chunk][family]") {
  for (const Family& f : families(3)) {
    const auto micro = micro_batches(f.cfg, 2, 35);
    for (auto [dt, fused] : {std::pair{DType::f32, false}, std::pair{DType::f64, false}, std::pair{DType::f32, true}}) {
      INFO(f.name << " " << dtype_name(dt) << (fused ? ", the head's backward fused into the forward" : ""));
      Reference ref = reference(f.cfg, dt, micro);
      ThreadPool pool(2);  // the reference's pool size
      Context ctx;
      ctx.pool = &pool;
      ChunkSpec s = whole_model(f.cfg);
      s.micro_batch = kB;
      s.dtype = dt;
      GptChunk chunk(s, nullptr);
      init_chunk(chunk);
      REQUIRE(bitwise(chunk.flat_params(), ref.model->flat_params()));  // same layout, same values
      chunk.zero_grad();
      for (size_t i = 0; i < micro.size(); ++i) {
        REQUIRE(chunk.forward(ctx, 0, micro[i].tokens, Tensor(), Tensor(), grad_scale(f.cfg), fused) == ref.loss[i]);
        chunk.backward(ctx, 0, Tensor(), Tensor());
      }
      REQUIRE(bitwise(chunk.flat_grads(), ref.model->flat_grads()));
      REQUIRE(chunk.forward_eval(ctx, micro[0].tokens, Tensor(), Tensor()) ==
              ref.model->forward_loss(ctx, micro[0].tokens));
    }
  }
}

TEST_CASE("families: every TP layout (SP on and off, dropout on and off) matches GptModel", "[chunk][family][tp]") {
  for (bool dropout : {false, true}) {
    for (const Family& f : families(2)) {
      const GptConfig cfg = dropout ? with_dropout(f.cfg) : f.cfg;
      std::vector<int> sizes = tp_sizes(cfg);
      sizes.insert(sizes.begin(), 1);
      for (int t : sizes) {
        for (bool sp : {false, true}) {
          if (t == 1 && sp) continue;
          for (DType dt : {DType::f32, DType::f64}) {
            INFO(f.name << (dropout ? " with dropout" : "") << " t=" << t << " sp=" << sp << " " << dtype_name(dt));
            const auto [loss_err, grad_err] = check_tp_against_reference(cfg, t, sp, dt, sp ? 8 : 0);
            if (verbose())
              std::printf("%s%s t=%d sp=%d %s vs GptModel: loss %.3g grad %.3g\n", f.name, dropout ? " dropout" : "", t,
                          sp, dtype_name(dt), loss_err, grad_err);
            CHECK(loss_err < (dt == DType::f32 ? 1e-5 : 1e-11));
            CHECK(grad_err < (dt == DType::f32 ? 1e-5 : 1e-10));
          }
        }
      }
    }
  }
}

TEST_CASE("families, t=1: gradients match finite differences of the chunk's loss (f64)", "[chunk][family][grad]") {
  for (const Family& f : families()) {
    INFO(f.name);
    check_fd(f.cfg, 1, false, {2, 1});  // the whole model's parameters; the head stage's input
  }
}

TEST_CASE("families, t>1 with SP: gradients match finite differences of the chunk's loss (f64)",
          "[chunk][family][tp][grad]") {
  for (const Family& f : families()) {
    for (int t : tp_sizes(f.cfg)) {
      if (t == 3) continue;  // t = 2 and 4 cover the splits; 3 runs in the layout test
      INFO(f.name << " t=" << t);
      check_fd(f.cfg, t, true, {2, 1}, 2);
    }
  }
  // Without sequence parallelism (the plain f / g operators, replicated input), one family each.
  check_fd(llama(), 2, false, {2, 1}, 2);
  check_fd(bloom(), 2, false, {2}, 2);
}

TEST_CASE("families: every TP layout (SP on and off) equals the t=1 chunk", "[chunk][family][tp]") {
  for (const Family& f : families()) {
    const auto micro = micro_batches(f.cfg, 2, 31);
    for (int which : {2, 0, 1}) {  // whole model; embedding stage (dout in); head stage (input in)
      const ChunkSpec s = stages_of(f.cfg)[which];
      for (int t : tp_sizes(f.cfg)) {
        for (bool sp : {false, true}) {
          for (DType dt : {DType::f64, DType::f32}) {
            if (dt == DType::f32 && which != 2) continue;
            INFO(f.name << " stage " << which << " t=" << t << " sp=" << sp << " " << dtype_name(dt));
            const auto [loss_err, grad_err] = tp_vs_one(s, t, sp, dt, micro, "F0 B0 F1 B1");
            if (verbose())
              std::printf("%s stage %d t=%d sp=%d %s: loss %.3g grad %.3g\n", f.name, which, t, sp, dtype_name(dt),
                          loss_err, grad_err);
            CHECK(loss_err < (dt == DType::f32 ? 1e-5 : 1e-12));
            CHECK(grad_err < (dt == DType::f32 ? 1e-4 : 1e-10));
          }
        }
      }
    }
  }
}

TEST_CASE("families with dropout: TP layouts equal the t=1 chunk (the masks do not depend on the layout)",
          "[chunk][family][tp][dropout]") {
  for (const GptConfig& cfg : {with_dropout(llama_wide()), with_dropout(bloom(2, 6))}) {
    const auto micro = micro_batches(cfg, 2, 32);
    for (int t : tp_sizes(cfg)) {
      INFO("heads " << cfg.num_attention_heads << " t=" << t);
      const auto [loss_err, grad_err] = tp_vs_one(whole_model(cfg), t, true, DType::f64, micro, "F0 B0 F1 B1");
      CHECK(loss_err < 1e-12);
      CHECK(grad_err < 1e-10);
    }
    // The masks apply: the dropout-free model gives another loss on the same weights and tokens.
    GptConfig plain = cfg;
    plain.hidden_dropout = plain.attention_dropout = 0;
    const auto a = run_chunk(whole_model(cfg), 1, DType::f64, micro, "F0 B0");
    const auto b = run_chunk(whole_model(plain), 1, DType::f64, micro, "F0 B0");
    CHECK(std::abs(a[0].loss[0] - b[0].loss[0]) > 1e-6 * std::abs(b[0].loss[0]));
  }
}

TEST_CASE("families: recompute, split backward, slots in flight and the fused head are bitwise the plain run",
          "[chunk][family]") {
  for (const GptConfig& cfg : {llama(3), llama_partial(3), bloom(3), with_dropout(bloom(3, 6)),
                               with_dropout(llama_wide(3))}) {
    const auto micro = micro_batches(cfg, 3, 33);
    for (auto [t, sp] : {std::pair{1, false}, std::pair{2, true}}) {
      for (ChunkSpec s : stages_of(cfg)) {
        INFO("heads " << cfg.num_attention_heads << " groups " << cfg.query_groups() << " t=" << t << " embedding="
                      << s.has_embedding << " head=" << s.has_head);
        s.sequence_parallel = sp;
        const auto base = run_chunk(s, t, DType::f32, micro, "F0 B0 F1 B1 F2 B2");
        for (Recompute rc : {Recompute::none, Recompute::full, Recompute::selective}) {
          INFO("recompute " << static_cast<int>(rc));
          s.recompute = rc;
          if (rc != Recompute::none) require_same(run_chunk(s, t, DType::f32, micro, "F0 B0 F1 B1 F2 B2"), base);
          require_same(run_chunk(s, t, DType::f32, micro, "F0 B0 W0 F1 B1 W1 F2 B2 W2"), base);
          require_same(run_chunk(s, t, DType::f32, micro, "F0 F1 B0 F2 B1 W0 B2 W1 W2", 3), base);
          require_same(run_chunk(s, t, DType::f32, micro, "H0 B0 H1 B1 H2 B2"), base);
        }
      }
    }
  }
}

TEST_CASE("families, t=1: a pipeline split chained equals the whole-model chunk", "[chunk][family]") {
  for (const GptConfig& cfg : {llama(3), bloom(3)}) {
    const bool tied = !cfg.untie_embeddings_and_output_weights;
    const auto micro = micro_batches(cfg, 2, 34);
    const auto whole = run_chunk(whole_model(cfg), 1, DType::f32, micro, "F0 B0 F1 B1");
    ThreadPool pool(1);  // run_chunk's ranks run one thread each
    Context ctx;
    ctx.pool = &pool;
    const int p = 2;
    std::vector<std::unique_ptr<GptChunk>> chunks;
    for (int k = 0; k < p; ++k) {
      ChunkSpec s = chunk_layers(cfg, p, 1, k, 0);
      s.micro_batch = kB;
      chunks.push_back(std::make_unique<GptChunk>(s, nullptr));
      init_chunk(*chunks.back());
      chunks.back()->zero_grad();
    }
    const int64_t N = kB * cfg.seq_length, C = cfg.hidden_size;
    for (size_t i = 0; i < micro.size(); ++i) {
      Tensor act = Tensor::empty({N, C});
      chunks[0]->forward(ctx, 0, micro[i].tokens, Tensor(), act, grad_scale(cfg));
      const double loss = chunks[1]->forward(ctx, 0, micro[i].tokens, act, Tensor(), grad_scale(cfg));
      REQUIRE(loss == whole[0].loss[i]);
      Tensor din = Tensor::empty({N, C});
      chunks[1]->backward(ctx, 0, Tensor(), din);
      chunks[0]->backward(ctx, 0, din, Tensor());
    }
    // Untied: every parameter lives on one stage, so every gradient is bitwise the whole model's. Tied:
    // wte's two copies add the whole model's terms in another order.
    Tensor wte_sum = Tensor::zeros(grad_of(whole[0], "transformer.wte.weight").shape());
    int seen = 0;
    for (const auto& c : chunks) {
      const auto gs = c->grads();
      for (size_t k = 0; k < c->specs().size(); ++k) {
        const std::string& name = c->specs()[k].name;
        INFO(name);
        ++seen;
        if (tied && name == "transformer.wte.weight") {
          ops::add_inplace(ctx, wte_sum, gs[k]);
          continue;
        }
        REQUIRE(bitwise(gs[k], grad_of(whole[0], name)));
      }
    }
    REQUIRE(seen == static_cast<int>(whole[0].specs.size()) + (tied ? 1 : 0));
    if (tied) CHECK(test::max_rel_diff(wte_sum, grad_of(whole[0], "transformer.wte.weight")) < 1e-6);
  }
}

TEST_CASE("families: unit hooks give the resident results", "[chunk][family]") {
  check_unit_hooks(llama(3));
  check_unit_hooks(bloom(3));
}

namespace {
// Records every point a chunk shows, as (where, tensor, direction).
class RecordingProbe final : public OpProbe {
 public:
  void after(const ProbePoint& at, const Tensor& result) override {
    REQUIRE(result.defined());
    const std::string where = at.layer >= 0 ? "layer" : at.layer == kEmbeddingProbe ? "embedding" : "head";
    seen.insert({where, at.tensor, at.dir});
  }
  std::set<std::tuple<std::string, std::string, ProbeDir>> seen;
};
}  // namespace

TEST_CASE("families: every point the chunk shows is a NaN-locator name with that direction", "[chunk][family]") {
  // TROUPE_FAULT_NAN and the NaN watch accept exactly gpt_probe_names(); the family's own points
  // (attention_rotary, mlp_swiglu, ln_embd) must be among them, and appear.
  std::map<std::pair<std::string, std::string>, ProbeName> names;
  for (const ProbeName& n : gpt_probe_names()) names[{n.where, n.tensor}] = n;
  for (const GptConfig& cfg : {llama(2), bloom(2), tiny(2)}) {
    RecordingProbe probe;
    ThreadPool pool(1);
    Context ctx;
    ctx.pool = &pool;
    const auto micro = micro_batches(cfg, 1, 36);
    for (Recompute rc : {Recompute::none, Recompute::selective}) {
      ChunkSpec s = whole_model(cfg);
      s.micro_batch = kB;
      s.recompute = rc;
      GptChunk chunk(s, nullptr);
      init_chunk(chunk);
      chunk.set_probe(&probe);
      chunk.forward(ctx, 0, micro[0].tokens, Tensor(), Tensor(), grad_scale(cfg));
      chunk.backward(ctx, 0, Tensor(), Tensor(), true);
      chunk.backward_weight(ctx, 0);
    }
    for (const auto& [where, tensor, dir] : probe.seen) {
      INFO(where << ":" << tensor << ":" << probe_dir_name(dir));
      const auto it = names.find({where, tensor});
      REQUIRE(it != names.end());
      REQUIRE((dir == ProbeDir::forward ? it->second.forward : dir == ProbeDir::backward ? it->second.backward
                                                                                         : it->second.weight));
    }
    auto shown = [&](const char* where, const char* tensor) {
      for (const auto& [w, t, d] : probe.seen)
        if (w == where && t == tensor) return true;
      return false;
    };
    const bool rope = cfg.position_embedding == PositionEmbedding::rope;
    CHECK(shown("layer", "attention_rotary") == rope);
    CHECK(shown("layer", "mlp_swiglu") == (cfg.activation == MlpActivation::swiglu));
    CHECK(shown("layer", "mlp_gelu") == (cfg.activation == MlpActivation::gelu));
    CHECK(shown("embedding", "ln_embd") == cfg.embed_layernorm);
  }
}
