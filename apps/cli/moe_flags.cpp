// apps/cli/moe_flags.hpp. The defaults below are the anchors' (argparse defaults and
// TransformerConfig fields). Megatron-DeepSpeed megatron/arguments.py, read at f4157be of
// microsoft/Megatron-DeepSpeed (the same MoE flags as the list at 4efb479): --num-experts [1],
// --expert-interval 2, --topk 1, capacity factors 1.0, --moe-min-capacity 4, --moe-loss-coeff 0.1,
// token dropping and top-2 sampling on, --moe-expert-parallel-size 1) and its MoE layer
// (megatron/model/transformer.py: DeepSpeed's MoE with use_rts left at True, the dense MLP where a
// layer has one expert); Megatron-LM megatron/training/arguments.py and TransformerConfig
// (--moe-layer-freq 1, --moe-router-topk 2, no capacity factor: dropless, aux_loss with coefficient
// 0, no z-loss, no jitter, drop policy probs, --expert-tensor-parallel-size the tensor-parallel
// size).
#include "apps/cli/moe_flags.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace troupe {
namespace {

// Each project's own MoE flags (in no arguments.py of the other), registered below.
constexpr const char* kDeepSpeedOwn[] = {"--expert-interval",
                                         "--topk",
                                         "--moe-expert-parallel-size",
                                         "--moe-train-capacity-factor",
                                         "--moe-eval-capacity-factor",
                                         "--moe-min-capacity",
                                         "--moe-loss-coeff",
                                         "--disable-moe-token-dropping",
                                         "--disable-moe-top2-2nd-expert-sampling",
                                         "--mlp-type",
                                         "--enable-expert-tensor-parallelism"};
constexpr const char* kMegatronOwn[] = {"--moe-layer-freq",
                                        "--moe-ffn-hidden-size",
                                        "--moe-router-topk",
                                        "--moe-router-load-balancing-type",
                                        "--moe-aux-loss-coeff",
                                        "--moe-z-loss-coeff",
                                        "--moe-router-pre-softmax",
                                        "--moe-expert-capacity-factor",
                                        "--moe-token-drop-policy",
                                        "--moe-pad-expert-input-to-capacity",
                                        "--moe-shared-expert-intermediate-size",
                                        "--moe-input-jitter-eps",
                                        "--expert-model-parallel-size",
                                        "--expert-tensor-parallel-size"};

// Reads the values of the flags given, appending a problem for each that is no number.
class Reader {
 public:
  Reader(const CLI::App& cmd, const FlagGivenFn& given, std::vector<std::string>& problems)
      : cmd_(cmd), given_(given), problems_(problems) {}

  bool given(const char* flag) const { return given_(flag); }
  // The values of the flag's last occurrence (a list's every value).
  std::vector<std::string> values(const char* flag) const {
    return cmd_.get_option(flag)->results();
  }
  std::string value(const char* flag) const {
    const std::vector<std::string> v = values(flag);
    return v.empty() ? std::string() : v.back();
  }
  // "--flag v1 v2" as given, or the switch.
  std::string shown(const char* flag) const {
    std::string s = flag;
    if (cmd_.get_option(flag)->get_expected_max() > 0)
      for (const std::string& v : values(flag)) s += " " + v;
    return s;
  }

  // argparse's type=int: a whole number (Python's int() also takes a sign).
  bool integer(const char* flag, const std::string& v, int* out) {
    char* end = nullptr;
    errno = 0;
    const long long n = v.empty() ? 0 : std::strtoll(v.c_str(), &end, 10);
    if (!v.empty() && end == v.c_str() + v.size() && errno == 0 && n >= INT_MIN && n <= INT_MAX) {
      *out = static_cast<int>(n);
      return true;
    }
    problems_.push_back(std::string(flag) + " " + v +
                        " is not an integer -- pass a whole number, e.g. 8");
    return false;
  }
  // argparse's type=float.
  bool number(const char* flag, const std::string& v, double* out) {
    char* end = nullptr;
    const double x = v.empty() ? 0 : std::strtod(v.c_str(), &end);
    if (!v.empty() && end == v.c_str() + v.size()) {
      *out = x;
      return true;
    }
    problems_.push_back(std::string(flag) + " " + v + " is not a number -- pass e.g. 1.0");
    return false;
  }
  // The flag's value into *out when given; false when given and not a number.
  bool integer_if_given(const char* flag, int* out) {
    return !given(flag) || integer(flag, value(flag), out);
  }
  bool number_if_given(const char* flag, double* out) {
    return !given(flag) || number(flag, value(flag), out);
  }

