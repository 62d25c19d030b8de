// Where GPT's dropout masks come from (the mask rule itself: kernels/dropout.hpp). Megatron's
// placement: the embedding output (token + position), the attention probabilities, and each
// residual branch's output (attention c_proj, MLP c_proj) before its residual add. Every element's
// mask is keyed by global coordinates only:
//   seed          the run's --seed
//   iteration     the training iteration (StepRequest::step)
//   sample        the sample's index in the iteration's global batch (not the dp rank's or the
//                 micro-batch's)
//   stream        4 * layer + site, layer the global transformer layer (0 for the embedding),
//                 whatever pipeline stage or virtual chunk holds it
//   element       hidden sites: t * C + c of the full (T, C) activation of the sample (t the global
//                 position, also under sequence parallelism); attention: (h * T + i) * T + j with h
//                 the global head (heads are split over tensor-parallel ranks), i the query, j the key
// so the masks, and with them the losses, are those of the 1x1x1 run on every layout. Recompute
// (full or selective) regenerates them from the same key: nothing is stored.
#pragma once
#include <cstdint>

#include "kernels/dropout.hpp"
#include "troupe/check.hpp"
#include "troupe/model_config.hpp"

namespace troupe {

// What a training micro-batch's masks are keyed by, besides the site. The engine fills it per
// micro-batch; evaluation has none (no dropout).
struct MicroBatchKey {
  uint64_t seed = 0;
  int64_t iteration = 0;
  int64_t first_sample = 0;  // global sample index of the micro-batch's first sequence
};

enum class DropoutSite : uint32_t { embedding = 0, attention_probs = 1, attention_output = 2, mlp_output = 3 };

// The mask of one site of global layer `layer` (0 for the embedding); inactive (p = 0) when the
// model's probability for that site is 0.
inline DropoutMask dropout_mask(const GptConfig& model, const MicroBatchKey& key, DropoutSite site, int layer) {
  TROUPE_CHECK(key.iteration >= 0 && key.iteration < (int64_t{1} << 32), "dropout: the iteration must be below 2^32");
  DropoutMask m;
  m.p = site == DropoutSite::attention_probs ? model.attention_dropout : model.hidden_dropout;
  m.seed = key.seed;
  m.stream = 4 * static_cast<uint32_t>(layer) + static_cast<uint32_t>(site);
  m.iteration = static_cast<uint32_t>(key.iteration);
  m.first_sample = key.first_sample;
  return m;
}

}  // namespace troupe
