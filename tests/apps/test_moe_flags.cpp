// The mixture-of-experts flags (apps/cli/moe_flags.hpp): each dialect's reading of --num-experts
// with its defaults and with every flag given, the start-up note that prints the reading, the
// dialect's choice, the flags accepted without effect and refused (apps/cli/megatron_table.cpp),
// and every bad input reported at once with its fix.
#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>

#include "apps/cli/moe_flags.hpp"
#include "apps/cli/train_options.hpp"
#include "config/validate.hpp"
#include "troupe/flags.hpp"

namespace troupe {
namespace {

using Catch::Contains;
using Catch::StartsWith;

std::vector<std::string> base(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--num-layers",          "4",
                                "--hidden-size",         "48",
                                "--num-attention-heads", "4",
                                "--seq-length",          "16",
                                "--micro-batch-size",    "2",
                                "--train-iters",         "5",
                                "--mock-data",           "--tokenizer-type",
                                "ByteLevelTokenizer"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The flags read as finalize_train_config reads them, before validation.
struct Reading {
  TrainConfig cfg;
  std::vector<std::string> problems, notes;
  const MoeConfig& moe() const { return cfg.model.moe; }
  std::string note(const std::string& start) const {
    for (const std::string& n : notes)
      if (n.rfind(start, 0) == 0) return n;
    return "";
  }
};

Reading read(const std::vector<std::string>& args) {
  Reading r;
  CLI::App app;
  add_train_options(&app, &r.cfg);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  app.parse(reversed);
  const FlagGivenFn given = [&app](const char* f) { return app.get_option(f)->count() > 0; };
  apply_moe_flags(app, given, &r.cfg, &r.problems, &r.notes);
  return r;
}

std::string problems(const std::vector<std::string>& args) {
  auto s = parse_train_flags(args);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.status().is_bad_input());
  return s.status().message();
}

TEST_CASE("moe flags: Megatron-DeepSpeed's --num-experts, with its defaults", "[moe]") {
  for (const char* run : {"--deepspeed", "--deepspeed-config"}) {
    std::vector<std::string> args = base({"--num-experts", "8", run});
    if (std::string(run) == "--deepspeed-config")
      args.push_back("ds.json");  // read only by finalize
    const Reading r = read(args);
    INFO(run);
    REQUIRE(r.problems.empty());
    const MoeConfig& m = r.moe();
    CHECK(m.router == MoeRouter::deepspeed);
    CHECK(m.num_experts == std::vector<int>{8});
    CHECK(m.layer_freq == 2);  // --expert-interval 2: layers 2 and 4 (from 1)
    CHECK(m.layer_pattern.empty());
    CHECK_FALSE(m.is_moe_layer(0, 4));
    CHECK(m.is_moe_layer(1, 4));
    CHECK_FALSE(m.is_moe_layer(2, 4));
    CHECK(m.is_moe_layer(3, 4));
    CHECK(m.topk == 1);
    CHECK(m.capacity_factor == 1.0);
    CHECK(m.eval_capacity_factor == 1.0);
    CHECK(m.min_capacity == 4);
    CHECK(m.aux_loss_coeff == 0.1);  // Megatron-DeepSpeed's --moe-loss-coeff default
    CHECK(m.drop_tokens);
    CHECK(m.random_token_selection);
    CHECK(m.second_expert_sampling);
    CHECK_FALSE(m.residual);
    CHECK(m.ffn_hidden == 0);
    CHECK(r.cfg.expert_model_parallel_size == 1);
    CHECK(r.cfg.expert_tensor_parallel_size ==
          1);  // whole experts without --enable-expert-tensor-parallelism
    const std::string note = r.note("--num-experts 8: ");
    CHECK_THAT(
        note, StartsWith(
                  std::string("--num-experts 8: read as Megatron-DeepSpeed's mixture of experts (a "
                              "DeepSpeed run: ") +
                  run + "): 8 experts in every 2nd layer (layers 2, 4 of 4)"));
    CHECK_THAT(
        note,
        Contains(
            "DeepSpeed-MoE's top-1 gating (softmax over all experts, random token selection)"));
    CHECK_THAT(note, Contains("capacity factor 1 (evaluation 1), at least 4 tokens per expert, "
                              "tokens over capacity dropped"));
    CHECK_THAT(note, Contains("l_aux x 0.1 (--moe-loss-coeff)"));
    CHECK_THAT(note,
               Contains("expert-parallel size 1, each expert whole on every tensor-parallel rank"));
  }
  // One of its own flags makes a command line Megatron-DeepSpeed's, --deepspeed or not.
  const Reading own = read(base({"--num-experts", "8", "--topk", "2"}));
  REQUIRE(own.problems.empty());
  CHECK(own.moe().router == MoeRouter::deepspeed);
  CHECK(own.moe().topk == 2);
  CHECK_THAT(own.note("--num-experts 8: "), Contains("(its own flag --topk)"));
  CHECK_THAT(
      own.note("--num-experts 8: "),
      Contains("top-2 gating (softmax over all experts, the 2nd expert by Gumbel sampling)"));
  // So does a list of several counts (Megatron-LM's --num-experts takes one).
  const Reading list = read(base({"--num-experts", "4", "8"}));
  REQUIRE(list.problems.empty());
  CHECK(list.moe().router == MoeRouter::deepspeed);
  CHECK(list.moe().num_experts == std::vector<int>{4, 8});
  CHECK_THAT(list.note("--num-experts 4 8: "), Contains("(its --num-experts list)"));
}

// The whole command line: the flags parse and validate, and the reading is a note.
TEST_CASE("moe flags: a valid MoE command line parses and notes its reading", "[moe]") {
  std::vector<std::string> notes;
  auto cfg = parse_train_flags(base({"--deepspeed", "--num-experts", "8", "--moe-loss-coeff",
                                     "0.01", "--use-tutel", "--create-moe-param-group"}),
                               1, &notes);
  INFO((cfg.is_ok() ? std::string() : cfg.status().message()));
  REQUIRE(cfg.is_ok());
  CHECK(cfg.value().model.moe.router == MoeRouter::deepspeed);
  CHECK(cfg.value().model.moe.aux_loss_coeff == 0.01);
  CHECK(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
    return n.rfind(
               "--num-experts 8: read as Megatron-DeepSpeed's mixture of experts (its own flag "
               "--moe-loss-coeff)",
               0) == 0;
  }));
  CHECK(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
    return n.rfind("--use-tutel: no effect", 0) == 0;
  }));
  // The JSON a checkpoint would store carries the reading.
  auto back = TrainConfig::from_json(cfg.value().to_json());
  REQUIRE(back.is_ok());
  CHECK(back.value().model.moe == cfg.value().model.moe);
}

