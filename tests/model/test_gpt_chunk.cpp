// GptChunk against GptModel (the 1x1x1 reference): bitwise for t = 1 whatever the pipeline split,
// recompute mode, split backward, slot order or unit hooks; within rounding for tensor parallelism
// (threads on the local comm backend), with finite differences in double for TP + SP.
// Catch2 is not thread-safe: rank threads only compute and record; the main thread checks.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "comm/local/local_world.hpp"
#include "reference/gpt.hpp"
#include "model/gpt_chunk.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;

namespace {

constexpr int kB = 3;
constexpr uint64_t kSeed = 1234;

GptConfig tiny(int layers = 4, int heads = 6) {
  GptConfig c;
  c.num_layers = layers;
  c.hidden_size = 12;
  c.num_attention_heads = heads;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 4;  // Vp = 40 (t = 1, 2), 48 (t = 3): real and padding rows split
  return c;
}

double grad_scale(const GptConfig& c) { return 1.0 / (kB * c.seq_length); }

Tensor random_windows(std::mt19937_64& rng, const GptConfig& c) {
  Tensor t = Tensor::empty({kB, c.seq_length + 1}, DType::i32);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(c.vocab_size - 1));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = u(rng);
  return t;
}

bool bitwise(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

double get(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f32 ? static_cast<double>(t.data<float>()[i]) : t.data<double>()[i];
}
void set(const Tensor& t, int64_t i, double v) {
  if (t.dtype() == DType::f32) t.data<float>()[i] = static_cast<float>(v);
  else t.data<double>()[i] = v;
}

// Adds a perturbation in [-0.3, 0.3) defined by (name, global index), so that LayerNorm weights and
// biases (1 and 0 at init) are non-trivial and every layout gets the same values.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
void perturb(const ParamSpec& s, const Tensor& p) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : s.name) h = (h ^ ch) * 1099511628211ULL;
  for (int64_t i = 0; i < p.numel(); ++i) {
    const int64_t g = slice_global_index(s, i);
    if (g < 0) continue;
    const double u = static_cast<double>(mix(h ^ mix(static_cast<uint64_t>(g))) >> 11) * 0x1.0p-53;
    set(p, i, get(p, i) + 0.6 * u - 0.3);
  }
}

void init_reference(GptModel& m) {
  m.init(kSeed);
  for (size_t k = 0; k < m.specs().size(); ++k) perturb(m.specs()[k], m.params()[k]);
}
void init_chunk(GptChunk& c) {
  c.init(kSeed);
  const auto ps = c.params();
  for (size_t k = 0; k < c.specs().size(); ++k) perturb(c.specs()[k], ps[k]);
}

// The reference gradient at this shard's slice of spec s (padding: 0).
Tensor slice_of(const Tensor& full, const ParamSpec& s) {
  Tensor out = Tensor::zeros(s.local_shape, DType::f64);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const int64_t g = slice_global_index(s, i);
    if (g >= 0) out.data<double>()[i] = get(full, g);
  }
  return out;
}

// Rows [r0, r0 + n) of a (N, C) tensor as a new tensor.
Tensor row_block(const Tensor& x, int64_t r0, int64_t n) { return x.rows(r0, r0 + n).clone(); }

// Sequence-parallel row blocks (the chunk's rule).
int64_t sp_rows(int64_t N, int t, int r) { return N / t + (r < N % t ? 1 : 0); }
int64_t sp_offset(int64_t N, int t, int r) { return r * (N / t) + std::min<int64_t>(r, N % t); }

// ---- ranks on the local backend ---------------------------------------------------------------

