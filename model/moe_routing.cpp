#include "model/moe_routing.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>

#include "troupe/check.hpp"

namespace troupe {

namespace {

// Softmax of one row of E logits into out; returns log-sum-exp.
double softmax_row(const double* x, int64_t E, double* out) {
  double m = x[0];
  for (int64_t e = 1; e < E; ++e) m = std::max(m, x[e]);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += out[e] = std::exp(x[e] - m);
  for (int64_t e = 0; e < E; ++e) out[e] /= sum;
  return m + std::log(sum);
}

// Index of the largest of v[0..E) (the first on ties), skipping `skip` (-1: none).
int32_t argmax(const double* v, int64_t E, int64_t skip = -1) {
  int32_t best = -1;
  for (int64_t e = 0; e < E; ++e) {
    if (e == skip) continue;
    if (best < 0 || v[e] > v[best]) best = static_cast<int32_t>(e);
  }
  return best;
}

// The k largest of v[0..E), largest first, the lower index first on ties.
std::vector<int32_t> top_indices(const double* v, int64_t E, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(E));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

// Keeps at most `cap` of the assignments `list` (in position order): the first `cap` in the order
// of `before` (a strict weak order whose ties the stable sort leaves in position order).
template <class Before>
void keep_capacity(std::vector<int64_t>& list, int64_t cap, std::vector<uint8_t>& kept, Before before) {
  if (static_cast<int64_t>(list.size()) <= cap) return;
  std::stable_sort(list.begin(), list.end(), before);
  for (size_t i = static_cast<size_t>(cap); i < list.size(); ++i) kept[static_cast<size_t>(list[i])] = 0;
}

}  // namespace

MoeRouting moe_route(const MoeConfig& moe, const double* logits, int64_t B, int64_t T, int64_t E, bool training,
                     const MoeDraws& draws) {
  TROUPE_CHECK(B >= 1 && T >= 1 && E >= 1, "moe_route: empty micro-batch or no experts");
  const int64_t S = B * T, k = moe.topk;
  TROUPE_CHECK(k >= 1 && k <= E, "moe_route: top-k must be between 1 and the number of experts");
  const bool ds = moe.router == MoeRouter::deepspeed;
  MoeRouting r;
  r.S = S;
  r.E = E;
  r.k = k;
  r.B = B;
  r.T = T;
  r.capacity = moe.drop_tokens ? moe.capacity(S, static_cast<int>(E), training) : S * k;
  r.expert.assign(static_cast<size_t>(S * k), -1);
  r.kept.assign(static_cast<size_t>(S * k), 1);
  r.weight.assign(static_cast<size_t>(S * k), 0.0);
  r.probs.resize(static_cast<size_t>(S * E));
  r.routed.assign(static_cast<size_t>(E), 0);
  r.kept_count.assign(static_cast<size_t>(E), 0);
  std::vector<double> lse(static_cast<size_t>(S));
  for (int64_t n = 0; n < S; ++n) lse[n] = softmax_row(logits + n * E, E, r.probs.data() + n * E);
  // Rows in the anchors' position-major order.
  std::vector<int64_t> order(static_cast<size_t>(S));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) order[static_cast<size_t>(t * B + b)] = b * T + t;
  const double* p = r.probs.data();
  const bool drop = moe.drop_tokens;