TEST_CASE("moe flags: Megatron-DeepSpeed's flags, every one given", "[moe]") {
  const Reading r = read(base({"--num-experts",
                               "4",
                               "8",
                               "--expert-interval",
                               "1",
                               "--num-layers",
                               "2",
                               "--topk",
                               "2",
                               "--moe-train-capacity-factor",
                               "1.5",
                               "--moe-eval-capacity-factor",
                               "2",
                               "--moe-min-capacity",
                               "0",
                               "--moe-loss-coeff",
                               "0.01",
                               "--disable-moe-token-dropping",
                               "--disable-moe-top2-2nd-expert-sampling",
                               "--mlp-type",
                               "residual",
                               "--moe-expert-parallel-size",
                               "2",
                               "--enable-expert-tensor-parallelism",
                               "--tensor-model-parallel-size",
                               "2"}));
  REQUIRE(r.problems.empty());
  const MoeConfig& m = r.moe();
  CHECK(m.router == MoeRouter::deepspeed);
  CHECK(m.num_experts == std::vector<int>{4, 8});
  CHECK(m.layer_freq == 1);
  CHECK(m.experts_of(0, 2) == 4);
  CHECK(m.experts_of(1, 2) == 8);
  CHECK(m.topk == 2);
  CHECK(m.capacity_factor == 1.5);
  CHECK(m.eval_capacity_factor == 2);
  CHECK(m.min_capacity == 0);
  CHECK(m.aux_loss_coeff == 0.01);
  CHECK_FALSE(m.drop_tokens);
  CHECK_FALSE(m.second_expert_sampling);
  CHECK(m.residual);
  CHECK(r.cfg.expert_model_parallel_size == 2);
  CHECK(r.cfg.expert_tensor_parallel_size == 2);  // the tensor-parallel size
  const std::string note = r.note("--num-experts 4 8: ");
  CHECK_THAT(note, Contains("experts 4, 8 (one count per MoE layer) in every layer"));
  CHECK_THAT(note, Contains("the 2nd expert by argmax"));
  CHECK_THAT(note, Contains("no token dropping"));
  CHECK_THAT(note, Contains("residual MLP beside the experts (PR-MoE)"));
  CHECK_THAT(note,
             Contains("expert-parallel size 2, each expert split over 2 tensor-parallel ranks"));

  // A per-layer list with a 1: that layer keeps the dense MLP in Megatron-DeepSpeed (its
  // get_num_experts_per_layer), which the layer pattern says.
  const Reading mixed = read(base({"--num-experts", "1", "8", "--moe-loss-coeff", "0.01"}));
  REQUIRE(mixed.problems.empty());
  CHECK(mixed.moe().layer_pattern == std::vector<int>{0, 0, 0, 1});
  CHECK(mixed.moe().num_experts == std::vector<int>{8});
  CHECK(mixed.moe().moe_layers(4) == 1);
  CHECK_THAT(mixed.note("--num-experts 1 8: "),
             Contains("8 experts in the pattern's layers (layers 4 of 4)"));
}