// n ranks (threads) of one local fabric; rank r's TP group is groups[r] (world ranks).
class Ranks {
 public:
  Ranks(int n, const std::function<std::vector<int>(int)>& group_of, int threads_per_rank = 1) : n_(n) {
    auto f = comm::LocalFabric::create(n);
    REQUIRE(f.is_ok());
    fabric_ = std::make_unique<comm::LocalFabric>(f.value());
    worlds_.resize(n);
    tp_.resize(n);
    for (int r = 0; r < n; ++r) {
      worlds_[r] = fabric_->world(r);
      pools_.push_back(std::make_unique<ThreadPool>(threads_per_rank));
      ctx_.emplace_back();
      ctx_.back().pool = pools_.back().get();
    }
    std::vector<std::string> errors(n);
    run([&](int r) {
      auto g = worlds_[r]->group(group_of(r));
      if (g.is_ok()) tp_[r] = std::move(g.value());
      else errors[r] = g.status().message();
    });
    for (const auto& e : errors) REQUIRE(e == "");
  }
  int size() const { return n_; }
  comm::Communicator* tp(int r) const { return tp_[r].get(); }
  Context& ctx(int r) { return ctx_[r]; }
  void run(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r) threads.emplace_back([&, r] { fn(r); });
    for (auto& th : threads) th.join();
  }

 private:
  int n_;
  std::unique_ptr<comm::LocalFabric> fabric_;
  std::vector<std::unique_ptr<comm::CommWorld>> worlds_;
  std::vector<std::unique_ptr<comm::Communicator>> tp_;
  std::vector<std::unique_ptr<ThreadPool>> pools_;
  std::vector<Context> ctx_;
};

std::vector<int> tp_group(int r, int t) {
  std::vector<int> g;
  for (int q = 0; q < t; ++q) g.push_back(r / t * t + q);
  return g;
}

// ---- running one chunk on t TP ranks ----------------------------------------------------------

// What one micro-batch feeds a chunk: tokens, and the full (N, C) input / output gradient when the
// chunk has no embedding / no head (each rank takes its rows under sequence parallelism).
struct Micro {
  Tensor tokens, input, dout;
  MicroBatchKey key;  // the dropout masks' key (used by configs with dropout)
};

struct RankResult {
  std::vector<double> loss;   // per micro-batch
  std::vector<Tensor> din;    // per micro-batch, this rank's rows
  std::vector<Tensor> out;
  Tensor grads;               // flat, after all micro-batches
  std::vector<ParamSpec> specs;
  std::vector<Tensor> grad_views;
};

