// A training job's plan before any actor exists: the parallel layout a config asks for, the rank
// spec of this process's ranks (checked: bad input naming each problem), and how the run reports a
// model given in code. No CAF: actors/job.cpp and the API's training actor spawn what it plans.
#pragma once
#include <vector>

#include "engine/job_options.hpp"
#include "engine/rank_engine.hpp"
#include "model/footprint.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

// The compute threads of a process: `requested`, or the machine's hardware threads when 0 or less.
int resolve_threads(int requested);

// The parallel layout a validated config asks for, with world_size ranks started (1: one process).
Result<ParallelConfig> parallel_config(const TrainConfig& config, int world_size);

// How a run reports a model given in code (null: GPT's): the loss terms per sample (0: seq_length,
// a loss per token) and whether Megatron's GPT FLOP count applies (the model has GPT layers).
struct ModelReport {
  int64_t loss_terms_per_sample = 0;
  bool gpt_flops = true;
};
ModelReport model_report(const Model* model);

// The rank spec of this process's ranks: the layout against the ranks started (options.world's, or
// one process), the device, a schedule and a model given in code (options.schedule, .model), each
// checked (bad input naming the problem) before any actor exists. threads: this process's compute
// threads (split among its ranks in one process).
Result<RankSpec> plan_ranks(const TrainConfig& config, const JobOptions& options, int threads);

// A model given in code against the job `config` describes with world_size ranks started:
// check_model's rules (every problem at once), and custom blocks refused on --device cuda. Bad input
// naming each problem; footprint (when given) gets each virtual stage's for the memory estimate.
Status check_model_for_job(const Model& model, const TrainConfig& config, int world_size,
                           std::vector<StageFootprint>* footprint = nullptr);

}  // namespace troupe
