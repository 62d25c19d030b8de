// A Megatron-LM command line and a DeepSpeed JSON, read as `troupe train` reads them (as
// Megatron-DeepSpeed's pretrain_gpt.py does: the JSON's batch sizes, ZeRO stage and clipping apply;
// its optimizer block does not, since Megatron-DeepSpeed hands DeepSpeed its own optimizer built from
// the flags), then trained from code; a mistyped flag is refused naming it.
#include <filesystem>
#include <fstream>

#include "example_util.hpp"

int main() {
  using namespace example;
  const std::filesystem::path json = std::filesystem::temp_directory_path() / "troupe_example_ds.json";
  std::ofstream(json) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.1}},
    "zero_optimization": {"stage": 1}, "gradient_clipping": 0.5})";
  auto cfg = troupe::parse_train_flags({"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                        "--seq-length", "32", "--max-position-embeddings", "32",
                                        "--tokenizer-type", "ByteLevelTokenizer", "--mock-data",
                                        "--data-parallel-size", "2", "--train-iters", "3", "--log-interval", "1",
                                        "--lr", "1e-3", "--adam-beta2", "0.95",
                                        "--num-threads", "2", "--deepspeed-config", json.string()});
  if (!cfg) fail(cfg.status().message());
  const troupe::TrainConfig& c = cfg.value();
  check(c.micro_batch_size == 2 && c.global_batch_size == 8, "DeepSpeed's batch rule: 2 x 2 accumulation x dp 2 = 8");
  check(c.zero_stage == 1 && c.clip_grad == 0.5, "the JSON's ZeRO stage and gradient clipping");
  check(c.lr == 1e-3 && c.adam_beta2 == 0.95, "the optimizer of the flags, not of the JSON's block (Megatron-DeepSpeed's)");
  check(losses_of(c).size() == 3, "it trains for --train-iters 3");

  auto bad = troupe::parse_train_flags({"--num-layer", "2"});
  check(!bad && bad.status().is_bad_input() && bad.status().message().find("--num-layer") != std::string::npos,
        "a mistyped flag is refused naming it: " + bad.status().message());
  std::filesystem::remove(json);
  return 0;
}