// script: "F0 F1 B0 W0 ..." in order; B defers the weight pass when a W of the same micro-batch
// appears in the script; H is F with head_backward_now (the head's backward fused into the forward).
// Slots: the lowest free one at F.
std::vector<RankResult> run_chunk(ChunkSpec spec, int t, DType dt, const std::vector<Micro>& micro,
                                  const std::string& script, int slots = 1) {
  Ranks ranks(t, [&](int r) { return tp_group(r, t); });
  spec.dtype = dt;
  spec.tp_size = t;
  spec.micro_batch = kB;
  spec.slots = slots;
  std::vector<std::unique_ptr<GptChunk>> chunks;
  for (int r = 0; r < t; ++r) {
    ChunkSpec s = spec;
    s.tp_rank = r;
    chunks.push_back(std::make_unique<GptChunk>(s, ranks.tp(r)));
    init_chunk(*chunks.back());
    chunks.back()->zero_grad();
  }
  std::vector<std::pair<char, int>> steps;
  for (size_t i = 0; i < script.size();) {
    if (script[i] == ' ') {
      ++i;
      continue;
    }
    const char kind = script[i++];
    int m = 0;
    while (i < script.size() && script[i] >= '0' && script[i] <= '9') m = m * 10 + (script[i++] - '0');
    steps.emplace_back(kind, m);
  }
  const int64_t N = kB * spec.model.seq_length, C = spec.model.hidden_size;
  std::vector<RankResult> res(t);
  ranks.run([&](int r) {
    GptChunk& c = *chunks[r];
    Context& ctx = ranks.ctx(r);
    const int64_t rows = c.boundary_rows(), r0 = spec.sequence_parallel ? sp_offset(N, t, r) : 0;
    RankResult& out = res[r];
    out.loss.assign(micro.size(), 0.0);
    out.din.resize(micro.size());
    out.out.resize(micro.size());
    std::map<int, int> slot_of;
    std::vector<bool> busy(slots, false);
    for (auto [kind, m] : steps) {
      const Micro& mb = micro[m];
      if (kind == 'F' || kind == 'H') {
        int s = 0;
        while (busy[s]) ++s;
        busy[s] = true;
        slot_of[m] = s;
        Tensor in = spec.has_embedding ? Tensor() : row_block(mb.input.to(dt), r0, rows);
        if (!spec.has_head) out.out[m] = Tensor::zeros({rows, C}, dt);
        out.loss[m] = c.forward(ctx, s, mb.tokens, in, out.out[m], grad_scale(spec.model), kind == 'H', mb.key);
      } else if (kind == 'B') {
        bool defer = false;
        for (auto [k2, m2] : steps) defer = defer || (k2 == 'W' && m2 == m);
        Tensor dout = spec.has_head ? Tensor() : row_block(mb.dout.to(dt), r0, rows);
        if (!spec.has_embedding) out.din[m] = Tensor::zeros({rows, C}, dt);
        c.backward(ctx, slot_of[m], dout, out.din[m], defer);
        if (!defer) busy[slot_of[m]] = false;
      } else {
        c.backward_weight(ctx, slot_of[m]);
        busy[slot_of[m]] = false;
      }
    }
    out.grads = c.flat_grads().clone();
    out.specs = c.specs();
    for (const Tensor& g : c.grads()) out.grad_views.push_back(g);
  });
  // Keep the views valid: point them into the clone.
  for (int r = 0; r < t; ++r) {
    int64_t off = 0;
    for (size_t k = 0; k < res[r].specs.size(); ++k) {
      const int64_t n = res[r].specs[k].local_shape.numel();
      res[r].grad_views[k] = res[r].grads.rows(off, off + n).view(res[r].specs[k].local_shape);
      off += n;
    }
  }
  return res;
}

// The reference: GptModel, same initial values, the same micro-batches accumulated.
struct Reference {
  std::vector<double> loss;
  std::unique_ptr<GptModel> model;
  std::map<std::string, int> index;
  const Tensor& grad(const std::string& name) const { return model->grads()[index.at(name)]; }
};

Reference reference(const GptConfig& cfg, DType dt, const std::vector<Micro>& micro) {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  Reference ref;
  ref.model = std::make_unique<GptModel>(cfg, kB, dt);
  init_reference(*ref.model);
  ref.model->zero_grad();
  for (const Micro& m : micro) ref.loss.push_back(ref.model->forward_backward(ctx, m.tokens, grad_scale(cfg), m.key));
  for (size_t k = 0; k < ref.model->specs().size(); ++k) ref.index[ref.model->specs()[k].name] = static_cast<int>(k);
  return ref;
}

std::vector<Micro> micro_batches(const GptConfig& cfg, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t N = kB * cfg.seq_length, C = cfg.hidden_size;
  std::vector<Micro> m;
  for (int i = 0; i < count; ++i) {
    Micro x;
    x.tokens = random_windows(rng, cfg);
    x.input = test::random_tensor({N, C}, rng);
    x.dout = test::random_tensor({N, C}, rng, -0.05, 0.05);
    x.key = MicroBatchKey{seed, 3, int64_t{i} * kB};  // micro-batch i of an iteration's global batch
    m.push_back(x);
  }
  return m;
}

bool verbose() { return std::getenv("TROUPE_TEST_VERBOSE") != nullptr; }

ChunkSpec whole_model(const GptConfig& cfg) { return chunk_layers(cfg, 1, 1, 0, 0); }

}  // namespace

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

