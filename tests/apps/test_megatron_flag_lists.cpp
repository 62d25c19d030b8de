// Every flag of Megatron-LM's and Megatron-DeepSpeed's arguments.py (the lists in tests/apps/data/,
// extracted from the two repositories' parsers: their headers say at which commits and how) is known
// to `troupe train`: registered, or a row of apps/cli/megatron_table.hpp. A flag neither is reported
// as "not a flag of troupe train"; the test fails listing every such flag.
#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <set>

#include "apps/cli/megatron_compat.hpp"
#include "apps/cli/train_options.hpp"
#include "base/spelling.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

std::vector<std::string> read_list(const std::string& name) {
  std::ifstream in(test::source_dir() + "/tests/apps/data/" + name);
  REQUIRE(in.good());
  std::vector<std::string> flags;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("--", 0) == 0) flags.push_back(line);
  return flags;
}

// The flags screen_train_args calls "not a flag of troupe train" among `flags`, given all at once.
std::vector<std::string> unknown(const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"--num-layers",          "2", "--hidden-size", "48",
                                   "--num-attention-heads", "4", "--seq-length",  "16",
                                   "--train-iters",         "1", "--mock-data",   "--tokenizer-type",
                                   "ByteLevelTokenizer"};
  args.insert(args.end(), flags.begin(), flags.end());
  auto s = screen_train_args(args, 1);
  std::vector<std::string> out;
  if (s.is_ok()) return out;
  const std::string m = s.status().message();
  for (const std::string& f : flags)
    if (m.find(f + ": not a flag of troupe train") != std::string::npos) out.push_back(f);
  return out;
}

std::string joined(const std::vector<std::string>& flags) {
  std::string s;
  for (const std::string& f : flags) s += "\n  " + f;
  return s;
}

TEST_CASE("flag lists: every flag of Megatron-LM's arguments.py is known to troupe train", "[compat]") {
  const std::vector<std::string> flags = read_list("megatron_lm_arguments.txt");
  CHECK(flags.size() == 878);
  const std::vector<std::string> missing = unknown(flags);
  INFO(missing.size() << " unknown:" << joined(missing));
  CHECK(missing.empty());
}

TEST_CASE("flag lists: every flag of Megatron-DeepSpeed's arguments.py is known to troupe train", "[compat]") {
  const std::vector<std::string> flags = read_list("megatron_deepspeed_arguments.txt");
  CHECK(flags.size() == 321);
  const std::vector<std::string> missing = unknown(flags);
  INFO(missing.size() << " unknown:" << joined(missing));
  CHECK(missing.empty());
}

// The check itself can fail: a made-up flag beside the real ones is reported, by name.
TEST_CASE("flag lists: a flag neither registered nor in the table is reported", "[compat]") {
  CHECK(unknown({"--num-experts", "--frobnicate-the-gradients", "--log-params-norm"}) ==
        std::vector<std::string>{"--frobnicate-the-gradients"});
}

// No row is dead: each of its flags is in one of the lists, or a spelling the rows document
// (older names the scripts still pass, and troupe's own other spellings).
TEST_CASE("flag lists: every row of the table is a flag of one of the two projects", "[compat]") {
  std::set<std::string> known;
  for (const char* list : {"megatron_lm_arguments.txt", "megatron_deepspeed_arguments.txt"})
    for (const std::string& f : read_list(list)) known.insert(f);
  // Older spellings of Megatron's own (in neither arguments.py at the anchors' commits, still in
  // real scripts: sc21's --activations-checkpoint-method, --checkpoint-activations, ...), an extra
  // flag of detxoify_lm's finetune_gpt.py that its scripts pass, and ModelOpt's flags.
  const std::set<std::string> older = {"--activations-checkpoint-method",
                                       "--checkpoint-activations",
                                       "--use-flash-attn-v1",
                                       "--use-flash-attn-v2",
                                       "--use-flash-attn-triton",
                                       "--micro-batch",
                                       "--warmup",
                                       "--model-parallel-size",
                                       "--lr-decay-iters-fraction",
                                       "--DDP-impl",
                                       "--no-scatter-gather-tensors-in-pipeline",
                                       "--contiguous-checkpointing",
                                       "--no-async-tensor-model-parallel-allreduce",
                                       "--async-tensor-model-parallel-allreduce",
                                       "--no-query-key-layer-scaling",
                                       "--no-contiguous-buffers-in-local-ddp",
                                       "--use-contiguous-buffers-in-local-ddp",
                                       "--squared-relu",
                                       "--openai-gelu",
                                       "--no-bias-gelu-fusion",
                                       "--use-legacy-models",
                                       "--use-mcore-models",
                                       "--data-impl",
                                       "--local_rank",
                                       "--optimizer",
                                       "--no-pipeline-parallel",
                                       "--batch-size",
                                       "--check-for-nan-in-loss-and-grad", "--data-path2",
                                       // ModelOpt's (megatron/post_training/arguments.py), added to
                                       // pretrain_gpt.py's parser with nvidia-modelopt installed
                                       "--export-force-local-attention", "--export-te-mcore-model",
                                       "--export-default-te-spec", "--export-legacy-megatron", "--export-model-type",
                                       "--modelopt-enabled", "--export-quant-cfg", "--export-real-quant-cfg",
                                       "--export-kv-cache-quant", "--qad-train-target", "--freeze-base-for-mtp",
                                       "--export-offline-model", "--export-kd-teacher-load",
                                       "--export-kd-teacher-model-config", "--export-kd-teacher-ckpt-format",
                                       "--export-kd-cfg", "--export-qk-l2-norm", "--export-moe-apply-probs-on-input",
                                       "--enable-gpt-oss", "--finetune-hf-dataset", "--finetune-data-split",
                                       "--finetune-data-files"};
  std::vector<std::string> dead;
  for (const CompatRow& r : compat_table())
    if (known.count(r.flag) == 0 && older.count(r.flag) == 0) dead.push_back(r.flag);
  INFO(dead.size() << " rows name no flag of either list:" << joined(dead));
  CHECK(dead.empty());
}

}  // namespace
TEST_CASE("flag lists: the hint's bounded distance is the distance, up to its bound", "[compat]") {
  // nearest_spellings stops a comparison once it exceeds its limit (the fuzzers' garbage flags
  // against ~1,400 names); within the bound the distance must be the full computation's.
  std::vector<std::string> words = read_list("megatron_deepspeed_arguments.txt");
  words.resize(120);
  words.push_back("--num-layrs");
  words.push_back("--lr-warmup-iters-x-y-z-with-a-long-tail");
  words.push_back("--\x01\x02garbage_garbage_garbage");
  int compared = 0, cut = 0;
  for (const std::string& a : words)
    for (const std::string& b : words)
      for (const size_t bound : {size_t{0}, size_t{2}, size_t{5}, size_t{12}}) {
        const size_t full = spelling_distance(a, b);
        const size_t bounded = spelling_distance(a, b, bound);
        INFO(a << " / " << b << " bound " << bound);
        REQUIRE((full <= bound ? bounded == full : bounded > bound));
        ++compared;
        cut += bounded == bound + 1 && full > bound + 1 ? 1 : 0;  // stopped early
      }
  CHECK(cut > compared / 4);
  CHECK(spelling_distance("--num-layers", "--num-layrs") == 1);
  CHECK(spelling_distance("--num_layers", "--num-layers") == 0);  // '-' and '_' alike
  CHECK(spelling_distance("--lr", "--rl") == 1);                  // a transposition
  const std::vector<std::string> near = nearest_spellings("--num-layrs", words);
  REQUIRE(!near.empty());
}

}  // namespace troupe
