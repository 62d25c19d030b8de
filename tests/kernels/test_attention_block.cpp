// Blockwise causal attention (context parallelism's kernel, kernels/ops.hpp): the sequence cut into
// Megatron's load-balanced chunks (2 cp chunks, rank r holding chunks r and 2cp-1-r), each rank's
// queries meeting every rank's key/value block in ring order, equal attention_forward and
// attention_backward over the whole sequence: f64 to 1e-12, f32 to 1e-5, with grouped-query
// attention, ALiBi, attention dropout, and odd chunk lengths.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/ops.hpp"
#include "kernels/thread_pool.hpp"
#include "tests/kernels/grad_check.hpp"

namespace troupe {
namespace {

using test::random_tensor;

struct Fixture {
  ThreadPool pool{3};
  Context ctx;
  std::mt19937_64 rng{20261205};
  Fixture() { ctx.pool = &pool; }
};

DropoutMask block_mask() {
  DropoutMask m;
  m.p = 0.25;
  m.seed = 0xfeedbeef12ull;
  m.stream = 9;
  m.iteration = 4;
  m.first_sample = 3;
  return m;
}

// The global positions rank r of cp holds: chunks r and 2cp-1-r of a sequence of T rows (chunk k holds
// rows [k T / 2cp, (k+1) T / 2cp)).
std::vector<int64_t> rank_positions(int64_t T, int cp, int r) {
  std::vector<int64_t> pos;
  for (int k : {r, 2 * cp - 1 - r})
    for (int64_t i = k * T / (2 * cp); i < (k + 1) * T / (2 * cp); ++i) pos.push_back(i);
  return pos;
}

// Rows `pos` of a (B, T, W) tensor, columns [c0, c0 + w).
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& pos, int64_t c0, int64_t w) {
  const int64_t B = t.dim(0), T = t.dim(1), W = t.dim(2), n = static_cast<int64_t>(pos.size());
  const Tensor h = t.to(DType::f64);
  Tensor out = Tensor::empty({B, n, w}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < w; ++c)
        out.data<double>()[(b * n + i) * w + c] = h.data<double>()[(b * T + pos[static_cast<size_t>(i)]) * W + c0 + c];
  return out.to(t.dtype());
}

// Adds a (B, n, w) tensor into rows `pos`, columns [c0, c0 + w) of a (B, T, W) f64 tensor.
void add_rows(const Tensor& into, const Tensor& part, const std::vector<int64_t>& pos, int64_t c0) {
  const int64_t B = into.dim(0), T = into.dim(1), W = into.dim(2), n = part.dim(1), w = part.dim(2);
  const Tensor p = part.to(DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < w; ++c)
        into.data<double>()[(b * T + pos[static_cast<size_t>(i)]) * W + c0 + c] += p.data<double>()[(b * n + i) * w + c];
}

double max_rel(const Tensor& got, const Tensor& want) {
  const Tensor g = got.to(DType::f64), w = want.to(DType::f64);
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    diff = std::max(diff, std::abs(g.data<double>()[i] - w.data<double>()[i]));
    scale = std::max(scale, std::abs(w.data<double>()[i]));
  }
  return diff / std::max(scale, 1e-300);
}

struct Result {
  Tensor out, dqkv;  // (B, T, C) and (B, T, W) over the whole sequence, f64
};

