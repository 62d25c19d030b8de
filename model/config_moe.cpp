// GptConfig's mixture-of-experts parts (model/config_moe.hpp). The flags named in messages are the
// router's dialect's: the deepspeed router is what Megatron-DeepSpeed's flags build, the megatron
// router Megatron-LM's (docs/COMPAT.md, "Mixture of experts").
#include "model/config_moe.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <sstream>

namespace troupe {
namespace {

std::string num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// Far beyond any trainable model, and small enough that E x C x F of the widest layers stays inside
// a double's exact range (the memory check refuses what does not fit long before).
constexpr int kMaxExperts = 1 << 20;
constexpr int kMaxWidth = 1 << 25;

}  // namespace

int64_t moe_mlp_parameters(const GptConfig& m, int experts) {
  const int64_t C = m.hidden_size, E = experts, Fe = m.expert_ffn_hidden_size();
  const bool swiglu = m.activation == MlpActivation::swiglu, bias = m.add_bias_linear;
  const MoeConfig& moe = m.moe;
  const int64_t fc1e = swiglu ? 2 * Fe : Fe;  // [gate | up] or one
  // An expert with the model's biases (both anchors add the experts' c_proj bias: Megatron-DeepSpeed's
  // RowParallelLinear adds it itself since its 2023-07 merge, docs/MOE_SEMANTICS.md).
  const int64_t expert = C * fc1e + Fe * C + (bias ? fc1e + C : 0);
  // The router (E, C), with a bias (E) in Megatron-Core when the model has biases.
  int64_t total = E * C + (bias && moe.router == MoeRouter::megatron ? E : 0) + E * expert;
  if (moe.residual) total += expert + 2 * C + 2;  // PR-MoE's MLP (a copy of the expert) + Linear(C, 2)
  if (moe.shared_expert_ffn > 0) {
    const int64_t Fs = moe.shared_expert_ffn, fc1s = swiglu ? 2 * Fs : Fs;
    total += C * fc1s + Fs * C + (bias ? fc1s + C : 0);
  }
  return total;
}

double moe_mlp_macs_per_token(const GptConfig& m, int experts) {
  const double C = m.hidden_size, Fe = m.expert_ffn_hidden_size();
  const double e =
      m.activation == MlpActivation::swiglu ? 3.0 : 2.0;  // fc1 (2 halves with SwiGLU) + fc2
  const MoeConfig& moe = m.moe;
  double macs = moe.topk * C * Fe * e + C * experts;  // k experts, the router
  if (moe.residual) macs += C * Fe * e + 2 * C;
  if (moe.shared_expert_ffn > 0) macs += C * moe.shared_expert_ffn * e;
  return macs;
}

void append_moe_problems(const GptConfig& m, std::vector<std::string>& out) {
  const MoeConfig& moe = m.moe;
  if (!moe.enabled()) return;
  const size_t before = out.size();
  auto bad = [&out](const std::string& flag, const std::string& what, const std::string& fix) {
    out.push_back(flag + " " + what + " -- " + fix);
  };
  const auto str = [](int64_t v) { return std::to_string(v); };
  const bool ds = moe.router == MoeRouter::deepspeed;
  const std::string topk_flag = ds ? "--topk" : "--moe-router-topk";
  const std::string freq_flag = ds ? "--expert-interval" : "--moe-layer-freq";
  const std::string cap_flag = ds ? "--moe-train-capacity-factor" : "--moe-expert-capacity-factor";
  const std::string aux_flag = ds ? "--moe-loss-coeff" : "--moe-aux-loss-coeff";

  // The experts of each MoE layer.
  bool counts_ok = true;
  for (const int e : moe.num_experts)
    if (e < 1 || e > kMaxExperts) counts_ok = false;
  if (!counts_ok) {
    std::string values;
    for (const int e : moe.num_experts) {
      if (!values.empty()) values += ' ';
      values += str(e);
    }
    bad("--num-experts", "must be 1 to " + str(kMaxExperts) + " in every MoE layer, got " + values,
        "give each MoE layer's experts, e.g. --num-experts 8");
  }
  // Which layers have them.
  bool layers_ok = m.num_layers > 0 && m.num_layers <= (1 << 20);
  if (moe.layer_pattern.empty()) {
    if (moe.layer_freq < 1) {
      bad(freq_flag, "must be at least 1, got " + str(moe.layer_freq),
          ds ? "use 2 (Megatron-DeepSpeed's default: experts in every 2nd layer) or 1 (every layer)"
             : "use 1 (experts in every layer) or N (layers 0, N, 2N, ... counted from 0)");
      layers_ok = false;
    }
  } else {
    for (const int v : moe.layer_pattern)
      if (v != 0 && v != 1) {
        bad("--moe-layer-freq",
            "pattern holds " + str(v) + ": each layer's entry is 1 (MoE) or 0 (dense)",
            "write e.g. \"([1]*3+[0]*1)*2\"");
        layers_ok = false;
        break;
      }
    if (static_cast<int64_t>(moe.layer_pattern.size()) != m.num_layers) {
      bad("--moe-layer-freq",
          "pattern has " + str(static_cast<int64_t>(moe.layer_pattern.size())) +
              " entries but --num-layers is " + str(m.num_layers),
          "give one 0/1 per layer (Megatron-LM asserts the same), e.g. \"[1]*" +
              str(std::max(1, m.num_layers)) + "\"");
      layers_ok = false;
    }
  }
  if (layers_ok) {
    const int moe_layers = moe.moe_layers(m.num_layers);
    const std::string rule = moe.layer_pattern.empty() ? freq_flag + " " + str(moe.layer_freq) +
                                                             " of --num-layers " + str(m.num_layers)
                                                       : "--moe-layer-freq's pattern";
    if (moe_layers == 0) {
      bad(freq_flag, "leaves no layer with experts (" + rule + ")",
          "choose an interval of at most --num-layers, or drop the MoE flags for a dense model");
    } else if (moe.num_experts.size() > 1 &&
               static_cast<int>(moe.num_experts.size()) != moe_layers) {
      bad("--num-experts",
          "lists " + str(static_cast<int64_t>(moe.num_experts.size())) +
              " values but the model has " + str(moe_layers) + " MoE layers (" + rule + ")",
          "give one value for every MoE layer, or one per MoE layer in order (Megatron-DeepSpeed "
          "asserts the same)");
    } else if (counts_ok && moe.topk >= 1) {
      int fewest = INT_MAX, at = -1;
      for (int l = 0; l < m.num_layers; ++l)
        if (moe.is_moe_layer(l, m.num_layers) && moe.experts_of(l, m.num_layers) < fewest) {
          fewest = moe.experts_of(l, m.num_layers);
          at = l;
        }
      if (moe.topk > fewest)
        bad(topk_flag,
            str(moe.topk) + " routes each token to more experts than the " + str(fewest) +
                " of layer " + str(at + 1),
            "lower k, or give that layer more experts");
    }
  }
  if (moe.topk < 1)
    bad(topk_flag, "must be at least 1, got " + str(moe.topk),
        ds ? "use e.g. --topk 1" : "use e.g. --moe-router-topk 2");
  else if (!ds && moe.topk == 1 && !moe.pre_softmax)
    bad("--moe-router-topk",
        "1 without --moe-router-pre-softmax: the softmax over the one chosen expert is always 1, "
        "so the router "
        "would never learn (Megatron-Core refuses it too)",
        "add --moe-router-pre-softmax, or route to 2 experts");

  // Widths.
  if (moe.ffn_hidden < 0 || moe.ffn_hidden > kMaxWidth)
    bad("--moe-ffn-hidden-size", "must be 1 to " + str(kMaxWidth) + ", got " + str(moe.ffn_hidden),
        "leave it out for --ffn-hidden-size, or give each expert's width");
  if (moe.shared_expert_ffn < 0 || moe.shared_expert_ffn > kMaxWidth)
    bad("--moe-shared-expert-intermediate-size",
        "must be 1 to " + str(kMaxWidth) + ", got " + str(moe.shared_expert_ffn),
        "give the shared experts' total width, or leave it out for none");

  // Capacity and the losses.
  if (moe.drop_tokens) {
    if (!(moe.capacity_factor > 0) || !std::isfinite(moe.capacity_factor))
      bad(cap_flag,
          "must be positive when tokens over capacity are dropped, got " + num(moe.capacity_factor),
          ds ? "use 1.0 (Megatron-DeepSpeed's default), or --disable-moe-token-dropping for no "
               "capacity limit"
             : "use e.g. 1.0, or leave --moe-expert-capacity-factor out for dropless routing");
    if ((ds || moe.eval_capacity_factor != moe.capacity_factor) &&
        (!(moe.eval_capacity_factor > 0) || !std::isfinite(moe.eval_capacity_factor)))
      bad(ds ? "--moe-eval-capacity-factor" : "the evaluation capacity factor",
          "must be positive when tokens over capacity are dropped, got " +
              num(moe.eval_capacity_factor),
          "use 1.0 (Megatron-DeepSpeed's default)");
  }
  if (moe.min_capacity < 0)
    bad("--moe-min-capacity", "must be >= 0, got " + str(moe.min_capacity),
        "use 4 (Megatron-DeepSpeed's default) or 0 (no minimum)");
  if (!(moe.aux_loss_coeff >= 0) || !std::isfinite(moe.aux_loss_coeff))
    bad(aux_flag, "must be >= 0, got " + num(moe.aux_loss_coeff),
        ds ? "use e.g. 0.01 (Megatron-DeepSpeed's scripts) or 0"
           : "use e.g. 0.01 (Megatron-LM's suggestion) or 0");
  if (!(moe.z_loss_coeff >= 0) || !std::isfinite(moe.z_loss_coeff))
    bad("--moe-z-loss-coeff", "must be >= 0, got " + num(moe.z_loss_coeff),
        "use e.g. 1e-3, or leave it out for none");
  if (!(moe.input_jitter_eps >= 0 && moe.input_jitter_eps < 1))
    bad("--moe-input-jitter-eps", "must be in [0, 1), got " + num(moe.input_jitter_eps),
        "use e.g. 0.01, or leave it out for no jitter");

  // Each router's own settings.
  if (!ds && moe.residual)
    bad("--mlp-type",
        "residual (PR-MoE, Megatron-DeepSpeed's) with the megatron router, which has no residual "
        "MLP",
        "use --moe-shared-expert-intermediate-size (Megatron-Core's shared expert) or drop "
        "--mlp-type residual");
  if (ds) {
    const std::string what =
        "is Megatron-Core's router setting; the deepspeed router (Megatron-DeepSpeed's "
        "DeepSpeed-MoE gating) has none";
    const std::string fix = "drop it, or write the MoE flags in Megatron-LM's spelling throughout";
    if (moe.shared_expert_ffn > 0)
      bad("--moe-shared-expert-intermediate-size", what,
          "use --mlp-type residual (PR-MoE's dense MLP beside the experts), or drop it");
    if (moe.pre_softmax) bad("--moe-router-pre-softmax", what, fix);
    if (moe.z_loss_coeff != 0) bad("--moe-z-loss-coeff", what, fix);
    if (moe.input_jitter_eps != 0) bad("--moe-input-jitter-eps", what, fix);
    if (moe.load_balancing != MoeLoadBalancing::aux_loss)
      bad(std::string("--moe-router-load-balancing-type ") + to_string(moe.load_balancing), what,
          "drop it: DeepSpeed-MoE always adds its l_aux, weighed by --moe-loss-coeff");
    if (moe.drop_policy != MoeDropPolicy::probs)
      bad(std::string("--moe-token-drop-policy ") + to_string(moe.drop_policy), what, fix);
  }
  if (moe.pad_to_capacity && !moe.drop_tokens)
    bad("--moe-pad-expert-input-to-capacity",
        "needs a capacity (Megatron-Core refuses it without one)",
        "add --moe-expert-capacity-factor F, or drop the flag");

  // The size, once every part of it is valid: within 2^60 parameters, as the dense layers are.
  if (out.size() == before && layers_ok && m.hidden_size > 0 && m.hidden_size <= (1 << 24) &&
      m.ffn_hidden_size() > 0 && m.ffn_hidden_size() <= kMaxWidth) {
    const double C = m.hidden_size, Fe = m.expert_ffn_hidden_size(), Fs = moe.shared_expert_ffn;
    double total = 0;
    for (int l = 0; l < m.num_layers; ++l)
      if (moe.is_moe_layer(l, m.num_layers)) {
        const double E = moe.experts_of(l, m.num_layers);
        total += E * C + (E + 1) * (3 * C * Fe + 2 * Fe + C) + 3 * C * Fs + 2 * Fs + 3 * C + 2;
      }
    if (total > 0x1p60)
      bad("--num-experts", "gives " + num(total) + " parameters in the MoE layers, beyond 2^60",
          "use fewer or narrower experts");
  }
}

}  // namespace troupe
