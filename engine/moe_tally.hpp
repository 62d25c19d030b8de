// The MoE layers' load of one training step, job-wide: each rank's chunks count their layers'
// routing (GptChunk::take_moe_stats: per layer, micro-batches, load-balancing and z-loss sums,
// assignments routed and kept per expert, dropped), and the step's one all-reduce over the world
// (RankEngine::compute_gradients: norm, loss, votes) carries them in size() more doubles, so every
// rank learns the iteration's totals without a collective of its own.
//
// Who adds: an MoE layer lives on one virtual stage; every data-parallel replica routes its own
// micro-batches through it, and every tensor-parallel rank routes them identically (the routing is
// host arithmetic on whole logits, model/moe_routing.hpp). So tensor-parallel rank 0 of each replica
// adds its counts: the sum over the world is the sum over replicas, each micro-batch once. Counts are
// integers below 2^53, exact in f64; the losses are sums of doubles, divided by the micro-batches.
//
// Slots: the model's MoE layers in layer order, each [micro_batches, lb_sum, z_sum, dropped,
// routed (E), kept (E)]. A dense model has none: the all-reduce stays what it was.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "model/gpt_chunk.hpp"
#include "troupe/model_config.hpp"
#include "troupe/reports.hpp"

namespace troupe {

class MoeTally {
 public:
  explicit MoeTally(const GptConfig& model);
  size_t size() const { return size_; }  // doubles; 0 without MoE layers
  // Adds one rank's statistics into `slots` (size() doubles). A layer the model does not have as an
  // MoE layer, or with another expert count, is a broken invariant (TROUPE_CHECK).
  void add(std::span<double> slots, const std::vector<MoeLayerStats>& stats) const;
  // The layers that routed (micro_batches > 0), in layer order; losses as means over micro-batches.
  std::vector<MoeLayerLoad> loads(std::span<const double> slots) const;

 private:
  struct Layer {
    int layer = 0, experts = 0;
    size_t offset = 0;
  };
  std::vector<Layer> layers_;
  size_t size_ = 0;
};

// Megatron-DeepSpeed's "moe loss" (pretrain_gpt.py: sum of the layers' l_aux times --moe-loss-coeff,
// averaged over the micro-batches by training_log): what the auxiliary losses add to the objective,
// sum over `loads` of aux_loss_coeff * lb_loss + z_loss_coeff * z_loss. 0 for no layers.
double moe_loss(const MoeConfig& moe, const std::vector<MoeLayerLoad>& loads);

}  // namespace troupe