// Context parallelism of cp ranks, simulated: rank r's queries meet the key/value blocks of ranks
// r, r-1, ... (the ring's order) in the forward, the same in the backward; each block's dK, dV is added
// at its owner's rows.
Result ring(Context& ctx, const Tensor& qkv, const Tensor& dout, const ops::AttentionLayout& layout, int cp,
            const DropoutMask& mask) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), W = qkv.dim(2);
  const int64_t H = layout.n_head, G = layout.n_group, hs = layout.head_dim, C = H * hs;
  const DType dt = qkv.dtype();
  std::vector<std::vector<int64_t>> pos(static_cast<size_t>(cp));
  std::vector<Tensor> q(static_cast<size_t>(cp)), kv(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r) {
    pos[r] = rank_positions(T, cp, r);
    q[r] = take_rows(qkv, pos[r], 0, W);
    kv[r] = take_rows(qkv, pos[r], C, 2 * G * hs);
  }
  Result res{Tensor::zeros({B, T, C}, DType::f64), Tensor::zeros({B, T, W}, DType::f64)};
  std::vector<Tensor> dkv(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r) dkv[r] = Tensor::zeros(kv[r].shape(), dt);
  for (int r = 0; r < cp; ++r) {
    const int64_t n = static_cast<int64_t>(pos[r].size());
    Tensor acc = Tensor::empty({B, n, C}, dt), m = Tensor::empty({B, H, n}, dt), l = Tensor::empty({B, H, n}, dt);
    ops::attention_block_begin(ctx, acc, m, l);
    ops::AttentionBlock blk;
    blk.layout = layout;
    blk.seq_len = T;
    blk.qpos = pos[r];
    for (int s = 0; s < cp; ++s) {
      const int owner = (r - s + cp) % cp;
      blk.kpos = pos[owner];
      ops::attention_block_forward(ctx, acc, m, l, q[r], kv[owner], blk, mask);
    }
    Tensor out = Tensor::empty({B, n, C}, dt), lse = Tensor::empty({B, H, n}, dt);
    ops::attention_block_finish(ctx, out, lse, acc, m, l);
    add_rows(res.out, out, pos[r], 0);
    // Backward.
    const Tensor go = take_rows(dout, pos[r], 0, C);
    Tensor delta = Tensor::empty({B, H, n}, dt), dq = Tensor::zeros({B, n, C}, dt);
    ops::attention_block_delta(ctx, delta, go, out);
    for (int s = 0; s < cp; ++s) {
      const int owner = (r - s + cp) % cp;
      blk.kpos = pos[owner];
      ops::attention_block_backward(ctx, dq, dkv[owner], go, delta, lse, q[r], kv[owner], blk, mask);
    }
    add_rows(res.dqkv, dq, pos[r], 0);
  }
  for (int r = 0; r < cp; ++r) add_rows(res.dqkv, dkv[r], pos[r], C);
  return res;
}

// Random qkv and dout for a (B, T) batch of `layout`; the largest relative differences of the simulated
// ring at cp (its output, its qkv gradient) from attention_forward / _backward over the whole sequence.
std::pair<double, double> ring_vs_whole(Fixture& f, int64_t B, int64_t T, const ops::AttentionLayout& layout,
                                        const DropoutMask& mask, DType dt, int cp) {
  const int64_t H = layout.n_head, W = (H + 2 * layout.n_group) * layout.head_dim, C = H * layout.head_dim;
  const Tensor qkv = random_tensor({B, T, W}, f.rng, -2, 2, dt), dout = random_tensor({B, T, C}, f.rng, -1, 1, dt);
  Tensor out = Tensor::empty({B, T, C}, dt), probs = Tensor::empty({B, H, T, T}, dt);
  ops::attention_forward(f.ctx, out, probs, qkv, layout, mask);
  Tensor dqkv = Tensor::zeros({B, T, W}, dt);
  ops::attention_backward(f.ctx, dqkv, dout, qkv, probs, layout, mask);
  const Result got = ring(f.ctx, qkv, dout, layout, cp, mask);
  return {max_rel(got.out, out), max_rel(got.dqkv, dqkv)};
}

}  // namespace

