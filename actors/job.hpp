// Runs a training or evaluation job inside one actor system: spawns the rank actors of this process
// (detached; one engine for every layout, 1x1x1 included), their group, the optimizer partitions,
// the offload actor, the data loader and the trainer, initialises or loads the model, and relays the trainer's reports to the
// caller's callbacks on the calling thread. Returns when the job is done, failed, or stopped.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "troupe/data_source.hpp"
#include "troupe/train.hpp"
#include "actors/messages.hpp"
#include "engine/job_options.hpp"
#include "engine/job_plan.hpp"
#include "troupe/train_config.hpp"

namespace troupe {

Result<TrainSummary> run_training(const TrainConfig& config, std::shared_ptr<const DataSource> data,
                                  const JobCallbacks& callbacks, const JobOptions& options = {});

// Loads the model of checkpoint `dir` (its latest iteration) and returns the mean next-token loss over
// the first `samples` windows of `data`'s training split read in order (all windows when samples <= 0).
// model: the model given in code the checkpoint holds (null: GPT's), for any layout it trained on.
Result<EvalSummary> run_evaluation(const std::string& dir, std::shared_ptr<const DataSource> data, int64_t samples,
                                   int micro_batch_size, int num_threads, std::shared_ptr<const Model> model = nullptr);

// Model configuration stored in a checkpoint (its latest iteration), accepted only when it describes
// the tensors the checkpoint holds (config/stored_config.hpp).
Result<TrainConfig> checkpoint_config(const std::string& dir);

}  // namespace troupe