TEST_CASE("moe flags: Megatron-LM's --num-experts, with its defaults", "[moe]") {
  const Reading r = read(base({"--num-experts", "8"}));
  REQUIRE(r.problems.empty());
  const MoeConfig& m = r.moe();
  CHECK(m.router == MoeRouter::megatron);
  CHECK(m.num_experts == std::vector<int>{8});
  CHECK(m.moe_layers(4) == 4);  // --moe-layer-freq 1
  CHECK(m.topk == 2);
  CHECK_FALSE(m.drop_tokens);  // no --moe-expert-capacity-factor: dropless
  CHECK(m.min_capacity == 0);
  CHECK(m.aux_loss_coeff == 0);  // Megatron-LM's --moe-aux-loss-coeff default 0.0
  CHECK(m.load_balancing == MoeLoadBalancing::aux_loss);
  CHECK(m.z_loss_coeff == 0);
  CHECK(m.input_jitter_eps == 0);
  CHECK_FALSE(m.pre_softmax);
  CHECK(m.drop_policy == MoeDropPolicy::probs);
  CHECK(m.shared_expert_ffn == 0);
  CHECK(m.ffn_hidden == 0);  // --ffn-hidden-size's
  CHECK(r.cfg.expert_model_parallel_size == 1);
  CHECK(r.cfg.expert_tensor_parallel_size == 0);  // the tensor-parallel size
  const std::string note = r.note("--num-experts 8: ");
  CHECK_THAT(
      note,
      StartsWith(
          "--num-experts 8: read as Megatron-LM's mixture of experts (no --deepspeed or "
          "--deepspeed-config): 8 experts in every layer; Megatron-Core's top-2 router (softmax "
          "after the top-k), dropless; load balancing aux_loss x 0"));
  CHECK_THAT(note, Contains("expert width 192"));
  CHECK_THAT(
      note,
      Contains("each expert split over the tensor-parallel ranks (1, Megatron-LM's default)"));
  // Its own flags win over --deepspeed, with a note saying so.
  const Reading ds_run =
      read(base({"--num-experts", "8", "--deepspeed", "--moe-router-topk", "2"}));
  REQUIRE(ds_run.problems.empty());
  CHECK(ds_run.moe().router == MoeRouter::megatron);
  CHECK_THAT(ds_run.note("--num-experts 8: "),
             Contains("its own flag --moe-router-topk, though a DeepSpeed run"));
}