TEST_CASE("attention blocks: every rank's queries against every key block in ring order equal attention over "
          "the whole sequence, forward and backward",
          "[kernels][attention_block]") {
  Fixture f;
  const int64_t B = 2, T = 26;  // chunks of 6 and 7 rows at cp 2, of 3 and 4 at cp 4
  const int H = 4, hs = 6;
  for (DType dt : {DType::f64, DType::f32})
    for (int G : {4, 2, 1})
      for (bool alibi : {false, true})
        for (bool dropout : {false, true})
          for (int cp : {1, 2, 4}) {
            INFO(dtype_name(dt) << " G " << G << " alibi " << alibi << " dropout " << dropout << " cp " << cp);
            ops::AttentionLayout layout;
            layout.n_head = H;
            layout.n_group = G;
            layout.head_dim = hs;
            if (alibi) layout.alibi_slopes = ops::alibi_slopes(H);
            const DropoutMask mask = dropout ? block_mask() : DropoutMask{};
            const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
            const auto [e_out, e_grad] = ring_vs_whole(f, B, T, layout, mask, dt, cp);
            if (std::getenv("TROUPE_TEST_VERBOSE"))
              std::printf("%s G %d alibi %d dropout %d cp %d: out %.3g grad %.3g\n", dtype_name(dt), G, alibi, dropout,
                          cp, e_out, e_grad);
            CHECK(e_out <= tol);
            CHECK(e_grad <= tol);
          }
}

// Blocks of several row tiles (the kernels take 128 query rows at a time, each tile against the keys
// it can see): a 2 x 530-row sequence at cp 1 (5 tiles, the last partial) and cp 2 (265 rows a rank,
// chunks of 132 and 133 rows, tiles straddling the two chunks), GQA, ALiBi and dropout on.
TEST_CASE("attention blocks: row tiles across chunk boundaries equal attention over the whole sequence",
          "[kernels][attention_block]") {
  Fixture f;
  const int64_t B = 2, T = 530;
  const int H = 4, G = 2, hs = 6;
  for (DType dt : {DType::f64, DType::f32})
    for (int cp : {1, 2}) {
      INFO(dtype_name(dt) << " cp " << cp);
      ops::AttentionLayout layout;
      layout.n_head = H;
      layout.n_group = G;
      layout.head_dim = hs;
      layout.alibi_slopes = ops::alibi_slopes(H);
      const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      const auto [e_out, e_grad] = ring_vs_whole(f, B, T, layout, block_mask(), dt, cp);
      CHECK(e_out <= tol);
      CHECK(e_grad <= tol);
    }
}

TEST_CASE("attention blocks: a block with no visible key leaves the state as it was", "[kernels][attention_block]") {
  Fixture f;
  const int64_t B = 1, H = 2, hs = 4, W = 3 * H * hs;
  ops::AttentionLayout layout;
  layout.n_head = H;
  layout.n_group = H;
  layout.head_dim = hs;
  ops::AttentionBlock blk;
  blk.layout = layout;
  blk.seq_len = 10;
  blk.qpos = {0, 1, 2};
  blk.kpos = {7, 8};  // all after every query: causally invisible
  const Tensor qkv = random_tensor({B, 3, W}, f.rng), kv = random_tensor({B, 2, 2 * H * hs}, f.rng);
  Tensor acc = Tensor::empty({B, 3, H * hs}, DType::f64), m = Tensor::empty({B, H, 3}, DType::f64),
         l = Tensor::empty({B, H, 3}, DType::f64);
  ops::attention_block_begin(f.ctx, acc, m, l);
  ops::attention_block_forward(f.ctx, acc, m, l, qkv, kv, blk);
  for (int64_t i = 0; i < acc.numel(); ++i) CHECK(acc.data<double>()[i] == 0.0);
  for (int64_t i = 0; i < l.numel(); ++i) {
    CHECK(l.data<double>()[i] == 0.0);
    CHECK(std::isinf(m.data<double>()[i]));
  }
}

