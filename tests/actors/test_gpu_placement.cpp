// --device cuda's refusals that come before any GPU is touched, and a GPU rank on a machine without
// one: each is a clear error naming the fix, never an abort. (The GPU runs themselves are the "gpu:"
// cases of tests/engine/test_parallel.cpp and tests/cli/gpu_train.sh, label gpu.)
#include <catch2/catch.hpp>

#include "actors/job.hpp"
#include "comm/local/local_world.hpp"
#include "comm/topology.hpp"
#include "engine/rank_engine.hpp"
#include "kernels/device_info.hpp"
#include "troupe/data_source.hpp"
#include "tests/test_util.hpp"

using namespace troupe;
using Catch::Matchers::Contains;

namespace {
TrainConfig gpu_config() {
  TrainConfig c;
  c.mock_data = true;
  c.tokenizer_type = "ByteLevelTokenizer";
  c.model.num_layers = 2;
  c.model.hidden_size = 16;
  c.model.num_attention_heads = 2;
  c.model.seq_length = 8;
  c.model.max_position_embeddings = 8;
  c.model.vocab_size = 37;
  c.micro_batch_size = 1;
  c.global_batch_size = 2;
  c.train_iters = 1;
  c.eval_interval = 0;
  c.num_threads = 1;
  c.device = "cuda";
  return c;
}
}  // namespace

TEST_CASE("gpu placement: several GPU ranks in one process, or ZeRO with one rank, are refused naming the fix",
          "[gpu_placement]") {
  auto data = make_mock_data(37, 8, 1);
  TrainConfig c = gpu_config();
  c.tensor_model_parallel_size = 2;
  auto several = run_training(c, data, {});
  REQUIRE_FALSE(several.is_ok());
  CHECK(several.status().is_bad_input());
  CHECK_THAT(several.status().message(), Contains("--device cuda with 2 ranks in one process") &&
                                             Contains("troupe launch --nproc-per-node 2"));
  c = gpu_config();
  c.zero_stage = 1;
  auto zero = run_training(c, data, {});
  REQUIRE_FALSE(zero.is_ok());
  CHECK(zero.status().is_bad_input());
  CHECK_THAT(zero.status().message(), Contains("--zero-stage 1 partitions over data-parallel ranks"));
}

TEST_CASE("gpu placement: a GPU rank where no GPU is usable is a DeviceError saying why", "[gpu_placement]") {
  if (query_devices().cuda_devices > 0) TROUPE_SKIP("this machine has a GPU: the gpu-labelled cases run instead");
  RankSpec spec;
  spec.model = gpu_config().model;
  spec.device = Device::cuda;
  comm::ParallelSizes sizes;
  auto topo = comm::Topology::create(sizes, 1).value();
  try {
    RankEngine engine(spec, topo, 0, RankComms{});
    FAIL("a GPU rank was built without a GPU");
  } catch (const DeviceError& e) {
    const std::string why = e.what();
    CHECK_THAT(why, Contains("CUDA") || Contains("GPU"));
  }
}
