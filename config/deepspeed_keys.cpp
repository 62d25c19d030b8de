#include "config/deepspeed_keys.hpp"

namespace troupe {
namespace {

// What each key does in DeepSpeed (deepspeed/runtime/config.py, zero/config.py, monitor/,
// profiling/, checkpoint), and why troupe's result is the same without it.
const char* const kZeroTuning =
    "tunes how DeepSpeed's ZeRO schedules memory and communication, not what it computes; troupe's "
    "ZeRO engine decides this itself";
const char* const kStage3Tuning =
    "tunes when DeepSpeed's ZeRO-3 gathers and releases parameters, not what it computes; troupe's "
    "ZeRO-3 decides this itself";
const char* const kCheckpointLayout =
    "troupe's checkpoints are layout-free: any layout resumes any other (docs/CHECKPOINT.md)";

}  // namespace

const std::vector<DsHarmlessKey>& deepspeed_harmless_keys() {
  static const std::vector<DsHarmlessKey> keys = {
      // Top level.
      {"", "prescale_gradients", DsValue::boolean,
       "DeepSpeed divides the gradients by the data-parallel size before the all-reduce instead of "
       "after; troupe averages them once, the same mean",
       ""},
      {"", "gradient_predivide_factor", DsValue::number,
       "DeepSpeed divides the gradients by it before the all-reduce and multiplies after; the mean "
       "is the same",
       ""},
      {"", "zero_allow_untested_optimizer", DsValue::boolean,
       "lets DeepSpeed's ZeRO wrap an optimizer it does not know; troupe's ZeRO runs its own AdamW", ""},
      {"", "zero_force_ds_cpu_optimizer", DsValue::boolean,
       "makes DeepSpeed use its CPU Adam with offload; troupe's offload steps its own AdamW", ""},
      {"", "memory_breakdown", DsValue::boolean,
       "DeepSpeed prints memory use; troupe prints its memory estimate at start-up and `troupe "
       "inspect status` shows it live",
       ""},
      {"", "dump_state", DsValue::boolean, "DeepSpeed prints its engine state at start-up", ""},
      {"", "sparse_gradients", DsValue::false_only, "",
       "sparse embedding gradients are not in troupe: its embedding gradient is dense (the same "
       "values) -- set false or remove it"},
      {"", "seq_parallel_communication_data_type", DsValue::string,
       "the data type of DeepSpeed-Ulysses' all-to-all; troupe's sequence parallelism is Megatron's", ""},
      {"", "flops_profiler", DsValue::object,
       "DeepSpeed's FLOP profiler only prints; troupe prints model TFLOP/s on every log line", ""},
      {"", "comms_logger", DsValue::object,
       "DeepSpeed's communication log only prints; `troupe inspect TARGET --exec flight` lists every "
       "rank's last operations",
       ""},
      {"", "activation_checkpointing", DsValue::object,
       "tunes where DeepSpeed keeps checkpointed activations (partitioned, on the CPU); troupe's "
       "--recompute-granularity gives the same gradients",
       ""},
      {"", "checkpoint", DsValue::object, kCheckpointLayout, ""},
      {"", "aio", DsValue::object, "tunes DeepSpeed's asynchronous NVMe I/O; troupe's optimizer swapper does its own",
       ""},
      {"", "timers", DsValue::object,
       "DeepSpeed's throughput timer; troupe prints tokens/s and TFLOP/s on every log line", ""},
      {"", "pipeline", DsValue::object,
       "DeepSpeed's pipeline engine settings (activation checkpoint interval, partitioned sends); "
       "troupe's pipeline is Megatron's (--pipeline-model-parallel-size, --pipeline-schedule)",
       ""},
      {"", "steps_per_print_offset", DsValue::count, "an offset of DeepSpeed's own log lines", ""},
      {"", "gradient_accumulation_dtype", DsValue::string, "troupe accumulates gradients in float32", ""},
      {"", "dataloader_drop_last", DsValue::boolean,
       "DeepSpeed's own data loader (deepspeed_io) reads it, which Megatron-DeepSpeed uses only with "
       "--data-efficiency-curriculum-learning (refused); its own sampler, like troupe's, never yields a partial "
       "batch",
       ""},
      // zero_optimization
      {"zero_optimization", "overlap_comm", DsValue::boolean, kZeroTuning, ""},
      {"zero_optimization", "contiguous_gradients", DsValue::boolean, kZeroTuning, ""},
      {"zero_optimization", "reduce_scatter", DsValue::boolean, kZeroTuning, ""},
      {"zero_optimization", "allgather_partitions", DsValue::boolean, kZeroTuning, ""},
      {"zero_optimization", "reduce_bucket_size", DsValue::count, kZeroTuning, ""},
      {"zero_optimization", "allgather_bucket_size", DsValue::count, kZeroTuning, ""},
      {"zero_optimization", "round_robin_gradients", DsValue::boolean, kZeroTuning, ""},
      {"zero_optimization", "use_multi_rank_bucket_allreduce", DsValue::boolean, kZeroTuning, ""},
      {"zero_optimization", "sub_group_size", DsValue::count,
       "the parameters DeepSpeed's ZeRO-3 steps at once; troupe steps each partition whole", ""},
      {"zero_optimization", "stage3_prefetch_bucket_size", DsValue::count, kStage3Tuning, ""},
      {"zero_optimization", "stage3_param_persistence_threshold", DsValue::count, kStage3Tuning, ""},
      {"zero_optimization", "stage3_model_persistence_threshold", DsValue::count, kStage3Tuning, ""},
      {"zero_optimization", "stage3_max_live_parameters", DsValue::count, kStage3Tuning, ""},
      {"zero_optimization", "stage3_max_reuse_distance", DsValue::count, kStage3Tuning, ""},
      {"zero_optimization", "stage3_module_granularity_threshold", DsValue::count, kStage3Tuning, ""},
      {"zero_optimization", "stage3_gather_16bit_weights_on_model_save", DsValue::boolean,
       "consolidates 16-bit weights when DeepSpeed saves; troupe trains in float32 and writes its own "
       "checkpoints (docs/CHECKPOINT.md)",
       ""},
      {"zero_optimization", "stage3_gather_fp16_weights_on_model_save", DsValue::boolean,
       "consolidates 16-bit weights when DeepSpeed saves; troupe trains in float32 and writes its own "
       "checkpoints (docs/CHECKPOINT.md)",
       ""},
      {"zero_optimization", "elastic_checkpoint", DsValue::boolean, kCheckpointLayout, ""},
      {"zero_optimization", "load_from_fp32_weights", DsValue::boolean,
       "troupe's checkpoints hold the float32 weights, which it always loads", ""},
      {"zero_optimization", "ignore_unused_parameters", DsValue::boolean,
       "every parameter of troupe's model takes part in every step", ""},
      {"zero_optimization", "legacy_stage1", DsValue::boolean, kZeroTuning, ""},
      {"zero_optimization", "memory_efficient_linear", DsValue::boolean, kStage3Tuning, ""},
      {"zero_optimization", "pipeline_loading_checkpoint", DsValue::boolean, kCheckpointLayout, ""},
      {"zero_optimization", "override_module_apply", DsValue::boolean, kStage3Tuning, ""},
      {"zero_optimization", "log_trace_cache_warnings", DsValue::boolean, "DeepSpeed's own warnings", ""},
      {"zero_optimization", "mics_shard_size", DsValue::minus_one_only, "",
       "MiCS shards the model states over sub-groups of the data-parallel ranks, which troupe's ZeRO "
       "does not -- remove it (or set -1)"},
      {"zero_optimization", "mics_hierarchical_params_gather", DsValue::boolean, kZeroTuning, ""},
      {"zero_optimization", "zero_hpz_partition_size", DsValue::count,
       "ZeRO++'s secondary partition only changes where copies live", ""},
      {"zero_optimization", "zero_quantized_weights", DsValue::false_only, "",
       "ZeRO++ quantises the gathered weights, which changes the results; troupe gathers them "
       "exactly -- set false or remove it"},
      {"zero_optimization", "zero_quantized_nontrainable_weights", DsValue::false_only, "",
       "ZeRO++ quantises the weights, which changes the results -- set false or remove it"},
      {"zero_optimization", "zero_quantized_gradients", DsValue::false_only, "",
       "ZeRO++ quantises the gradients, which changes the results; troupe reduces them exactly -- set "
       "false or remove it"},
  };
  return keys;
}

const std::vector<DsSwitchedBlock>& deepspeed_switched_blocks() {
  static const std::vector<DsSwitchedBlock> blocks = {
      {"amp",
       "NVIDIA Apex AMP (mixed precision) is not in troupe: it trains in float32 -- set "
       "\"enabled\": false or remove the block"},
      {"wandb",
       "wandb is not available here (no network, no wandb package) -- remove the block; "
       "--metrics-file FILE writes every iteration as JSON lines"},
      {"comet",
       "Comet is not available here (no network) -- remove the block; --metrics-file FILE "
       "writes every iteration as JSON lines"},
      {"csv_monitor",
       "DeepSpeed's CSV monitor is not in troupe -- remove the block; --metrics-file "
       "FILE writes every iteration as JSON lines"},
      {"elasticity",
       "elastic training (a batch size that adapts to the ranks that come and go) is "
       "not in troupe -- remove the block and fix the batch sizes"},
      {"curriculum_learning",
       "DeepSpeed's legacy curriculum learning (curriculum_type seqlen: iteration n trains on the first L(n) "
       "tokens of every sample, L growing from min_difficulty to max_difficulty by schedule_type fixed_linear, "
       "fixed_root or fixed_discrete) is not in troupe -- set \"enabled\": false or remove the block to train "
       "at full length"},
      {"sparse_attention",
       "sparse attention computes a different attention; troupe's is dense -- "
       "remove the block"},
      {"nebula",
       "Azure Nebula checkpointing is not in troupe; its own checkpoints are "
       "asynchronous already (docs/CHECKPOINT.md) -- remove the block"},
  };
  return blocks;
}

}  // namespace troupe