  void problem(const std::string& p) { problems_.push_back(p); }

 private:
  const CLI::App& cmd_;
  const FlagGivenFn& given_;
  std::vector<std::string>& problems_;
};

// ---- Megatron-LM's --moe-layer-freq pattern: a Python list expression of digits, [], (), +, * and
// commas (Megatron's _eval_pattern allows exactly these characters, then eval()s it). ----
struct PatternValue {
  bool is_list = false;
  long long n = 0;
  std::vector<int> list;
};

class PatternParser {
 public:
  explicit PatternParser(const std::string& text) : s_(text) {}

  bool parse(std::vector<int>* out, std::string* error) {
    PatternValue v;
    if (!expr(&v)) return *error = error_, false;
    if (pos_ != s_.size()) return *error = "unexpected '" + std::string(1, s_[pos_]) + "'", false;
    if (!v.is_list) return *error = "it is a number, not a list", false;
    *out = v.list;
    return true;
  }

 private:
  static constexpr size_t kMaxLength = 1 << 20;  // entries; far beyond any --num-layers
  static constexpr int kMaxDepth = 64;           // nested brackets: the recursion stays shallow

  bool fail(const std::string& why) {
    if (error_.empty()) error_ = why;
    return false;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) return ++pos_, true;
    return false;
  }
  bool expr(PatternValue* v) {
    if (!term(v)) return false;
    while (eat('+')) {
      PatternValue r;
      if (!term(&r)) return false;
      if (v->is_list != r.is_list) return fail("'+' joins a list and a number");
      if (v->is_list) {
        if (v->list.size() + r.list.size() > kMaxLength) return fail("the list is too long");
        v->list.insert(v->list.end(), r.list.begin(), r.list.end());
      } else if ((v->n += r.n) > INT_MAX) {
        return fail("a number is too large");
      }
    }
    return true;
  }
  bool term(PatternValue* v) {
    if (!atom(v)) return false;
    while (eat('*')) {
      PatternValue r;
      if (!atom(&r)) return false;
      if (v->is_list && r.is_list) return fail("'*' multiplies two lists");
      if (!v->is_list && !r.is_list) {
        if ((v->n *= r.n) > INT_MAX) return fail("a number is too large");
        continue;
      }
      PatternValue& list = v->is_list ? *v : r;
      const long long times = v->is_list ? r.n : v->n;  // Python: a list times n <= 0 is empty
      if (times > 0 && list.list.size() * static_cast<size_t>(times) > kMaxLength)
        return fail("the list is too long");
      if (times == 1) {  // no copy (a long chain of "*1" stays linear)
        if (!v->is_list) *v = std::move(r);
        continue;
      }
      std::vector<int> repeated;
      for (long long i = 0; i < times && !list.list.empty(); ++i)
        repeated.insert(repeated.end(), list.list.begin(), list.list.end());
      v->is_list = true;
      v->list = std::move(repeated);
    }
    return true;
  }
  bool group(PatternValue* v) {  // "(" expr ")"
    eat('(');
    if (!expr(v)) return false;
    return eat(')') || fail("a '(' is not closed");
  }
  bool list(PatternValue* v) {  // "[" [expr ("," expr)*] "]", each a number
    eat('[');
    v->is_list = true;
    if (eat(']')) return true;
    do {
      PatternValue item;
      if (!expr(&item)) return false;
      if (item.is_list) return fail("a list inside the list");
      v->list.push_back(static_cast<int>(item.n));
      if (v->list.size() > kMaxLength) return fail("the list is too long");
    } while (eat(','));
    return eat(']') || fail("a '[' is not closed");
  }
  bool atom(PatternValue* v) {
    if (pos_ < s_.size() && (s_[pos_] == '(' || s_[pos_] == '[')) {
      if (++depth_ > kMaxDepth) return fail("brackets nest too deep");
      const bool ok = s_[pos_] == '(' ? group(v) : list(v);
      --depth_;
      return ok;
    }
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    if (pos_ == start)
      return fail(pos_ < s_.size() ? "unexpected '" + std::string(1, s_[pos_]) + "'"
                                   : "it ends early");
    if (pos_ - start > 9) return fail("a number is too large");
    v->n = std::stoll(s_.substr(start, pos_ - start));
    return true;
  }

