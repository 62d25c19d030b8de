#include "reference/dropout.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ops.hpp"

namespace troupe::ref_dropout {

namespace {

// The high and low 32 bits of a * b.
void mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product & 0xffffffffu);
}

// The model's ALiBi slopes (the product's rule, kernels/ops.hpp), or none.
std::vector<double> alibi(const GptConfig& model) {
  if (model.position_embedding != PositionEmbedding::alibi) return {};
  return ops::alibi_slopes(model.num_attention_heads);
}

}  // namespace

void philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
  uint32_t key[2] = {k0, k1};
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {  // the key schedule: Weyl sequence bumps before every round but the first
      key[0] += 0x9E3779B9u;
      key[1] += 0xBB67AE85u;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c[0], &hi0, &lo0);
    mulhilo(0xCD9E8D57u, c[2], &hi1, &lo1);
    const uint32_t next[4] = {hi1 ^ c[1] ^ key[0], lo1, hi0 ^ c[3] ^ key[1], lo0};
    std::copy(next, next + 4, c);
  }
}

double dropout_factor(const GptConfig& model, const MicroBatchKey& key, DropoutSite site, int layer, int64_t sample,
                      int64_t element) {
  const double p = site == DropoutSite::attention_probs ? model.attention_dropout : model.hidden_dropout;
  if (p == 0) return 1.0;
  const uint32_t site_code = site == DropoutSite::embedding          ? 0u
                             : site == DropoutSite::attention_probs  ? 1u
                             : site == DropoutSite::attention_output ? 2u
                                                                     : 3u;
  uint32_t c[4] = {static_cast<uint32_t>(element / 4), static_cast<uint32_t>(sample),
                   static_cast<uint32_t>(key.iteration), 4u * static_cast<uint32_t>(layer) + site_code};
  philox(c, static_cast<uint32_t>(key.seed & 0xffffffffu), static_cast<uint32_t>(key.seed >> 32));
  const double u = static_cast<double>(c[element % 4] >> 8) / 16777216.0;  // 24-bit uniform in [0, 1)
  return u >= p ? 1.0 / (1.0 - p) : 0.0;
}

template <class T>
void attention_forward(const GptConfig& model, const MicroBatchKey& key, int layer, T* out, T* probs, const T* qkv,
                       int64_t B) {
  const int64_t Tn = model.seq_length, H = model.num_attention_heads, G = model.query_groups(), hs = model.head_size();
  const int64_t W = model.qkv_size(), A = model.attention_size();  // qkv and out row widths
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const std::vector<double> slopes = alibi(model);
  std::vector<double> s(static_cast<size_t>(Tn));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kc = H * hs + h / (H / G) * hs, vc = (H + G) * hs + h / (H / G) * hs;  // its group's k, v
      for (int64_t i = 0; i < Tn; ++i) {
        const T* q = qkv + (b * Tn + i) * W + h * hs;
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const T* k = qkv + (b * Tn + j) * W + kc;
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d) dot += static_cast<double>(q[d]) * static_cast<double>(k[d]);
          s[j] = dot * scale;
          if (!slopes.empty()) s[j] += slopes[h] * static_cast<double>(j - i);
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += s[j] = std::exp(s[j] - mx);
        T* prow = probs + ((b * H + h) * Tn + i) * Tn;
        for (int64_t j = 0; j < Tn; ++j) prow[j] = j <= i ? static_cast<T>(s[j] / sum) : T(0);
        T* o = out + (b * Tn + i) * A + h * hs;
        for (int64_t d = 0; d < hs; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const double f =
                dropout_factor(model, key, DropoutSite::attention_probs, layer, key.first_sample + b, (h * Tn + i) * Tn + j);
            acc += static_cast<double>(prow[j]) * f * static_cast<double>(qkv[(b * Tn + j) * W + vc + d]);
          }
          o[d] = static_cast<T>(acc);
        }
      }
    }
}

