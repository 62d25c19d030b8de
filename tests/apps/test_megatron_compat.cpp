// Megatron's and DeepSpeed's flags before CLI11 (apps/cli/megatron_compat.hpp): no-ops and aliases
// are accepted with a note each, refused and unknown flags are all reported in one message with
// the nearest spelling, validation's problems come with them, and a --load folder with nothing in
// it starts from scratch as Megatron does.
#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "apps/cli/megatron_compat.hpp"
#include "apps/cli/megatron_table.hpp"
#include "apps/cli/train_options.hpp"
#include "tests/test_util.hpp"
#include "troupe/flags.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

// A valid run on mock data, plus `extra`.
std::vector<std::string> base(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--num-layers",  "2",  "--hidden-size", "48", "--num-attention-heads", "4",
                                "--seq-length",  "16", "--micro-batch-size", "2", "--train-iters", "5",
                                "--mock-data", "--tokenizer-type", "ByteLevelTokenizer"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::set<std::string> registered() {
  TrainConfig cfg;
  CLI::App app;
  add_train_options(&app, &cfg);
  std::set<std::string> out;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& n : o->get_lnames()) out.insert("--" + n);
  return out;
}

// Optimal string alignment distance, written independently of the product's (recursion with a
// memo), '-' and '_' equal.
size_t osa(const std::string& a, const std::string& b) {
  std::map<std::pair<size_t, size_t>, size_t> memo;
  auto same = [](char x, char y) { return x == y || ((x == '-' || x == '_') && (y == '-' || y == '_')); };
  std::function<size_t(size_t, size_t)> d = [&](size_t i, size_t j) -> size_t {
    if (i == 0) return j;
    if (j == 0) return i;
    auto it = memo.find({i, j});
    if (it != memo.end()) return it->second;
    size_t best = std::min({d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
    if (i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1])) best = std::min(best, d(i - 2, j - 2) + 1);
    return memo[{i, j}] = best;
  };
  return d(a.size(), b.size());
}

TEST_CASE("compat: the flag distance is the optimal string alignment distance", "[compat]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()));
  const std::string alphabet = "ab-_c";
  for (int t = 0; t < 300; ++t) {
    auto word = [&] {
      std::string w;
      for (size_t n = rng() % 8; n > 0; --n) w += alphabet[rng() % alphabet.size()];
      return w;
    };
    const std::string a = word(), b = word();
    INFO(a << " vs " << b);
    CHECK(flag_distance(a, b) == osa(a, b));
    CHECK(flag_distance(a, b) == flag_distance(b, a));
  }
  CHECK(flag_distance("--local_rank", "--local-rank") == 0);
  CHECK(flag_distance("--num-layres", "--num-layers") == 1);
}

TEST_CASE("compat: registered flags pass through untouched, and the table names none of them", "[compat]") {
  const std::vector<std::string> args = base({"--lr", "-0.5", "--save", "x", "--num-layers-per-virtual-pipeline-stage", "1"});
  auto s = screen_train_args(args, 1);
  REQUIRE(s.is_ok());
  CHECK(s.value().args == args);
  CHECK(s.value().notes.empty());
  const std::set<std::string> reg = registered();
  std::set<std::string> spellings;  // '-' and '_' alike: two rows of one spelling, the second unused
  for (const CompatRow& r : compat_table()) {
    // An implemented row documents a registered flag (the MoE flags); every other row's flag is one
    // troupe does not register, else the row would never be used.
    INFO(r.flag << (r.disposition == "implemented" ? " is implemented but not registered"
                                                    : " is registered, or spelt as another row: its row is never used"));
    CHECK(reg.count(r.flag) == (r.disposition == "implemented" ? 1u : 0u));
    std::string s = r.flag;
    std::replace(s.begin(), s.end(), '_', '-');
    CHECK(spellings.insert(s).second);
  }
}

// A value each accepted row takes (its first `ok` value, else one of the flag's own kind).
std::string accepted_value(const std::string& flag, const CompatRule& rule) {
  static const std::map<std::string, std::string> own = {{"--data-parallel-sharding-strategy", "optim"},
                                                         {"--encoder-num-layers", "2"},
                                                         {"--encoder-seq-length", "16"},
                                                         {"--persistent-save-interval", "5"},
                                                         {"--cp-comm-type", "p2p"},
                                                         {"--exit-signal", "SIGTERM"}};
  if (auto it = own.find(flag); it != own.end()) return it->second;
  const std::string ok = rule.ok;
  return ok.empty() ? "1" : ok.substr(0, ok.find('|'));
}

