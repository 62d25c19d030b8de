// troupe bench: measured figures, printed the way peers print them.
//   troupe bench gpt    trains the given GPT on synthetic tokens in the actor runtime; tokens/s, model
//                       TFLOP/s and the fraction of the sgemm peak measured in the same run.
//   troupe bench sgemm  the sgemm peak alone.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "troupe/data_source.hpp"
#include "actors/job.hpp"
#include "apps/commands.hpp"
#include "apps/report.hpp"
#include "kernels/peak.hpp"

namespace troupe::apps {

namespace {

struct GptBenchArgs {
  TrainConfig cfg;
  int64_t vocab_size = 50304;
  int64_t warmup_iters = 2;
  int64_t iters = 10;
  bool json = false;
};

int run_gpt_bench(GptBenchArgs a) {
  TrainConfig& cfg = a.cfg;
  cfg.model.vocab_size = a.vocab_size;
  if (cfg.model.max_position_embeddings < cfg.model.seq_length) cfg.model.max_position_embeddings = cfg.model.seq_length;
  cfg.global_batch_size = cfg.micro_batch_size;
  cfg.train_iters = a.warmup_iters + a.iters;
  cfg.lr = 1e-4;
  cfg.lr_decay_style = "constant";
  // The peer (bench/torch_gpt.py) trains without dropout; so does the benchmark, or the ratio would
  // weigh troupe's masks against nothing.
  cfg.model.hidden_dropout = 0;
  cfg.model.attention_dropout = 0;
  cfg.eval_interval = 0;
  cfg.log_interval = 1;
  if (Status st = cfg.model.validate(); !st) {
    print_error("bench gpt", st);
    return kExitUsage;
  }
  if (a.iters <= 0 || a.warmup_iters < 0 || cfg.micro_batch_size <= 0) {
    print_error("bench gpt", "--iters and --micro-batch-size must be positive, --warmup-iters >= 0");
    return kExitUsage;
  }
  std::vector<IterationStats> timed;
  JobCallbacks cb;
  cb.on_iteration = [&](const IterationStats& s) {
    if (!a.json) std::fprintf(stderr, "%s\n", format_iteration(s).c_str());
    if (s.iteration > a.warmup_iters) timed.push_back(s);
  };
  auto result = run_training(cfg, make_mock_data(a.vocab_size, cfg.model.seq_length, cfg.seed), cb);
  if (!result) {
    print_error("bench gpt", result.status());
    return kExitFailure;
  }
  double ms = 0;
  for (const auto& s : timed) ms += s.ms_per_iter;
  ms /= static_cast<double>(timed.size());
  const int64_t tokens = int64_t{cfg.micro_batch_size} * cfg.model.seq_length;
  const double flops = cfg.model.flops_per_iteration(tokens);
  const double tflops = flops / (ms / 1e3) / 1e12;
  const double peak = timed.front().fraction_of_peak > 0 ? timed.front().model_tflops * 1e3 / timed.front().fraction_of_peak : 0;
  nlohmann::json j = {{"impl", "troupe"},
                      {"threads", cfg.num_threads},
                      {"tokens_per_sec", tokens / (ms / 1e3)},
                      {"ms_per_iter", ms},
                      {"iters", a.iters},
                      {"model_flops_per_iter", flops},
                      {"model_tflops", tflops},
                      {"sgemm_peak_gflops", peak},
                      {"fraction_of_peak", peak > 0 ? tflops * 1e3 / peak : 0.0},
                      {"final_loss", result.value().last_loss}};
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s\n", fmt::format("troupe bench gpt: {:.0f} tokens/s, {:.1f} ms/iter, {:.3f} model TFLOP/s = {:.1f}% of "
                                    "the measured sgemm peak ({:.1f} GFLOP/s)",
                                    tokens / (ms / 1e3), ms, tflops, 100.0 * tflops * 1e3 / peak, peak)
                            .c_str());
  }
  return kExitOk;
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (see bench/ and docs/PERFORMANCE.md)");
  bench->require_subcommand(1, 1);

  auto a = std::make_shared<GptBenchArgs>();
  a->cfg.model.num_layers = 4;
  a->cfg.model.hidden_size = 384;
  a->cfg.model.num_attention_heads = 6;
  a->cfg.model.seq_length = 256;
  a->cfg.model.max_position_embeddings = 0;
  a->cfg.micro_batch_size = 8;
  a->cfg.num_threads = 0;
  CLI::App* gpt = bench->add_subcommand("gpt", "Train a GPT on synthetic tokens and report tokens/s and % of sgemm peak");
  gpt->add_option("--num-layers", a->cfg.model.num_layers)->capture_default_str();
  gpt->add_option("--hidden-size", a->cfg.model.hidden_size)->capture_default_str();
  gpt->add_option("--num-attention-heads", a->cfg.model.num_attention_heads)->capture_default_str();
  gpt->add_option("--seq-length", a->cfg.model.seq_length)->capture_default_str();
  gpt->add_option("--max-position-embeddings", a->cfg.model.max_position_embeddings, "default: seq length");
  gpt->add_option("--micro-batch-size", a->cfg.micro_batch_size)->capture_default_str();
  gpt->add_option("--vocab-size", a->vocab_size, "vocabulary size of the synthetic tokens")->capture_default_str();
  gpt->add_option("--num-threads", a->cfg.num_threads, "compute threads (0: all cores)")->capture_default_str();
  gpt->add_option("--warmup-iters", a->warmup_iters, "iterations not timed")->capture_default_str();
  gpt->add_option("--iters", a->iters, "timed iterations")->capture_default_str();
  gpt->add_option("--seed", a->cfg.seed)->capture_default_str();
  gpt->add_flag("--json", a->json, "print one JSON line");
  gpt->callback([a, exit_code] { *exit_code = run_gpt_bench(*a); });

  add_bench_comm_subcommand(bench, exit_code);

  auto threads = std::make_shared<int>(0);
  auto seconds = std::make_shared<double>(2.0);
  CLI::App* sgemm = bench->add_subcommand("sgemm", "Measure the sgemm peak on this machine");
  sgemm->add_option("--num-threads", *threads, "threads (0: all cores)")->capture_default_str();
  sgemm->add_option("--seconds", *seconds, "time to spend")->capture_default_str();
  sgemm->callback([threads, seconds, exit_code] {
    const int n = *threads > 0 ? *threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    ThreadPool pool(n);
    std::printf("sgemm peak: %.1f GFLOP/s on %d thread(s)\n", measure_sgemm_peak_gflops(pool, *seconds), n);
    *exit_code = kExitOk;
  });
}

}  // namespace troupe::apps
