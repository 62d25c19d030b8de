// The harness of the GptChunk tests (test_gpt_chunk.cpp: GPT-2, test_gpt_chunk_family.cpp: the other
// families): tiny configs, deterministic perturbed initial values, TP ranks as threads on the local
// comm backend, scripted forward / backward / weight calls, the GptModel reference, and the shared
// checks (bitwise equality of two runs, finite differences in double, unit hooks).
// Catch2 is not thread-safe: rank threads only compute and record; the main thread checks.
#pragma once
#include <algorithm>
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
#include <vector>

#include <catch2/catch.hpp>

#include "comm/local/local_world.hpp"
#include "model/gpt_chunk.hpp"
#include "reference/gpt.hpp"
#include "tests/kernels/grad_check.hpp"

namespace troupe::chunk_test {

constexpr int kB = 3;
constexpr uint64_t kSeed = 1234;

inline GptConfig tiny(int layers = 4, int heads = 6) {
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

inline double grad_scale(const GptConfig& c) { return 1.0 / (kB * c.seq_length); }

inline Tensor random_windows(std::mt19937_64& rng, const GptConfig& c) {
  Tensor t = Tensor::empty({kB, c.seq_length + 1}, DType::i32);
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(c.vocab_size - 1));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = u(rng);
  return t;
}

inline bool bitwise(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

inline double get(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f32 ? static_cast<double>(t.data<float>()[i]) : t.data<double>()[i];
}
inline void set(const Tensor& t, int64_t i, double v) {
  if (t.dtype() == DType::f32) t.data<float>()[i] = static_cast<float>(v);
  else t.data<double>()[i] = v;
}

// Adds a perturbation in [-0.3, 0.3) defined by (name, global index), so that LayerNorm weights and
// biases (1 and 0 at init) are non-trivial and every layout gets the same values.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline void perturb(const ParamSpec& s, const Tensor& p) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : s.name) h = (h ^ ch) * 1099511628211ULL;
  for (int64_t i = 0; i < p.numel(); ++i) {
    const int64_t g = slice_global_index(s, i);
    if (g < 0) continue;
    const double u = static_cast<double>(mix(h ^ mix(static_cast<uint64_t>(g))) >> 11) * 0x1.0p-53;
    set(p, i, get(p, i) + 0.6 * u - 0.3);
  }
}

inline void init_reference(GptModel& m) {
  m.init(kSeed);
  for (size_t k = 0; k < m.specs().size(); ++k) perturb(m.specs()[k], m.params()[k]);
}
inline void init_chunk(GptChunk& c) {
  c.init(kSeed);
  const auto ps = c.params();
  for (size_t k = 0; k < c.specs().size(); ++k) perturb(c.specs()[k], ps[k]);
}

// The reference gradient at this shard's slice of spec s (padding: 0).
inline Tensor slice_of(const Tensor& full, const ParamSpec& s) {
  Tensor out = Tensor::zeros(s.local_shape, DType::f64);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const int64_t g = slice_global_index(s, i);
    if (g >= 0) out.data<double>()[i] = get(full, g);
  }
  return out;
}

// Rows [r0, r0 + n) of a (N, C) tensor as a new tensor.
inline Tensor row_block(const Tensor& x, int64_t r0, int64_t n) { return x.rows(r0, r0 + n).clone(); }

// Sequence-parallel row blocks (the chunk's rule).
inline int64_t sp_rows(int64_t N, int t, int r) { return N / t + (r < N % t ? 1 : 0); }
inline int64_t sp_offset(int64_t N, int t, int r) { return r * (N / t) + std::min<int64_t>(r, N % t); }

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