  if (ds && k > 2) {
    // topkgating: the k largest probabilities; l_aux over all k choices; each expert keeps its
    // capacity of largest probabilities; the kept weights renormalised.
    for (int64_t n = 0; n < S; ++n) {
      const std::vector<int32_t> top = top_indices(p + n * E, E, k);
      for (int64_t j = 0; j < k; ++j) r.expert[n * k + j] = top[j];
    }
    for (int64_t i = 0; i < S * k; ++i) ++r.routed[r.expert[i]];
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      double me = 0;
      for (int64_t n = 0; n < S; ++n) me += p[n * E + e];
      sum += (me / S) * (static_cast<double>(r.routed[e]) / S);
    }
    r.lb_loss = sum * E / k;
    if (drop) {
      std::vector<std::vector<int64_t>> lists(static_cast<size_t>(E));
      for (int64_t s = 0; s < S; ++s)
        for (int64_t j = 0; j < k; ++j) lists[r.expert[order[s] * k + j]].push_back(order[s] * k + j);
      auto prob = [&](int64_t i) { return p[(i / k) * E + r.expert[i]]; };
      for (auto& list : lists)
        keep_capacity(list, r.capacity, r.kept, [&](int64_t a, int64_t b) { return prob(a) > prob(b); });
    }
    for (int64_t n = 0; n < S; ++n) {
      double d = 0;
      for (int64_t j = 0; j < k; ++j) d += r.kept[n * k + j] ? p[n * E + r.expert[n * k + j]] : 0.0;
      d = std::max(d, static_cast<double>(FLT_EPSILON));
      for (int64_t j = 0; j < k; ++j)
        r.weight[n * k + j] = r.kept[n * k + j] ? p[n * E + r.expert[n * k + j]] / d : 0.0;
    }
  } else if (ds) {
    std::vector<int64_t> first(static_cast<size_t>(E), 0);  // first choices per expert
    for (int64_t n = 0; n < S; ++n) {
      const int32_t e1 = argmax(p + n * E, E);
      r.expert[n * k] = e1;
      ++first[e1];
    }
    if (k == 2) {
      const bool sample = training && moe.second_expert_sampling && draws;
      if (sample) r.gumbel.resize(static_cast<size_t>(S * E));
      std::vector<double> noisy(static_cast<size_t>(E));
      for (int64_t n = 0; n < S; ++n) {
        for (int64_t e = 0; e < E; ++e) {
          double v = logits[n * E + e];
          if (sample) {
            const double g = -std::log(-std::log(draws(MoeDraw::gumbel, n, e)));
            r.gumbel[n * E + e] = g;
            v += g;
          }
          noisy[e] = v;
        }
        r.expert[n * k + 1] = argmax(noisy.data(), E, r.expert[n * k]);
      }
    }
    for (int64_t i = 0; i < S * k; ++i) ++r.routed[r.expert[i]];
    // l_aux = E * sum_e mean_s(g_se) * mean_s(first choice == e)
    double l_aux = 0;
    for (int64_t e = 0; e < E; ++e) {
      double me = 0;
      for (int64_t n = 0; n < S; ++n) me += p[n * E + e];
      l_aux += (me / S) * (static_cast<double>(first[e]) / S);
    }
    r.lb_loss = l_aux * E;
    if (drop) {
      if (k == 1) {
        const bool rts = training && moe.random_token_selection && draws;
        std::vector<std::vector<int64_t>> lists(static_cast<size_t>(E));
        for (int64_t s = 0; s < S; ++s) lists[r.expert[order[s]]].push_back(order[s]);
        std::vector<double> u;
        if (rts) {
          u.resize(static_cast<size_t>(S));
          for (int64_t n = 0; n < S; ++n) u[n] = draws(MoeDraw::rts, n, r.expert[n]);
        }
        for (auto& list : lists)
          keep_capacity(list, r.capacity, r.kept, [&](int64_t a, int64_t b) { return rts && u[a] > u[b]; });
      } else {
        // Expert e's slots: every first choice of e in position order, then the second choices.
        std::vector<int64_t> seen1(static_cast<size_t>(E), 0), seen2(static_cast<size_t>(E), 0);
        for (int64_t s = 0; s < S; ++s) {
          const int64_t n = order[s];
          const int32_t e1 = r.expert[n * 2], e2 = r.expert[n * 2 + 1];
          if (seen1[e1]++ >= r.capacity) r.kept[n * 2] = 0;
          if (first[e2] + seen2[e2]++ >= r.capacity) r.kept[n * 2 + 1] = 0;
        }
      }
    }
    for (int64_t n = 0; n < S; ++n) {
      if (k == 1) {
        r.weight[n] = r.kept[n] ? p[n * E + r.expert[n]] : 0.0;
      } else {
        const double g1 = r.kept[n * 2] ? p[n * E + r.expert[n * 2]] : 0.0;
        const double g2 = r.kept[n * 2 + 1] ? p[n * E + r.expert[n * 2 + 1]] : 0.0;
        // DeepSpeed clamps the sum at fp32's epsilon (its gates are fp32).
        const double d = std::max(g1 + g2, static_cast<double>(FLT_EPSILON));
        r.weight[n * 2] = g1 / d;
        r.weight[n * 2 + 1] = g2 / d;
      }
    }
  } else {
    r.topk_probs.resize(static_cast<size_t>(S * k));
    for (int64_t n = 0; n < S; ++n) {
      const double* row = moe.pre_softmax ? p + n * E : logits + n * E;
      const std::vector<int32_t> top = top_indices(row, E, k);
      double m = row[top[0]], sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        r.expert[n * k + j] = top[j];
        if (moe.pre_softmax) r.topk_probs[n * k + j] = row[top[j]];
        else sum += r.topk_probs[n * k + j] = std::exp(row[top[j]] - m);
      }
      if (!moe.pre_softmax)
        for (int64_t j = 0; j < k; ++j) r.topk_probs[n * k + j] /= sum;
    }
    for (int64_t i = 0; i < S * k; ++i) ++r.routed[r.expert[i]];
    if (drop) {
      std::vector<std::vector<int64_t>> lists(static_cast<size_t>(E));
      for (int64_t s = 0; s < S; ++s) {
        const int64_t n = order[s];
        for (int64_t j = 0; j < k; ++j) lists[r.expert[n * k + j]].push_back(n * k + j);
      }
      const bool by_probs = moe.drop_policy == MoeDropPolicy::probs;
      for (auto& list : lists)
        keep_capacity(list, r.capacity, r.kept,
                      [&](int64_t a, int64_t b) { return by_probs && r.topk_probs[a] > r.topk_probs[b]; });
    }
    for (int64_t i = 0; i < S * k; ++i) r.weight[i] = r.kept[i] ? r.topk_probs[i] : 0.0;
    if (moe.load_balancing == MoeLoadBalancing::aux_loss) {
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) {
        double pe = 0;
        for (int64_t n = 0; n < S; ++n) pe += p[n * E + e];
        sum += pe * static_cast<double>(r.routed[e]);
      }
      r.lb_loss = sum * (static_cast<double>(E) / (static_cast<double>(k) * S * S));
    } else if (moe.load_balancing == MoeLoadBalancing::seq_aux_loss) {
      double total = 0;
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t e = 0; e < E; ++e) {
          int64_t count = 0;
          double pe = 0;
          for (int64_t t = 0; t < T; ++t) {
            const int64_t n = b * T + t;
            pe += p[n * E + e];
            for (int64_t j = 0; j < k; ++j) count += r.expert[n * k + j] == e ? 1 : 0;
          }
          total += (static_cast<double>(count) * E / (static_cast<double>(T) * k)) * (pe / T);
        }
      }
      r.lb_loss = total / B;
    }
  }
  // The z-loss (Megatron-Core's; reported for every router, in the objective with its coefficient).
  double z = 0;
  for (int64_t n = 0; n < S; ++n) z += lse[n] * lse[n];
  r.z_loss = z / S;
  for (int64_t i = 0; i < S * k; ++i) {
    if (r.kept[i]) ++r.kept_count[r.expert[i]];
    else ++r.dropped;
  }
  return r;
}