TEST_CASE("compat: every no-op and alias is accepted with one note, and aliases set what they stand for", "[compat]") {
  std::vector<std::string> extra;
  size_t expected_notes = 0;
  for (const CompatSection& section : compat_sections())
    for (const CompatRule& rule : section.rules) {
      if (rule.kind != CompatKind::noop && rule.kind != CompatKind::alias) continue;
      for (const char* spec : rule.flags) {
        const std::string s = spec;
        const std::string flag = s.substr(0, s.find(' '));
        if (flag == "--deepscale_config") continue;  // names a file: its own case below
        extra.push_back(flag);
        if (s.find(" V") != std::string::npos && rule.when != CompatWhen::no_value)
          extra.push_back(accepted_value(flag, rule));
        ++expected_notes;
      }
    }
  REQUIRE(expected_notes > 500);
  std::vector<std::string> notes;
  auto cfg = parse_train_flags(base(extra), 1, &notes);
  INFO((cfg.is_ok() ? std::string() : cfg.status().message()));
  REQUIRE(cfg.is_ok());
  size_t flag_notes = 0;  // notes of other origins (a DeepSpeed file's) do not come here
  for (const std::string& n : notes) flag_notes += n.rfind("--", 0) == 0 ? 1 : 0;
  CHECK(flag_notes == expected_notes);
  CHECK(cfg.value().offload_optimizer == "cpu");
  CHECK(cfg.value().pipeline_schedule == "zb-h1");
  CHECK(cfg.value().save_interval == 5);
  // The last recompute alias given wins among aliases; an explicit flag wins over any alias.
  auto explicit_wins = parse_train_flags(base({"--recompute-granularity", "selective", "--checkpoint-activations",
                                               "--use-distributed-optimizer", "--zero-stage", "2"}));
  REQUIRE(explicit_wins.is_ok());
  CHECK(explicit_wins.value().recompute_granularity == "selective");
  CHECK(explicit_wins.value().zero_stage == 2);
  auto alias = parse_train_flags(base({"--checkpoint-activations"}));
  REQUIRE(alias.is_ok());
  CHECK(alias.value().recompute_granularity == "full");
  // --flag=value spells the same.
  auto inline_value = screen_train_args(base({"--data-impl=mmap", "--local_rank=2"}), 1);
  REQUIRE(inline_value.is_ok());
  CHECK(inline_value.value().notes.size() == 2);
  CHECK(inline_value.value().args == base());
}

// Aliases that carry the flag's value, and the ones computed from other flags.
TEST_CASE("compat: aliases with values and the FSDP sharding strategies", "[compat]") {
  auto layers = parse_train_flags(base({"--encoder-num-layers", "3"}));  // base's --num-layers 2 wins
  REQUIRE(layers.is_ok());
  CHECK(layers.value().model.num_layers == 2);
  std::vector<std::string> args = base();
  args.erase(args.begin(), args.begin() + 2);  // without --num-layers
  args.insert(args.end(), {"--encoder-num-layers", "3", "--persistent-save-interval", "7"});
  auto encoder = parse_train_flags(args);
  REQUIRE(encoder.is_ok());
  CHECK(encoder.value().model.num_layers == 3);
  CHECK(encoder.value().save_interval == 7);
  const std::map<std::string, int> strategies = {
      {"no_shard", 0}, {"optim", 1}, {"optim_grads", 2}, {"optim_grads_params", 3}};
  for (const auto& [strategy, stage] : strategies) {
    std::vector<std::string> notes;
    auto c = parse_train_flags(base({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy}), 1, &notes);
    INFO(strategy);
    REQUIRE(c.is_ok());
    CHECK(c.value().zero_stage == stage);
  }
  auto fsdp_default = parse_train_flags(base({"--use-megatron-fsdp"}));  // Megatron's default: optim_grads_params
  REQUIRE(fsdp_default.is_ok());
  CHECK(fsdp_default.value().zero_stage == 3);
  auto strategy_alone = parse_train_flags(base({"--data-parallel-sharding-strategy", "optim"}));  // read by FSDP only
  REQUIRE(strategy_alone.is_ok());
  CHECK(strategy_alone.value().zero_stage == 0);
  auto fsdp2 = parse_train_flags(base({"--use-torch-fsdp2", "--torch-fsdp2-no-reshard-after-forward"}));
  REQUIRE(fsdp2.is_ok());
  CHECK(fsdp2.value().zero_stage == 2);
  auto bad = screen_train_args(base({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "zero9"}), 1);
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Contains("--data-parallel-sharding-strategy zero9: Megatron knows"));
  auto zb = parse_train_flags(base({"--enable-zbh1-pipeline", "--enable-zbh1-exact-semantics"}));
  REQUIRE(zb.is_ok());
  CHECK(zb.value().pipeline_schedule == "zb-h1");
  test::TempDir dir;
  const std::string json = dir.str("ds.json");
  std::ofstream(json) << R"({"train_micro_batch_size_per_gpu": 2})";
  auto deepscale = parse_train_flags(base({"--deepscale", "--deepscale_config", json}));
  REQUIRE(deepscale.is_ok());
  CHECK(deepscale.value().deepspeed_config == json);
}

