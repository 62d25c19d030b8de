// Which training run wrote a checkpoint, and what may change when a run is resumed.
//
// A run begins when `troupe train` starts without --load and continues through every resume: an
// explicit --load, a restart after a failure (--max-restarts, in one process or every process under
// troupe launch). Its id, 128 random bits, is recorded in every checkpoint it writes
// (metadata.json: "run": {"id": "<32 hex digits>"}); a resume inherits the id of the checkpoint it
// loads. The rules:
//
//   - A restart resumes only this run's checkpoints: the latest checkpoint in --save is loaded when
//     its run id is this run's, never another run's (troupe launch passes its run id to every
//     process it starts, and again to every restart, as TROUPE_RUN_ID).
//   - --save into a folder whose latest checkpoint belongs to another run is refused unless that
//     run is the one being resumed (--load of the same run), so two runs never mix in one folder.
//   - --load of a checkpoint compares the flags with the config stored in it (Megatron's rules,
//     megatron/training/checkpointing.py check_checkpoint_args and OptimizerParamScheduler):
//       must agree     --num-layers, --hidden-size, --num-attention-heads,
//                      --max-position-embeddings, the architecture family (--normalization,
//                      --position-embedding-type, --swiglu, the biases, the head's tying,
//                      --embed-layernorm, the key/value groups, --kv-channels, --ffn-hidden-size,
//                      the rotary percent, base and pairing), the experts of each layer and what
//                      shapes them (the MoE router's dialect, the expert width, PR-MoE's residual
//                      MLP, the shared expert), the vocabulary (tokenizer type and size), --seed
//                      (it fixes the data order, which the run continues); and the learning-rate
//                      schedule (--lr, --min-lr, --lr-decay-style, --lr-warmup-*, the decay length
//                      --lr-decay-iters or --train-iters), unless --override-opt_param-scheduler
//                      (this run's values win) or --use-checkpoint-opt_param-scheduler (the
//                      checkpoint's win). Values the schedule does not depend on are not compared
//                      (a constant schedule has no decay length, so --train-iters may grow).
//       may change     the parallel layout (expert sizes included) and ZeRO stage, the MoE routing
//                      settings (k, capacity, the load-balancing coefficient), batch sizes,
//                      --train-iters (with the schedule rule above), the data (--data-path,
//                      --split: the run continues at its consumed samples), optimizer
//                      hyper-parameters (weight decay, betas, eps, clipping), offload, recompute, intervals, threads, the precision (--fp16,
//                      --bf16: the checkpoint's master weights are fp32). Each change is reported.
//     Everything that must agree and does not is reported at once, as bad input (exit code 2).
//
// Pure functions except new_run_id (reads /dev/urandom) and the checks that read a folder.
#pragma once
#include <string>
#include <vector>

#include "troupe/train_config.hpp"
#include "troupe/status.hpp"
#include "storage/checkpoint.hpp"

namespace troupe {

// 32 hex digits from /dev/urandom.
std::string new_run_id();
// The "run" object of metadata.json: {"id": "..."}.
std::string run_json(const std::string& run_id);
// The run id a checkpoint records; "" for checkpoints written before runs had ids (or none at all).
std::string run_id_of(const CheckpointMeta& meta);

// The run id and stored config of DIR's latest checkpoint. found is false when DIR has no
// complete checkpoint (no latest pointer); an unreadable latest checkpoint is an error.
struct LatestRun {
  bool found = false;
  int64_t iteration = 0;
  std::string run_id;
  TrainConfig config;
};
Result<LatestRun> latest_run(const std::string& dir);

// What --load of a checkpoint whose stored config is `saved` means for this run's `now`: the
// differences that refuse the resume (each names the flag, both values and the fix) and the allowed
// changes (for the log).
struct ResumeCheck {
  std::vector<std::string> refused;
  std::vector<std::string> changed;
  // One bad-input Status listing every refusal (ok when there is none); finetune: check_finetune's.
  Status status(const std::string& dir, bool finetune = false) const;
};
ResumeCheck check_resume(const TrainConfig& now, const TrainConfig& saved);

// --finetune (and --load of a Hugging Face folder): a new run from the checkpoint's parameters.
// Only what the parameters' shapes and meaning depend on must agree (the layer count, hidden size,
// heads, positions, the family but the rotary base, the vocabulary size); the seed, schedule and
// everything else are this run's. Changes of the tokenizer type, the norm epsilon and the rotary
// base (context extension) are reported.
ResumeCheck check_finetune(const TrainConfig& now, const TrainConfig& saved);

// --use-checkpoint-opt_param-scheduler: the learning-rate schedule's fields of `saved` in `now`
// (the decay length made explicit, so a changed --train-iters does not move it).
void use_checkpoint_schedule(TrainConfig& now, const TrainConfig& saved);

// Refuses (bad input) a --save folder whose latest checkpoint belongs to a run other than
// `run_id`, naming that run's seed, iteration and the fixes. Ok when the folder has no checkpoint.
// `resuming_from` is the --load folder ("" without --load): a legacy checkpoint without a run id
// is accepted only in the folder being resumed.
Status check_save_folder(const std::string& save, const std::string& run_id, const std::string& resuming_from);

}  // namespace troupe