  const std::string& s_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string error_;
};

// "1st", "2nd", "3rd", "4th", ...
std::string ordinal(int n) {
  const int tens = n % 100, ones = n % 10;
  const char* suffix = tens >= 11 && tens <= 13 ? "th"
                       : ones == 1              ? "st"
                       : ones == 2              ? "nd"
                       : ones == 3              ? "rd"
                                                : "th";
  return std::to_string(n) + suffix;
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

// A dense model's MoE flags: one note each, nothing read.
void note_dense(const Reader& r, const std::vector<const char*>& flags, const std::string& why,
                std::vector<std::string>* notes) {
  if (notes == nullptr) return;
  for (const char* f : flags) notes->push_back(r.shown(f) + ": no effect -- " + why);
}

// Megatron-DeepSpeed's reading.
void read_deepspeed(Reader& r, const std::vector<std::string>& experts_text,
                    const std::vector<const char*>& own, const std::string& why, TrainConfig* cfg,
                    std::vector<std::string>* notes) {
  bool ok = true;
  std::vector<int> experts;
  for (const std::string& v : experts_text) {
    int e = 0;
    ok = r.integer("--num-experts", v, &e) && ok;
    experts.push_back(e);
  }
  int interval = 2, topk = 1, min_capacity = 4, ep = 1;
  double train_factor = 1.0, eval_factor = 1.0, coeff = 0.1;
  ok = r.integer_if_given("--expert-interval", &interval) && ok;
  ok = r.integer_if_given("--topk", &topk) && ok;
  ok = r.integer_if_given("--moe-min-capacity", &min_capacity) && ok;
  ok = r.integer_if_given("--moe-expert-parallel-size", &ep) && ok;
  ok = r.number_if_given("--moe-train-capacity-factor", &train_factor) && ok;
  ok = r.number_if_given("--moe-eval-capacity-factor", &eval_factor) && ok;
  ok = r.number_if_given("--moe-loss-coeff", &coeff) && ok;
  const std::string mlp_type = r.given("--mlp-type") ? r.value("--mlp-type") : "standard";
  if (mlp_type != "standard" && mlp_type != "residual") {
    r.problem("--mlp-type " + mlp_type +
              " is not one of Megatron-DeepSpeed's MLP types -- use standard, or residual (PR-MoE: "
              "a dense MLP "
              "beside the experts)");
    ok = false;
  }
  if (!ok) return;
  // Megatron-DeepSpeed builds the dense MLP where a layer's count is 1 and adds no MoE loss when
  // the largest is 1 (megatron/model/transformer.py, pretrain_gpt.py): every value 1 is the dense
  // model.
  if (std::all_of(experts.begin(), experts.end(), [](int e) { return e == 1; })) {
    std::vector<const char*> flags = own;
    if (!experts.empty()) flags.insert(flags.begin(), "--num-experts");
    note_dense(r, flags,
               experts.empty() ? "a dense model (no --num-experts: Megatron-DeepSpeed's default "
                                 "[1]): its DeepSpeed-MoE "
                                 "settings have no effect, and no MoE loss is added"
                               : "one expert per layer: Megatron-DeepSpeed builds its dense MLP "
                                 "(its default, [1]) and "
                                 "adds no MoE loss",
               notes);
    return;
  }
  const int layers = cfg->model.num_layers;
  MoeConfig m;
  m.router = MoeRouter::deepspeed;
  m.num_experts = experts;
  m.layer_freq = interval;
  m.topk = topk;
  m.capacity_factor = train_factor;
  m.eval_capacity_factor = eval_factor;
  m.min_capacity = min_capacity;
  m.drop_tokens = !r.given("--disable-moe-token-dropping");
  m.random_token_selection = true;  // DeepSpeed's use_rts default; Megatron-DeepSpeed passes none
  m.second_expert_sampling = !r.given("--disable-moe-top2-2nd-expert-sampling");
  m.aux_loss_coeff = coeff;
  m.residual = mlp_type == "residual";
  // A per-layer list with some values 1: those layers keep the dense MLP
  // (get_num_experts_per_layer), which the layer pattern says. A list of the wrong length is left
  // for validation to name.
  const bool some_dense = std::any_of(experts.begin(), experts.end(), [](int e) { return e == 1; });
  if (experts.size() > 1 && some_dense && interval >= 1 && layers >= 1 &&
      static_cast<int>(experts.size()) == layers / interval) {
    m.layer_pattern.assign(static_cast<size_t>(layers), 0);
    m.num_experts.clear();
    for (int l = 0; l < layers; ++l) {
      const int n = (l + 1) % interval == 0 ? experts[static_cast<size_t>(l / interval)] : 1;
      if (n == 1) continue;
      m.layer_pattern[static_cast<size_t>(l)] = 1;
      m.num_experts.push_back(n);
    }
  }
  cfg->model.moe = m;
  cfg->expert_model_parallel_size = ep;
  cfg->expert_tensor_parallel_size =
      r.given("--enable-expert-tensor-parallelism") ? cfg->tensor_model_parallel_size : 1;
  if (notes != nullptr)
    notes->push_back(r.shown("--num-experts") +
                     ": read as Megatron-DeepSpeed's mixture of experts (" + why +
                     "): " + describe_moe(*cfg));
}

// Megatron-LM's reading.
void read_megatron(Reader& r, const std::vector<const char*>& own, const std::string& why,
                   TrainConfig* cfg, std::vector<std::string>* notes) {
  bool ok = true;
  int experts = 0;  // 0: None (Megatron-LM: "if args.num_experts == 0: args.num_experts = None")
  ok = r.integer_if_given("--num-experts", &experts) && ok;
  int freq = 1, topk = 2, ffn = 0, shared = 0, ep = 1, etp = 0;
  std::vector<int> pattern;
  if (r.given("--moe-layer-freq")) {
    const std::string v = r.value("--moe-layer-freq");
    if (v.find('[') ==
        std::string::npos) {  // Megatron's moe_freq_type: an int unless it holds a list
      ok = r.integer("--moe-layer-freq", v, &freq) && ok;
    } else {
      std::string error;
      if (v.find_first_not_of("0123456789[](),+*") != std::string::npos)
        error = "only digits, [], (), +, * and commas may appear (Megatron-LM's rule)";
      else if (!PatternParser(v).parse(&pattern, &error))
        error = "not a list expression: " + error;
      if (!error.empty()) {
        r.problem("--moe-layer-freq " + v + ": " + error +
                  " -- write e.g. \"([1]*3+[0]*1)*2\" (one 0/1 per layer)");
        ok = false;
      }
    }
  }
  ok = r.integer_if_given("--moe-router-topk", &topk) && ok;
  for (auto [flag, width] : {std::pair{"--moe-ffn-hidden-size", &ffn},
                             std::pair{"--moe-shared-expert-intermediate-size", &shared}}) {
    if (!r.integer_if_given(flag, width)) {
      ok = false;
    } else if (r.given(flag) && *width <= 0) {
      r.problem(
          r.shown(flag) +
          " must be positive (Megatron-LM refuses it too) -- give a width, or leave the flag out");
      ok = false;
    }
  }
  ok = r.integer_if_given("--expert-model-parallel-size", &ep) && ok;
  ok = r.integer_if_given("--expert-tensor-parallel-size", &etp) && ok;
  double capacity = -1, z_loss = 0, jitter = 0;
  ok = r.number_if_given("--moe-expert-capacity-factor", &capacity) && ok;
  ok = r.number_if_given("--moe-z-loss-coeff", &z_loss) && ok;
  ok = r.number_if_given("--moe-input-jitter-eps", &jitter) && ok;
  // The load-balancing type(s) and their coefficients (nargs='+' each).
  MoeLoadBalancing balancing = MoeLoadBalancing::aux_loss;
  double coeff = 0;
  if (r.given("--moe-router-load-balancing-type")) {
    const std::vector<std::string> types = r.values("--moe-router-load-balancing-type");
    if (types.size() > 1) {
      r.problem(r.shown("--moe-router-load-balancing-type") +
                ": several load-balancing losses at once are not in troupe -- give one of "
                "aux_loss, seq_aux_loss "
                "or none");
      ok = false;
    } else if (!types.empty() && !parse(types[0], balancing)) {
      const std::string& t = types[0];
      const std::string feature =
          t == "sinkhorn"          ? "Sinkhorn routing (S-BASE's balancing)"
          : t == "global_aux_loss" ? "the load-balancing loss over the global batch"
          : t == "quantile_balancing"
              ? "quantile balancing (a per-expert bias updated by dual coordinate descent)"
              : "";
      r.problem("--moe-router-load-balancing-type " + t + ": " +
                (feature.empty() ? std::string("not one of Megatron-LM's load-balancing types")
                                 : feature + " is not in troupe") +
                " -- use aux_loss (the default), seq_aux_loss or none");
      ok = false;
    }
  }
  if (r.given("--moe-aux-loss-coeff")) {
    const std::vector<std::string> coeffs = r.values("--moe-aux-loss-coeff");
    if (coeffs.size() > 1) {
      r.problem(
          r.shown("--moe-aux-loss-coeff") +
          ": one coefficient per load-balancing type, and troupe takes one type -- give one value");
      ok = false;
    } else if (!coeffs.empty()) {
      ok = r.number("--moe-aux-loss-coeff", coeffs[0], &coeff) && ok;
    }
  }
  MoeDropPolicy policy = MoeDropPolicy::probs;
  if (r.given("--moe-token-drop-policy") && !parse(r.value("--moe-token-drop-policy"), policy)) {
    r.problem("--moe-token-drop-policy " + r.value("--moe-token-drop-policy") +
              " is not one of Megatron-LM's policies -- use probs (drop the lowest-probability "
              "tokens) or position "
              "(drop the last ones)");
    ok = false;
  }
  if (!ok) return;
  if (!r.given("--num-experts") || experts == 0 || experts == 1) {
    // No experts. --expert-model-parallel-size still counts: validation refuses it above 1, as
    // Megatron-LM asserts ("num_experts must be non None to use expert model parallelism").
    cfg->expert_model_parallel_size = ep;
    std::vector<const char*> flags;
    if (r.given("--num-experts")) flags.push_back("--num-experts");
    for (const char* f : own)
      if (std::string(f) != "--expert-model-parallel-size" || ep == 1) flags.push_back(f);
    note_dense(
        r, flags,
        experts == 1
            ? "one expert per layer: Megatron-DeepSpeed builds its dense MLP (its default, [1]); "
              "Megatron-LM a one-expert layer whose router gives every token weight 1, the same "
              "function: troupe trains the dense model"
        : r.given("--num-experts")
            ? "Megatron-LM reads --num-experts 0 as no experts: the dense model"
            : "no --num-experts: the dense model (Megatron-LM reads its MoE settings only with "
              "experts)",
        notes);
    return;
  }
  const int layers = cfg->model.num_layers;
  MoeConfig m;
  m.router = MoeRouter::megatron;
  m.num_experts = {experts};
  if (!pattern.empty()) {
    m.layer_pattern = pattern;
  } else if (freq > 1 && layers >= 1 && layers <= (1 << 20)) {
    // Megatron-Core's integer N: layers 0, N, 2N, ... counted from 0 (gpt_layer_specs.py).
    for (int l = 0; l < layers; ++l) m.layer_pattern.push_back(l % freq == 0 ? 1 : 0);
  } else {
    m.layer_freq = freq;  // 1, or a value validation refuses
  }
  m.topk = topk;
  m.ffn_hidden = ffn;
  // Megatron-Core: no factor is dropless; a negative one too ("if moe_expert_capacity_factor < 0:
  // None"). The evaluation uses the same factor.
  m.drop_tokens = r.given("--moe-expert-capacity-factor") && capacity >= 0;
  if (m.drop_tokens) m.capacity_factor = m.eval_capacity_factor = capacity;
  m.min_capacity = 0;
  m.drop_policy = policy;
  m.pad_to_capacity = r.given("--moe-pad-expert-input-to-capacity");
  m.load_balancing = balancing;
  m.pre_softmax = r.given("--moe-router-pre-softmax");
  m.z_loss_coeff = z_loss;
  m.input_jitter_eps = jitter;
  m.aux_loss_coeff = coeff;
  m.shared_expert_ffn = shared;
  cfg->model.moe = m;
  cfg->expert_model_parallel_size = ep;
  cfg->expert_tensor_parallel_size = r.given("--expert-tensor-parallel-size") ? etp : 0;
  if (notes == nullptr) return;
  notes->push_back(r.shown("--num-experts") + ": read as Megatron-LM's mixture of experts (" + why +
                   "): " + describe_moe(*cfg));
  if (r.given("--moe-expert-capacity-factor") && capacity < 0)
    notes->push_back(r.shown("--moe-expert-capacity-factor") +
                     ": read as dropless, as Megatron-Core reads a negative capacity factor");
  if (m.pad_to_capacity)
    notes->push_back(
        "--moe-pad-expert-input-to-capacity: no effect -- padding each expert's tokens to its "
        "capacity "
        "changes the shapes Megatron-Core computes, not the results");
}

}  // namespace

