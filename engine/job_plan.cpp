// engine/job_plan.hpp.
#include "engine/job_plan.hpp"

#include <algorithm>
#include <string>
#include <thread>

#include "kernels/device_info.hpp"
#include "model/pipeline_model.hpp"

namespace troupe {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

Result<ParallelConfig> parallel_config(const TrainConfig& c, int world_size) {
  ParallelConfig p;
  p.tp = c.tensor_model_parallel_size;
  p.pp = c.pipeline_model_parallel_size;
  p.dp = c.resolved_dp(world_size);
  p.zero_stage = c.zero_stage;
  auto schedule = sched::parse_schedule(c.pipeline_schedule);
  if (!schedule) return schedule.status();
  p.schedule = schedule.value();
  p.virtual_chunks = c.num_layers_per_virtual_pipeline_stage > 0
                         ? c.model.num_layers / (p.pp * c.num_layers_per_virtual_pipeline_stage)
                         : 1;
  p.recompute = c.recompute_granularity == "full"        ? Recompute::full
                : c.recompute_granularity == "selective" ? Recompute::selective
                                                         : Recompute::none;
  p.sequence_parallel = c.sequence_parallel && p.tp > 1;
  // Experts whole on every TP rank (expert-TP 1) or split like the MLP (expert-TP = TP; 0: TP).
  p.expert_tensor_parallel = c.expert_tensor_parallel_size != 1 || p.tp == 1;
  // Expert parallelism: groups of ep consecutive dp ranks split the experts (validated to divide dp).
  p.ep = c.model.moe.enabled() ? std::max(1, c.expert_model_parallel_size) : 1;
  p.cp = std::max(1, c.context_parallel_size);
  p.cp_comm = c.cp_comm_type == "all_gather" ? CpComm::all_gather
              : c.cp_comm_type == "a2a"      ? CpComm::a2a
                                             : CpComm::p2p;
  if (c.ds_sequence_parallel_size > 1) {  // DeepSpeed-Ulysses: the sequence dimension, contiguous rows
    p.cp = c.ds_sequence_parallel_size;
    p.cp_comm = CpComm::a2a;
    p.cp_contiguous = true;
  }
  return p;
}

ModelReport model_report(const Model* model) {
  ModelReport r;
  if (model == nullptr) return r;
  r.loss_terms_per_sample = model->loss_terms_per_sample;
  r.gpt_flops = false;
  for (const auto& stage : model->stages)
    for (const Block& b : stage) r.gpt_flops = r.gpt_flops || (b.kind == Block::Kind::gpt && b.num_layers > 0);
  return r;
}

Status check_model_for_job(const Model& model, const TrainConfig& config, int world_size,
                           std::vector<StageFootprint>* footprint) {
  auto par = parallel_config(config, world_size);
  if (!par) return par.status().as_bad_input();
  RankSpec precision;
  set_precision(precision, config.precision);
  StageBuild job;
  job.gpt = config.model;
  job.tp_size = par->tp;
  job.sequence_parallel = par->sequence_parallel;
  job.cp_size = par->cp;
  job.micro_batch = config.micro_batch_size;
  job.dtype = precision.dtype;
  TROUPE_RETURN_IF_ERROR(check_model(model, job, par->pp, par->virtual_chunks, footprint));
  // A custom stage computes on host views (View<float> over host memory, StageContext::gemm on CPU
  // threads); a GPU rank's tensors live in device memory. GPT's own blocks run anywhere.
  if (config.device == "cuda")
    for (const auto& stage : model.stages)
      for (const Block& b : stage)
        if (b.kind == Block::Kind::custom)
          return Status::bad_input("custom block \"" + b.name + "\" on --device cuda: a troupe::Stage computes on "
                                   "host memory (its views and StageContext::gemm are the CPU's), and a GPU rank keeps "
                                   "its tensors in device memory -- train a model with custom blocks on the CPU "
                                   "(--device cpu), or one of GPT's blocks only on the GPU");
  return Status::ok();
}

// The rank spec of this process's ranks: the layout against the ranks started, the device, a
// schedule and a model given in code, each checked (bad input naming the problem) before any actor.
Result<RankSpec> plan_ranks(const TrainConfig& config, const JobOptions& options, int threads) {
  const int launched = options.world ? options.world->size() : 1;
  auto par = parallel_config(config, launched);
  if (!par) return par.status();
  const int world = par.value().world_size();
  if (options.world && world != launched)
    return Status::error("tensor " + std::to_string(par.value().tp) + " x pipeline " + std::to_string(par.value().pp) +
                         " x data " + std::to_string(par.value().dp) + " = " + std::to_string(world) +
                         " ranks, but troupe launch started " + std::to_string(launched) +
                         " -- change the parallel sizes or the number of processes");
  RankSpec rs;
  rs.model = config.model;
  rs.seed = config.seed;  // the dropout masks' key
  rs.par = par.value();
  rs.micro_batch_size = config.micro_batch_size;
  rs.micro_batches = config.grad_accumulation_steps(launched);
  // A batch-size ramp-up's steps: START, START + INCREMENT, ... below the global batch, each split
  // over the data-parallel ranks and into micro-batches as the engine splits it.
  if (config.rampup() && config.rampup_batch_increment > 0)
    for (int64_t b = config.rampup_start_batch; b < config.global_batch_size; b += config.rampup_batch_increment) {
      const int64_t count = b / std::max(1, par.value().dp) / std::max(1, config.micro_batch_size);
      if (count >= 1 && count < rs.micro_batches) rs.ramp_micro_batches.push_back(static_cast<int>(count));
    }
  set_precision(rs, config.precision);
  rs.num_threads = options.world ? threads : std::max(1, threads / world);
  if (config.device == "cuda") {
    // One process per GPU (troupe launch), each rank on its LOCAL_RANK's GPU, the groups NCCL's; in
    // one process a single rank (the in-process backend moves host memory only).
    if (!options.world && world > 1)
      return Status::bad_input("--device cuda with " + std::to_string(world) +
                               " ranks in one process: GPU ranks run one per process -- start them with troupe launch "
                               "--nproc-per-node " + std::to_string(world) +
                               " (one per GPU), or train this layout on the CPU (--device cpu)");
    if (!options.world && rs.par.zero_stage > 0)
      return Status::bad_input("--zero-stage " + std::to_string(rs.par.zero_stage) +
                               " partitions over data-parallel ranks, and this GPU job has one -- drop --zero-stage, "
                               "or start data-parallel ranks with troupe launch --nproc-per-node N");
    rs.device = Device::cuda;
    rs.cuda_device = options.cuda_device;
  }
  rs.keep_span_steps = config.timeline.empty() ? 0 : 20;
  if (options.schedule) {
    TROUPE_RETURN_IF_ERROR(check_custom_schedule(*options.schedule, rs.par, rs.micro_batches));
    rs.par.custom_schedule = options.schedule;
  }
  if (options.model) {
    TROUPE_RETURN_IF_ERROR(check_model_for_job(*options.model, config, launched));
    rs.custom_model = options.model;
  }
  return rs;
}

}  // namespace troupe