// Decoding's cached attention: several sequences' new rows (a long prompt past one row tile, a
// prompt, single decode rows) over caches that already hold earlier rows give, bit for bit, what the
// blockwise kernels give each sequence alone; grouped-query, with and without ALiBi, any pool size;
// over bf16 and fp16 caches, what the f32 kernel gives over them widened.
TEST_CASE("attention blocks: cached attention of ragged sequences equals each sequence's blocks bitwise",
          "[attention_block]") {
  Fixture f;
  const int64_t H = 6, G = 2, hs = 8, W = (H + 2 * G) * hs, kvw = 2 * G * hs;
  // (rows fed now, rows in the cache before)
  const std::vector<std::pair<int64_t, int64_t>> seqs = {{131, 0}, {17, 0}, {1, 40}, {5, 3}, {1, 0}, {200, 9}};
  std::vector<int64_t> row0{0}, kv_len;
  for (auto [tq, before] : seqs) {
    row0.push_back(row0.back() + tq);
    kv_len.push_back(before + tq);
  }
  const int64_t R = row0.back();
  for (bool alibi : {false, true}) {
    ops::AttentionLayout layout;
    layout.n_head = static_cast<int>(H);
    layout.n_group = static_cast<int>(G);
    layout.head_dim = static_cast<int>(hs);
    if (alibi) layout.alibi_slopes = ops::alibi_slopes(static_cast<int>(H));
    const Tensor qkv = random_tensor({R, W}, f.rng, -1.0, 1.0, DType::f32);
    std::vector<Tensor> caches;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Tensor c = random_tensor({kv_len[i] + 3, kvw}, f.rng, -1.0, 1.0, DType::f32);  // rows past kv_len unused
      for (int64_t r = 0; r < seqs[i].first; ++r)  // the new rows' keys and values are in the cache
        std::copy_n(qkv.data<float>() + (row0[i] + r) * W + H * hs, kvw, c.data<float>() + (seqs[i].second + r) * kvw);
      caches.push_back(c);
    }
    Tensor got = Tensor::empty({R, H * hs}, DType::f32);
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      Context ctx;
      ctx.pool = &pool;
      ops::attention_cached_forward(ctx, got, qkv, row0, caches, kv_len, layout);
      for (size_t i = 0; i < seqs.size(); ++i) {
        const int64_t Tq = seqs[i].first, Tk = kv_len[i];
        ops::AttentionBlock block;
        block.layout = layout;
        block.seq_len = Tk;
        for (int64_t r = 0; r < Tq; ++r) block.qpos.push_back(Tk - Tq + r);
        for (int64_t r = 0; r < Tk; ++r) block.kpos.push_back(r);
        Tensor acc = Tensor::empty({1, Tq, H * hs}, DType::f32), want = Tensor::empty({1, Tq, H * hs}, DType::f32);
        Tensor m = Tensor::empty({1, H, Tq}, DType::f32), l = Tensor::empty({1, H, Tq}, DType::f32);
        Tensor lse = Tensor::empty({1, H, Tq}, DType::f32);
        ops::attention_block_begin(f.ctx, acc, m, l);
        ops::attention_block_forward(f.ctx, acc, m, l, qkv.rows(row0[i], row0[i] + Tq).view({1, Tq, W}),
                                     caches[i].rows(0, Tk).view({1, Tk, kvw}), block);
        ops::attention_block_finish(f.ctx, want, lse, acc, m, l);
        INFO("sequence " << i << ", alibi " << alibi << ", threads " << threads);
        CHECK(std::memcmp(want.data<float>(), got.data<float>() + row0[i] * H * hs,
                          static_cast<size_t>(Tq * H * hs) * sizeof(float)) == 0);
      }
      // 16-bit caches (a bf16 or fp16 decoder's): bit for bit the f32 kernel over the caches widened.
      for (DType h : {DType::bf16, DType::f16}) {
        std::vector<Tensor> narrow, widened;
        for (const Tensor& c : caches) {
          narrow.push_back(c.to(h));
          widened.push_back(narrow.back().to(DType::f32));
        }
        Tensor want = Tensor::empty({R, H * hs}, DType::f32), half_got = Tensor::empty({R, H * hs}, DType::f32);
        ops::attention_cached_forward(ctx, want, qkv, row0, widened, kv_len, layout);
        ops::attention_cached_forward(ctx, half_got, qkv, row0, narrow, kv_len, layout);
        INFO(dtype_name(h) << " caches, alibi " << alibi << ", threads " << threads);
        CHECK(std::memcmp(want.data<float>(), half_got.data<float>(), static_cast<size_t>(R * H * hs) * sizeof(float)) == 0);
      }
    }
  }
}

}  // namespace troupe
