// Everything a training job is configured by: Megatron's flags, the DeepSpeed JSON keys troupe
// understands, merged by apps/cli/train_options.hpp (explicit flags win over the file) and validated
// before anything runs; the learning rate of each step is engine/lr_schedule.hpp.
// Serialised to JSON into every checkpoint, so `troupe eval --load` and resuming know the model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/status.hpp"
#include "troupe/model_config.hpp"
#include "troupe/precision.hpp"

namespace troupe {

// Megatron's TensorBoard switches (docs/COMPAT.md, "TensorBoard"; apps/tensorboard_log.hpp maps
// the run's statistics to Megatron's tags). Logging only: not stored in checkpoints (TrainConfig's
// to_json leaves them out), so a resumed run logs as its own flags say.
struct TensorBoardConfig {
  std::string dir;               // --tensorboard-dir: event files go here ("": none)
  int64_t log_interval = 1;      // --tensorboard-log-interval: the per-iteration scalars every N
  int64_t queue_size = 1000;     // --tensorboard-queue-size: accepted; troupe writes each iteration
  bool log_timers = false;       // --log-timers-to-tensorboard: iteration-time, <timer>-time, throughput
  bool log_learning_rate = true; // --no-log-learnig-rate-to-tensorboard turns it off
  bool log_loss_scale = true;    // --no-log-loss-scale-to-tensorboard turns it off
  bool log_validation_ppl = false;  // --log-validation-ppl-to-tensorboard
  bool log_world_size = false;      // --log-world-size-to-tensorboard
  bool log_throughput = false;      // --log-throughput: 'throughput' (with log_timers)
};

struct TrainConfig {
  // The model. Dropout defaults to Megatron's 0.1 (hidden and attention) here, as on the command
  // line, where a bare GptConfig has none: a run configured by a TrainConfig trains as the same
  // Megatron flags would.
  GptConfig model = [] {
    GptConfig m;
    m.hidden_dropout = 0.1;
    m.attention_dropout = 0.1;
    return m;
  }();

  // Batches: gradient accumulation steps = global_batch_size / (micro_batch_size * dp).
  int micro_batch_size = 4;
  int global_batch_size = 4;

  // Parallelism (Megatron's flags; zero_stage also from the DeepSpeed JSON's zero_optimization.stage).
  // tp x pp x dp actors run in one process, or one per rank under `troupe launch`, where
  // tp x pp x dp must equal the ranks started (data_parallel_size 0: ranks / (tp x pp)).
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int data_parallel_size = 0;  // 0: 1 in one process, ranks / (tp x cp x pp) under troupe launch
  int zero_stage = 0;          // 0..3
  std::string pipeline_schedule = "1f1b";  // 1f1b | gpipe | interleaved | zb-h1
  int num_layers_per_virtual_pipeline_stage = 0;  // interleaved: layers per model chunk
  std::string recompute_granularity = "none";     // none | full | selective
  bool sequence_parallel = false;
  // Mixture of experts (model.moe, docs/MOE.md): the experts of each MoE layer are split over
  // expert_model_parallel_size ranks of the data-parallel group (--moe-expert-parallel-size,
  // --expert-model-parallel-size; it divides the data-parallel size and every layer's experts), each
  // expert over expert_tensor_parallel_size ranks: 1 (whole experts, replicated over TP) or the
  // tensor-parallel size (--enable-expert-tensor-parallelism; --expert-tensor-parallel-size;
  // 0: Megatron-Core's default, the tensor-parallel size).
  int expert_model_parallel_size = 1;
  int expert_tensor_parallel_size = 0;
  // Long sequences (docs/PARALLEL.md, "Long sequences"). Context parallelism: each sequence split over
  // context_parallel_size ranks (Megatron's --context-parallel-size; the job's ranks are tp x cp x pp
  // x dp), attention by the ring exchange of key/value blocks (cp_comm_type p2p, Megatron's default)
  // or by an all-gather of them (all_gather). DeepSpeed-Ulysses (--ds-sequence-parallel-size): the
  // sequence split over ranks, attention by heads after an all-to-all.
  int context_parallel_size = 1;
  std::string cp_comm_type = "p2p";  // p2p | all_gather | a2a
  int ds_sequence_parallel_size = 1;
  // The ranks every sequence is split over: the context-parallel or the Ulysses size (validation
  // refuses both above 1 at once).
  int sequence_ranks() const { return std::max(1, context_parallel_size) * std::max(1, ds_sequence_parallel_size); }
  std::string timeline;  // Chrome trace JSON of every actor's spans ("": none)

  // Optimizer offload (DeepSpeed's zero_optimization.offload_optimizer): where the Adam moments of
  // each optimizer partition live. none: with the partition actor; cpu: the process's host memory
  // pool (pinned where CUDA exists), stepped on the partition's own thread; nvme: a file under
  // offload_path per partition, read ahead for each piece's step and written back after it.
  std::string offload_optimizer = "none";  // none | cpu | nvme
  std::string offload_path;                // nvme: the directory of the swap files