namespace {
// Runs `spec` (whole model or a p = 2 stage) on t TP ranks and checks loss and every gradient slice
// against GptModel. Returns (max loss rel error, max gradient rel error).
std::pair<double, double> check_tp_against_reference(const GptConfig& cfg, int t, bool sp, DType dt,
                                                     int64_t head_chunk_rows) {
  const auto micro = micro_batches(cfg, 2, 13);
  Reference ref = reference(cfg, dt, micro);
  ChunkSpec s = whole_model(cfg);
  s.sequence_parallel = sp;
  s.head_chunk_rows = head_chunk_rows;
  auto res = run_chunk(s, t, dt, micro, "F0 B0 F1 B1");
  double loss_err = 0, grad_err = 0;
  for (int r = 0; r < t; ++r) {
    for (size_t i = 0; i < micro.size(); ++i) {
      REQUIRE(res[r].loss[i] == res[0].loss[i]);  // identical on every rank
      loss_err = std::max(loss_err, std::abs(res[r].loss[i] - ref.loss[i]) / std::abs(ref.loss[i]));
    }
    for (size_t k = 0; k < res[r].specs.size(); ++k) {
      const ParamSpec& ps = res[r].specs[k];
      INFO("rank " << r << " " << ps.name);
      grad_err = std::max(grad_err, test::max_rel_diff(res[r].grad_views[k], slice_of(ref.grad(ps.name), ps)));
      if (ps.slice.dim < 0) REQUIRE(bitwise(res[r].grad_views[k], res[0].grad_views[k]));  // replicated
    }
  }
  return {loss_err, grad_err};
}
}  // namespace

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

namespace {
void require_same(const std::vector<RankResult>& a, const std::vector<RankResult>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(a[r].loss == b[r].loss);
    REQUIRE(bitwise(a[r].grads, b[r].grads));
    for (size_t i = 0; i < a[r].din.size(); ++i) {
      REQUIRE(a[r].din[i].defined() == b[r].din[i].defined());
      if (a[r].din[i].defined()) REQUIRE(bitwise(a[r].din[i], b[r].din[i]));
      if (a[r].out[i].defined()) REQUIRE(bitwise(a[r].out[i], b[r].out[i]));
    }
  }
}

