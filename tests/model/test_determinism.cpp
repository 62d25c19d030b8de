// Two training steps of a GPT (forward, backward, gradient clipping, AdamW) on 1, 2 and 3 threads
// give bitwise the same losses, gradients and parameters. The sizes put every GEMM of the model
// above the one-call threshold, cut into row, column and K tiles. Run once per OpenBLAS core type
// by tests/cli/openblas_coretypes.sh.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.hpp"
#include "kernels/ops.hpp"
#include "reference/gpt.hpp"
#include "tests/kernels/grad_check.hpp"

using namespace troupe;

namespace {

GptConfig parallel_path_config() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 96;
  c.num_attention_heads = 3;
  c.seq_length = 64;
  c.max_position_embeddings = 64;
  c.vocab_size = 8191;  // padded to 8192: the head's dX sums over K = 8192, cut into K chunks
  return c;
}
constexpr int kBatch = 4;

struct StepResults {
  std::vector<double> losses;
  std::vector<Tensor> tensors;  // gradients after each step, parameters and moments at the end
};

StepResults train_two_steps(int threads) {
  ThreadPool pool(threads);
  Context ctx;
  ctx.pool = &pool;
  const GptConfig cfg = parallel_path_config();
  GptModel model(cfg, kBatch);
  model.init(2024);
  Tensor m = Tensor::zeros(model.flat_params().shape()),
         v = Tensor::zeros(model.flat_params().shape());
  std::mt19937_64 rng(7);
  StepResults r;
  const double scale = 1.0 / (kBatch * cfg.seq_length);
  for (int step = 1; step <= 2; ++step) {
    Tensor tokens = test::random_tokens(rng, kBatch * (cfg.seq_length + 1), cfg.vocab_size)
                        .view({kBatch, cfg.seq_length + 1});
    model.zero_grad();
    r.losses.push_back(model.forward_backward(ctx, tokens, scale));
    r.tensors.push_back(model.flat_grads().clone());
    r.losses.push_back(ops::clip_grad_norm(ctx, {model.flat_grads()}, 0.5));
    ops::AdamWParams hp;
    hp.lr = 3e-3;
    hp.weight_decay = 0.1;
    hp.step = step;
    ops::adamw_update(ctx, model.flat_params(), model.flat_grads(), m, v, hp);
  }
  r.tensors.insert(r.tensors.end(), {model.flat_params().clone(), m, v});
  return r;
}

}  // namespace

TEST_CASE("GPT training steps are bitwise the same on 1, 2 and 3 threads", "[model][determinism]") {
  // The model's GEMMs take the parallel path, in every kind of tile.
  using Axis = cpu::GemmTiling::Axis;
  const GptConfig cfg = parallel_path_config();
  const int64_t N = kBatch * cfg.seq_length, C = cfg.hidden_size, Vp = cfg.padded_vocab_size(1);
  REQUIRE(cpu::gemm_tiling(N, 3 * C, C).tiles > 1);        // QKV forward
  REQUIRE(cpu::gemm_tiling(4 * C, C, N).tiles > 1);        // c_fc weight gradient
  REQUIRE(cpu::gemm_tiling(N, Vp, C).axis == Axis::cols);  // logits
  REQUIRE(cpu::gemm_tiling(N, Vp, C).tiles > 1);
  REQUIRE(cpu::gemm_tiling(N, C, Vp).axis == Axis::depth);  // head dX
  REQUIRE(cpu::gemm_tiling(N, C, Vp).tiles > 1);
  REQUIRE(cpu::gemm_tiling(Vp, C, N).axis == Axis::rows);  // head dW
  REQUIRE(cpu::gemm_tiling(Vp, C, N).tiles > 1);

  configure_blas_threads();  // as every shard does
  const StepResults reference = train_two_steps(1);
  for (double loss : reference.losses) REQUIRE(std::isfinite(loss));
  for (int threads : {2, 3}) {
    INFO("threads " << threads);
    const StepResults got = train_two_steps(threads);
    CHECK(got.losses == reference.losses);
    REQUIRE(got.tensors.size() == reference.tensors.size());
    for (size_t i = 0; i < got.tensors.size(); ++i) {
      INFO("tensor " << i);
      CHECK(std::memcmp(got.tensors[i].raw(), reference.tensors[i].raw(),
                        got.tensors[i].nbytes()) == 0);
    }
  }
}
