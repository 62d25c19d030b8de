// The mixture-of-experts flags of `troupe train` (docs/COMPAT.md, "Mixture of experts"):
// Megatron-LM's and Megatron-DeepSpeed's, read into GptConfig::moe and TrainConfig's expert sizes
// as the dialect the command line is written in means them. The two projects give --num-experts
// different meanings (Megatron-DeepSpeed: DeepSpeed-MoE in every --expert-interval'th layer, top-1,
// capacity 1.0 with token dropping; Megatron-LM: Megatron-Core's router in every layer, top-2,
// dropless), so the dialect decides:
//   - Megatron-DeepSpeed's when the command line gives one of that project's own MoE flags (--topk,
//     --expert-interval, --moe-expert-parallel-size, --moe-loss-coeff, ..., or a --num-experts list
//     of several values);
//   - Megatron-LM's when it gives one of Megatron-LM's own (--moe-router-topk, --moe-layer-freq,
//     --expert-model-parallel-size, ...);
//   - otherwise (--num-experts alone) Megatron-DeepSpeed's for a DeepSpeed run (--deepspeed,
//     --deepspeed-config: troupe train is then Megatron-DeepSpeed's pretrain_gpt.py), else
//     Megatron-LM's.
// Own flags of both projects together are a problem. Each dialect's defaults are its arguments.py's
// (Megatron-DeepSpeed megatron/arguments.py, Megatron-LM megatron/training/arguments.py and
// TransformerConfig, at the commits docs/COMPAT.md names). A dense model's MoE flags (no
// --num-experts, every value 1, or Megatron-LM's 0) change nothing: one note each. With experts,
// the reading taken is one start-up note ("--num-experts 8: read as Megatron-DeepSpeed's ...").
//
// The flags troupe implements under these names are registered here; the table
// (apps/cli/megatron_table.cpp) lists them too, beside the MoE flags it accepts without effect or
// refuses. Not thread-safe with respect to `cfg`.
#pragma once
#include <string>
#include <vector>

#include "config/deepspeed_config.hpp"  // FlagGivenFn
#include "troupe/train_config.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace troupe {

// Registers both projects' implemented MoE flags on `cmd`, unbound: apply_moe_flags reads them.
void add_moe_options(CLI::App* cmd);

// After the parse (and the tensor-parallel size known): sets cfg->model.moe,
// cfg->expert_model_parallel_size and cfg->expert_tensor_parallel_size from the flags given. Each
// value that is not a number of the flag's kind, each refused value and a mix of the dialects is
// appended to `*problems` ("FLAG what -- fix"); `*notes` (if given) gets the start-up notes.
// Validation (GptConfig::architecture_problems, validate_train_config) checks the result.
void apply_moe_flags(const CLI::App& cmd, const FlagGivenFn& given, TrainConfig* cfg,
                     std::vector<std::string>* problems, std::vector<std::string>* notes);

// The mixture of experts `cfg` describes, in words (the note's text after "read as ..."): the
// router, experts, layers, k, capacity, losses and expert parallelism. "" for a dense model.
std::string describe_moe(const TrainConfig& cfg);

}  // namespace troupe