void add_moe_options(CLI::App* cmd) {
  const char* group =
      "Mixture of experts (Megatron-LM's or Megatron-DeepSpeed's reading: docs/COMPAT.md)";
  auto one = [&](const char* name, const char* type, const char* help) {
    cmd->add_option(name)->description(help)->type_name(type)->group(group);
  };
  // nargs='+': every value up to the next flag; a later occurrence replaces an earlier one.
  auto list = [&](const char* name, const char* type, const char* help) {
    cmd->add_option(name)
        ->description(help)
        ->type_name(type)
        ->expected(1, CLI::detail::expected_max_vector_size)
        ->allow_extra_args()
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->trigger_on_parse()
        ->group(group);
  };
  auto flag = [&](const char* name, const char* help) {
    cmd->add_flag(name)->description(help)->group(group);
  };
  list("--num-experts", "N...",
       "Experts per MoE layer: one number, or (Megatron-DeepSpeed) one per MoE layer; every value "
       "1 (or Megatron-LM's "
       "0): the dense model");
  // Megatron-DeepSpeed's (DeepSpeed-MoE).
  one("--expert-interval", "N",
      "Megatron-DeepSpeed: experts in every N-th layer, counted from 1 (default 2)");
  one("--topk", "K", "Megatron-DeepSpeed: top-1 or top-2 gating (default 1)");
  one("--moe-train-capacity-factor", "F",
      "Megatron-DeepSpeed: capacity factor in training (default 1.0)");
  one("--moe-eval-capacity-factor", "F",
      "Megatron-DeepSpeed: capacity factor in evaluation (default 1.0)");
  one("--moe-min-capacity", "N", "Megatron-DeepSpeed: tokens an expert takes at least (default 4)");
  one("--moe-loss-coeff", "C",
      "Megatron-DeepSpeed: coefficient of the experts' l_aux (default 0.1)");
  flag("--disable-moe-token-dropping",
       "Megatron-DeepSpeed: no capacity limit (every routed token computed)");
  flag("--disable-moe-top2-2nd-expert-sampling",
       "Megatron-DeepSpeed: top-2's second expert by argmax instead of Gumbel sampling");
  one("--mlp-type", "TYPE",
      "Megatron-DeepSpeed: standard, or residual (PR-MoE: a dense MLP beside the experts)");
  one("--moe-expert-parallel-size", "N",
      "Megatron-DeepSpeed: ranks of the data-parallel group splitting the experts");
  flag("--enable-expert-tensor-parallelism",
       "Megatron-DeepSpeed: split each expert over the tensor-parallel ranks (else whole on each)");
  // Megatron-LM's (Megatron-Core).
  one("--moe-layer-freq", "N|PATTERN",
      "Megatron-LM: experts in layers 0, N, 2N, ... (default 1: every layer), or a list expression "
      "of one 0/1 per "
      "layer, e.g. \"([1]*3+[0]*1)*2\"");
  one("--moe-ffn-hidden-size", "N", "Megatron-LM: each expert's width (default --ffn-hidden-size)");
  one("--moe-router-topk", "K", "Megatron-LM: experts each token is routed to (default 2)");
  list("--moe-router-load-balancing-type", "TYPE",
       "Megatron-LM: aux_loss (default), seq_aux_loss or none");
  list("--moe-aux-loss-coeff", "C",
       "Megatron-LM: coefficient of the load-balancing loss (default 0)");
  one("--moe-z-loss-coeff", "C", "Megatron-LM: coefficient of the router's z-loss (default none)");
  flag("--moe-router-pre-softmax",
       "Megatron-LM: top-k of the softmax over all experts (default: softmax over the k)");
  one("--moe-expert-capacity-factor", "F",
      "Megatron-LM: capacity factor, tokens over capacity dropped (default none: dropless)");
  one("--moe-token-drop-policy", "POLICY",
      "Megatron-LM: which tokens an over-full expert drops: probs or position");
  flag("--moe-pad-expert-input-to-capacity",
       "Megatron-LM: pad each expert's tokens to its capacity (same results)");
  one("--moe-shared-expert-intermediate-size", "N",
      "Megatron-LM: width of the shared expert(s) every token passes");
  one("--moe-input-jitter-eps", "EPS",
      "Megatron-LM: multiply the router's input by U(1 - eps, 1 + eps) in training");
  one("--expert-model-parallel-size", "N",
      "Megatron-LM: ranks of the data-parallel group splitting the experts");
  one("--expert-tensor-parallel-size", "N",
      "Megatron-LM: ranks splitting each expert: 1, or the tensor-parallel size (its default)");
}