template <class T>
void attention_backward(const GptConfig& model, const MicroBatchKey& key, int layer, T* dqkv, const T* dout,
                        const T* qkv, const T* probs, int64_t B) {
  const int64_t Tn = model.seq_length, H = model.num_attention_heads, G = model.query_groups(), hs = model.head_size();
  const int64_t W = model.qkv_size(), A = model.attention_size();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::fill(dqkv, dqkv + B * Tn * W, T(0));
  // ALiBi's bias does not depend on q or k: the score gradient is the same with or without it.
  std::vector<double> dq(static_cast<size_t>(Tn * hs)), dk(dq.size()), dv(dq.size()), dp(static_cast<size_t>(Tn));
  // Column of (part, head or group, d): q heads, then k groups, then v groups.
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return (b * Tn + t) * W + (part == 0 ? 0 : part == 1 ? H * hs : (H + G) * hs) + h * hs + d;
  };
  // dk, dv of a group sum its heads' contributions (in head order); kept in double until written.
  std::vector<double> dk_group(static_cast<size_t>(B * G * Tn * hs), 0.0), dv_group(dk_group.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t grp = h / (H / G);
      std::fill(dq.begin(), dq.end(), 0.0);
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t i = 0; i < Tn; ++i) {
        const T* prow = probs + ((b * H + h) * Tn + i) * Tn;
        const T* dO = dout + (b * Tn + i) * A + h * hs;
        // d(dropped prob) = dO . v_j, and dv_j += dropped prob * dO; d(prob) = its factor times the first.
        double rowdot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const double f =
              dropout_factor(model, key, DropoutSite::attention_probs, layer, key.first_sample + b, (h * Tn + i) * Tn + j);
          double ddrop = 0;
          for (int64_t d = 0; d < hs; ++d) {
            ddrop += static_cast<double>(dO[d]) * static_cast<double>(qkv[at(b, j, 2, grp, d)]);
            dv[j * hs + d] += static_cast<double>(prow[j]) * f * static_cast<double>(dO[d]);
          }
          dp[j] = ddrop * f;
          rowdot += static_cast<double>(prow[j]) * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = static_cast<double>(prow[j]) * (dp[j] - rowdot) * scale;  // d(score before scaling)
          for (int64_t d = 0; d < hs; ++d) {
            dq[i * hs + d] += ds * static_cast<double>(qkv[at(b, j, 1, grp, d)]);
            dk[j * hs + d] += ds * static_cast<double>(qkv[at(b, i, 0, h, d)]);
          }
        }
      }
      for (int64_t t = 0; t < Tn; ++t)
        for (int64_t d = 0; d < hs; ++d) dqkv[at(b, t, 0, h, d)] = static_cast<T>(dq[t * hs + d]);
      if (G == H) {  // one head per group: written as computed (the GPT-2 rounding of before GQA)
        for (int64_t t = 0; t < Tn; ++t)
          for (int64_t d = 0; d < hs; ++d) {
            dqkv[at(b, t, 1, h, d)] = static_cast<T>(dk[t * hs + d]);
            dqkv[at(b, t, 2, h, d)] = static_cast<T>(dv[t * hs + d]);
          }
      } else {
        double* gk = dk_group.data() + (b * G + grp) * Tn * hs;
        double* gv = dv_group.data() + (b * G + grp) * Tn * hs;
        for (int64_t e = 0; e < Tn * hs; ++e) {
          gk[e] += dk[e];
          gv[e] += dv[e];
        }
      }
    }
  if (G != H)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t grp = 0; grp < G; ++grp)
        for (int64_t t = 0; t < Tn; ++t)
          for (int64_t d = 0; d < hs; ++d) {
            const size_t e = static_cast<size_t>(((b * G + grp) * Tn + t) * hs + d);
            dqkv[at(b, t, 1, grp, d)] = static_cast<T>(dk_group[e]);
            dqkv[at(b, t, 2, grp, d)] = static_cast<T>(dv_group[e]);
          }
}

template void attention_forward<float>(const GptConfig&, const MicroBatchKey&, int, float*, float*, const float*,
                                       int64_t);
template void attention_forward<double>(const GptConfig&, const MicroBatchKey&, int, double*, double*, const double*,
                                        int64_t);
template void attention_backward<float>(const GptConfig&, const MicroBatchKey&, int, float*, const float*,
                                        const float*, const float*, int64_t);
template void attention_backward<double>(const GptConfig&, const MicroBatchKey&, int, double*, const double*,
                                         const double*, const double*, int64_t);

}  // namespace troupe::ref_dropout
