#include "engine/types.hpp"

#include <cmath>

namespace troupe {

const char* tensor_kind_suffix(TensorKind kind) {
  switch (kind) {
    case TensorKind::value: return "";
    case TensorKind::grad: return ".grad";
    case TensorKind::exp_avg: return ".exp_avg";
    case TensorKind::exp_avg_sq: return ".exp_avg_sq";
  }
  return "";
}

CheckpointMeta checkpoint_meta(const SaveRequest& r, std::string run_json) {
  CheckpointMeta meta;
  meta.iteration = r.iteration;
  meta.consumed_samples = r.consumed_samples;
  meta.optimizer_step = r.optimizer_step;
  meta.config_json = r.config_json;
  meta.rng_json = r.rng_json;
  meta.run_json = std::move(run_json);
  return meta;
}

IterationStats iteration_stats(const TrainConfig& c, int64_t iteration, int64_t consumed, double loss_sum,
                               double grad_norm, double lr, double seconds, int64_t loss_terms, bool gpt_flops,
                               int64_t global_batch) {
  const int64_t batch = global_batch > 0 ? global_batch : int64_t{c.global_batch_size};
  const int64_t tokens = batch * static_cast<int64_t>(c.model.seq_length);
  const int64_t terms = batch * (loss_terms > 0 ? loss_terms : int64_t{c.model.seq_length});
  IterationStats s;
  s.iteration = iteration;
  s.train_iters = c.iterations_to_run();
  s.lm_loss = loss_sum / static_cast<double>(terms);
  s.lr = lr;
  s.grad_norm = grad_norm;
  s.ms_per_iter = seconds * 1e3;
  s.tokens_per_sec = tokens / seconds;
  s.model_tflops = gpt_flops ? c.model.flops_per_iteration(tokens) / seconds / 1e12 : 0.0;
  s.consumed_samples = consumed;
  s.global_batch_size = batch;
  s.nan_loss = !std::isfinite(s.lm_loss);
  return s;
}

}  // namespace troupe