// The two halves of a p = 2 split: an embedding chunk (dout in, no din) and a head chunk (input in).
std::vector<ChunkSpec> stages_of(const GptConfig& cfg) {
  return {chunk_layers(cfg, 2, 1, 0, 0), chunk_layers(cfg, 2, 1, 1, 0), whole_model(cfg)};
}
}  // namespace

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
  const GptConfig cfg = tiny(3);
  const auto micro = micro_batches(cfg, 2, 17);
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  const int64_t N = kB * cfg.seq_length, C = cfg.hidden_size;
  for (int which : {0, 1, 2}) {  // embedding stage, head stage (wte copy in the head unit), whole model
    for (int mode : {0, 1, 2}) {  // backward at once, deferred weight pass, head fused into the forward
      const bool defer = mode == 1, fused = mode == 2;
      ChunkSpec s = stages_of(cfg)[which];
      s.micro_batch = kB;
      INFO("chunk " << which << " defer " << defer << " fused " << fused);
      GptChunk resident(s, nullptr);
      init_chunk(resident);
      resident.zero_grad();

      // Hooks: fresh copies of the resident parameters, poisoned on release; gradient buffers owned
      // here; a log of every call.
      const auto& units = resident.units();
      std::map<int, std::vector<Tensor>> live;  // unit -> acquired copies not yet released
      std::vector<Tensor> gbuf;
      for (const UnitInfo& u : units) gbuf.push_back(Tensor::zeros({u.numel}));
      std::vector<std::string> log;
      std::vector<std::vector<Tensor>> snapshots(units.size());
      UnitHooks h;
      h.acquire_params = [&](int u, Pass pass) {
        const UnitInfo& info = units[u];
        Tensor copy = resident.flat_params().rows(info.param_offset, info.param_offset + info.numel).clone();
        live[u].push_back(copy);
        log.push_back("A" + std::to_string(u) + (pass == Pass::forward ? "f" : "b"));
        return copy;
      };
      h.release_params = [&](int u, Pass) {
        REQUIRE(!live[u].empty());
        Tensor t = live[u].back();
        live[u].pop_back();
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = std::nanf("");
        log.push_back("R" + std::to_string(u));
      };
      h.grad_buffer = [&](int u) {
        log.push_back("G" + std::to_string(u));
        return gbuf[u];
      };
      h.grads_ready = [&](int u, int slot) {
        log.push_back("Y" + std::to_string(u));
        snapshots[u].push_back(gbuf[u].clone());
      };
      GptChunk hooked(s, nullptr, h);
      REQUIRE_FALSE(hooked.flat_params().defined());
      REQUIRE_FALSE(hooked.flat_grads().defined());
      REQUIRE(hooked.param_bytes() == 0);
      REQUIRE(hooked.grad_bytes() == 0);

      for (size_t i = 0; i < micro.size(); ++i) {
        for (GptChunk* c : {&resident, &hooked}) {
          Tensor in = s.has_embedding ? Tensor() : micro[i].input.to(DType::f32);
          Tensor out = s.has_head ? Tensor() : Tensor::empty({N, C});
          Tensor din = s.has_embedding ? Tensor() : Tensor::empty({N, C});
          const double loss = c->forward(ctx, 0, micro[i].tokens, in, out, grad_scale(cfg), fused);
          if (c == &hooked) {
            REQUIRE(loss == resident.forward_eval(ctx, micro[i].tokens, in, out));
            for (auto& [u, v] : live) REQUIRE(v.empty());  // everything acquired was released
          }
          const size_t before = log.size();
          c->backward(ctx, 0, s.has_head ? Tensor() : micro[i].dout.to(DType::f32), din, defer);
          if (c == &hooked && defer) {
            for (size_t e = before; e < log.size(); ++e) REQUIRE(log[e][0] != 'Y');  // no weight grads in B
          }
          if (defer) c->backward_weight(ctx, 0);
          if (c == &hooked) for (auto& [u, v] : live) REQUIRE(v.empty());
        }
        // Each unit reported once for this micro-batch, and its buffer was final when it was.
        for (size_t u = 0; u < units.size(); ++u) {
          INFO("unit " << u);
          REQUIRE(snapshots[u].size() == i + 1);
          REQUIRE(bitwise(snapshots[u].back(), gbuf[u]));
        }
      }
      for (size_t u = 0; u < units.size(); ++u) {
        const Tensor mine = resident.flat_grads().rows(units[u].param_offset, units[u].param_offset + units[u].numel);
        REQUIRE(bitwise(gbuf[u], mine));
      }
      // grad_buffer is asked before a unit's gradients of a micro-batch, grads_ready after.
      for (size_t u = 0; u < units.size(); ++u) {
        int asked = 0, ready = 0;
        for (const std::string& e : log) {
          if (e == "G" + std::to_string(u)) {
            REQUIRE(asked == ready);
            ++asked;
          }
          if (e == "Y" + std::to_string(u)) ++ready;
        }
        REQUIRE(ready == static_cast<int>(micro.size()));
      }
    }
  }
}

