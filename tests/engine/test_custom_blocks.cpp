// The example blocks of examples/mlp_stages.hpp and examples/zloss_head.hpp, on their own (tp 1, no
// engine): the gradients their backward computes equal central finite differences of the loss their
// forward returns. (test_parallel.cpp checks that every layout runs them as the single stage does.)
#include <cmath>
#include <random>

#include <catch2/catch.hpp>

#include "examples/mlp_stages.hpp"
#include "examples/zloss_head.hpp"
#include "examples/adapter_block.hpp"

namespace {

class Serial final : public troupe::StageContext {
 public:
  int tp_rank() const override { return 0; }
  int tp_size() const override { return 1; }
  void all_reduce(float*, int64_t, Reduce) override {}
  void all_reduce(double*, int64_t, Reduce) override {}
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
            int64_t ldb, float beta, float* C, int64_t ldc) override {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += double(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
        C[i * ldc + j] = static_cast<float>(alpha * s + (beta == 0 ? 0.0 : double(beta) * C[i * ldc + j]));
      }
  }
};

struct Net {  // blocks in a chain, with their parameters and boundary tensors
  std::vector<std::unique_ptr<troupe::Stage>> blocks;
  std::vector<std::vector<std::vector<float>>> params, grads;
  std::vector<std::vector<std::vector<float>>> acts, dacts;  // acts[i]: outputs of block i (f32 or i32 bits)
};

std::vector<int64_t> numel_of(const std::vector<troupe::TensorDecl>& d) {
  std::vector<int64_t> n;
  for (const auto& t : d) {
    int64_t k = 1;
    for (int64_t x : t.shape) k *= x;
    n.push_back(k);
  }
  return n;
}

Net make_net(std::vector<std::unique_ptr<troupe::Stage>> blocks, uint64_t seed) {
  Net n;
  n.blocks = std::move(blocks);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0, 0.3f);
  for (auto& b : n.blocks) {
    n.params.emplace_back();
    n.grads.emplace_back();
    for (const auto& p : b->parameters()) {
      int64_t k = 1;
      for (int64_t x : p.shape) k *= x;
      std::vector<float> v(static_cast<size_t>(k));
      for (float& x : v) x = g(rng);
      n.params.back().push_back(v);
      n.grads.back().emplace_back(v.size(), 0.0f);
    }
    n.acts.emplace_back();
    n.dacts.emplace_back();
    for (int64_t k : numel_of(b->outputs())) {
      n.acts.back().emplace_back(static_cast<size_t>(k), 0.0f);
      n.dacts.back().emplace_back(static_cast<size_t>(k), 0.0f);
    }
  }
  return n;
}

std::vector<troupe::TensorView> views(std::vector<std::vector<float>>& ts, const std::vector<troupe::TensorDecl>& d,
                                      bool grads) {
  std::vector<troupe::TensorView> out;
  for (size_t i = 0; i < d.size(); ++i)
    out.push_back(grads && !d[i].requires_grad ? troupe::TensorView{}
                                                : troupe::TensorView{ts[i].data(), d[i].shape, d[i].type});
  return out;
}

std::vector<troupe::ConstTensorView> const_views(std::vector<std::vector<float>>& ts,
                                                 const std::vector<troupe::TensorDecl>& d, bool grads) {
  std::vector<troupe::ConstTensorView> out;
  for (const troupe::TensorView& v : views(ts, d, grads)) out.push_back({v.data, v.shape, v.type});
  return out;
}

double run(Net& n, const std::vector<int32_t>& batch, int64_t B, int64_t R, bool backward, double scale) {
  Serial ctx;
  const troupe::View<const int32_t> rows{batch.data(), {B, R}};
  double loss = 0;
  for (size_t i = 0; i < n.blocks.size(); ++i) {
    troupe::ForwardArgs a;
    a.slot = 0;
    for (auto& p : n.params[i]) a.params.push_back({p.data(), {static_cast<int64_t>(p.size())}});
    if (n.blocks[i]->reads_batch()) a.batch = rows;
    if (i > 0) a.inputs = const_views(n.acts[i - 1], n.blocks[i]->inputs(), false);
    a.outputs = views(n.acts[i], n.blocks[i]->outputs(), false);
    a.valid_samples = B;
    a.loss_scale = scale;
    loss += n.blocks[i]->forward(ctx, a);
  }
  for (size_t i = n.blocks.size(); i-- > 0;) {
    troupe::BackwardArgs b;
    b.slot = 0;
    for (auto& p : n.params[i]) b.params.push_back({p.data(), {static_cast<int64_t>(p.size())}});
    for (auto& g : n.grads[i]) {
      if (backward) std::fill(g.begin(), g.end(), 0.0f);
      b.param_grads.push_back({g.data(), {static_cast<int64_t>(g.size())}});
    }
    if (n.blocks[i]->reads_batch()) b.batch = rows;
    b.output_grads = const_views(n.dacts[i], n.blocks[i]->outputs(), true);
    if (i > 0) b.input_grads = views(n.dacts[i - 1], n.blocks[i]->inputs(), true);
    b.loss_scale = scale;
    n.blocks[i]->backward(ctx, b);  // frees the slot even when only the forward is wanted
  }
  return loss;
}

