// The `troupe train` command line: Megatron-LM's flag names bound to a TrainConfig, an optional
// DeepSpeed JSON file merged under them, and validation of the result before anything runs.
//
// Use:
//   TrainConfig cfg;
//   CLI::App* cmd = app.add_subcommand("train", ...);
//   add_train_options(cmd, &cfg);
//   ... app.parse(argc, argv) ...          // a bad flag or value type throws CLI::ParseError
//   Status st = finalize_train_config(*cmd, &cfg);
//   // then the caller sets cfg.model.vocab_size from the tokenizer.
//
// Precedence, highest first: a flag given on the command line; the --deepspeed-config file; derived
// defaults (--max-position-embeddings = --seq-length, --global-batch-size = --micro-batch-size x
// data-parallel size); TrainConfig's defaults. A flag counts as given when it appears in argv, even
// with the default value. As in Megatron, giving --num-layers-per-virtual-pipeline-stage selects
// --pipeline-schedule interleaved unless that flag is given too, and --sequence-parallel is turned
// off when --tensor-model-parallel-size is 1.
//
// DeepSpeed keys understood: train_batch_size -> --global-batch-size; train_micro_batch_size_per_gpu
// -> --micro-batch-size; gradient_accumulation_steps (DeepSpeed's rule train_batch_size = micro * gas
// * data-parallel size); optimizer {type Adam|AdamW, params {lr, betas, eps, weight_decay,
// adam_w_mode}}; scheduler {type WarmupLR|WarmupDecayLR|WarmupCosineLR, params {...}};
// gradient_clipping -> --clip-grad; steps_per_print -> --log-interval; wall_clock_breakdown ->
// --timing-log-level 2; zero_optimization {stage 0..3 -> --zero-stage, offload_optimizer {device
// none|cpu|nvme -> --offload-optimizer, nvme_path -> --offload-path}, offload_param only with device
// "none"}; fp16 {enabled -> --fp16, loss_scale, initial_scale_power, loss_scale_window, hysteresis,
// consecutive_hysteresis, min_loss_scale; auto_cast and fp16_master_weights_and_grads only false},
// bf16 {enabled -> --bf16, immediate_grad_update, check_grad_overflow}, communication_data_type. The keys that change nothing in troupe
// (config/deepspeed_keys.hpp) are accepted with a note each; "auto" leaves the flag's value; any
// other key, at any depth, is a problem naming its key path and the nearest accepted spelling.
// docs/COMPAT.md has the tables; deepspeed_config.cpp the DeepSpeed behaviour each mapping
// reproduces.
//
// Failure modes: every problem comes back as a failed Status naming the flag or the JSON key (and
// the file) and saying how to fix it. Validation reads the filesystem (data, vocabulary, --load)
// but never writes: nothing is created when the config is bad. Not thread-safe with respect to
// `cfg`.
#pragma once
#include <string>
#include <vector>

#include "config/validate.hpp"
#include "troupe/train_config.hpp"
#include "troupe/status.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace troupe {

// Registers every `troupe train` flag on `cmd`, bound to the fields of `*cfg` (which must outlive
// the parse). Help texts show the current values of `*cfg` as defaults.
void add_train_options(CLI::App* cmd, TrainConfig* cfg);

// The model-family flags alone (--model-preset, --normalization, --swiglu, the rotary and
// grouped-query flags, --ffn-hidden-size, the biases, the head tying, --norm-epsilon; docs/MODELS.md),
// bound to `*m`: add_train_options registers them, and so does `troupe bench gpt` beside its own
// sizes. After the parse, apply_model_family_flags reads the enum-valued and combining ones, then
// fills the fields whose flags were not given from --model-preset (a flag `cmd` lacks counts as not
// given). Each bad value or contradiction is appended to `*problems` ("FLAG what -- fix"), for the
// caller to report with validation's; `*notes` (if given) gets the start-up notes.
void add_model_family_options(CLI::App* cmd, GptConfig* m);
void apply_model_family_flags(const CLI::App& cmd, GptConfig* m, std::vector<std::string>* problems,
                              std::vector<std::string>* notes);

// The mixed-precision flags after the parse (and after the DeepSpeed file's merge): --fp16 /
// --bf16 set the type unless the file enabled a 16-bit block (then DeepSpeed's recipe holds, the
// flags' loss-scale values still winning field by field: include/troupe/precision.hpp);
// --apply-query-key-layer-scaling implies --attention-softmax-in-fp32. --fp16 with --bf16 is
// appended to `*problems`; `*notes` (if given) gets a line for each setting without effect in the
// chosen type (loss scaling in fp32, the dynamic settings with bf16).
void apply_precision_flags(const FlagGivenFn& given, TrainConfig* cfg, std::vector<std::string>* problems,
                           std::vector<std::string>* notes);

// After `cmd` was parsed: merges the --deepspeed-config file (if given) for the settings whose
// flags were not given, fills derived defaults, then validates with validate_train_config, and with
// validate_world when world_size > 1. world_size: the ranks troupe launch started (1 in one
// process); it sets the data-parallel size when --data-parallel-size is 0, which DeepSpeed's batch
// rule and the default global batch multiply by. `cmd` must be the App that add_train_options
// registered on. `*notes` (if given) gets the start-up notes of the DeepSpeed file (keys accepted
// without effect, "auto" values). On failure `*cfg` may be partly merged: discard it.
// What `troupe plan` does not read of a train command: the data (mock data instead), checkpoints
// and, when none is given, the run's length (one iteration; the length changes no iteration's cost).
void waive_run_inputs_for_plan(TrainConfig* cfg);

Status finalize_train_config(const CLI::App& cmd, TrainConfig* cfg, int world_size = 1,
                             std::vector<std::string>* notes = nullptr);

}  // namespace troupe