  // Supervision: a failed actor or process stops the job; with max_restarts > 0 the job restarts
  // every actor from the latest checkpoint in --save up to this many times.
  int max_restarts = 0;
  // Megatron's --distributed-timeout-minutes: an iteration (or evaluation, or save) that makes no
  // progress for this long means a rank is stuck; the job stops naming the ranks that did not finish.
  double distributed_timeout_minutes = 10;
  // A stall: no rank of this process changes what it does for this long. The job prints who waits
  // on whom and the culprit in one line and writes the ranks' activities to a JSON file, before
  // distributed_timeout_minutes acts. 0: the smaller of 60 s and half the distributed timeout.
  double inspect_stall_seconds = 0;
  // The inspector (`troupe inspect`): "[HOST:]PORT" to listen on (HOST defaults to 127.0.0.1; port
  // 0 picks a free one); empty: none. inspect_file: where the address and the job token go (mode
  // 0600); empty: troupe-inspect.json in --save, else troupe-inspect-PID.json here.
  std::string inspect;
  std::string inspect_file;
  // The live dashboard (docs/INSPECT.md): "[HOST:]PORT" of its web page, served by rank 0's process
  // (HOST 127.0.0.1 unless given; port 0 picks a free one); empty: none. It shows the inspector's
  // answers, so it also starts the inspector (on a free port of the same host) when `inspect` is
  // empty.
  std::string dashboard;
  // The NaN locator (docs/INSPECT.md, "A NaN hunt"): every step keeps its inputs and checks the
  // loss, the gradient norm and the parameters; the first non-finite one stops the job, naming the
  // op it came from (found by replaying the iteration). The inspector's `watch nan|off` switches it
  // at run time. Like the inspector's flags, not stored in checkpoints.
  bool watch_nan = false;

  // Mixed precision (include/troupe/precision.hpp): --fp16 / --bf16 and the loss scaling, or the
  // DeepSpeed file's fp16 / bf16 blocks. Stored in checkpoints ("precision"); a checkpoint may be
  // resumed in another precision (its master weights are fp32), and one written before version 7
  // reads as fp32.
  PrecisionConfig precision;

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
  // Megatron's sample-based runs (0: not given): train_samples sets train_iters to
  // train_samples / global_batch_size; the schedule is then measured in samples, decaying over
  // lr_decay_samples (0: train_samples) after warming up over lr_warmup_samples. lr_warmup_fraction
  // (< 0: not given) makes the warm-up that share of the decay, in either kind of run.
  int64_t train_samples = 0;
  int64_t lr_warmup_samples = 0;
  int64_t lr_decay_samples = 0;
  double lr_warmup_fraction = -1;
  // Megatron-DeepSpeed's token-based ones: train_tokens (0: none) stops the run once that many
  // tokens were consumed; lr_warmup_tokens (< 0: not given) and lr_decay_tokens (0: not given)
  // measure the warm-up and the decay in tokens.
  int64_t train_tokens = 0;
  int64_t lr_warmup_tokens = -1;
  int64_t lr_decay_tokens = 0;
  // Megatron's --rampup-batch-size START INCREMENT SAMPLES (start 0: none; also in iteration-based runs):
  // the iteration that begins after `consumed` samples trains START + INCREMENT x floor(consumed /
  // (SAMPLES / ((global_batch_size - START) / INCREMENT))) samples while consumed <= SAMPLES, then
  // global_batch_size (megatron/core/num_microbatches_calculator.py).
  int64_t rampup_start_batch = 0;
  int64_t rampup_batch_increment = 0;
  int64_t rampup_samples = 0;
  bool rampup() const { return rampup_start_batch > 0; }
  // The global batch of the iteration that begins after `consumed` samples.
  int64_t global_batch_at(int64_t consumed) const;
  // The samples the first `iterations` iterations consume.
  int64_t samples_after(int64_t iterations) const;
  // The schedule's lengths as Megatron measures them (engine/lr_schedule.hpp): in samples, and in
  // tokens where given (warmup_tokens < 0, decay_tokens 0: not token-based).
  struct LrLengths {
    double warmup_samples = 0, decay_samples = 0;
    double warmup_tokens = -1, decay_tokens = 0;
    bool operator==(const LrLengths&) const = default;
  };
  LrLengths lr_lengths() const;
  // The iterations the run takes: train_iters, and fewer when train_tokens stops it first.
  int64_t iterations_to_run() const;
  uint64_t seed = 1234;

  // Data (docs/DATA.md, "Blends"). data_path: Megatron's --data-path items, one prefix of a
  // .bin/.idx pair, several prefixes (weighed by size) or WEIGHT PREFIX pairs, split by `split`.
  // Or, instead of it, one blend per split (Megatron's --train-data-path, ...; `split` unused).
  std::vector<std::string> data_path;
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  // GPT2BPETokenizer | ByteLevelTokenizer | GPTSentencePieceTokenizer | Llama2Tokenizer |
  // HuggingFaceTokenizer | HFTokenizer | NullTokenizer (storage/tokenizer.hpp, docs/TOKENIZERS.md)
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string vocab_file;
  std::string merge_file;
  // The SentencePiece model, or tokenizer.json (or its folder); for NullTokenizer, which has no
  // files, its vocabulary size in decimal (the command line's --vocab-size).
  std::string tokenizer_model;
  bool no_shuffle = false;
  bool mock_data = false;  // Megatron's --mock-data: synthetic tokens, no dataset needed
  std::string split = "969,30,1";  // train, validation, test weights over documents

