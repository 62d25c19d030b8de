// Helpers of the Hugging Face export tests (test_hf_families.cpp, test_hf_mixtral.cpp): a model's
// parameters with random values, a one-shard troupe checkpoint of them, and its export.
#pragma once
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "model/params.hpp"
#include "storage/checkpoint.hpp"
#include "storage/hf_export.hpp"
#include "storage/hf_import.hpp"

namespace troupe::hf_test {

// The troupe parameters of `cfg` (global shapes, real vocabulary, f32) with random values.
inline std::vector<NamedTensor> random_params(const GptConfig& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<NamedTensor> out;
  for (const ParamSpec& s : gpt2_param_specs(cfg)) {
    Tensor t = Tensor::empty(s.global_shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    out.push_back({s.name, s.global_shape, t});
  }
  return out;
}

// A troupe checkpoint (iteration 0, one shard) of `params` in dir.
inline void write_checkpoint(const std::string& dir, const std::vector<NamedTensor>& params,
                             const std::string& config_json) {
  HfModel m;
  m.params = params;
  CheckpointMeta meta;
  meta.config_json = config_json;
  meta.rng_json = R"({"seed": 1, "consumed_samples": 0})";
  REQUIRE(write_hf_checkpoint(m, dir, meta).message() == "");
}

inline Status export_of(const std::string& ckpt, const std::string& out, const HfArch& arch) {
  auto c = Checkpoint::open(ckpt, 0);
  REQUIRE(c.is_ok());
  return export_hf_folder(*c, out, arch);
}

}  // namespace troupe::hf_test