TEST_CASE("moe flags: Megatron-LM's flags, every one given", "[moe]") {
  const Reading r = read(base({"--num-experts",
                               "8",
                               "--moe-layer-freq",
                               "2",
                               "--moe-ffn-hidden-size",
                               "64",
                               "--moe-router-topk",
                               "4",
                               "--moe-router-load-balancing-type",
                               "seq_aux_loss",
                               "--moe-aux-loss-coeff",
                               "0.01",
                               "--moe-z-loss-coeff",
                               "0.001",
                               "--moe-router-pre-softmax",
                               "--moe-expert-capacity-factor",
                               "1.25",
                               "--moe-token-drop-policy",
                               "position",
                               "--moe-pad-expert-input-to-capacity",
                               "--moe-shared-expert-intermediate-size",
                               "128",
                               "--moe-input-jitter-eps",
                               "0.01",
                               "--expert-model-parallel-size",
                               "2",
                               "--expert-tensor-parallel-size",
                               "1"}));
  REQUIRE(r.problems.empty());
  const MoeConfig& m = r.moe();
  CHECK(m.router == MoeRouter::megatron);
  CHECK(m.layer_pattern == std::vector<int>{1, 0, 1, 0});  // Megatron-Core: layers 0, 2, ... from 0
  CHECK(m.ffn_hidden == 64);
  CHECK(m.topk == 4);
  CHECK(m.load_balancing == MoeLoadBalancing::seq_aux_loss);
  CHECK(m.aux_loss_coeff == 0.01);
  CHECK(m.z_loss_coeff == 0.001);
  CHECK(m.pre_softmax);
  CHECK(m.drop_tokens);
  CHECK(m.capacity_factor == 1.25);
  CHECK(m.eval_capacity_factor == 1.25);  // Megatron-Core evaluates with the same factor
  CHECK(m.drop_policy == MoeDropPolicy::position);
  CHECK(m.pad_to_capacity);
  CHECK(m.shared_expert_ffn == 128);
  CHECK(m.input_jitter_eps == 0.01);
  CHECK(r.cfg.expert_model_parallel_size == 2);
  CHECK(r.cfg.expert_tensor_parallel_size == 1);
  const std::string note = r.note("--num-experts 8: ");
  CHECK_THAT(note, Contains("8 experts in the pattern's layers (layers 1, 3 of 4)"));
  CHECK_THAT(note, Contains("top-4 router (softmax before the top-k), capacity factor 1.25 "
                            "dropping by position, padded"));
  CHECK_THAT(note,
             Contains("load balancing seq_aux_loss x 0.01, z-loss x 0.001, input jitter 0.01"));
  CHECK_THAT(note, Contains("a shared expert of width 128; expert width 64"));
  CHECK_FALSE(r.note("--moe-pad-expert-input-to-capacity: no effect").empty());

  // The list form of --moe-layer-freq, Python's expression as Megatron-LM evaluates it.
  const Reading pattern = read(
      base({"--num-layers", "8", "--num-experts", "4", "--moe-layer-freq", "([1]*3+[0]*1)*2"}));
  REQUIRE(pattern.problems.empty());
  CHECK(pattern.moe().layer_pattern == std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0});
  const Reading literal =
      read(base({"--num-experts", "4", "--moe-layer-freq", "[0]+[1]*2+[0,1][1:]"}));
  CHECK(literal.problems.size() == 1);  // slicing is not among Megatron's characters
  const Reading plain = read(base({"--num-experts", "4", "--moe-layer-freq", "[0,1]*2"}));
  CHECK(plain.moe().layer_pattern == std::vector<int>{0, 1, 0, 1});
  // A negative capacity factor is dropless in Megatron-Core.
  const Reading dropless = read(base({"--num-experts", "4", "--moe-expert-capacity-factor", "-1"}));
  CHECK_FALSE(dropless.moe().drop_tokens);
  CHECK_FALSE(dropless.note("--moe-expert-capacity-factor -1: read as dropless").empty());
}