TEST_CASE("compat: every misspelt, refused or unknown flag at once, each with its fix", "[compat]") {
  std::mt19937 rng(static_cast<unsigned>(Catch::rngSeed()));
  const std::set<std::string> reg = registered();
  std::vector<std::string> names(reg.begin(), reg.end());
  names.erase(std::remove_if(names.begin(), names.end(), [](const std::string& n) { return n.size() < 10; }),
              names.end());
  std::shuffle(names.begin(), names.end(), rng);
  // Three registered flags misspelt by one dropped letter (after "--x"), so each is one edit away.
  std::vector<std::string> extra, originals;
  for (int k = 0; k < 3; ++k) {
    std::string bad = names[static_cast<size_t>(k)];
    const size_t at = 3 + rng() % (bad.size() - 3);
    bad.erase(at, 1);
    if (reg.count(bad) > 0) continue;  // dropping it made another flag
    extra.push_back(bad);
    originals.push_back(names[static_cast<size_t>(k)]);
  }
  extra.insert(extra.end(), {"--eod-mask-loss", "--optimizer", "sgd", "--squared-relu", "--lr-decay-iters-fraction",
                             "0.5", "--zzzz-not-megatron", "7", "--decoupled-lr", "1e-3"});
  auto s = screen_train_args(base(extra), 1);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.status().is_bad_input());
  const std::string m = s.status().message();
  INFO(m);
  for (size_t k = 0; k < originals.size(); ++k) {
    CHECK_THAT(m, Contains(extra[k] + ": not a flag of troupe train"));
    CHECK_THAT(m, Contains(originals[k]));
  }
  CHECK_THAT(m, Contains("--eod-mask-loss: troupe counts the loss on every token"));
  CHECK_THAT(m, Contains("--optimizer sgd: troupe trains with AdamW only"));
  CHECK_THAT(m, Contains("--squared-relu: an architecture variant troupe does not build"));
  CHECK_THAT(m, Contains("--lr-decay-iters-fraction 0.5: give --lr-decay-iters"));
  CHECK_THAT(m, Contains("--zzzz-not-megatron: not a flag of troupe train -- troupe train --help"));
  CHECK_THAT(m, Contains("--decoupled-lr 1e-3: a separate learning rate for the word embedding and output layer"));
  CHECK_THAT(m, Contains(std::to_string(originals.size() + 6) + " problems with the flags"));
}

TEST_CASE("compat: --hidden-dropout and --attention-dropout: Megatron's defaults, any probability below 1", "[compat]") {
  auto defaults = parse_train_flags(base());
  REQUIRE(defaults.is_ok());
  CHECK(defaults.value().model.hidden_dropout == 0.1);  // Megatron's defaults, as TrainConfig's
  CHECK(defaults.value().model.attention_dropout == 0.1);
  CHECK(TrainConfig{}.model.hidden_dropout == 0.1);
  CHECK(GptConfig{}.hidden_dropout == 0);  // a bare model has none
  auto set = parse_train_flags(base({"--hidden-dropout", "0.25", "--attention-dropout", "0"}));
  REQUIRE(set.is_ok());
  CHECK(set.value().model.hidden_dropout == 0.25);
  CHECK(set.value().model.attention_dropout == 0);
  for (const char* bad : {"1", "-0.1", "1.5", "nan"}) {
    auto s = parse_train_flags(base({"--attention-dropout", bad}));
    INFO(bad);
    REQUIRE_FALSE(s.is_ok());
    CHECK(s.status().is_bad_input());
    CHECK_THAT(s.status().message(), Contains("--attention-dropout"));
  }
}

// Megatron's nargs=3: every spelling with another count is refused with the flag named (CLI11 hands
// `--rampup-batch-size=2` over as one value; reading three from it overflowed, found by fuzz_train_flags).
TEST_CASE("compat: --rampup-batch-size takes exactly three values", "[compat]") {
  const std::vector<std::string> samples = {"--train-samples", "96", "--global-batch-size", "8"};
  auto with = [&](std::vector<std::string> v) {
    std::vector<std::string> a = {"--num-layers", "2", "--hidden-size", "48", "--num-attention-heads", "4",
                                  "--seq-length", "16", "--micro-batch-size", "2", "--mock-data",
                                  "--tokenizer-type", "ByteLevelTokenizer"};
    a.insert(a.end(), samples.begin(), samples.end());
    a.insert(a.end(), v.begin(), v.end());
    return parse_train_flags(a);
  };
  auto good = with({"--rampup-batch-size", "2", "2", "40"});
  REQUIRE(good.is_ok());
  CHECK(good.value().rampup_start_batch == 2);
  CHECK(good.value().rampup_batch_increment == 2);
  CHECK(good.value().rampup_samples == 40);
  auto again = with({"--rampup-batch-size", "2", "2", "40", "--rampup-batch-size", "4", "4", "24"});
  REQUIRE(again.is_ok());  // the last occurrence wins, as with Megatron's argparse
  CHECK(again.value().rampup_start_batch == 4);
  CHECK(again.value().rampup_samples == 24);
  for (const auto& bad : std::vector<std::vector<std::string>>{{"--rampup-batch-size=2"},
                                                                {"--rampup-batch-size", "2", "2"},
                                                                {"--rampup-batch-size", "2", "2", "40", "8"}}) {
    auto s = with(bad);
    INFO(bad.back());
    REQUIRE_FALSE(s.is_ok());
    CHECK(s.status().is_bad_input());
    CHECK_THAT(s.status().message(), Contains("--rampup-batch-size"));
  }
}