TEST_CASE("TP + SP in double: gradients match finite differences of the chunk's loss", "[chunk][tp][grad]") {
  const GptConfig cfg = tiny(2);
  const int t = 2;
  const DType dt = DType::f64;
  const auto micro = micro_batches(cfg, 1, 18);
  const int64_t N = kB * cfg.seq_length, C = cfg.hidden_size;
  // Whole model (parameters) and the last stage of a p = 2 split (input elements).
  for (int which : {2, 1}) {
    ChunkSpec s = stages_of(cfg)[which];
    s.sequence_parallel = true;
    s.micro_batch = kB;
    s.dtype = dt;
    s.tp_size = t;
    Ranks ranks(t, [&](int r) { return tp_group(r, t); });
    std::vector<std::unique_ptr<GptChunk>> chunks;
    for (int r = 0; r < t; ++r) {
      ChunkSpec rs = s;
      rs.tp_rank = r;
      chunks.push_back(std::make_unique<GptChunk>(rs, ranks.tp(r)));
      init_chunk(*chunks.back());
      chunks.back()->zero_grad();
    }
    std::vector<Tensor> in(t), din(t);
    for (int r = 0; r < t; ++r) {
      if (s.has_embedding) continue;
      in[r] = row_block(micro[0].input, sp_offset(N, t, r), sp_rows(N, t, r));
      din[r] = Tensor::zeros(in[r].shape(), dt);
    }
    const double scale = grad_scale(cfg);
    std::vector<double> loss(t);
    ranks.run([&](int r) {
      loss[r] = chunks[r]->forward(ranks.ctx(r), 0, micro[0].tokens, in[r], Tensor(), scale);
      chunks[r]->backward(ranks.ctx(r), 0, Tensor(), din[r]);
    });
    auto objective = [&] {
      std::vector<double> l(t);
      ranks.run([&](int r) { l[r] = chunks[r]->forward_eval(ranks.ctx(r), micro[0].tokens, in[r], Tensor()); });
      return scale * l[0];
    };
    REQUIRE(objective() == Approx(scale * loss[0]).epsilon(1e-14));
    // One element at a time: perturb it wherever it is held (every rank for replicated parameters).
    auto check = [&](const std::string& what, const std::vector<double*>& where, double analytic) {
      const double h = 1e-5;
      const double saved = *where[0];
      for (double* p : where) *p = saved + h;
      const double fp = objective();
      for (double* p : where) *p = saved - h;
      const double fm = objective();
      for (double* p : where) *p = saved;
      const double fd = (fp - fm) / (2 * h);
      INFO(what << ": finite difference " << fd << " vs backward " << analytic);
      CHECK(std::abs(fd - analytic) <= 1e-8 + 1e-6 * std::max(std::abs(fd), std::abs(analytic)));
    };
    std::mt19937_64 rng(99);
    const auto& specs0 = chunks[0]->specs();
    for (size_t k = 0; k < specs0.size(); ++k) {
      const ParamSpec& global = specs0[k];
      const int64_t total = global.global_shape.numel();
      for (int trial = 0; trial < 3; ++trial) {
        const int64_t g = std::uniform_int_distribution<int64_t>(0, total - 1)(rng);
        std::vector<double*> where;
        double analytic = 0;
        for (int r = 0; r < t; ++r) {
          const ParamSpec& ps = chunks[r]->specs()[k];
          const Tensor p = chunks[r]->params()[k], gr = chunks[r]->grads()[k];
          for (int64_t i = 0; i < p.numel(); ++i) {
            if (slice_global_index(ps, i) != g) continue;
            where.push_back(p.data<double>() + i);
            analytic = gr.data<double>()[i];
          }
        }
        REQUIRE(where.size() == (global.slice.dim < 0 ? static_cast<size_t>(t) : 1u));
        check(global.name + "[" + std::to_string(g) + "]", where, analytic);
      }
    }
    if (!s.has_embedding) {
      for (int trial = 0; trial < 8; ++trial) {
        const int64_t n = std::uniform_int_distribution<int64_t>(0, N - 1)(rng);
        const int64_t c = std::uniform_int_distribution<int64_t>(0, C - 1)(rng);
        int r = 0;
        while (n >= sp_offset(N, t, r) + sp_rows(N, t, r)) ++r;
        const int64_t i = (n - sp_offset(N, t, r)) * C + c;
        check("input[" + std::to_string(n) + "," + std::to_string(c) + "]", {in[r].data<double>() + i},
              din[r].data<double>()[i]);
      }
    }
  }
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