void apply_moe_flags(const CLI::App& cmd, const FlagGivenFn& given, TrainConfig* cfg,
                     std::vector<std::string>* problems, std::vector<std::string>* notes) {
  Reader r(cmd, given, *problems);
  std::vector<const char*> deepspeed_own, megatron_own;
  for (const char* f : kDeepSpeedOwn)
    if (given(f)) deepspeed_own.push_back(f);
  for (const char* f : kMegatronOwn)
    if (given(f)) megatron_own.push_back(f);
  const bool experts_given = given("--num-experts");
  const std::vector<std::string> experts =
      experts_given ? r.values("--num-experts") : std::vector<std::string>{};
  if (!experts_given && deepspeed_own.empty() && megatron_own.empty()) return;
  const bool experts_list = experts.size() > 1;  // nargs='+': Megatron-LM's --num-experts takes one
  if ((experts_list || !deepspeed_own.empty()) && !megatron_own.empty()) {
    std::vector<std::string> ds, lm;
    if (experts_list) ds.push_back(r.shown("--num-experts"));
    for (const char* f : deepspeed_own) ds.push_back(r.shown(f));
    for (const char* f : megatron_own) lm.push_back(r.shown(f));
    r.problem(join(ds) + " (Megatron-DeepSpeed's) and " + join(lm) +
              " (Megatron-LM's) mix the two projects' mixture-of-experts flags, which read "
              "--num-experts differently "
              "-- write them in one project's spelling (docs/COMPAT.md, \"Mixture of experts\", "
              "lists both)");
    return;
  }
  if (experts_list || !deepspeed_own.empty()) {
    read_deepspeed(
        r, experts, deepspeed_own,
        experts_list ? "its --num-experts list" : std::string("its own flag ") + deepspeed_own[0],
        cfg, notes);
  } else if (!megatron_own.empty()) {
    const bool deepspeed_run = given("--deepspeed") || given("--deepspeed-config");
    read_megatron(
        r, megatron_own,
        std::string("its own flag ") + megatron_own[0] +
            (deepspeed_run
                 ? ", though a DeepSpeed run: --num-experts alone would be Megatron-DeepSpeed's"
                 : ""),
        cfg, notes);
  } else if (given("--deepspeed") || given("--deepspeed-config")) {
    read_deepspeed(r, experts, {},
                   std::string("a DeepSpeed run: ") +
                       (given("--deepspeed") ? "--deepspeed" : "--deepspeed-config"),
                   cfg, notes);
  } else {
    read_megatron(r, {}, "no --deepspeed or --deepspeed-config", cfg, notes);
  }
}