TEST_CASE("moe flags: a dense model's MoE flags are notes, in both dialects", "[moe]") {
  const Reading one = read(base({"--num-experts", "1", "--moe-router-topk", "1"}));
  CHECK(one.problems.empty());
  CHECK_FALSE(one.moe().enabled());
  CHECK_FALSE(one.note("--num-experts 1: no effect -- one expert per layer").empty());
  CHECK_FALSE(one.note("--moe-router-topk 1: no effect").empty());
  const Reading zero = read(base({"--num-experts", "0"}));
  CHECK_FALSE(zero.moe().enabled());
  CHECK_FALSE(
      zero.note("--num-experts 0: no effect -- Megatron-LM reads --num-experts 0 as no experts")
          .empty());
  const Reading ds = read(base({"--moe-loss-coeff", "0.01", "--mlp-type", "residual"}));
  CHECK_FALSE(ds.moe().enabled());
  CHECK_FALSE(
      ds.note("--moe-loss-coeff 0.01: no effect -- a dense model (no --num-experts").empty());
  CHECK_FALSE(ds.note("--mlp-type residual: no effect").empty());
  // And the run trains the dense model, as before.
  std::vector<std::string> notes;
  auto dense = parse_train_flags(base({"--num-experts", "1", "1", "--topk", "2"}), 1, &notes);
  REQUIRE(dense.is_ok());
  CHECK_FALSE(dense.value().model.moe.enabled());
}

TEST_CASE("moe flags: values that are no numbers, refused values and mixed dialects", "[moe]") {
  const Reading mixed = read(base({"--num-experts", "8", "--topk", "2", "--moe-router-topk", "2"}));
  REQUIRE(mixed.problems.size() == 1);
  CHECK_THAT(
      mixed.problems[0],
      StartsWith("--topk 2 (Megatron-DeepSpeed's) and --moe-router-topk 2 (Megatron-LM's) mix "
                 "the two projects' mixture-of-experts flags"));
  CHECK_FALSE(mixed.moe().enabled());
  const Reading list_mixed =
      read(base({"--num-experts", "4", "8", "--expert-model-parallel-size", "2"}));
  REQUIRE(list_mixed.problems.size() == 1);
  CHECK_THAT(list_mixed.problems[0], StartsWith("--num-experts 4 8 (Megatron-DeepSpeed's) and "));

  const Reading ds = read(base({"--num-experts", "eight", "--topk", "1.5", "--moe-loss-coeff",
                                "a lot", "--mlp-type", "dense"}));
  REQUIRE(ds.problems.size() == 4);
  CHECK_THAT(ds.problems[0], StartsWith("--num-experts eight is not an integer"));
  CHECK_THAT(ds.problems[1], StartsWith("--topk 1.5 is not an integer"));
  CHECK_THAT(ds.problems[2], StartsWith("--moe-loss-coeff a lot is not a number"));
  CHECK_THAT(
      ds.problems[3],
      StartsWith("--mlp-type dense is not one of Megatron-DeepSpeed's MLP types -- use standard"));

  const Reading lm = read(base({"--num-experts", "8", "--moe-router-load-balancing-type",
                                "sinkhorn", "--moe-token-drop-policy", "random", "--moe-layer-freq",
                                "([1]*3+[0]", "--moe-ffn-hidden-size", "0"}));
  const std::string all = [&] {
    std::string s;
    for (const std::string& p : lm.problems) s += p + "\n";
    return s;
  }();
  INFO(all);
  CHECK(lm.problems.size() == 4);
  CHECK_THAT(
      all,
      Contains(
          "--moe-layer-freq ([1]*3+[0]: not a list expression: a '(' is not closed -- write e.g."));
  CHECK_THAT(all, Contains("--moe-ffn-hidden-size 0 must be positive"));
  CHECK_THAT(all, Contains("--moe-router-load-balancing-type sinkhorn: Sinkhorn routing (S-BASE's "
                           "balancing) is not in "
                           "troupe -- use aux_loss"));
  CHECK_THAT(all, Contains("--moe-token-drop-policy random is not one of Megatron-LM's policies"));
  const Reading several =
      read(base({"--num-experts", "8", "--moe-router-load-balancing-type", "aux_loss",
                 "seq_aux_loss", "--moe-aux-loss-coeff", "0.01", "0.001"}));
  CHECK(several.problems.size() == 2);
  // Deep or huge patterns stay cheap.
  const Reading deep =
      read(base({"--num-experts", "8", "--moe-layer-freq", std::string(200, '(') + "[1]"}));
  CHECK_THAT(deep.problems.at(0), Contains("brackets nest too deep"));
  const Reading huge = read(base({"--num-experts", "8", "--moe-layer-freq", "[1]*999999999"}));
  CHECK_THAT(huge.problems.at(0), Contains("the list is too long"));
  const Reading chars = read(base({"--num-experts", "8", "--moe-layer-freq", "[1]*__import__"}));
  CHECK_THAT(chars.problems.at(0), Contains("only digits, [], (), +, * and commas may appear"));
}

