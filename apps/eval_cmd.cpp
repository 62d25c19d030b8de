// troupe eval: mean next-token loss and perplexity of a checkpoint over the first K windows of a dataset.
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "troupe/data_source.hpp"
#include "actors/job.hpp"
#include "config/memory_estimate.hpp"
#include "apps/commands.hpp"
#include "apps/report.hpp"

namespace troupe::apps {

namespace {

struct EvalArgs {
  std::string load;
  std::string data_path;
  int64_t eval_samples = 0;
  int micro_batch_size = 8;
  int num_threads = 0;
  bool json = false;
};

int run_eval(const EvalArgs& a) {
  const std::string name = "eval";
  auto cfg = checkpoint_config(a.load);
  if (!cfg) {
    print_error(name, cfg.status().with_context("--load " + a.load + ": "));
    return kExitUsage;
  }
  if (a.micro_batch_size <= 0) {
    print_error(name, "--micro-batch-size must be positive -- pass e.g. --micro-batch-size 8");
    return kExitUsage;
  }
  if (a.eval_samples < 0) {
    print_error(name, "--eval-samples must be positive -- omit it to evaluate every window");
    return kExitUsage;
  }
  const GptConfig& model = cfg.value().model;
  // The model eval builds (one shard, --micro-batch-size windows at a time) must fit.
  TrainConfig sized = cfg.value();
  sized.micro_batch_size = sized.global_batch_size = a.micro_batch_size;
  sized.tensor_model_parallel_size = sized.pipeline_model_parallel_size = sized.data_parallel_size = 1;
  sized.context_parallel_size = sized.ds_sequence_parallel_size = 1;
  sized.zero_stage = 0;
  sized.offload_optimizer = "none";
  sized.recompute_granularity = "none";
  if (Status st = check_memory(sized, 1, 1, available_memory_bytes()); !st) {
    print_error(name, st);
    return kExitUsage;
  }
  auto data = open_indexed_data_unsplit(a.data_path, model.seq_length, model.vocab_size);
  if (!data) {
    print_error(name, data.status().with_context("--data-path " + a.data_path + ": "));
    return kExitUsage;
  }
  auto result = run_evaluation(a.load, data.value(), a.eval_samples, a.micro_batch_size, a.num_threads);
  if (!result) {
    print_error(name, result.status());
    return exit_code_for(result.status());
  }
  const EvalSummary& r = result.value();
  if (a.json) {
    nlohmann::json j = {{"loss", r.loss},       {"perplexity", r.perplexity}, {"tokens", r.tokens},
                        {"samples", r.samples}, {"iteration", r.iteration},   {"checkpoint", a.load},
                        {"data_path", a.data_path}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s\n", fmt::format("troupe eval: checkpoint {} (iteration {}) on {}: loss {:.6f} | perplexity {:.4f} | "
                                    "{} windows, {} tokens",
                                    a.load, r.iteration, a.data_path, r.loss, r.perplexity, r.samples, r.tokens)
                            .c_str());
  }
  return kExitOk;
}

}  // namespace

void add_eval_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Mean next-token loss and perplexity of a checkpoint on a dataset");
  cmd->add_option("--load", args->load, "checkpoint directory (as written by --save)")->required();
  cmd->add_option("--data-path", args->data_path, "dataset prefix (PREFIX.bin / PREFIX.idx)")->required();
  cmd->add_option("--eval-samples", args->eval_samples,
                  "evaluate the first K windows of seq_length+1 tokens (default: all windows)");
  cmd->add_option("--micro-batch-size", args->micro_batch_size, "windows per forward pass")->capture_default_str();
  cmd->add_option("--num-threads", args->num_threads, "compute threads (0: all cores)")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object {loss, perplexity, tokens, ...}");
  cmd->callback([args, exit_code] { *exit_code = run_eval(*args); });
}

}  // namespace troupe::apps
