#include "engine/moe_tally.hpp"

#include <string>

#include "troupe/check.hpp"

namespace troupe {

namespace {
constexpr size_t kHead = 4;  // micro_batches, lb_sum, z_sum, dropped
}  // namespace

MoeTally::MoeTally(const GptConfig& model) {
  for (int l = 0; l < model.num_layers; ++l) {
    const int e = model.moe.experts_of(l, model.num_layers);
    if (e <= 0) continue;
    layers_.push_back({l, e, size_});
    size_ += kHead + 2 * static_cast<size_t>(e);
  }
}

void MoeTally::add(std::span<double> slots, const std::vector<MoeLayerStats>& stats) const {
  TROUPE_CHECK(slots.size() == size_, "MoeTally::add: slots must hold size() doubles");
  for (const MoeLayerStats& st : stats) {
    const Layer* at = nullptr;
    for (const Layer& l : layers_)
      if (l.layer == st.layer) at = &l;
    TROUPE_CHECK(at != nullptr && st.routed.size() == static_cast<size_t>(at->experts) &&
                     st.kept.size() == st.routed.size(),
                 "MoeTally::add: statistics of a layer the model does not have as an MoE layer of that many "
                 "experts (the chunks and the RankSpec's model disagree)");
    double* s = slots.data() + at->offset;
    s[0] += static_cast<double>(st.micro_batches);
    s[1] += st.lb_loss;
    s[2] += st.z_loss;
    s[3] += static_cast<double>(st.dropped);
    const size_t e = st.routed.size();
    for (size_t i = 0; i < e; ++i) {
      s[kHead + i] += static_cast<double>(st.routed[i]);
      s[kHead + e + i] += static_cast<double>(st.kept[i]);
    }
  }
}

std::vector<MoeLayerLoad> MoeTally::loads(std::span<const double> slots) const {
  TROUPE_CHECK(slots.size() == size_, "MoeTally::loads: slots must hold size() doubles");
  std::vector<MoeLayerLoad> out;
  for (const Layer& l : layers_) {
    const double* s = slots.data() + l.offset;
    if (s[0] <= 0) continue;
    MoeLayerLoad load;
    load.layer = l.layer;
    load.micro_batches = static_cast<int64_t>(s[0]);
    load.lb_loss = s[1] / s[0];
    load.z_loss = s[2] / s[0];
    load.dropped = static_cast<int64_t>(s[3]);
    const size_t e = static_cast<size_t>(l.experts);
    for (size_t i = 0; i < e; ++i) {
      load.routed.push_back(static_cast<int64_t>(s[kHead + i]));
      load.kept.push_back(static_cast<int64_t>(s[kHead + e + i]));
    }
    out.push_back(std::move(load));
  }
  return out;
}

double moe_loss(const MoeConfig& moe, const std::vector<MoeLayerLoad>& loads) {
  double sum = 0;
  for (const MoeLayerLoad& l : loads) sum += moe.aux_loss_coeff * l.lb_loss + moe.z_loss_coeff * l.z_loss;
  return sum;
}

}  // namespace troupe