// Every parameter element's gradient against (L(p + h) - L(p - h)) / 2h.
void require_finite_differences(Net& n, const std::vector<int32_t>& batch, int64_t B, int64_t R) {
  run(n, batch, B, R, true, 1.0);
  const auto grads = n.grads;
  double worst = 0;
  for (size_t i = 0; i < n.params.size(); ++i)
    for (size_t j = 0; j < n.params[i].size(); ++j)
      for (size_t k = 0; k < n.params[i][j].size(); ++k) {
        float& p = n.params[i][j][k];
        const float keep = p, h = 1e-2f;
        p = keep + h;
        const double up = run(n, batch, B, R, false, 1.0);
        p = keep - h;
        const double down = run(n, batch, B, R, false, 1.0);
        p = keep;
        const double fd = (up - down) / (2.0 * h), got = grads[i][j][k];
        const double err = std::abs(fd - got) / std::max(1.0, std::abs(fd));
        worst = std::max(worst, err);
        INFO("block " << i << " parameter " << j << " element " << k << ": backward " << got << ", differences " << fd);
        REQUIRE(err < 2e-2);
      }
  CHECK(worst > 0);  // something was compared
}


// A block in front that makes the hidden rows from the tokens, so that the input gradients of the
// blocks after it are checked too (through this block's parameters).
struct Lookup final : troupe::Stage {
  int64_t B, T, C;
  Lookup(int64_t b, int64_t t, int64_t c) : B(b), T(t), C(c) {}
  std::vector<troupe::TensorDecl> inputs() const override { return {}; }
  std::vector<troupe::TensorDecl> outputs() const override { return {{"hidden", {B * T, C}}}; }
  std::vector<troupe::ParamDecl> parameters() const override { return {{"emb", {11, C}}}; }
  bool reads_batch() const override { return true; }
  double forward(troupe::StageContext&, const troupe::ForwardArgs& a) override {
    float* h = static_cast<float*>(a.outputs[0].data);
    for (int64_t n = 0; n < B * T; ++n)
      for (int64_t c = 0; c < C; ++c) h[n * C + c] = a.params[0][a.batch[(n / T) * (T + 1) + n % T] * C + c];
    return 0;
  }
  void backward(troupe::StageContext&, const troupe::BackwardArgs& a) override {
    const float* d = static_cast<const float*>(a.output_grads[0].data);
    for (int64_t n = 0; n < B * T; ++n)
      for (int64_t c = 0; c < C; ++c) a.param_grads[0][a.batch[(n / T) * (T + 1) + n % T] * C + c] += d[n * C + c];
  }
};

}  // namespace

TEST_CASE("custom blocks: the MLP's backward equals finite differences", "[custom]") {
  const example::MlpShape s{5, 6, 3};
  const int64_t B = 3, R = s.features + 1;
  troupe::StagePlace at;
  at.micro_batch = static_cast<int>(B);
  at.record_length = R;
  std::vector<std::unique_ptr<troupe::Stage>> blocks;
  blocks.push_back(std::make_unique<example::MlpInput>(at, s));
  blocks.push_back(std::make_unique<example::MlpHidden>(at, s, 0));
  blocks.push_back(std::make_unique<example::MlpHead>(at, s));
  Net n = make_net(std::move(blocks), 7);
  std::mt19937_64 rng(3);
  std::vector<int32_t> batch(static_cast<size_t>(B * R));
  for (auto& v : batch) v = static_cast<int32_t>(rng() % 256);
  require_finite_differences(n, batch, B, R);
}

TEST_CASE("custom blocks: the z-loss head's backward equals finite differences", "[custom]") {
  const int64_t B = 2, T = 3, C = 4;
  troupe::StagePlace at;
  at.micro_batch = static_cast<int>(B);
  at.record_length = T + 1;
  at.hidden_size = C;
  at.vocab_size = 11;  // padded to 64: the padding columns are masked
  std::vector<std::unique_ptr<troupe::Stage>> blocks;
  blocks.push_back(std::make_unique<Lookup>(B, T, C));
  blocks.push_back(std::make_unique<example::ZLossHead>(at, /*z=*/0.05));
  Net n = make_net(std::move(blocks), 11);
  for (auto& v : n.params[1][0]) v *= 3;  // larger logits: the z-loss term matters
  std::mt19937_64 rng(5);
  std::vector<int32_t> batch(static_cast<size_t>(B * (T + 1)));
  for (auto& v : batch) v = static_cast<int32_t>(rng() % 11);
  require_finite_differences(n, batch, B, T + 1);
}

TEST_CASE("custom blocks: the adapter's backward equals finite differences", "[custom]") {
  const int64_t B = 2, T = 3, C = 4;
  troupe::StagePlace at;
  at.micro_batch = static_cast<int>(B);
  at.record_length = T + 1;
  at.hidden_size = C;
  at.vocab_size = 11;
  std::vector<std::unique_ptr<troupe::Stage>> blocks;
  blocks.push_back(std::make_unique<Lookup>(B, T, C));
  blocks.push_back(std::make_unique<example::Adapter>(at, 0, 3));
  blocks.push_back(std::make_unique<example::ZLossHead>(at, /*z=*/0.05));
  Net n = make_net(std::move(blocks), 13);
  std::mt19937_64 rng(9);
  std::vector<int32_t> batch(static_cast<size_t>(B * (T + 1)));
  for (auto& v : batch) v = static_cast<int32_t>(rng() % 11);
  require_finite_differences(n, batch, B, T + 1);
}
