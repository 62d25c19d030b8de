// troupe bench: measured figures, printed the way peers print them.
//   troupe bench gpt    trains the given GPT on synthetic tokens in the actor runtime; tokens/s, model
//                       TFLOP/s and the fraction of the sgemm peak measured in the same run. The
//                       family flags of `troupe train` (--model-preset, --swiglu, ...) choose a LLaMA
//                       or a BLOOM; the FLOPs are GptConfig::flops_per_iteration, family-aware.
//                       The mixture-of-experts flags of `troupe train` (--num-experts 8
//                       --moe-router-topk 2, ...) make MoE layers; their FLOPs are what one token
//                       computes (k experts and the router), as GptConfig::flops_per_iteration counts.
//   troupe bench sgemm  the sgemm peak alone.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "troupe/data_source.hpp"
#include "actors/job.hpp"
#include "apps/cli/moe_flags.hpp"
#include "apps/cli/train_options.hpp"
#include "apps/commands.hpp"
#include "apps/report.hpp"
#include "config/model_presets.hpp"
#include "kernels/peak.hpp"

namespace troupe::apps {

namespace {

struct GptBenchArgs {
  TrainConfig cfg;
  int64_t vocab_size = 50304;  // a preset's own tokenizer's when --vocab-size is not given
  int64_t warmup_iters = 2;
  int64_t iters = 10;
  bool json = false;
  bool bf16 = false;
};

int run_gpt_bench(GptBenchArgs a, const CLI::App& cmd) {
  TrainConfig& cfg = a.cfg;
  std::vector<std::string> problems, notes;
  apply_model_family_flags(cmd, &cfg.model, &problems, &notes);
  // The MoE flags as `troupe train` reads them (Megatron-LM's or Megatron-DeepSpeed's dialect); a flag
  // this command lacks (--deepspeed) was not given.
  const FlagGivenFn given = [&cmd](const char* flag) {
    const CLI::Option* o = cmd.get_option_no_throw(flag);
    return o != nullptr && o->count() > 0;
  };
  apply_moe_flags(cmd, given, &cfg, &problems, &notes);
  // No tokenizer here: a preset's own vocabulary unless --vocab-size is given (train's note about
  // --tokenizer-type does not apply).
  if (const ModelPreset* p = cmd.count("--model-preset") > 0
                                 ? find_model_preset(cmd.get_option("--model-preset")->as<std::string>())
                                 : nullptr) {
    std::erase_if(notes, [](const std::string& n) { return n.rfind("--model-preset", 0) == 0; });
    if (cmd.count("--vocab-size") == 0) a.vocab_size = p->model.vocab_size;
    notes.push_back(fmt::format("--model-preset {}: {}'s architecture, flags given beside it win; vocabulary {}",
                                p->name, p->source, a.vocab_size));
  }
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
  if (a.bf16) cfg.precision.dtype = PrecisionDType::bf16;
  // Every problem at once: the family flags', the architecture's, the run's.
  if (Status st = cfg.model.validate(); !st) {
    const std::string& m = st.message();
    const std::string sep = "\n  - ";
    if (m.find(" problems:" + sep) == std::string::npos) {
      problems.push_back(m);
    } else {
      for (size_t at = m.find(sep); at != std::string::npos;) {
        const size_t next = m.find(sep, at + sep.size());
        problems.push_back(m.substr(at + sep.size(), next == std::string::npos ? next : next - at - sep.size()));
        at = next;
      }
    }
  }
  if (a.iters <= 0 || a.warmup_iters < 0 || cfg.micro_batch_size <= 0)
    problems.push_back("--iters and --micro-batch-size must be positive, --warmup-iters >= 0 -- pass e.g. --iters 10");
  if (!problems.empty()) {
    std::string message = problems.size() == 1 ? problems[0] : fmt::format("{} problems:", problems.size());
    if (problems.size() > 1)
      for (const std::string& p : problems) message += "\n  - " + p;
    print_error("bench gpt", message);
    return kExitUsage;
  }
  if (!a.json)
    for (const std::string& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
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
                      {"final_loss", result.value().last_loss},
                      {"family", cfg.model.family_name()},
                      {"moe", describe_moe(cfg)},
                      {"device", cfg.device},
                      {"dtype", a.bf16 ? "bf16" : "fp32"},
                      {"parameters", cfg.model.num_parameters()}};
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s\n", fmt::format("troupe bench gpt ({}, {:.1f}M parameters): {:.0f} tokens/s, {:.1f} ms/iter, "
                                    "{:.3f} model TFLOP/s = {:.1f}% of the measured sgemm peak ({:.1f} GFLOP/s)",
                                    cfg.model.family_name(), cfg.model.num_parameters() / 1e6,
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
  gpt->add_option("--device", a->cfg.device, "cpu or cuda (GPU 0), as troupe train's")->capture_default_str();
  gpt->add_flag("--bf16", a->bf16, "bf16 parameters and activations, fp32 master weights (troupe train's --bf16)");
  // The architecture: GPT-2 unless the family flags (or a preset, the flags given beside it winning)
  // say otherwise, as in `troupe train`.
  add_model_family_options(gpt, &a->cfg.model);
  add_moe_options(gpt);
  gpt->callback([a, gpt, exit_code] { *exit_code = run_gpt_bench(*a, *gpt); });

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