TEST_CASE("compat: validation's problems come with the flags' problems", "[compat]") {
  auto s = screen_train_args(base({"--eod-mask-loss", "--lr", "-1", "--clip-grad", "-2", "--hidden-dropout", "1"}), 1);
  REQUIRE_FALSE(s.is_ok());
  const std::string m = s.status().message();
  INFO(m);
  CHECK_THAT(m, Contains("--eod-mask-loss"));
  CHECK_THAT(m, Contains("--lr"));
  CHECK_THAT(m, Contains("--clip-grad"));
  CHECK_THAT(m, Contains("--hidden-dropout must be a probability at least 0 and below 1"));
  CHECK_THAT(m, Contains("4 problems with the flags"));
  // A value CLI11 cannot read is named too.
  auto t = screen_train_args(base({"--eod-mask-loss", "--num-layers", "two"}), 1);
  REQUIRE_FALSE(t.is_ok());
  CHECK_THAT(t.status().message(), Contains("--eod-mask-loss"));
  CHECK_THAT(t.status().message(), Contains("two"));
}

TEST_CASE("compat: --load of a folder with no checkpoint starts from scratch, as Megatron's", "[compat]") {
  test::TempDir dir;
  const std::string missing = dir.str("never_saved");
  std::vector<std::string> notes;
  auto fresh = parse_train_flags(base({"--save", missing, "--load", missing}), 1, &notes);
  REQUIRE(fresh.is_ok());
  CHECK(fresh.value().load.empty());
  CHECK(fresh.value().save == missing);
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Contains("starts from scratch"));
  CHECK_FALSE(fs::exists(missing));  // nothing created
  fs::create_directories(dir.str("empty"));
  auto empty = parse_train_flags(base({"--load", dir.str("empty")}));
  REQUIRE(empty.is_ok());
  CHECK(empty.value().load.empty());
  // Megatron's switch keeps the refusal; an unfinished save (iter_* without the tracker) is not a
  // fresh start.
  auto strict = parse_train_flags(base({"--load", missing, "--exit-on-missing-checkpoint"}));
  REQUIRE_FALSE(strict.is_ok());
  CHECK_THAT(strict.status().message(), Contains("--load"));
  fs::create_directories(dir.str("half/iter_0000007"));
  auto half = parse_train_flags(base({"--load", dir.str("half")}));
  REQUIRE_FALSE(half.is_ok());
  CHECK_THAT(half.status().message(), Contains("latest_checkpointed_iteration.txt"));
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// docs/COMPAT.md prints the table as compat_table_markdown() writes it, between two marker lines.
// TROUPE_UPDATE_DOCS=1 makes this test write it there instead (after changing a row).
TEST_CASE("compat: docs/COMPAT.md prints the table as it is", "[compat]") {
  const std::string path = test::source_dir() + "/docs/COMPAT.md";
  std::ifstream in(path);
  REQUIRE(in.good());
  std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string begin = "<!-- compat table: written by tests/apps/test_megatron_compat.cpp, do not edit -->\n";
  const std::string end = "<!-- end of the compat table -->\n";
  const size_t b = doc.find(begin), e = doc.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  const std::string want = compat_table_markdown();
  const std::string have = doc.substr(b + begin.size(), e - b - begin.size());
  if (have != want && std::getenv("TROUPE_UPDATE_DOCS") != nullptr) {
    std::ofstream(path) << doc.substr(0, b + begin.size()) << want << doc.substr(e);
    SUCCEED("docs/COMPAT.md rewritten");
    return;
  }
  CHECK(have == want);
  // Every flag of the table is on a row of its disposition.
  for (const CompatRow& r : compat_table()) {
    INFO(r.flag);
    CHECK(want.find("`" + r.flag) != std::string::npos);
  }
}

}  // namespace
}  // namespace troupe