void moe_route_backward(const MoeConfig& moe, const MoeRouting& r, const double* logits, const double* dweight,
                        double lb_scale, double z_scale, double* dlogits) {
  const int64_t S = r.S, E = r.E, k = r.k;
  const double* p = r.probs.data();
  std::vector<double> dp(static_cast<size_t>(S * E), 0.0);  // d/d(probs over all experts)
  std::fill(dlogits, dlogits + S * E, 0.0);
  if (moe.router == MoeRouter::deepspeed && k > 2) {
    for (int64_t n = 0; n < S; ++n) {
      double d = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j)
        if (r.kept[n * k + j]) {
          d += p[n * E + r.expert[n * k + j]];
          dot += r.weight[n * k + j] * dweight[n * k + j];
        }
      const bool clamped = d < static_cast<double>(FLT_EPSILON);
      for (int64_t j = 0; j < k; ++j) {
        if (!r.kept[n * k + j]) continue;
        dp[n * E + r.expert[n * k + j]] += clamped ? dweight[n * k + j] / FLT_EPSILON : (dweight[n * k + j] - dot) / d;
      }
    }
    if (lb_scale != 0)  // l_aux = E / k sum_e mean_s(p_se) routed_e / S
      for (int64_t e = 0; e < E; ++e) {
        const double g = lb_scale * E / k * (static_cast<double>(r.routed[e]) / S) / S;
        for (int64_t n = 0; n < S; ++n) dp[n * E + e] += g;
      }
  } else if (moe.router == MoeRouter::deepspeed) {
    for (int64_t n = 0; n < S; ++n) {
      if (k == 1) {
        if (r.kept[n]) dp[n * E + r.expert[n]] += dweight[n];
        continue;
      }
      const double g1 = r.kept[n * 2] ? p[n * E + r.expert[n * 2]] : 0.0;
      const double g2 = r.kept[n * 2 + 1] ? p[n * E + r.expert[n * 2 + 1]] : 0.0;
      const double sum = g1 + g2;
      const double dw1 = r.kept[n * 2] ? dweight[n * 2] : 0.0, dw2 = r.kept[n * 2 + 1] ? dweight[n * 2 + 1] : 0.0;
      double d1, d2;  // d/d g1, d/d g2 of dw1 w1 + dw2 w2
      if (sum >= static_cast<double>(FLT_EPSILON)) {
        const double inv2 = 1.0 / (sum * sum);
        d1 = (dw1 * g2 - dw2 * g2) * inv2;
        d2 = (dw2 * g1 - dw1 * g1) * inv2;
      } else {  // the clamp holds the denominator constant
        d1 = dw1 / FLT_EPSILON;
        d2 = dw2 / FLT_EPSILON;
      }
      if (r.kept[n * 2]) dp[n * E + r.expert[n * 2]] += d1;
      if (r.kept[n * 2 + 1]) dp[n * E + r.expert[n * 2 + 1]] += d2;
    }
    if (lb_scale != 0) {  // l_aux = E sum_e mean_s(g_se) ce_e
      std::vector<int64_t> first(static_cast<size_t>(E), 0);
      for (int64_t n = 0; n < S; ++n) ++first[r.expert[n * k]];
      for (int64_t e = 0; e < E; ++e) {
        const double d = lb_scale * E * (static_cast<double>(first[e]) / S) / S;
        for (int64_t n = 0; n < S; ++n) dp[n * E + e] += d;
      }
    }
  } else {
    for (int64_t n = 0; n < S; ++n) {
      if (moe.pre_softmax) {
        for (int64_t j = 0; j < k; ++j)
          if (r.kept[n * k + j]) dp[n * E + r.expert[n * k + j]] += dweight[n * k + j];
        continue;
      }
      // weights = softmax over the k chosen logits: d logit_j = w_j (dw_j - sum_i w_i dw_i)
      double dot = 0;
      for (int64_t j = 0; j < k; ++j)
        if (r.kept[n * k + j]) dot += r.topk_probs[n * k + j] * dweight[n * k + j];
      for (int64_t j = 0; j < k; ++j) {
        const double dw = r.kept[n * k + j] ? dweight[n * k + j] : 0.0;
        dlogits[n * E + r.expert[n * k + j]] += r.topk_probs[n * k + j] * (dw - dot);
      }
    }
    if (lb_scale != 0 && moe.load_balancing == MoeLoadBalancing::aux_loss) {
      const double c = lb_scale * static_cast<double>(E) / (static_cast<double>(k) * S * S);
      for (int64_t n = 0; n < S; ++n)
        for (int64_t e = 0; e < E; ++e) dp[n * E + e] += c * static_cast<double>(r.routed[e]);
    } else if (lb_scale != 0 && moe.load_balancing == MoeLoadBalancing::seq_aux_loss) {
      const int64_t B = r.B, T = r.T;
      std::vector<double> count(static_cast<size_t>(E));
      for (int64_t b = 0; b < B; ++b) {
        std::fill(count.begin(), count.end(), 0.0);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < k; ++j) count[r.expert[(b * T + t) * k + j]] += 1;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t e = 0; e < E; ++e)
            dp[(b * T + t) * E + e] += lb_scale / B * (count[e] * E / (static_cast<double>(T) * k)) / T;
      }
    }
  }
  if (z_scale != 0) {  // z = mean_s lse_s^2: d logit_se = 2 lse_s p_se / S
    for (int64_t n = 0; n < S; ++n) {
      const double* x = logits + n * E;
      double m = x[0];
      for (int64_t e = 1; e < E; ++e) m = std::max(m, x[e]);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - m);
      const double lse = m + std::log(sum);
      for (int64_t e = 0; e < E; ++e) dlogits[n * E + e] += z_scale * 2 * lse * p[n * E + e] / S;
    }
  }
  // Softmax backward of dp into dlogits: d logit_e += p_e (dp_e - sum_i p_i dp_i).
  for (int64_t n = 0; n < S; ++n) {
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += p[n * E + e] * dp[n * E + e];
    for (int64_t e = 0; e < E; ++e) dlogits[n * E + e] += p[n * E + e] * (dp[n * E + e] - dot);
  }
}

}  // namespace troupe