inline std::vector<int> tp_group(int r, int t) {
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
inline std::vector<RankResult> run_chunk(ChunkSpec spec, int t, DType dt, const std::vector<Micro>& micro,
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

inline Reference reference(const GptConfig& cfg, DType dt, const std::vector<Micro>& micro) {
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

inline std::vector<Micro> micro_batches(const GptConfig& cfg, int count, uint64_t seed) {
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

inline bool verbose() { return std::getenv("TROUPE_TEST_VERBOSE") != nullptr; }

inline ChunkSpec whole_model(const GptConfig& cfg) { return chunk_layers(cfg, 1, 1, 0, 0); }


// The t = 1 chunk's gradient of `name` (a full tensor, wte / lm_head padded).
inline const Tensor& grad_of(const RankResult& one, const std::string& name) {
  for (size_t k = 0; k < one.specs.size(); ++k)
    if (one.specs[k].name == name) return one.grad_views[k];
  FAIL("no parameter " << name);
  return one.grad_views[0];
}

// Runs `s` on t TP ranks and on one; returns (max loss rel error, max gradient rel error), every
// rank's slice of every gradient compared with the single rank's, replicated ones bitwise alike.
inline std::pair<double, double> tp_vs_one(ChunkSpec s, int t, bool sp, DType dt, const std::vector<Micro>& micro,
                                    const std::string& script) {
  s.sequence_parallel = false;
  const auto one = run_chunk(s, 1, dt, micro, script);
  s.sequence_parallel = sp;
  const auto res = run_chunk(s, t, dt, micro, script);
  double loss_err = 0, grad_err = 0;
  const int64_t N = kB * s.model.seq_length;
  for (int r = 0; r < t; ++r) {
    for (size_t i = 0; i < micro.size(); ++i) {
      REQUIRE(res[r].loss[i] == res[0].loss[i]);
      if (s.has_head)
        loss_err = std::max(loss_err, std::abs(res[r].loss[i] - one[0].loss[i]) / std::abs(one[0].loss[i]));
      // The boundary tensors: this rank's rows of the single rank's.
      const int64_t rows = sp ? sp_rows(N, t, r) : N, r0 = sp ? sp_offset(N, t, r) : 0;
      if (res[r].din[i].defined())
        grad_err = std::max(grad_err, test::max_rel_diff(res[r].din[i], row_block(one[0].din[i], r0, rows)));
      if (res[r].out[i].defined())
        grad_err = std::max(grad_err, test::max_rel_diff(res[r].out[i], row_block(one[0].out[i], r0, rows)));
    }
    for (size_t k = 0; k < res[r].specs.size(); ++k) {
      const ParamSpec& ps = res[r].specs[k];
      INFO("rank " << r << " " << ps.name);
      grad_err = std::max(grad_err, test::max_rel_diff(res[r].grad_views[k], slice_of(grad_of(one[0], ps.name), ps)));
      if (ps.slice.dim < 0) REQUIRE(bitwise(res[r].grad_views[k], res[0].grad_views[k]));
    }
  }
  return {loss_err, grad_err};
}

// Runs `spec` (whole model or a p = 2 stage) on t TP ranks and checks loss and every gradient slice
// against GptModel. Returns (max loss rel error, max gradient rel error).
inline std::pair<double, double> check_tp_against_reference(const GptConfig& cfg, int t, bool sp, DType dt,
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

inline void require_same(const std::vector<RankResult>& a, const std::vector<RankResult>& b) {
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
inline std::vector<ChunkSpec> stages_of(const GptConfig& cfg) {
  return {chunk_layers(cfg, 2, 1, 0, 0), chunk_layers(cfg, 2, 1, 1, 0), whole_model(cfg)};
}

// Finite differences in double of the chunk's loss (forward_eval, scaled as the training loss) against
// its backward on t TP ranks: `trials` random elements of every parameter (perturbed wherever they are
// held) and, for a chunk without the embedding, of its input. stages: indices into stages_of(cfg).
inline void check_fd(const GptConfig& cfg, int t, bool sp, const std::vector<int>& stages, int trials = 3) {
  const DType dt = DType::f64;
  const auto micro = micro_batches(cfg, 1, 18);
  const int64_t N = kB * cfg.seq_length, C = cfg.hidden_size;
  // Whole model (parameters) and the last stage of a p = 2 split (input elements).
  for (int which : stages) {
    ChunkSpec s = stages_of(cfg)[which];
    s.sequence_parallel = sp;
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
      in[r] = sp ? row_block(micro[0].input, sp_offset(N, t, r), sp_rows(N, t, r)) : micro[0].input.clone();
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
      for (int trial = 0; trial < trials; ++trial) {
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
        const std::string what = "input[" + std::to_string(n) + "," + std::to_string(c) + "]";
        if (!sp) {  // every rank holds every row: perturb them all; each rank's din is the whole gradient
          std::vector<double*> where;
          for (int r = 0; r < t; ++r) where.push_back(in[r].data<double>() + n * C + c);
          check(what, where, din[0].data<double>()[n * C + c]);
          continue;
        }
        int r = 0;
        while (n >= sp_offset(N, t, r) + sp_rows(N, t, r)) ++r;
        const int64_t i = (n - sp_offset(N, t, r)) * C + c;
        check(what, {in[r].data<double>() + i}, din[r].data<double>()[i]);
      }
    }
  }
}

// Unit hooks (ZeRO's acquire / release / grad_buffer / grads_ready) give the resident chunk's results on
// the embedding stage, the head stage and the whole model, with and without a deferred weight pass and
// with the head fused into the forward; every unit reported once per micro-batch.
inline void check_unit_hooks(const GptConfig& cfg) {
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

}  // namespace troupe::chunk_test