TEST_CASE(
    "moe flags: unimplemented MoE features are refused by name; dispatch and kernels are notes",
    "[moe]") {
  const std::string m = problems(base(
      {"--num-experts", "8", "--moe-router-score-function", "sigmoid", "--moe-router-num-groups",
       "4", "--moe-router-group-topk", "2", "--moe-router-enable-expert-bias", "--moe-router-dtype",
       "fp64", "--moe-router-topk-scaling-factor", "2.5", "--moe-latent-size", "64",
       "--moe-shared-expert-gate", "--num-experts-switch", "8"}));
  INFO(m);
  CHECK_THAT(
      m, Contains("--moe-router-score-function sigmoid: sigmoid and sqrt-softplus router scores"));
  CHECK_THAT(
      m, Contains("--moe-router-num-groups 4, --moe-router-group-topk 2: group-limited routing"));
  CHECK_THAT(m, Contains("--moe-router-enable-expert-bias: aux-loss-free load balancing"));
  CHECK_THAT(m, Contains("--moe-router-dtype fp64: routing in fp64 is not in troupe"));
  CHECK_THAT(m,
             Contains("--moe-router-topk-scaling-factor 2.5: scaling the top-k routing weights"));
  CHECK_THAT(m, Contains("--moe-latent-size 64: latent MoE"));
  CHECK_THAT(m, Contains("--moe-shared-expert-gate: a gate on the shared expert"));
  CHECK_THAT(m, Contains("--num-experts-switch 8: Megatron-DeepSpeed's Switch MLP"));
  // The values troupe has are notes; dispatchers, grouping, Tutel and the parameter groups too.
  std::vector<std::string> notes;
  auto ok =
      parse_train_flags(base({"--moe-router-score-function", "softmax", "--moe-router-dtype",
                              "fp32", "--moe-router-topk-scaling-factor", "1.0",
                              "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm",
                              "--moe-permute-fusion", "--use-tutel", "--create-moe-param-group"}),
                        1, &notes);
  REQUIRE(ok.is_ok());
  for (const char* n :
       {"--moe-router-score-function softmax: no effect", "--moe-router-dtype fp32: no effect",
        "--moe-router-topk-scaling-factor 1.0: no effect",
        "--moe-token-dispatcher-type alltoall: no effect -- how tokens travel to their experts",
        "--moe-grouped-gemm: no effect -- how the experts' GEMMs are grouped",
        "--moe-permute-fusion: no effect", "--use-tutel: no effect",
        "--create-moe-param-group: no effect"}) {
    INFO(n);
    CHECK(std::any_of(notes.begin(), notes.end(),
                      [&](const std::string& s) { return s.rfind(n, 0) == 0; }));
  }
}

