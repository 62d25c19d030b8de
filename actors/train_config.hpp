// Everything a training job is configured by: Megatron's flags, the DeepSpeed JSON keys troupe
// understands, merged by actors/train_options.hpp (explicit flags win over the file) and validated
// before anything runs; the learning rate of each step is actors/lr_schedule.hpp.
// Serialised to JSON into every checkpoint, so `troupe eval --load` and resuming know the model.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/status.hpp"
#include "model/config.hpp"

namespace troupe {

struct TrainConfig {
  GptConfig model;

  // Batches: gradient accumulation steps = global_batch_size / micro_batch_size (one data-parallel rank).
  int micro_batch_size = 4;
  int global_batch_size = 4;

  // Optimizer (AdamW) and learning-rate schedule (Megatron's semantics).
  double lr = 6e-4;
  double min_lr = 0.0;
  std::string lr_decay_style = "linear";  // constant | linear | cosine
  int64_t lr_warmup_iters = 0;
  std::string lr_warmup_style = "linear"; // linear | log (log: DeepSpeed's WarmupLR default)
  double lr_warmup_init = 0.0;            // lr at iteration 0 of warm-up
  int64_t lr_decay_iters = 0;             // 0: train_iters
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;  // 0 disables clipping
  int64_t train_iters = 0;
  uint64_t seed = 1234;

  // Data.
  std::string data_path;  // prefix of the .bin/.idx pair
  std::string tokenizer_type = "GPT2BPETokenizer";  // GPT2BPETokenizer | ByteLevelTokenizer
  std::string vocab_file;
  std::string merge_file;
  bool no_shuffle = false;
  bool mock_data = false;  // Megatron's --mock-data: synthetic tokens, no dataset needed
  std::string split = "969,30,1";  // train, validation, test weights over documents

  // Checkpointing.
  std::string save;
  int64_t save_interval = 0;  // 0: save only at the end (when --save is given)
  int64_t exit_interval = 0;  // Megatron's --exit-interval: stop (and save) when iteration % N == 0
  std::string load;

  // Evaluation and logging.
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  int64_t log_interval = 100;
  std::string metrics_file;  // one JSON object per iteration
  int num_threads = 0;       // compute threads of the shard; 0: all cores

  std::string deepspeed_config;  // the file the values came from, if any (informational)

  int grad_accumulation_steps() const { return global_batch_size / micro_batch_size; }

  // {"format": "troupe.train_config", "version": 1, "model": {GptConfig's fields}, every field
  // above}, indented. from_json requires every key and rejects unknown ones; errors name the key.
  std::string to_json() const;
  static Result<TrainConfig> from_json(const std::string& json);
};

}  // namespace troupe