std::string describe_moe(const TrainConfig& cfg) {
  const MoeConfig& m = cfg.model.moe;
  if (!m.enabled()) return "";
  const int layers = cfg.model.num_layers;
  const bool ds = m.router == MoeRouter::deepspeed;
  std::string experts;
  if (m.num_experts.size() == 1) {
    experts = fmt::format("{} experts", m.num_experts[0]);
  } else {
    for (const int e : m.num_experts) experts += (experts.empty() ? "" : ", ") + std::to_string(e);
    experts = "experts " + experts + " (one count per MoE layer)";
  }
  // Which layers (counted from 1, as Megatron-DeepSpeed counts them).
  std::vector<std::string> which;
  int count = 0;
  for (int l = 0; l < layers && l < (1 << 20); ++l)
    if (m.is_moe_layer(l, layers)) {
      if (++count <= 8) which.push_back(std::to_string(l + 1));
    }
  std::string where;
  if (count == layers && layers > 0) {
    where = "every layer";
  } else {
    where = m.layer_pattern.empty() ? "every " + ordinal(m.layer_freq) + " layer"
                                    : "the pattern's layers";
    where += " (layers " + join(which) + (count > 8 ? ", ..." : "") + " of " +
             std::to_string(layers) + ")";
  }
  std::string s = experts + " in " + where + "; ";
  if (ds) {
    s += fmt::format("DeepSpeed-MoE's top-{} gating (softmax over all experts", m.topk);
    if (m.topk == 1) s += m.drop_tokens ? ", random token selection" : "";
    if (m.topk == 2)
      s += m.second_expert_sampling ? ", the 2nd expert by Gumbel sampling"
                                    : ", the 2nd expert by argmax";
    s += ")";
    s += m.drop_tokens ? fmt::format(
                             ", capacity factor {} (evaluation {}), at least {} tokens per expert, "
                             "tokens over "
                             "capacity dropped",
                             m.capacity_factor, m.eval_capacity_factor, m.min_capacity)
                       : ", no token dropping";
    s += fmt::format("; l_aux x {} (--moe-loss-coeff)", m.aux_loss_coeff);
    if (m.residual) s += "; residual MLP beside the experts (PR-MoE)";
  } else {
    s += fmt::format("Megatron-Core's top-{} router (softmax {} the top-k)", m.topk,
                     m.pre_softmax ? "before" : "after");
    s += m.drop_tokens ? fmt::format(", capacity factor {} dropping by {}{}", m.capacity_factor,
                                     to_string(m.drop_policy),
                                     m.pad_to_capacity ? ", padded to capacity" : "")
                       : ", dropless";
    s += fmt::format("; load balancing {} x {}", to_string(m.load_balancing), m.aux_loss_coeff);
    if (m.z_loss_coeff > 0) s += fmt::format(", z-loss x {}", m.z_loss_coeff);
    if (m.input_jitter_eps > 0) s += fmt::format(", input jitter {}", m.input_jitter_eps);
    if (m.shared_expert_ffn > 0)
      s += fmt::format("; a shared expert of width {}", m.shared_expert_ffn);
  }
  s += fmt::format("; expert width {}", cfg.model.expert_ffn_hidden_size());
  const int tp = cfg.tensor_model_parallel_size, etp = cfg.expert_tensor_parallel_size;
  s += fmt::format("; expert-parallel size {}, each expert ", cfg.expert_model_parallel_size);
  if (etp == 0)
    s += fmt::format("split over the tensor-parallel ranks ({}, Megatron-LM's default)", tp);
  else if (etp == 1)
    s += "whole on every tensor-parallel rank";
  else
    s += fmt::format("split over {} tensor-parallel ranks", etp);
  return s;
}

}  // namespace troupe