TEST_CASE("moe flags: every bad input at once, each with its fix, before anything runs", "[moe]") {
  // Megatron-LM's dialect: the layout, k, capacity, coefficients, jitter, the expert
  // tensor-parallel size and the device, in one message.
  const std::string lm = problems(base({"--num-experts",
                                        "6",
                                        "--expert-model-parallel-size",
                                        "4",
                                        "--data-parallel-size",
                                        "2",
                                        "--moe-router-topk",
                                        "8",
                                        "--moe-expert-capacity-factor",
                                        "0",
                                        "--moe-aux-loss-coeff",
                                        "-1",
                                        "--moe-z-loss-coeff",
                                        "-0.5",
                                        "--moe-input-jitter-eps",
                                        "1",
                                        "--expert-tensor-parallel-size",
                                        "3",
                                        "--tensor-model-parallel-size",
                                        "2",
                                        "--device",
                                        "cuda"}));
  INFO(lm);
  for (const char* p :
       {"--expert-model-parallel-size 4 does not divide the 6 experts of an MoE layer -- ",
        "--expert-model-parallel-size 4 does not divide the data-parallel size 2 -- ",
        "--moe-router-topk 8 routes each token to more experts than the 6 of layer 1 -- ",
        "--moe-expert-capacity-factor must be positive when tokens over capacity are dropped, got "
        "0 -- ",
        "--moe-aux-loss-coeff must be >= 0, got -1 -- ",
        "--moe-z-loss-coeff must be >= 0, got -0.5 -- ",
        "--moe-input-jitter-eps must be in [0, 1), got 1 -- ",
        "--expert-tensor-parallel-size 3 is neither 1 nor --tensor-model-parallel-size 2 -- ",
        "--device cuda with mixture of experts (--num-experts): the CUDA backend has no MoE "
        "kernels yet -- "})
    CHECK_THAT(lm, Contains(p));
  // Megatron-DeepSpeed's: a per-layer list of the wrong length, k beyond top-2, capacities,
  // coefficient.
  const std::string ds =
      problems(base({"--num-experts", "4", "4", "4", "--expert-interval", "1", "--num-layers", "2",
                     "--topk", "3", "--moe-min-capacity", "-1", "--moe-eval-capacity-factor", "0",
                     "--moe-loss-coeff", "-0.1", "--moe-expert-parallel-size", "3"}));
  INFO(ds);
  for (const char* p : {"--num-experts lists 3 values but the model has 2 MoE layers "
                        "(--expert-interval 1 of --num-layers 2) -- ",
                        "--moe-min-capacity must be >= 0, got -1 -- ",
                        "--moe-eval-capacity-factor must be positive when tokens over capacity are "
                        "dropped, got 0 -- ",
                        "--moe-loss-coeff must be >= 0, got -0.1 -- "})
    CHECK_THAT(ds, Contains(p));
  // The layer rule and the counts.
  const std::string rule = problems(
      base({"--num-experts", "-2", "--moe-layer-freq", "[1,0,1]", "--moe-router-topk", "0"}));
  INFO(rule);
  CHECK_THAT(rule, Contains("--num-experts must be 1 to 1048576 in every MoE layer, got -2 -- "));
  CHECK_THAT(rule, Contains("--moe-layer-freq pattern has 3 entries but --num-layers is 4 -- give "
                            "one 0/1 per layer"));
  CHECK_THAT(rule, Contains("--moe-router-topk must be at least 1, got 0 -- "));
  const std::string interval =
      problems(base({"--num-experts", "8", "--deepspeed", "--expert-interval", "5"}));
  CHECK_THAT(interval, Contains("--expert-interval leaves no layer with experts (--expert-interval "
                                "5 of --num-layers 4)"));
  // Megatron-Core refuses top-1 without the softmax before it (the router would not learn).
  CHECK_THAT(problems(base({"--num-experts", "8", "--moe-router-topk", "1"})),
             Contains("--moe-router-topk 1 without --moe-router-pre-softmax"));
}

}  // namespace
}  // namespace troupe
