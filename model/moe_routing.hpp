// The routing of one MoE layer for one micro-batch: which experts each token goes to, which
// assignments an over-full expert drops, the combine weights, the load-balancing and z losses, and
// the backward of all of it to the router's logits. Pure host arithmetic in double on the (S, E)
// logits; no tensors, no communication, so the same function decides on every layout and every
// tensor-parallel rank (docs/MOE.md, "Exactness").
//
// Rows and order. The S = B * T tokens arrive in troupe's row order n = b * T + t. Both anchors
// flatten (T, B, C) hidden states, so their "first come" order is position-major: token s = t * B + b.
// Every cumulative count, capacity priority and position tie-break below uses that order.
//
// Routers (GptConfig's MoeRouter comment has the anchors' files):
//   deepspeed, k = 1   g = softmax(logits); e1 = argmax g (first on ties); each expert keeps its
//                      capacity of tokens with the largest RTS draw (training with RTS) or the
//                      earliest ones; weight g[e1]; l_aux = E * sum_e mean_s(g_se) * mean_s(e1_s == e).
//   deepspeed, k = 2   e1 = argmax g; e2 = argmax over e != e1 of logits + Gumbel noise (training with
//                      sampling) or of the logits; expert e's slots hold every first choice of e in
//                      order, then the second choices; an assignment past the capacity is dropped;
//                      weights g[e1], g[e2] of the kept ones divided by their sum; l_aux as k = 1.
//   megatron           top-k of the logits and a softmax over those k (pre_softmax: top-k of the
//                      softmax over all experts, not renormalised); with capacity, each expert keeps
//                      its capacity of assignments by largest weight (probs) or earliest (position);
//                      lb_loss (aux_loss) = E / (k S^2) * sum_e (sum_s p_se) * routed_e with p the
//                      softmax over all experts; seq_aux_loss the same per sequence (T tokens in
//                      place of S), averaged over the B sequences; z_loss = mean_s logsumexp(logits_s)^2.
// Ties among weights or draws keep the earlier position.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "troupe/model_config.hpp"

namespace troupe {

// The random draws of a training micro-batch, uniform in (0, 1): (purpose, row, expert) -> u.
// Null: no draws (evaluation, or a test that switches them off).
enum class MoeDraw : int { rts = 0, gumbel = 1 };
using MoeDraws = std::function<double(MoeDraw purpose, int64_t row, int64_t expert)>;

struct MoeRouting {
  int64_t S = 0, E = 0, k = 0, B = 0, T = 0;
  int64_t capacity = 0;              // per expert (S * k when dropless)
  // Assignment j < k of token row n: index n * k + j.
  std::vector<int32_t> expert;       // the chosen expert
  std::vector<uint8_t> kept;         // 1: computed; 0: dropped by the capacity
  std::vector<double> weight;        // combine weight (0 when dropped)
  std::vector<double> probs;         // (S, E) row order: softmax over all experts
  std::vector<double> topk_probs;    // (S, k) megatron: the weights before dropping
  std::vector<double> gumbel;        // (S, E) deepspeed k = 2 with sampling: the noise drawn
  std::vector<int64_t> routed;       // (E) assignments routed to each expert before dropping
  std::vector<int64_t> kept_count;   // (E) after dropping
  int64_t dropped = 0;
  double lb_loss = 0;                // before its coefficient (deepspeed: l_aux)
  double z_loss = 0;                 // before its coefficient (megatron; 0 for deepspeed)
};

// logits: (S, E) in row order. training picks the capacity factor and allows draws.
MoeRouting moe_route(const MoeConfig& moe, const double* logits, int64_t B, int64_t T, int64_t E, bool training,
                     const MoeDraws& draws);

// dlogits (S, E) = d/d(logits) of  sum_{n,j} dweight[n*k+j] * weight[n*k+j]
//                                   + lb_scale * lb_loss + z_scale * z_loss
// (dweight of a dropped assignment is ignored: its weight is 0 whatever the logits).
void moe_route_backward(const MoeConfig& moe, const MoeRouting& r, const double* logits, const double* dweight,
                        double lb_scale, double z_scale, double* dlogits);

}  // namespace troupe
