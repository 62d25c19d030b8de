// The model-family flags of `troupe train` (docs/MODELS.md): Megatron-LM's and Megatron-DeepSpeed's
// spellings set the same GptConfig, their combinations follow Megatron's rules, --model-preset
// fills what was not given, and every bad value or contradiction is reported with the others.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/model_presets.hpp"
#include "troupe/flags.hpp"

namespace troupe {
namespace {

using Catch::Contains;

// A valid run on mock data, plus `extra`.
std::vector<std::string> base(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--num-layers", "2",  "--hidden-size",      "64", "--num-attention-heads",
                                "8",            "--seq-length", "16", "--micro-batch-size", "2",
                                "--train-iters", "5", "--mock-data", "--tokenizer-type", "ByteLevelTokenizer"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

GptConfig parsed(std::vector<std::string> extra, std::vector<std::string>* notes = nullptr) {
  auto cfg = parse_train_flags(base(std::move(extra)), 1, notes);
  INFO(cfg.status().message());
  REQUIRE(cfg.is_ok());
  return cfg.value().model;
}

std::string refused(std::vector<std::string> extra, int world_size = 1) {
  auto cfg = parse_train_flags(base(std::move(extra)), world_size);
  REQUIRE_FALSE(cfg.is_ok());
  CHECK(cfg.status().is_bad_input());
  return cfg.status().message();
}

TEST_CASE("family flags: Megatron-LM's LLaMA flags", "[family_flags]") {
  const GptConfig m = parsed({"--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                              "--rotary-percent", "0.5", "--rotary-base", "500000", "--rotary-interleaved",
                              "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16",
                              "--ffn-hidden-size", "170", "--disable-bias-linear",
                              "--untie-embeddings-and-output-weights", "--norm-epsilon", "1e-6"});
  CHECK(m.normalization == Normalization::rmsnorm);
  CHECK(m.activation == MlpActivation::swiglu);
  CHECK(m.position_embedding == PositionEmbedding::rope);
  CHECK(m.rotary_percent == 0.5);
  CHECK(m.rotary_base == 500000);
  CHECK(m.rotary_interleaved);
  CHECK(m.num_query_groups == 2);
  CHECK(m.kv_channels == 16);
  CHECK(m.ffn_hidden_size() == 170);
  CHECK_FALSE(m.add_bias_linear);
  CHECK(m.untie_embeddings_and_output_weights);
  CHECK(m.layernorm_epsilon == 1e-6);
  CHECK(std::string(m.family_name()) == "LLaMA");
  // Megatron's SwiGLU width rule when --ffn-hidden-size is left out: int(4h x 2/3 / 64) x 64.
  CHECK(parsed({"--hidden-size", "256", "--swiglu"}).ffn_hidden_size() == 640);
  // BLOOM's.
  const GptConfig b = parsed({"--position-embedding-type", "alibi", "--embed-layernorm"});
  CHECK(b.position_embedding == PositionEmbedding::alibi);
  CHECK(b.embed_layernorm);
  CHECK(std::string(b.family_name()) == "BLOOM");
  CHECK(parsed({}).is_gpt2_family());
}

TEST_CASE("family flags: Megatron-DeepSpeed's spellings", "[family_flags]") {
  const GptConfig m = parsed({"--normalization", "rmsnorm", "--use-rotary-position-embeddings",
                              "--no-position-embedding", "--num-key-value-heads", "4", "--layernorm-epsilon", "1e-6",
                              "--rotary-position-embeddings-theta", "20000"});
  CHECK(m.normalization == Normalization::rmsnorm);
  CHECK(m.position_embedding == PositionEmbedding::rope);  // --no-position-embedding beside rotary: no table
  CHECK(m.num_query_groups == 4);                          // always, without --group-query-attention
  CHECK(m.layernorm_epsilon == 1e-6);
  CHECK(m.rotary_base == 20000);
  // Alone, --no-position-embedding means no positions at all.
  CHECK(parsed({"--no-position-embedding"}).position_embedding == PositionEmbedding::none);
  CHECK(parsed({"--normalization", "layernorm"}).normalization == Normalization::layernorm);
}

TEST_CASE("family flags: grouped-query attention follows Megatron's rules", "[family_flags]") {
  // --group-query-attention alone: Megatron's default of one group (multi-query attention).
  CHECK(parsed({"--group-query-attention"}).query_groups() == 1);
  // --num-query-groups without --group-query-attention counts for nothing in Megatron-LM: a note.
  std::vector<std::string> notes;
  CHECK(parsed({"--num-query-groups", "2"}, &notes).query_groups() == 8);
  bool noted = false;
  for (const std::string& n : notes) noted = noted || n.find("--num-query-groups 2: no effect without") == 0;
  CHECK(noted);
  CHECK_THAT(refused({"--group-query-attention", "--num-query-groups", "2", "--num-key-value-heads", "4"}),
             Contains("--num-query-groups 2 and --num-key-value-heads 4 disagree"));
}

TEST_CASE("family flags: --model-preset, with explicit flags winning", "[family_flags]") {
  const std::vector<std::string> small = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads",
                                          "8", "--ffn-hidden-size", "176", "--seq-length", "16"};
  std::vector<std::string> llama = {"--model-preset", "llama2-70b"};
  llama.insert(llama.end(), small.begin(), small.end());
  const GptConfig m = parsed(llama);
  CHECK(m.num_layers == 2);
  CHECK(m.hidden_size == 64);
  CHECK(m.ffn_hidden_size() == 176);
  CHECK(m.num_query_groups == 8);             // the preset's: not given
  CHECK(m.normalization == Normalization::rmsnorm);
  CHECK(m.untie_embeddings_and_output_weights);
  CHECK(m.max_position_embeddings == 4096);   // the preset's table (no table with rope, but kept)
  CHECK(m.hidden_dropout == 0);
  // An explicit flag beats the preset's value; overriding the positions drops the preset's rotary base.
  llama.insert(llama.end(), {"--num-query-groups", "4", "--group-query-attention", "--normalization", "LayerNorm",
                             "--hidden-dropout", "0.2"});
  const GptConfig o = parsed(llama);
  CHECK(o.num_query_groups == 4);
  CHECK(o.normalization == Normalization::layernorm);
  CHECK(o.hidden_dropout == 0.2);
  // A preset with grouped-query attention stands for --group-query-attention.
  std::vector<std::string> groups = {"--model-preset", "llama2-70b", "--num-query-groups", "2"};
  groups.insert(groups.end(), small.begin(), small.end());
  CHECK(parsed(groups).query_groups() == 2);
  std::vector<std::string> l3 = {"--model-preset", "llama3-8b", "--position-embedding-type", "alibi"};
  l3.insert(l3.end(), small.begin(), small.end());
  CHECK(parsed(l3).rotary_base == 10000);
  // A GPT-2 preset on the command line's sizes is still GPT-2.
  CHECK(parsed({"--model-preset", "gpt2-124m", "--num-layers", "2", "--hidden-size", "48", "--num-attention-heads",
                "4", "--seq-length", "16"})
            .is_gpt2_family());
  CHECK_THAT(refused({"--model-preset", "llama9-1t"}),
             Contains("--model-preset llama9-1t is not a preset -- use one of gpt2-124m"));
}

TEST_CASE("family flags: every bad value and contradiction at once, with validation's problems", "[family_flags]") {
  const std::string m = refused({"--normalization", "BatchNorm", "--position-embedding-type", "sinusoidal",
                                 "--disable-bias-linear", "--add-bias-linear", "--rotary-base", "20000",
                                 "--num-key-value-heads", "3", "--lr", "-1"});
  INFO(m);
  CHECK_THAT(m, Contains("6 problems"));
  CHECK_THAT(m, Contains("--normalization BatchNorm is not a normalization -- use LayerNorm or RMSNorm"));
  CHECK_THAT(m, Contains("--position-embedding-type sinusoidal is not a position embedding"));
  CHECK_THAT(m, Contains("--disable-bias-linear and --add-bias-linear contradict each other"));
  CHECK_THAT(m, Contains("--rotary-base has no effect with --position-embedding-type learned_absolute"));
  CHECK_THAT(m, Contains("--num-query-groups 3 does not divide --num-attention-heads 8"));
  CHECK_THAT(m, Contains("--lr must be >= 0"));
  CHECK_THAT(refused({"--use-rotary-position-embeddings", "--position-embedding-type", "alibi"}),
             Contains("contradict each other"));
  CHECK_THAT(refused({"--no-position-embedding", "--position-embedding-type", "learned_absolute"}),
             Contains("contradict each other"));
  CHECK_THAT(refused({"--rotary-percent", "0.5"}), Contains("--rotary-percent has no effect"));
  CHECK_THAT(refused({"--num-query-groups", "x", "--group-query-attention"}), Contains("is not an integer"));
}

TEST_CASE("family flags: tensor parallelism splits whole heads, groups and MLP rows", "[family_flags]") {
  CHECK_THAT(refused({"--group-query-attention", "--num-query-groups", "2", "--tensor-model-parallel-size", "4"}),
             Contains("--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4"));
  CHECK_THAT(refused({"--ffn-hidden-size", "171", "--tensor-model-parallel-size", "2"}),
             Contains("--ffn-hidden-size 171 is not divisible by --tensor-model-parallel-size 2"));
  const std::string both =
      refused({"--ffn-hidden-size", "171", "--group-query-attention", "--num-query-groups", "2",
               "--tensor-model-parallel-size", "4"});
  CHECK_THAT(both, Contains("--ffn-hidden-size 171") && Contains("--num-query-groups 2"));
  CHECK(parsed({"--group-query-attention", "--num-query-groups", "4", "--tensor-model-parallel-size", "4"})
            .query_groups() == 4);
}

}  // namespace
}  // namespace troupe