  // Checkpointing.
  std::string save;
  int64_t save_interval = 0;  // 0: save only at the end (when --save is given)
  int64_t exit_interval = 0;  // Megatron's --exit-interval: stop (and save) when iteration % N == 0
  std::string load;
  // Resuming and stopping (not stored in checkpoints; config/run_identity.hpp): Megatron's flags
  // for a learning-rate schedule that differs from the checkpoint's (this run's values win, or the
  // checkpoint's), --exit-duration-in-mins (stop and save after this long; 0: never), and the
  // background saves that may be in flight at once (a further save waits for one to finish).
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  // What --load takes (not stored in checkpoints either: they describe one load). finetune
  // (Megatron's --finetune): the parameters only; the run starts anew at iteration 0 with fresh
  // optimizer state, schedule, data position and run id. A --load of a Hugging Face folder
  // (storage/hf_import.hpp) always means it. no_load_optim (--no-load-optim): the parameters,
  // iteration and data position, fresh Adam moments (and bias correction counted from this load).
  bool finetune = false;
  bool no_load_optim = false;
  double exit_duration_in_mins = 0;
  int max_saves_in_flight = 1;
  // In-memory snapshots (docs/RESILIENCE.md, "Memory snapshots"): every save_memory_interval
  // iterations (0: never) the job's model and optimizer state is snapshotted, in the background, as a
  // checkpoint in save_memory_dir (a tmpfs: host memory; empty: /dev/shm/troupe-memory-<pid>), the
  // previous one dropped once the new one is complete; a restart (max_restarts) resumes from it when
  // it is newer than the latest save in --save. The directory goes when the run ends.
  int64_t save_memory_interval = 0;
  std::string save_memory_dir;
  std::string run_id;  // set by run_training: the run this job continues or starts

  // Evaluation and logging.
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  int64_t log_interval = 100;
  // Megatron's timers, printed every log interval as "(min, max) time across ranks (ms):" lines
  // (the ranks of this process): level 0 forward-backward and optimizer; 1 also forward-compute,
  // backward-compute, all-grads-sync, params-all-gather; 2 also the pipeline waits (forward-recv,
  // backward-recv). DeepSpeed's wall_clock_breakdown sets 2. timing_log_option: minmax | max |
  // all (all: every rank of this process, one line each). Logging only: not stored.
  int timing_log_level = 0;
  std::string timing_log_option = "minmax";
  std::string metrics_file;  // one JSON object per iteration
  // Megatron's --log-params-norm and --log-num-zeros-in-grad: every iteration also reports the L2
  // norm of the parameters after its update (the fp32 master weights, each element once over the
  // job) and how many elements of the gradients the optimizer steps on are exactly zero (each once;
  // the vocabulary padding's rows left out). Logging only: not stored in checkpoints.
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  TensorBoardConfig tensorboard;  // not stored in checkpoints (see above)
  int num_threads = 0;       // compute threads of the process's ranks; 0: all cores
  // Where the ranks compute: "cpu", or "cuda" (GPU 0; one rank for now: docs/CUDA.md says what the
  // other layouts still need).
  std::string device = "cpu";

  std::string deepspeed_config;  // the file the values came from, if any (informational)

  // Data-parallel size once the ranks are known (world_size: ranks started; 1 in one process).
  int resolved_dp(int world_size = 1) const;
  // Micro-batches per data-parallel rank and iteration.
  int grad_accumulation_steps(int world_size = 1) const {
    return global_batch_size / (micro_batch_size * resolved_dp(world_size));
  }
  bool parallel() const {
    return tensor_model_parallel_size * pipeline_model_parallel_size * sequence_ranks() * resolved_dp() > 1 ||
           zero_stage > 0 ||
           offload_optimizer != "none";
  }

  // {"format": "troupe.train_config", "version": 8, "model": {GptConfig's fields, "moe": {MoeConfig's
  // fields}}, "parallel": {the parallelism fields, the expert sizes}, "runtime": {offload_optimizer,
  // offload_path, max_restarts, distributed_timeout_minutes}, "schedule": {...}, "precision":
  // {PrecisionConfig's fields}, every other field above}, indented; the data paths are arrays of
  // strings. Versions 1 (no "parallel"), 2 (no "runtime"), 3 (data_path a string, no per-split
  // paths), 4, 5, 6 (no "precision": fp32) and 7 (no "moe": a dense model, expert sizes 1 and 0)
  // still load. from_json requires every key and rejects unknown ones; errors name the key.
  std::string to_json() const;
  static Result<TrainConfig> from_json(const std::string& json);
};

}  // namespace troupe
